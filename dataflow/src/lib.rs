//! Riffle's engine core: the pieces every pipeline is built from, independent of any model,
//! file format or broker.
//!
//! - [`batch`]: the unit that travels between operators, an Arrow `RecordBatch` with its
//!   provenance, serialisable as Arrow IPC when it crosses a process boundary.
//! - [`stage`], [`source`], [`sink`]: the three traits operators and connectors implement.
//! - [`operators`]: timely extension traits that run those traits on sharded workers.
//! - [`cluster`]: how many workers, threads and processes, turned into a timely configuration.
//! - [`observe`]: what a run reports to, handed to the runtime as a
//!   [`observe::RunContext`]: the Prometheus registry with per-stage counters and latency
//!   histograms, readiness, dead-letter reasons, the summary, and the live tap a viewer drains.
//! - [`runtime`]: the run loop: a [`runtime::Job`] on workers, with epochs, flow control,
//!   checkpoints and liveness.
//! - [`state`]: operator state as checkpoints keep it: typed records in a versioned envelope.
//! - [`range`]: the allowed range of a configuration number, declared beside its key.
//! - [`dead_letter`]: how a bad record is described on its way to the dead-letter sink.
//! - [`tensor`]: conventions for tensors stored in Arrow columns.

// No panic on data or configuration in library code (its unit tests may unwrap); every index
// or slice left says why it is in bounds.
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)
)]

pub mod batch;
pub mod checkpoint;
pub mod cluster;
pub mod compression;
pub mod control;
pub mod credit;
pub mod dead_letter;
pub mod error;
pub mod events;
pub mod observe;
pub mod operators;
pub mod range;
pub mod runtime;
pub mod sink;
pub mod source;
pub mod stage;
pub mod state;
pub mod tensor;

pub use batch::{Batch, BatchKind, Trace};
pub use compression::Compression;
pub use error::{DataflowError, DataflowResult};
pub use sink::{Committer, Recovery, Sink};
pub use source::{Source, SourceBatch, SourceFactory, SourcePosition};
pub use stage::{Stage, StageOutput};

/// Logical time of a record: the epoch its source assigned it to.
pub type Epoch = u64;
