use std::sync::Arc;
use std::time::Instant;

use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::Operator;

use super::BatchStream;
use crate::dead_letter::{self, DeadLetter};
use crate::error::DataflowError;
use crate::observe::registry::StageMetrics;
use crate::stage::Stage;
use crate::{Batch, BatchKind};

/// Runs a [`Stage`] on every batch of a stream, on the worker that holds the batch.
pub trait ApplyStage<'scope> {
    /// Applies `stage` batch by batch. Rows the stage rejects, and every row of a batch it fails
    /// on, continue as dead letters, so a bad record never stops the worker.
    ///
    /// # Examples
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// use arrow_array::{Int64Array, RecordBatch};
    /// use arrow_schema::SchemaRef;
    /// use riffle_dataflow::{Batch, DataflowResult, Stage, StageOutput};
    /// use riffle_dataflow::observe::registry::Metrics;
    /// use riffle_dataflow::operators::ApplyStage;
    /// use timely::dataflow::operators::{Inspect, ToStream};
    ///
    /// struct Identity;
    /// impl Stage for Identity {
    ///     fn name(&self) -> &str { "identity" }
    ///     fn output_schema(&self, input: &SchemaRef) -> DataflowResult<SchemaRef> { Ok(input.clone()) }
    ///     fn process_batch(&mut self, batch: &RecordBatch) -> DataflowResult<StageOutput> {
    ///         Ok(StageOutput::all(batch.clone()))
    ///     }
    /// }
    ///
    /// let seen = Arc::new(Mutex::new(0));
    /// let seen2 = seen.clone();
    /// timely::example(move |scope| {
    ///     let rows = RecordBatch::try_from_iter(vec![("x", Arc::new(Int64Array::from(vec![1, 2, 3])) as _)]).unwrap();
    ///     let metrics = Metrics::new().unwrap().stage("identity").unwrap();
    ///     vec![Batch::records(rows, 0)]
    ///         .to_stream(scope)
    ///         .container::<Vec<_>>()
    ///         .apply_stage(Box::new(Identity), metrics)
    ///         .inspect(move |b: &Batch| *seen2.lock().unwrap() += b.num_rows());
    /// });
    /// assert_eq!(*seen.lock().unwrap(), 3);
    /// ```
    fn apply_stage(self, stage: Box<dyn Stage>, metrics: Arc<StageMetrics>) -> Self;
}

impl<'scope> ApplyStage<'scope> for BatchStream<'scope> {
    fn apply_stage(self, mut stage: Box<dyn Stage>, metrics: Arc<StageMetrics>) -> Self {
        let name = stage.name().to_string();
        self.unary(Pipeline, &name, move |_, _| {
            move |input, output| {
                input.for_each(|cap, data| {
                    let mut session = output.session(&cap);
                    for batch in data.drain(..) {
                        for out in run_stage(stage.as_mut(), &metrics, &batch) {
                            session.give(out);
                        }
                    }
                });
            }
        })
    }
}

/// One batch through one stage: its results and, if any, a batch of dead letters.
/// Dead letters and retired keys pass through untouched. The results' trace counts the
/// stage's time.
pub fn run_stage(stage: &mut dyn Stage, metrics: &StageMetrics, batch: &Batch) -> Vec<Batch> {
    let started = Instant::now();
    let mut out = run_stage_untraced(stage, metrics, batch);
    let took = started.elapsed().as_nanos() as u64;
    for b in out.iter_mut().filter(|b| b.kind == BatchKind::Records) {
        b.trace.stages_ns = b.trace.stages_ns.saturating_add(took);
    }
    out
}

/// [`run_stage`] without adding its time to the results' trace (a batcher adds the time of
/// the whole merged batch once).
pub(crate) fn run_stage_untraced(
    stage: &mut dyn Stage,
    metrics: &StageMetrics,
    batch: &Batch,
) -> Vec<Batch> {
    if batch.kind != BatchKind::Records {
        return vec![batch.clone()];
    }
    let started = Instant::now();
    let rows_in = batch.num_rows();
    let result = stage.process_batch(&batch.data);
    if matches!(result, Err(DataflowError::BatchTooLarge { .. })) && rows_in > 1 {
        // Halves until each fits: a single row that is still too large fails alone.
        let half = rows_in / 2;
        let first = batch.with_data(batch.data.slice(0, half));
        let mut out = run_stage_untraced(stage, metrics, &first);
        let rest = batch.with_data(batch.data.slice(half, rows_in - half));
        out.extend(run_stage_untraced(stage, metrics, &rest));
        return out;
    }
    let (records, rejected) = match result {
        Ok(out) => (Some(out.records), out.rejected),
        Err(e) => {
            let reason = e.to_string();
            let letters = (0..rows_in)
                .map(|row| DeadLetter::for_row(stage.name(), &batch.data, row, &reason))
                .collect();
            (None, letters)
        }
    };
    let rows_out = records.as_ref().map_or(0, |r| r.num_rows());
    metrics.record_batch(rows_in, rows_out, rejected.len(), started.elapsed());
    let mut out = Vec::with_capacity(2);
    if let Some(records) = records {
        if records.num_rows() > 0 {
            out.push(batch.with_data(records));
        }
    }
    if !rejected.is_empty() {
        match dead_letter::to_batch(&rejected) {
            Ok(letters) => out.push(Batch::dead_letters(letters, batch.ingest_ns)),
            Err(e) => tracing::error!(stage = stage.name(), "cannot build dead letters: {e}"),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::DataflowResult;
    use crate::stage::StageOutput;
    use arrow_array::{Array, Int64Array, RecordBatch};
    use arrow_schema::SchemaRef;

    /// Fails batches of more than `max` rows as too large, passes smaller ones through.
    struct AtMost {
        max: usize,
        calls: Vec<usize>,
    }

    impl Stage for AtMost {
        fn name(&self) -> &str {
            "at_most"
        }
        fn output_schema(&self, input: &SchemaRef) -> DataflowResult<SchemaRef> {
            Ok(input.clone())
        }
        fn process_batch(&mut self, batch: &RecordBatch) -> DataflowResult<StageOutput> {
            self.calls.push(batch.num_rows());
            if batch.num_rows() > self.max {
                return Err(DataflowError::batch_too_large("at_most", "too many rows"));
            }
            Ok(StageOutput::all(batch.clone()))
        }
    }

    fn numbers(batches: &[Batch]) -> Vec<i64> {
        batches
            .iter()
            .filter(|b| b.kind == BatchKind::Records)
            .flat_map(|b| {
                let column = b.data.column(0).as_any().downcast_ref::<Int64Array>();
                column.map(|c| c.values().to_vec()).unwrap_or_default()
            })
            .collect()
    }

    #[test]
    fn a_batch_too_large_is_split_until_it_fits_and_no_row_fails() {
        let metrics = crate::observe::registry::Metrics::new()
            .unwrap()
            .stage("at_most")
            .unwrap();
        let data =
            RecordBatch::try_from_iter([("n", Arc::new(Int64Array::from_iter_values(0..7)) as _)])
                .unwrap();
        let mut stage = AtMost {
            max: 2,
            calls: Vec::new(),
        };
        let out = run_stage(&mut stage, &metrics, &Batch::records(data.clone(), 0));
        assert_eq!(numbers(&out), (0..7).collect::<Vec<_>>());
        assert!(out.iter().all(|b| b.kind == BatchKind::Records));
        assert_eq!(stage.calls, [7, 3, 1, 2, 4, 2, 2]);

        // A single row still too large is a dead letter with the reason, alone.
        let mut stage = AtMost {
            max: 0,
            calls: Vec::new(),
        };
        let out = run_stage(&mut stage, &metrics, &Batch::records(data.slice(0, 2), 0));
        assert!(numbers(&out).is_empty());
        let dead: usize = out
            .iter()
            .filter(|b| b.kind == BatchKind::DeadLetters)
            .map(Batch::num_rows)
            .sum();
        assert_eq!(dead, 2);
    }
}
