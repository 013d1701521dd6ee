use std::sync::{Arc, Mutex};
use std::time::Instant;

use timely::dataflow::channels::pact::Exchange;
use timely::dataflow::operators::{Operator, Probe};
use timely::dataflow::ProbeHandle;

use super::BatchStream;
use crate::batch::now_ns;
use crate::error::DataflowError;
use crate::metrics::Metrics;
use crate::sink::Sink;
use crate::{Batch, BatchKind, Epoch};

/// Sinks a stream: results to one sink, dead letters to another.
pub trait WriteToSink<'scope> {
    /// Sends every batch to worker 0, which writes results to `results` and dead letters to
    /// `dead_letters` (other workers pass `None`: only worker 0 opens the files). The first
    /// write error is stored in `errors` and later batches are dropped, so the run can end and
    /// report it. Returns a probe that passes an epoch once its results are written.
    ///
    /// # Examples
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// use arrow_array::{Int64Array, RecordBatch};
    /// use riffle_dataflow::{Batch, DataflowResult, Sink};
    /// use riffle_dataflow::metrics::Metrics;
    /// use riffle_dataflow::operators::WriteToSink;
    /// use timely::dataflow::operators::ToStream;
    ///
    /// struct Count(Arc<Mutex<usize>>);
    /// impl Sink for Count {
    ///     fn write_batch(&mut self, b: &RecordBatch) -> DataflowResult<()> { *self.0.lock().unwrap() += b.num_rows(); Ok(()) }
    ///     fn flush(&mut self) -> DataflowResult<()> { Ok(()) }
    /// }
    ///
    /// let rows = Arc::new(Mutex::new(0));
    /// let sink_rows = rows.clone();
    /// timely::example(move |scope| {
    ///     let data = RecordBatch::try_from_iter(vec![("x", Arc::new(Int64Array::from(vec![1, 2])) as _)]).unwrap();
    ///     vec![Batch::records(data, 0)]
    ///         .to_stream(scope)
    ///         .container::<Vec<_>>()
    ///         .write_to_sink(Some(Box::new(Count(sink_rows))), None, Metrics::new().unwrap(), Default::default(), None);
    /// });
    /// assert_eq!(*rows.lock().unwrap(), 2);
    /// ```
    fn write_to_sink(
        self,
        results: Option<Box<dyn Sink>>,
        dead_letters: Option<Box<dyn Sink>>,
        metrics: Arc<Metrics>,
        errors: Arc<Mutex<Vec<DataflowError>>>,
        latency_column: Option<String>,
    ) -> ProbeHandle<Epoch>;
}

impl<'scope> WriteToSink<'scope> for BatchStream<'scope> {
    fn write_to_sink(
        self,
        mut results: Option<Box<dyn Sink>>,
        mut dead_letters: Option<Box<dyn Sink>>,
        metrics: Arc<Metrics>,
        errors: Arc<Mutex<Vec<DataflowError>>>,
        latency_column: Option<String>,
    ) -> ProbeHandle<Epoch> {
        let sink_metrics = metrics.stage("sink");
        let dead_metrics = metrics.stage("dead-letters");
        let mut failed = false;
        let fail = move |e: DataflowError| {
            tracing::error!("sink: {e}");
            if let Ok(mut errors) = errors.lock() {
                errors.push(e);
            }
        };
        let mut flushed_frontier: Vec<Epoch> = Vec::new();
        let (probe, _) = self
            .unary_frontier::<timely::container::CapacityContainerBuilder<Vec<()>>, _, _, _>(
                Exchange::new(|_: &Batch| 0),
                "WriteToSink",
                move |_, _| {
                    move |(input, frontier), _output| {
                        input.for_each(|_cap, data| {
                            for batch in data.drain(..) {
                                if failed {
                                    continue;
                                }
                                let started = Instant::now();
                                let (sink, stage) = match batch.kind {
                                    BatchKind::Records => (&mut results, &sink_metrics),
                                    BatchKind::DeadLetters => (&mut dead_letters, &dead_metrics),
                                };
                                let Some(sink) = sink.as_mut() else { continue };
                                let now = now_ns();
                                let data = match (&latency_column, batch.kind) {
                                    (Some(name), BatchKind::Records) => {
                                        with_latency(&batch.data, name, now, batch.ingest_ns)
                                    }
                                    _ => Ok(batch.data.clone()),
                                };
                                if let Err(e) = data.and_then(|d| sink.write_batch(&d)) {
                                    failed = true;
                                    fail(e);
                                    continue;
                                }
                                if let Ok(stage) = stage {
                                    stage.record_batch(
                                        batch.num_rows(),
                                        batch.num_rows(),
                                        0,
                                        started.elapsed(),
                                    );
                                }
                                if batch.kind == BatchKind::Records {
                                    metrics.record_end_to_end(
                                        batch.ingest_ns,
                                        now,
                                        batch.num_rows(),
                                    );
                                }
                            }
                        });
                        // Make each completed epoch visible to readers of the files.
                        let current: Vec<Epoch> = frontier.frontier().iter().copied().collect();
                        if current != flushed_frontier && !failed {
                            flushed_frontier = current;
                            // An empty frontier is the end of the input: make it durable.
                            let end = flushed_frontier.is_empty();
                            for sink in [&mut results, &mut dead_letters].into_iter().flatten() {
                                let done = if end { sink.finish() } else { sink.flush() };
                                if let Err(e) = done {
                                    failed = true;
                                    fail(e);
                                }
                            }
                        }
                    }
                },
            )
            .probe();
        probe
    }
}

/// `batch` plus a column holding each row's end-to-end latency in milliseconds.
fn with_latency(
    batch: &arrow_array::RecordBatch,
    name: &str,
    now_ns: u64,
    ingest_ns: u64,
) -> Result<arrow_array::RecordBatch, DataflowError> {
    let ms = now_ns.saturating_sub(ingest_ns) as f64 / 1e6;
    let mut fields: Vec<_> = batch.schema().fields().iter().cloned().collect();
    fields.push(Arc::new(arrow_schema::Field::new(
        name,
        arrow_schema::DataType::Float64,
        false,
    )));
    let mut columns = batch.columns().to_vec();
    columns.push(Arc::new(arrow_array::Float64Array::from(vec![
        ms;
        batch
            .num_rows(
            )
    ])));
    Ok(arrow_array::RecordBatch::try_new(
        Arc::new(arrow_schema::Schema::new(fields)),
        columns,
    )?)
}
