//! Counters and latency histograms per stage, shared by all workers of a process.
//!
//! Two views of the same measurements: Prometheus metrics (scraped while running, behind
//! `--metrics-addr`) and an end-of-run [`Summary`] with exact-enough quantiles from HDR
//! histograms (Prometheus buckets are too coarse for a p99 report).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use hdrhistogram::Histogram;
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry, TextEncoder,
};

use crate::error::{DataflowError, DataflowResult};
use crate::live::LiveTap;

const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];
/// Metric families of connectors that the end-of-run summary lists.
const CONNECTOR_PREFIXES: &[&str] = &["riffle_kafka_", "riffle_video_"];
const BATCH_SIZE_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 1024.0];

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
    live: OnceLock<Arc<LiveTap>>,
    ready_workers: AtomicUsize,
    dead_letter_reasons: Mutex<BTreeMap<String, u64>>,
}

/// Distinct dead-letter reasons counted; later ones are counted together.
const MAX_REASONS: usize = 64;
/// Longest reason kept for counting (reasons quoting a record differ past this).
const REASON_CHARS: usize = 160;
const OTHER_REASONS: &str = "(other reasons)";

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
        let registry = Registry::new_custom(Some("riffle".into()), None).map_err(prom_err)?;
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
        let latency = HistogramVec::new(
            HistogramOpts::new("stage_batch_seconds", "Time a stage spent on one batch")
                .buckets(LATENCY_BUCKETS.to_vec()),
            &["stage"],
        )
        .map_err(prom_err)?;
        registry
            .register(Box::new(latency.clone()))
            .map_err(prom_err)?;
        let batch_size = HistogramVec::new(
            HistogramOpts::new("stage_batch_rows", "Rows per batch a stage processed")
                .buckets(BATCH_SIZE_BUCKETS.to_vec()),
            &["stage"],
        )
        .map_err(prom_err)?;
        registry
            .register(Box::new(batch_size.clone()))
            .map_err(prom_err)?;
        let end_to_end = prometheus::Histogram::with_opts(
            HistogramOpts::new(
                "end_to_end_seconds",
                "Time from a record's ingestion by the source to its arrival at the sink",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
        )
        .map_err(prom_err)?;
        registry
            .register(Box::new(end_to_end.clone()))
            .map_err(prom_err)?;
        let ready = prometheus::Histogram::with_opts(
            HistogramOpts::new(
                "result_ready_seconds",
                "Time from a record's ingestion by the source to its result existing at the \
                 sink operator (live view, metrics), before its epoch completes and commits",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
        )
        .map_err(prom_err)?;
        registry
            .register(Box::new(ready.clone()))
            .map_err(prom_err)?;
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
            ready,
            ready_hdr,
            results_span: Mutex::new(None),
            live: OnceLock::new(),
            ready_workers: AtomicUsize::new(0),
            dead_letter_reasons: Mutex::new(BTreeMap::new()),
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

    /// Has the run feed `tap` (a live view is watching); the first tap attached stays.
    pub fn attach_live(&self, tap: Arc<LiveTap>) {
        let _ = self.live.set(tap);
    }

    /// The live tap, when a viewer attached one.
    pub fn live(&self) -> Option<&Arc<LiveTap>> {
        self.live.get()
    }

    /// A worker of this process has built its dataflow (models loaded) and has its share of the
    /// source.
    pub fn worker_ready(&self) {
        self.ready_workers.fetch_add(1, Ordering::SeqCst);
    }

    /// Workers of this process that are ready (see [`Metrics::worker_ready`]).
    pub fn ready_workers(&self) -> usize {
        self.ready_workers.load(Ordering::SeqCst)
    }

    /// Counts the reasons of a batch of dead letters (in [`crate::dead_letter::schema`]), by
    /// stage and reason, for the end-of-run report.
    pub fn record_dead_letters(&self, batch: &arrow_array::RecordBatch) {
        use arrow_array::cast::AsArray;
        let column = |name| {
            batch
                .column_by_name(name)
                .and_then(|c| c.as_string_opt::<i32>())
        };
        let (Some(stages), Some(reasons)) = (column("stage"), column("reason")) else {
            return;
        };
        let mut counts = lock(&self.dead_letter_reasons);
        for (stage, reason) in stages.iter().zip(reasons.iter()) {
            let reason: String = reason.unwrap_or("").chars().take(REASON_CHARS).collect();
            let key = format!("{}: {reason}", stage.unwrap_or("?"));
            let key = if counts.contains_key(&key) || counts.len() < MAX_REASONS {
                key
            } else {
                OTHER_REASONS.to_string()
            };
            *counts.entry(key).or_insert(0) += 1;
        }
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

    /// Registers an extra collector (connectors add their own metrics) on the same endpoint.
    pub fn register(&self, collector: Box<dyn prometheus::core::Collector>) -> DataflowResult<()> {
        self.registry.register(collector).map_err(prom_err)
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

    /// Values of metrics that connectors registered (`riffle_kafka_*`, `riffle_video_*`), one
    /// line each.
    pub fn connector_values(&self) -> Vec<(String, f64)> {
        let mut out = Vec::new();
        for family in self.registry.gather() {
            if !CONNECTOR_PREFIXES
                .iter()
                .any(|p| family.name().starts_with(p))
            {
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

    /// A snapshot for the end-of-run report.
    pub fn summary(&self, elapsed: Duration) -> Summary {
        let stages = lock(&self.stages);
        let mut list: Vec<_> = stages.values().cloned().collect();
        list.sort_by_key(|s| s.order);
        let e2e = lock(&self.end_to_end_hdr);
        let ready = lock(&self.ready_hdr);
        let mut reasons: Vec<(String, u64)> = lock(&self.dead_letter_reasons)
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        reasons.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        Summary {
            dead_letter_reasons: reasons,
            connectors: self.connector_values(),
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
        }
    }
}

impl StageMetrics {
    /// Records one processed batch.
    /// The metrics of another stage of the same process, e.g. one per model variant
    /// (`model[candidate]`): reported like every stage's.
    pub fn sibling(&self, name: &str) -> DataflowResult<Arc<StageMetrics>> {
        self.parent
            .upgrade()
            .ok_or_else(|| DataflowError::Config(format!("metrics for {name}: none in use")))?
            .stage(name)
    }

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

/// End-of-run figures for one stage.
#[derive(Clone, Debug)]
pub struct StageSummary {
    pub name: String,
    pub records_in: u64,
    pub records_out: u64,
    pub dead_letters: u64,
    /// Records that arrived after the stage's real-time budget (dropped when so configured).
    pub late: u64,
    pub batches: u64,
    pub mean_batch_rows: f64,
    pub max_batch_rows: u64,
    /// Per-batch processing time quantiles.
    pub p50: Duration,
    pub p99: Duration,
}

/// End-of-run figures for the whole pipeline (this process).
#[derive(Clone, Debug)]
pub struct Summary {
    pub elapsed: Duration,
    pub stages: Vec<StageSummary>,
    pub end_to_end_p50: Duration,
    pub end_to_end_p99: Duration,
    /// Source read → result existing at the sink operator, before its epoch commits: what the
    /// live view and metrics see.
    pub ready_p50: Duration,
    pub ready_p99: Duration,
    /// Rows that reached the sink.
    pub results: u64,
    /// From the first result's source read to the last result written: the run without its
    /// start-up (model loading) and shut-down, for throughput.
    pub busy: Duration,
    /// Connector metrics (Kafka lag, bytes, produce errors; video drops, reconnects) by name
    /// and labels.
    pub connectors: Vec<(String, f64)>,
    /// Bytes of batches this process received from other processes.
    pub exchange_bytes_in: u64,
    /// Dead letters written by this process, by `stage: reason`, commonest first.
    pub dead_letter_reasons: Vec<(String, u64)>,
}

impl Summary {
    /// Records this process's sources read (good and rejected), and how many of them went to
    /// dead letters (at the source or in a stage).
    pub fn dead_letter_share(&self) -> (u64, u64) {
        let read = self
            .stages
            .iter()
            .find(|s| s.name == "source")
            .map_or(0, |s| s.records_out + s.dead_letters);
        let dead = self
            .stages
            .iter()
            .filter(|s| s.name != "sink" && s.name != "dead-letters")
            .map(|s| s.dead_letters)
            .sum();
        (dead, read)
    }

    pub fn throughput(&self) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if secs > 0.0 {
            self.results as f64 / secs
        } else {
            0.0
        }
    }
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "{:<20} {:>10} {:>10} {:>6} {:>6} {:>8} {:>10} {:>10} {:>10}",
            "stage", "in", "out", "dead", "late", "batches", "mean rows", "p50", "p99"
        )?;
        for s in &self.stages {
            writeln!(
                f,
                "{:<20} {:>10} {:>10} {:>6} {:>6} {:>8} {:>10.1} {:>10} {:>10}",
                s.name,
                s.records_in,
                s.records_out,
                s.dead_letters,
                s.late,
                s.batches,
                s.mean_batch_rows,
                fmt_duration(s.p50),
                fmt_duration(s.p99)
            )?;
        }
        writeln!(
            f,
            "results: {} in {:.2} s = {:.1} records/s; end-to-end latency p50 {} p99 {} \
             (results ready, before their epoch commits: p50 {} p99 {})",
            self.results,
            self.elapsed.as_secs_f64(),
            self.throughput(),
            fmt_duration(self.end_to_end_p50),
            fmt_duration(self.end_to_end_p99),
            fmt_duration(self.ready_p50),
            fmt_duration(self.ready_p99)
        )?;
        for (name, value) in &self.connectors {
            writeln!(f, "{name} {value}")?;
        }
        if self.exchange_bytes_in > 0 {
            writeln!(
                f,
                "exchange: {} bytes received from other processes",
                self.exchange_bytes_in
            )?;
        }
        Ok(())
    }
}

pub fn fmt_duration(d: Duration) -> String {
    let us = d.as_micros();
    if us < 1_000 {
        format!("{us} µs")
    } else if us < 1_000_000 {
        format!("{:.2} ms", us as f64 / 1000.0)
    } else {
        format!("{:.2} s", d.as_secs_f64())
    }
}

fn prom_err(e: impl std::fmt::Display) -> DataflowError {
    DataflowError::Config(format!("metrics: {e}"))
}

// A poisoned lock only means another worker panicked mid-update; the counts are still usable.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
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
}
