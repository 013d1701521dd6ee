//! The Prometheus registry of one process, with per-stage counters and latency histograms
//! shared by all its workers.
//!
//! Two views of the same measurements: Prometheus metrics (scraped while running, behind
//! `--metrics-addr`) and an end-of-run [`Summary`] with exact-enough quantiles from HDR
//! histograms (Prometheus buckets are too coarse for a p99 report). Sources and sinks add their
//! own metrics with [`Metrics::register`]; the summary lists those too.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hdrhistogram::Histogram;
use prometheus::core::Collector;
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry, TextEncoder,
};

use super::lock;
use super::summary::{Breakdown, StageSummary, Summary};
use crate::batch::Trace;
use crate::error::{DataflowError, DataflowResult};

const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];
const BATCH_SIZE_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 1024.0];
/// What the registry puts before every name it exposes.
const PREFIX: &str = "riffle";

/// All metrics of one process.
pub struct Metrics {
    /// Itself, for stages' metrics to create their siblings ([`StageMetrics::sibling`]).
    me: std::sync::Weak<Metrics>,
    registry: Registry,
    records_in: IntCounterVec,
    records_out: IntCounterVec,
    batches: IntCounterVec,
    dead_letters: IntCounterVec,
    late: IntCounterVec,
    latency: HistogramVec,
    batch_size: HistogramVec,
    end_to_end: prometheus::Histogram,
    ready: prometheus::Histogram,
    ready_hdr: Mutex<Histogram<u64>>,
    /// The earliest ingest and the latest arrival of the results written (ns).
    results_span: Mutex<Option<(u64, u64)>>,
    stages: Mutex<BTreeMap<String, Arc<StageMetrics>>>,
    end_to_end_hdr: Mutex<Histogram<u64>>,
    /// Where written results' time went, summed over rows (the summary's breakdown).
    breakdown: Mutex<BreakdownSums>,
    /// Names (without the prefix) of the families added with [`Metrics::register`].
    registered: Mutex<BTreeSet<String>>,
}

/// The metrics of one stage (all workers of the process share it).
pub struct StageMetrics {
    pub name: String,
    parent: std::sync::Weak<Metrics>,
    order: usize,
    records_in: prometheus::IntCounter,
    records_out: prometheus::IntCounter,
    batches: prometheus::IntCounter,
    dead_letters: prometheus::IntCounter,
    late: prometheus::IntCounter,
    latency: prometheus::Histogram,
    batch_size: prometheus::Histogram,
    hdr: Mutex<StageHistograms>,
}

struct StageHistograms {
    latency_us: Histogram<u64>,
    batch_rows: Histogram<u64>,
}

/// 3 significant digits over 1 µs .. 1 h.
fn hdr() -> DataflowResult<Histogram<u64>> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3)
        .map_err(|e| DataflowError::Config(format!("metrics histogram: {e}")))
}

impl Metrics {
    pub fn new() -> DataflowResult<Arc<Metrics>> {
        let registry = Registry::new_custom(Some(PREFIX.into()), None).map_err(prom_err)?;
        let counter = |name: &str, help: &str| -> DataflowResult<IntCounterVec> {
            let c = IntCounterVec::new(Opts::new(name, help), &["stage"]).map_err(prom_err)?;
            registry.register(Box::new(c.clone())).map_err(prom_err)?;
            Ok(c)
        };
        let records_in = counter("stage_records_in_total", "Records received by a stage")?;
        let records_out = counter("stage_records_out_total", "Records emitted by a stage")?;
        let batches = counter("stage_batches_total", "Batches processed by a stage")?;
        let dead_letters = counter(
            "stage_dead_letters_total",
            "Records a stage sent to the dead-letter sink",
        )?;
        let late = counter(
            "stage_late_records_total",
            "Records older than the stage's real-time budget when it reached them",
        )?;
        let histogram_vec = |name: &str, help: &str, buckets: &[f64]| {
            let h = HistogramVec::new(
                HistogramOpts::new(name, help).buckets(buckets.to_vec()),
                &["stage"],
            )
            .map_err(prom_err)?;
            registry.register(Box::new(h.clone())).map_err(prom_err)?;
            Ok::<_, DataflowError>(h)
        };
        let latency = histogram_vec(
            "stage_batch_seconds",
            "Time a stage spent on one batch",
            LATENCY_BUCKETS,
        )?;
        let batch_size = histogram_vec(
            "stage_batch_rows",
            "Rows per batch a stage processed",
            BATCH_SIZE_BUCKETS,
        )?;
        let histogram = |name: &str, help: &str| {
            let h = prometheus::Histogram::with_opts(
                HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec()),
            )
            .map_err(prom_err)?;
            registry.register(Box::new(h.clone())).map_err(prom_err)?;
            Ok::<_, DataflowError>(h)
        };
        let end_to_end = histogram(
            "end_to_end_seconds",
            "Time from a record's ingestion by the source to its arrival at the sink",
        )?;
        let ready = histogram(
            "result_ready_seconds",
            "Time from a record's ingestion by the source to its result existing at the \
             sink operator (live view, metrics), before its epoch completes and commits",
        )?;
        let build_info = prometheus::IntGaugeVec::new(
            Opts::new("build_info", "Riffle's version (the value is always 1)"),
            &["version"],
        )
        .map_err(prom_err)?;
        build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION")])
            .set(1);
        registry.register(Box::new(build_info)).map_err(prom_err)?;
        // CPU, memory, open files and start time of this process (`process_*`, unprefixed as
        // Prometheus' conventions have them).
        #[cfg(target_os = "linux")]
        prometheus::default_registry()
            .register(Box::new(
                prometheus::process_collector::ProcessCollector::for_self(),
            ))
            .or_else(|e| match e {
                prometheus::Error::AlreadyReg => Ok(()),
                e => Err(e),
            })
            .map_err(prom_err)?;
        let end_to_end_hdr = Mutex::new(hdr()?);
        let ready_hdr = Mutex::new(hdr()?);
        Ok(Arc::new_cyclic(|me| Metrics {
            me: me.clone(),
            registry,
            records_in,
            records_out,
            batches,
            dead_letters,
            late,
            latency,
            batch_size,
            end_to_end,
            stages: Mutex::new(BTreeMap::new()),
            end_to_end_hdr,
            breakdown: Mutex::new(BreakdownSums::default()),
            ready,
            ready_hdr,
            results_span: Mutex::new(None),
            registered: Mutex::new(BTreeSet::new()),
        }))
    }

    /// The metrics of stage `name`, created on first use. Stages are reported in creation order.
    pub fn stage(&self, name: &str) -> DataflowResult<Arc<StageMetrics>> {
        let mut stages = lock(&self.stages);
        if let Some(existing) = stages.get(name) {
            return Ok(existing.clone());
        }
        let l = [name];
        let created = Arc::new(StageMetrics {
            name: name.to_string(),
            parent: self.me.clone(),
            order: stages.len(),
            records_in: self.records_in.with_label_values(&l),
            records_out: self.records_out.with_label_values(&l),
            batches: self.batches.with_label_values(&l),
            dead_letters: self.dead_letters.with_label_values(&l),
            late: self.late.with_label_values(&l),
            latency: self.latency.with_label_values(&l),
            batch_size: self.batch_size.with_label_values(&l),
            hdr: Mutex::new(StageHistograms {
                latency_us: hdr()?,
                batch_rows: hdr()?,
            }),
        });
        stages.insert(name.to_string(), created.clone());
        Ok(created)
    }

    /// Every stage's metrics, in creation order.
    pub fn stages(&self) -> Vec<Arc<StageMetrics>> {
        let stages = lock(&self.stages);
        let mut list: Vec<_> = stages.values().cloned().collect();
        list.sort_by_key(|s| s.order);
        list
    }

    /// Records `rows` results that exist (reached the sink operator, before their epoch
    /// completes), ingested at `ingest_ns`.
    pub fn record_ready(&self, ingest_ns: u64, now_ns: u64, rows: usize) {
        let latency = Duration::from_nanos(now_ns.saturating_sub(ingest_ns));
        for _ in 0..rows {
            self.ready.observe(latency.as_secs_f64());
        }
        let _ = lock(&self.ready_hdr).record_n(latency.as_micros().max(1) as u64, rows as u64);
    }

    /// Records `rows` results that reached the sink, ingested at `ingest_ns`.
    pub fn record_end_to_end(&self, ingest_ns: u64, now_ns: u64, rows: usize) {
        let latency = Duration::from_nanos(now_ns.saturating_sub(ingest_ns));
        for _ in 0..rows {
            self.end_to_end.observe(latency.as_secs_f64());
        }
        let _ = lock(&self.end_to_end_hdr).record_n(latency.as_micros().max(1) as u64, rows as u64);
        if rows > 0 {
            let mut span = lock(&self.results_span);
            let (first, last) = span.get_or_insert((ingest_ns, now_ns));
            *first = (*first).min(ingest_ns);
            *last = (*last).max(now_ns);
        }
    }

    /// Records where the time of `rows` written results went: `trace` as carried from the
    /// source, `ready_ns` when they reached the sink operator, `written_ns` when their epoch
    /// was complete and the sink took them, `write` the sink's own call.
    pub fn record_breakdown(&self, trace: &Trace, at: Milestones, rows: usize) {
        let rows = rows as u128;
        let mut b = lock(&self.breakdown);
        let in_dataflow = at.ready_ns.saturating_sub(at.ingest_ns);
        let traced = trace.batching_ns.saturating_add(trace.stages_ns);
        b.rows += rows;
        b.queued += u128::from(trace.queued_ns) * rows;
        b.batching += u128::from(trace.batching_ns) * rows;
        b.stages += u128::from(trace.stages_ns) * rows;
        b.dataflow += u128::from(in_dataflow.saturating_sub(traced)) * rows;
        b.epoch += u128::from(at.written_ns.saturating_sub(at.ready_ns)) * rows;
        b.sink += at.write.as_nanos() * rows;
    }

    /// Adds a source's or sink's own metrics (a collector whose names carry no prefix: the
    /// registry adds `riffle_`) to this process's endpoint; their counters and gauges are also
    /// listed in the end-of-run summary ([`Metrics::registered_values`]). Registering the same
    /// collector again (a source and a sink of one kind, or two sources) is not an error.
    pub fn register(&self, collector: Box<dyn Collector>) -> DataflowResult<()> {
        let names: Vec<String> = collector.desc().iter().map(|d| d.fq_name.clone()).collect();
        match self.registry.register(collector) {
            Ok(()) | Err(prometheus::Error::AlreadyReg) => {}
            Err(e) => return Err(prom_err(e)),
        }
        lock(&self.registered).extend(names);
        Ok(())
    }

    /// Prometheus text exposition of every metric.
    pub fn render_prometheus(&self) -> DataflowResult<String> {
        let mut buf = Vec::new();
        let mut families = self.registry.gather();
        families.extend(prometheus::default_registry().gather());
        TextEncoder::new()
            .encode(&families, &mut buf)
            .map_err(prom_err)?;
        String::from_utf8(buf).map_err(|e| DataflowError::Config(e.to_string()))
    }

    /// Values of the counters and gauges added with [`Metrics::register`] (sources' and
    /// sinks' own), one per name and labels, in name order.
    pub fn registered_values(&self) -> Vec<(String, f64)> {
        let registered = lock(&self.registered).clone();
        let mut out = Vec::new();
        for family in self.registry.gather() {
            let unprefixed = family
                .name()
                .strip_prefix(PREFIX)
                .and_then(|n| n.strip_prefix('_'))
                .unwrap_or(family.name());
            if !registered.contains(unprefixed) {
                continue;
            }
            for metric in family.get_metric() {
                let labels: Vec<String> = metric
                    .get_label()
                    .iter()
                    .map(|l| format!("{}={}", l.name(), l.value()))
                    .collect();
                let value = match family.get_field_type() {
                    prometheus::proto::MetricType::COUNTER => metric.get_counter().get_value(),
                    prometheus::proto::MetricType::GAUGE => metric.get_gauge().get_value(),
                    _ => continue,
                };
                out.push((format!("{}{{{}}}", family.name(), labels.join(",")), value));
            }
        }
        out
    }

    /// A snapshot for the end-of-run report. Dead-letter reasons are counted beside the
    /// registry: [`super::RunContext::summary`] adds them.
    pub fn summary(&self, elapsed: Duration) -> Summary {
        let list = self.stages();
        let e2e = lock(&self.end_to_end_hdr);
        let ready = lock(&self.ready_hdr);
        Summary {
            dead_letter_reasons: Vec::new(),
            connectors: self.registered_values(),
            elapsed,
            stages: list.iter().map(|s| s.summary()).collect(),
            end_to_end_p50: Duration::from_micros(e2e.value_at_quantile(0.5)),
            end_to_end_p99: Duration::from_micros(e2e.value_at_quantile(0.99)),
            ready_p50: Duration::from_micros(ready.value_at_quantile(0.5)),
            ready_p99: Duration::from_micros(ready.value_at_quantile(0.99)),
            results: e2e.len(),
            busy: lock(&self.results_span).map_or(Duration::ZERO, |(first, last)| {
                Duration::from_nanos(last.saturating_sub(first))
            }),
            exchange_bytes_in: crate::batch::exchange_bytes_received(),
            breakdown: lock(&self.breakdown).means(),
        }
    }
}

/// The moments a written result passed, for [`Metrics::record_breakdown`].
#[derive(Clone, Copy, Debug)]
pub struct Milestones {
    /// The source read it (ns since the Unix epoch).
    pub ingest_ns: u64,
    /// It reached the sink operator.
    pub ready_ns: u64,
    /// Its epoch was complete and the sink took it.
    pub written_ns: u64,
    /// The sink's write call.
    pub write: Duration,
}

#[derive(Debug, Default)]
struct BreakdownSums {
    rows: u128,
    queued: u128,
    batching: u128,
    stages: u128,
    dataflow: u128,
    epoch: u128,
    sink: u128,
}

impl BreakdownSums {
    fn means(&self) -> Option<Breakdown> {
        if self.rows == 0 {
            return None;
        }
        let mean = |sum: u128| Duration::from_nanos((sum / self.rows) as u64);
        Some(Breakdown {
            queued: mean(self.queued),
            batching: mean(self.batching),
            stages: mean(self.stages),
            dataflow: mean(self.dataflow),
            epoch: mean(self.epoch),
            sink: mean(self.sink),
        })
    }
}

impl StageMetrics {
    /// The metrics of another stage of the same process, e.g. one per model variant
    /// (`model[candidate]`): reported like every stage's.
    pub fn sibling(&self, name: &str) -> DataflowResult<Arc<StageMetrics>> {
        self.parent
            .upgrade()
            .ok_or_else(|| DataflowError::Config(format!("metrics for {name}: none in use")))?
            .stage(name)
    }

    /// Records one processed batch.
    pub fn record_batch(&self, rows_in: usize, rows_out: usize, dead: usize, took: Duration) {
        self.records_in.inc_by(rows_in as u64);
        self.records_out.inc_by(rows_out as u64);
        self.dead_letters.inc_by(dead as u64);
        self.batches.inc();
        self.latency.observe(took.as_secs_f64());
        self.batch_size.observe(rows_in as f64);
        let mut hdr = lock(&self.hdr);
        let _ = hdr.latency_us.record(took.as_micros().max(1) as u64);
        let _ = hdr.batch_rows.record(rows_in.max(1) as u64);
    }

    /// Records that reached the stage after their real-time budget.
    pub fn record_late(&self, rows: usize) {
        self.late.inc_by(rows as u64);
    }

    /// Records read by a source (or any stage counted without a latency).
    pub fn records_in(&self) -> u64 {
        self.records_in.get()
    }

    pub fn records_out(&self) -> u64 {
        self.records_out.get()
    }

    /// Records sent to dead letters by this stage.
    pub fn dead_letters(&self) -> u64 {
        self.dead_letters.get()
    }

    /// Records that reached the stage after their real-time budget.
    pub fn late(&self) -> u64 {
        self.late.get()
    }

    /// Batches processed.
    pub fn batches(&self) -> u64 {
        self.batches.get()
    }

    /// A copy of the per-batch latency histogram (µs) since the start; the difference of two
    /// copies (`Histogram::subtract`) gives the quantiles of the time between them.
    pub fn latency_histogram(&self) -> Histogram<u64> {
        lock(&self.hdr).latency_us.clone()
    }

    fn summary(&self) -> StageSummary {
        let hdr = lock(&self.hdr);
        let batches = self.batches.get();
        StageSummary {
            name: self.name.clone(),
            records_in: self.records_in.get(),
            records_out: self.records_out.get(),
            dead_letters: self.dead_letters.get(),
            late: self.late.get(),
            batches,
            mean_batch_rows: if batches == 0 {
                0.0
            } else {
                self.records_in.get() as f64 / batches as f64
            },
            p50: Duration::from_micros(hdr.latency_us.value_at_quantile(0.5)),
            p99: Duration::from_micros(hdr.latency_us.value_at_quantile(0.99)),
            max_batch_rows: hdr.batch_rows.max(),
        }
    }
}

fn prom_err(e: impl std::fmt::Display) -> DataflowError {
    DataflowError::Config(format!("metrics: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_metrics_feed_summary_and_prometheus() {
        let metrics = Metrics::new().unwrap();
        let s = metrics.stage("model").unwrap();
        s.record_batch(8, 8, 0, Duration::from_millis(4));
        s.record_batch(4, 3, 1, Duration::from_millis(2));
        let summary = metrics.summary(Duration::from_secs(1));
        assert_eq!(summary.stages[0].records_in, 12);
        assert_eq!(summary.stages[0].dead_letters, 1);
        assert_eq!(summary.stages[0].mean_batch_rows, 6.0);
        assert!(summary.stages[0].p99 >= Duration::from_millis(3));
        let text = metrics.render_prometheus().unwrap();
        assert!(
            text.contains("riffle_stage_records_in_total{stage=\"model\"} 12"),
            "{text}"
        );
    }

    #[test]
    fn registered_collectors_are_served_and_listed_once() {
        let metrics = Metrics::new().unwrap();
        let sent =
            IntCounterVec::new(Opts::new("thing_sent_total", "Things sent"), &["to"]).unwrap();
        let depth = prometheus::IntGauge::new("thing_depth", "Things waiting").unwrap();
        metrics.register(Box::new(sent.clone())).unwrap();
        metrics.register(Box::new(sent.clone())).unwrap();
        metrics.register(Box::new(depth.clone())).unwrap();
        sent.with_label_values(&["b"]).inc_by(3);
        depth.set(2);
        assert_eq!(
            metrics.registered_values(),
            vec![
                ("riffle_thing_depth{}".to_string(), 2.0),
                ("riffle_thing_sent_total{to=b}".to_string(), 3.0),
            ]
        );
        assert!(metrics.summary(Duration::ZERO).connectors.len() == 2);
        let text = metrics.render_prometheus().unwrap();
        assert!(
            text.contains("riffle_thing_sent_total{to=\"b\"} 3"),
            "{text}"
        );
        // The registry's own families are not listed as a source's or sink's.
        metrics
            .stage("model")
            .unwrap()
            .record_batch(1, 1, 0, Duration::ZERO);
        assert_eq!(metrics.registered_values().len(), 2);
    }
}
