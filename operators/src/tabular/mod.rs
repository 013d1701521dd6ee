//! Tabular data and recommendation: stages over plain columns. Casting columns, building
//! tensor columns from them, filtering and selecting rows and columns, the top-k of a score,
//! ranking candidates per event, and candidate generation from a click stream
//! (differential-dataflow features, a stateful step).

pub mod cast;
pub mod filter;
pub mod rank;
pub mod recs;
pub mod select;
pub mod tensor_stage;
pub mod topk;
