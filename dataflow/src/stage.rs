//! The shape of a record-at-a-time operator: a batch in, a batch out.

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;

use crate::dead_letter::DeadLetter;
use crate::error::DataflowResult;

/// What a stage made of one input batch.
#[derive(Debug)]
pub struct StageOutput {
    /// Rows that passed, in input order (minus the rejected ones).
    pub records: RecordBatch,
    /// Rows that could not be processed, each with the reason; they go to the dead-letter sink.
    pub rejected: Vec<DeadLetter>,
}

impl StageOutput {
    pub fn all(records: RecordBatch) -> Self {
        StageOutput {
            records,
            rejected: Vec::new(),
        }
    }
}

/// A pipeline stage: one `process_batch` per Arrow batch (Arroyo's operator shape).
///
/// One instance runs per worker, so `&mut self` state (a model session, scratch buffers) is
/// never shared between threads.
pub trait Stage: Send {
    /// Kind of stage, for metrics and error messages (e.g. `"decode"`).
    fn name(&self) -> &str;

    /// The schema this stage produces from `input`, or why `input` does not fit it. Called at
    /// validation, before any data flows, so configuration mistakes surface early.
    fn output_schema(&self, input: &SchemaRef) -> DataflowResult<SchemaRef>;

    /// Transforms one batch. An `Err` fails the whole batch: the engine sends every row of it to
    /// the dead-letter sink with the error as the reason and keeps running.
    fn process_batch(&mut self, batch: &RecordBatch) -> DataflowResult<StageOutput>;

    /// Whether output row `i` always corresponds to input row `i` (no filtering, no
    /// rejection): such stages can be run on merged batches and their output split again.
    fn preserves_rows(&self) -> bool {
        false
    }
}
