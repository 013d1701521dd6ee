use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use timely::dataflow::channels::pact::Exchange;
use timely::dataflow::operators::{Operator, Probe};
use timely::dataflow::ProbeHandle;

use super::BatchStream;
use crate::batch::now_ns;
use crate::error::DataflowError;
use crate::events::EventsSpec;
use crate::observe::RunContext;
use crate::sink::Sink;
use crate::{Batch, BatchKind, Epoch};
use arrow_schema::SchemaRef;

/// Where results and dead letters go, and what the sink reports back.
#[derive(Default)]
pub struct SinkOptions {
    /// Results (on worker 0; other workers pass `None`).
    pub results: Option<Box<dyn Sink>>,
    /// Dead letters (on worker 0).
    pub dead_letters: Option<Box<dyn Sink>>,
    /// Adds a column of this name with each result's end-to-end latency in ms.
    pub latency_column: Option<String>,
    /// Filled with the results sink's position after each completed epoch (for checkpoints).
    pub positions: Option<Rc<RefCell<BTreeMap<Epoch, u64>>>>,
    /// The run's generation, when its output is exactly-once (see [`crate::Committer`]).
    pub generation: Option<u64>,
    /// The first write error; later batches are dropped so the run can end and report it.
    pub errors: Arc<Mutex<Vec<DataflowError>>>,
    /// Results as they arrive, before their epoch commits (on worker 0): a live topic for
    /// dashboards. Not part of any checkpoint; its errors are logged, never fail the run.
    pub live: Option<Box<dyn Sink>>,
    /// Events taken out of each result batch and written, with the results of their epoch, to
    /// a sink of their own (on worker 0).
    pub events: Option<(EventsSpec, SchemaRef, Box<dyn Sink>)>,
}

/// Sinks a stream: results to one sink, dead letters to another.
pub trait WriteToSink<'scope> {
    /// Sends every batch to worker 0, which writes each epoch's results once the epoch is
    /// complete, in epoch order, so that the sink's contents after epoch `e` are exactly the
    /// results of epochs ≤ `e` (what a checkpoint of `e` must match). Dead letters are written
    /// as they come. Returns a probe that passes an epoch once its results are written.
    /// Reports to `context`: the sink's and dead letters' metrics, end-to-end latencies,
    /// dead-letter reasons, and every result and dead letter to its live tap, if any.
    ///
    /// # Examples
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// use arrow_array::{Int64Array, RecordBatch};
    /// use riffle_dataflow::{Batch, DataflowResult, Sink};
    /// use riffle_dataflow::observe::RunContext;
    /// use riffle_dataflow::operators::{SinkOptions, WriteToSink};
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
    ///     let options = SinkOptions { results: Some(Box::new(Count(sink_rows))), ..Default::default() };
    ///     vec![Batch::records(data, 0)]
    ///         .to_stream(scope)
    ///         .container::<Vec<_>>()
    ///         .write_to_sink(options, RunContext::new().unwrap());
    /// });
    /// assert_eq!(*rows.lock().unwrap(), 2);
    /// ```
    fn write_to_sink(self, options: SinkOptions, context: RunContext) -> ProbeHandle<Epoch>;
}

impl<'scope> WriteToSink<'scope> for BatchStream<'scope> {
    fn write_to_sink(self, options: SinkOptions, context: RunContext) -> ProbeHandle<Epoch> {
        let SinkOptions {
            mut results,
            mut dead_letters,
            latency_column,
            positions,
            generation,
            errors,
            mut live,
            events,
        } = options;
        let (events, mut events_sink) = match events {
            Some((spec, schema, sink)) => (Some((spec, schema)), Some(sink)),
            None => (None, None),
        };
        let events_metrics = events
            .as_ref()
            .and_then(|_| context.metrics.stage("events").ok());
        let mut live_failed = false;
        let RunContext {
            metrics,
            dead_letters: reasons,
            live: tap,
            ..
        } = context;
        let sink_metrics = metrics.stage("sink");
        let dead_metrics = metrics.stage("dead-letters");
        let mut failed = false;
        let fail = move |e: DataflowError| {
            tracing::error!("sink: {e}");
            if let Ok(mut errors) = errors.lock() {
                errors.push(e);
            }
        };
        let mut pending: BTreeMap<Epoch, Vec<Batch>> = BTreeMap::new();
        let mut flushed_frontier: Option<Vec<Epoch>> = None;
        let (probe, _) = self
            .unary_frontier::<timely::container::CapacityContainerBuilder<Vec<()>>, _, _, _>(
                Exchange::new(|_: &Batch| 0),
                "WriteToSink",
                move |_, _| {
                    move |(input, frontier), _output| {
                        let mut live_wrote = false;
                        input.for_each(|cap, data| {
                            let epoch = cap.least().copied().unwrap_or_default();
                            for batch in data.drain(..) {
                                if let (Some(sink), BatchKind::Records) =
                                    (live.as_mut(), batch.kind)
                                {
                                    let data = match &latency_column {
                                        Some(name) => with_latency(
                                            &batch.data,
                                            name,
                                            now_ns(),
                                            batch.ingest_ns,
                                        ),
                                        None => Ok(batch.data.clone()),
                                    };
                                    match data.and_then(|d| sink.write_batch(&d)) {
                                        Ok(()) => live_wrote = true,
                                        Err(e) => live_error(&mut live_failed, &e),
                                    }
                                }
                                // A live view sees results as they arrive, before they commit.
                                if let Some(tap) = &tap {
                                    match batch.kind {
                                        BatchKind::Records => tap.results(&batch.data),
                                        BatchKind::DeadLetters => tap.dead_letters(&batch.data),
                                        BatchKind::Retired => {}
                                    }
                                }
                                match batch.kind {
                                    BatchKind::Records => {
                                        metrics.record_ready(
                                            batch.ingest_ns,
                                            now_ns(),
                                            batch.num_rows(),
                                        );
                                        pending.entry(epoch).or_default().push(batch)
                                    }
                                    BatchKind::DeadLetters if !failed => {
                                        reasons.record(&batch.data);
                                        let started = Instant::now();
                                        let Some(sink) = dead_letters.as_mut() else {
                                            continue;
                                        };
                                        match sink.write_batch(&batch.data) {
                                            Ok(()) => {
                                                if let Ok(m) = &dead_metrics {
                                                    m.record_batch(
                                                        batch.num_rows(),
                                                        batch.num_rows(),
                                                        0,
                                                        started.elapsed(),
                                                    );
                                                }
                                            }
                                            Err(e) => {
                                                failed = true;
                                                fail(e);
                                            }
                                        }
                                    }
                                    BatchKind::DeadLetters | BatchKind::Retired => {}
                                }
                            }
                        });
                        // Once per activation, so a busy stream shares one flush among its batches.
                        if let (true, Some(sink)) = (live_wrote, live.as_mut()) {
                            if let Err(e) = sink.flush() {
                                live_error(&mut live_failed, &e);
                            }
                        }
                        if frontier.frontier().is_empty() {
                            if let Some(mut sink) = live.take() {
                                if let Err(e) = sink.finish() {
                                    live_error(&mut live_failed, &e);
                                }
                            }
                        }
                        // Every epoch the frontier has passed is complete: write it, in order.
                        let complete: Vec<Epoch> = pending
                            .keys()
                            .copied()
                            .filter(|e| !frontier.less_equal(e))
                            .collect();
                        for epoch in complete {
                            if let Some(g) = generation {
                                for sink in [&mut results, &mut events_sink].into_iter().flatten() {
                                    sink.begin_epoch(g, epoch);
                                }
                            }
                            let batches = pending.remove(&epoch).unwrap_or_default();
                            // Which rows of the output are which epoch's (tests read it).
                            tracing::debug!(
                                "epoch {epoch}: {} result row(s) written",
                                batches.iter().map(Batch::num_rows).sum::<usize>()
                            );
                            for batch in batches {
                                if failed {
                                    continue;
                                }
                                let started = Instant::now();
                                let Some(sink) = results.as_mut() else {
                                    continue;
                                };
                                let now = now_ns();
                                let data = match &latency_column {
                                    Some(name) => {
                                        with_latency(&batch.data, name, now, batch.ingest_ns)
                                    }
                                    None => Ok(batch.data.clone()),
                                };
                                if let Err(e) = data.and_then(|d| sink.write_batch(&d)) {
                                    failed = true;
                                    fail(e);
                                    continue;
                                }
                                if let Ok(m) = &sink_metrics {
                                    m.record_batch(
                                        batch.num_rows(),
                                        batch.num_rows(),
                                        0,
                                        started.elapsed(),
                                    );
                                }
                                metrics.record_end_to_end(batch.ingest_ns, now, batch.num_rows());
                                if let (Some((spec, schema)), Some(sink)) =
                                    (&events, events_sink.as_mut())
                                {
                                    let started = Instant::now();
                                    let written =
                                        spec.extract(&batch.data, schema).and_then(|rows| {
                                            if rows.num_rows() > 0 {
                                                sink.write_batch(&rows)?;
                                            }
                                            Ok(rows.num_rows())
                                        });
                                    match written {
                                        Ok(n) => {
                                            if let Some(m) = &events_metrics {
                                                m.record_batch(
                                                    batch.num_rows(),
                                                    n,
                                                    0,
                                                    started.elapsed(),
                                                );
                                            }
                                        }
                                        Err(e) => {
                                            failed = true;
                                            fail(e);
                                        }
                                    }
                                }
                            }
                        }
                        // Make each completed epoch visible, and note where it ends.
                        let current: Vec<Epoch> = frontier.frontier().iter().copied().collect();
                        if flushed_frontier.as_ref() != Some(&current) && !failed {
                            // An empty frontier is the end of the input: make it durable.
                            let end = current.is_empty();
                            for sink in [&mut results, &mut dead_letters, &mut events_sink]
                                .into_iter()
                                .flatten()
                            {
                                let done = if end { sink.finish() } else { sink.flush() };
                                if let Err(e) = done {
                                    failed = true;
                                    fail(e);
                                }
                            }
                            if let (Some(positions), Some(at)) =
                                (&positions, results.as_ref().and_then(|s| s.position()))
                            {
                                let last_complete = match current.first() {
                                    Some(f) => f.checked_sub(1),
                                    None => Some(Epoch::MAX),
                                };
                                if let (Some(epoch), false) = (last_complete, failed) {
                                    positions.borrow_mut().insert(epoch, at);
                                }
                            }
                            flushed_frontier = Some(current);
                        }
                    }
                },
            )
            .probe();
        probe
    }
}

/// A live sink's failure is logged once: it never stops the committed outputs.
fn live_error(logged: &mut bool, e: &DataflowError) {
    if !*logged {
        tracing::warn!(
            "live sink: {e} (results still go to the sink; later live errors are not logged)"
        );
        *logged = true;
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
