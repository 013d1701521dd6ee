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
use crate::observe::registry::{Milestones, StageMetrics};
use crate::observe::RunContext;
use crate::sink::Sink;
use crate::{Batch, BatchKind, Epoch};
use arrow_array::RecordBatch;
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
        let mut writer = SinkWriter::new(options, context);
        let (probe, _) = self
            .unary_frontier::<timely::container::CapacityContainerBuilder<Vec<()>>, _, _, _>(
                Exchange::new(|_: &Batch| 0),
                "WriteToSink",
                move |_, _| {
                    move |(input, frontier), _output| {
                        input.for_each(|cap, data| {
                            let epoch = cap.least().copied().unwrap_or_default();
                            for batch in data.drain(..) {
                                writer.take(epoch, batch);
                            }
                        });
                        writer.end_activation(frontier.frontier().is_empty());
                        writer.write_complete(|e| !frontier.less_equal(e));
                        writer.commit(frontier.frontier().iter().copied().collect());
                    }
                },
            )
            .probe();
        probe
    }
}

/// The sink operator's state and its steps, in the order an activation runs them: take each
/// arriving batch ([`SinkWriter::take`]), flush the live tap, write the epochs now complete
/// ([`SinkWriter::write_complete`]), then make them visible and note where they end
/// ([`SinkWriter::commit`]).
struct SinkWriter {
    results: Option<Box<dyn Sink>>,
    dead_letters: Option<Box<dyn Sink>>,
    live: Option<Box<dyn Sink>>,
    events: Option<(EventsSpec, SchemaRef)>,
    events_sink: Option<Box<dyn Sink>>,
    latency_column: Option<String>,
    positions: Option<Rc<RefCell<BTreeMap<Epoch, u64>>>>,
    generation: Option<u64>,
    errors: Arc<Mutex<Vec<DataflowError>>>,
    context: RunContext,
    sink_metrics: Option<Arc<StageMetrics>>,
    dead_metrics: Option<Arc<StageMetrics>>,
    events_metrics: Option<Arc<StageMetrics>>,
    /// Results by epoch, each with when it reached the sink (ns), until the epoch completes.
    pending: BTreeMap<Epoch, Vec<(Batch, u64)>>,
    flushed_frontier: Option<Vec<Epoch>>,
    /// A write failed: later batches are dropped so the run can end and report it.
    failed: bool,
    live_failed: bool,
    live_wrote: bool,
}

impl SinkWriter {
    fn new(options: SinkOptions, context: RunContext) -> Self {
        let SinkOptions {
            results,
            dead_letters,
            latency_column,
            positions,
            generation,
            errors,
            live,
            events,
        } = options;
        let (events, events_sink) = match events {
            Some((spec, schema, sink)) => (Some((spec, schema)), Some(sink)),
            None => (None, None),
        };
        let metrics = &context.metrics;
        SinkWriter {
            events_metrics: events.as_ref().and_then(|_| metrics.stage("events").ok()),
            sink_metrics: metrics.stage("sink").ok(),
            dead_metrics: metrics.stage("dead-letters").ok(),
            results,
            dead_letters,
            live,
            events,
            events_sink,
            latency_column,
            positions,
            generation,
            errors,
            context,
            pending: BTreeMap::new(),
            flushed_frontier: None,
            failed: false,
            live_failed: false,
            live_wrote: false,
        }
    }

    fn fail(&mut self, e: DataflowError) {
        tracing::error!("sink: {e}");
        self.failed = true;
        if let Ok(mut errors) = self.errors.lock() {
            errors.push(e);
        }
    }

    /// The rows of `data` with the latency column, if the pipeline asks for one.
    fn stamped(&self, batch: &Batch, now_ns: u64) -> Result<RecordBatch, DataflowError> {
        match &self.latency_column {
            Some(name) => with_latency(&batch.data, name, now_ns, batch.ingest_ns),
            None => Ok(batch.data.clone()),
        }
    }

    /// One arriving batch: results go to the live sink and tap at once and wait for their
    /// epoch; dead letters are written as they come.
    fn take(&mut self, epoch: Epoch, batch: Batch) {
        let now = now_ns();
        if batch.kind == BatchKind::Records {
            self.write_live(&batch, now);
        }
        if let Some(tap) = &self.context.live {
            match batch.kind {
                BatchKind::Records => tap.results(&batch.data),
                BatchKind::DeadLetters => tap.dead_letters(&batch.data),
                BatchKind::Retired => {}
            }
        }
        match batch.kind {
            BatchKind::Records => {
                let metrics = &self.context.metrics;
                metrics.record_ready(batch.ingest_ns, now, batch.num_rows());
                self.pending.entry(epoch).or_default().push((batch, now));
            }
            BatchKind::DeadLetters if !self.failed => self.write_dead_letters(&batch),
            BatchKind::DeadLetters | BatchKind::Retired => {}
        }
    }

    /// Results as they arrive, before they commit: a live sink's errors never fail the run.
    fn write_live(&mut self, batch: &Batch, now_ns: u64) {
        if self.live.is_none() {
            return;
        }
        let written = self
            .stamped(batch, now_ns)
            .and_then(|d| self.live.as_mut().map_or(Ok(()), |s| s.write_batch(&d)));
        match written {
            Ok(()) => self.live_wrote = true,
            Err(e) => live_error(&mut self.live_failed, &e),
        }
    }

    fn write_dead_letters(&mut self, batch: &Batch) {
        self.context.dead_letters.record(&batch.data);
        let started = Instant::now();
        let Some(sink) = self.dead_letters.as_mut() else {
            return;
        };
        match sink.write_batch(&batch.data) {
            Ok(()) => {
                if let Some(m) = &self.dead_metrics {
                    let rows = batch.num_rows();
                    m.record_batch(rows, rows, 0, started.elapsed());
                }
            }
            Err(e) => self.fail(e),
        }
    }

    /// Once per activation, so a busy stream shares one flush of the live sink among its
    /// batches; at the end of the input the live sink is finished.
    fn end_activation(&mut self, input_ended: bool) {
        if std::mem::take(&mut self.live_wrote) {
            if let Some(Err(e)) = self.live.as_mut().map(|s| s.flush()) {
                live_error(&mut self.live_failed, &e);
            }
        }
        if input_ended {
            if let Some(Err(e)) = self.live.take().map(|mut s| s.finish()) {
                live_error(&mut self.live_failed, &e);
            }
        }
    }

    /// Writes every pending epoch the frontier has passed (`complete`), in epoch order.
    fn write_complete(&mut self, complete: impl Fn(&Epoch) -> bool) {
        let done: Vec<Epoch> = self
            .pending
            .keys()
            .copied()
            .filter(|e| complete(e))
            .collect();
        for epoch in done {
            let batches = self.pending.remove(&epoch).unwrap_or_default();
            self.write_epoch(epoch, batches);
        }
    }

    fn write_epoch(&mut self, epoch: Epoch, batches: Vec<(Batch, u64)>) {
        if let Some(g) = self.generation {
            for sink in [&mut self.results, &mut self.events_sink]
                .into_iter()
                .flatten()
            {
                sink.begin_epoch(g, epoch);
            }
        }
        // Which rows of the output are which epoch's (tests read it).
        tracing::debug!(
            "epoch {epoch}: {} result row(s) written",
            batches.iter().map(|(b, _)| b.num_rows()).sum::<usize>()
        );
        for (batch, ready_ns) in batches {
            if self.failed || self.results.is_none() {
                continue;
            }
            if self.write_result(&batch, ready_ns) {
                self.write_events(&batch);
            }
        }
    }

    /// One result batch to the results sink, with its metrics; false if it failed.
    fn write_result(&mut self, batch: &Batch, ready_ns: u64) -> bool {
        let started = Instant::now();
        let now = now_ns();
        let written = self
            .stamped(batch, now)
            .and_then(|d| self.results.as_mut().map_or(Ok(()), |s| s.write_batch(&d)));
        if let Err(e) = written {
            self.fail(e);
            return false;
        }
        let write = started.elapsed();
        let rows = batch.num_rows();
        if let Some(m) = &self.sink_metrics {
            m.record_batch(rows, rows, 0, write);
        }
        let metrics = &self.context.metrics;
        metrics.record_end_to_end(batch.ingest_ns, now, rows);
        let at = Milestones {
            ingest_ns: batch.ingest_ns,
            ready_ns,
            written_ns: now,
            write,
        };
        metrics.record_breakdown(&batch.trace, at, rows);
        true
    }

    /// The events a result batch carries, to their own sink.
    fn write_events(&mut self, batch: &Batch) {
        let (Some((spec, schema)), Some(sink)) = (&self.events, self.events_sink.as_mut()) else {
            return;
        };
        let started = Instant::now();
        let written = spec.extract(&batch.data, schema).and_then(|rows| {
            if rows.num_rows() > 0 {
                sink.write_batch(&rows)?;
            }
            Ok(rows.num_rows())
        });
        match written {
            Ok(n) => {
                if let Some(m) = &self.events_metrics {
                    m.record_batch(batch.num_rows(), n, 0, started.elapsed());
                }
            }
            Err(e) => self.fail(e),
        }
    }

    /// Makes each completed epoch visible (an empty frontier, the end of the input, durable)
    /// and notes where the results sink stands after it, for checkpoints.
    fn commit(&mut self, current: Vec<Epoch>) {
        if self.flushed_frontier.as_ref() == Some(&current) || self.failed {
            return;
        }
        let end = current.is_empty();
        // Every sink is flushed (or finished), and every failure reported, as before.
        let mut failures = Vec::new();
        for sink in [
            &mut self.results,
            &mut self.dead_letters,
            &mut self.events_sink,
        ]
        .into_iter()
        .flatten()
        {
            let done = if end { sink.finish() } else { sink.flush() };
            failures.extend(done.err());
        }
        for e in failures {
            self.fail(e);
        }
        if let (Some(positions), Some(at)) = (
            &self.positions,
            self.results.as_ref().and_then(|s| s.position()),
        ) {
            let last_complete = match current.first() {
                Some(f) => f.checked_sub(1),
                None => Some(Epoch::MAX),
            };
            if let (Some(epoch), false) = (last_complete, self.failed) {
                positions.borrow_mut().insert(epoch, at);
            }
        }
        self.flushed_frontier = Some(current);
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
