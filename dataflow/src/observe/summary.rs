//! The end-of-run figures of one process and the table `riffle run` prints of them.

use std::time::Duration;

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
    /// The metrics sources and sinks registered themselves (lag, bytes, errors, drops,
    /// reconnects), by name and labels ([`super::Metrics::register`]).
    pub connectors: Vec<(String, f64)>,
    /// Bytes of batches this process received from other processes.
    pub exchange_bytes_in: u64,
    /// Dead letters written by this process, by `stage: reason`, commonest first.
    pub dead_letter_reasons: Vec<(String, u64)>,
    /// Where a written result's time went, on average; none when nothing was written here.
    pub breakdown: Option<Breakdown>,
}

/// The mean time a written result spent in each part of the run, from the camera's (or
/// other source's) own queue to the sink's write: the parts add up to its capture → written
/// latency.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Breakdown {
    /// In the source's own queue before the worker read it (capture → read).
    pub queued: Duration,
    /// In a batcher, waiting for a model batch to form.
    pub batching: Duration,
    /// Inside stages (their `process_batch`), all stages together.
    pub stages: Duration,
    /// Between them: channels, exchanges, a worker busy with other rows.
    pub dataflow: Duration,
    /// At the sink, waiting for the result's epoch to complete (every worker past it).
    pub epoch: Duration,
    /// The sink's own write.
    pub sink: Duration,
}

impl Breakdown {
    /// Read → written: everything after the source's queue.
    pub fn after_read(&self) -> Duration {
        self.batching + self.stages + self.dataflow + self.epoch + self.sink
    }

    /// The parts by name, in the order a result passes them.
    pub fn parts(&self) -> [(&'static str, Duration); 6] {
        [
            ("source queue", self.queued),
            ("batching", self.batching),
            ("stages", self.stages),
            ("dataflow", self.dataflow),
            ("epoch", self.epoch),
            ("sink", self.sink),
        ]
    }
}

impl std::fmt::Display for Breakdown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let parts: Vec<String> = self
            .parts()
            .iter()
            .map(|(name, d)| format!("{name} {:.1}", ms(*d)))
            .collect();
        write!(
            f,
            "where the time goes (mean ms per result): {} = {:.1} after the read",
            parts.join(" + "),
            ms(self.after_read())
        )
    }
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
        // The latency a user sees comes first; the per-stage table explains it.
        writeln!(
            f,
            "latency: results ready p50 {} p99 {} after their read (what the live view and a \
             live sink see); written p50 {} p99 {} (when their epoch commits)",
            fmt_duration(self.ready_p50),
            fmt_duration(self.ready_p99),
            fmt_duration(self.end_to_end_p50),
            fmt_duration(self.end_to_end_p99)
        )?;
        if let Some(breakdown) = &self.breakdown {
            writeln!(f, "{breakdown}")?;
        }
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
            "results: {} in {:.2} s = {:.1} records/s",
            self.results,
            self.elapsed.as_secs_f64(),
            self.throughput(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prints_latency_first_then_stages_results_and_registered_metrics() {
        let summary = Summary {
            elapsed: Duration::from_secs(2),
            stages: vec![StageSummary {
                name: "model".into(),
                records_in: 10,
                records_out: 9,
                dead_letters: 1,
                late: 0,
                batches: 2,
                mean_batch_rows: 5.0,
                max_batch_rows: 6,
                p50: Duration::from_micros(900),
                p99: Duration::from_millis(3),
            }],
            end_to_end_p50: Duration::from_millis(5),
            end_to_end_p99: Duration::from_secs(2),
            ready_p50: Duration::from_millis(4),
            ready_p99: Duration::from_millis(8),
            results: 9,
            busy: Duration::from_secs(1),
            connectors: vec![("riffle_thing_total{to=b}".into(), 3.0)],
            exchange_bytes_in: 0,
            dead_letter_reasons: Vec::new(),
            breakdown: None,
        };
        let text = summary.to_string();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "latency: results ready p50 4.00 ms p99 8.00 ms after their read (what the live view \
             and a live sink see); written p50 5.00 ms p99 2.00 s (when their epoch commits)"
        );
        assert!(lines[1].starts_with("stage "), "{}", lines[1]);
        assert_eq!(
            lines[2],
            "model                        10          9      1      0        2        5.0     \
             900 µs    3.00 ms"
        );
        assert_eq!(lines[3], "results: 9 in 2.00 s = 4.5 records/s");
        assert_eq!(lines[4], "riffle_thing_total{to=b} 3");
        assert_eq!(lines.len(), 5);
    }

    #[test]
    fn the_breakdown_is_one_line_after_the_latency_and_its_parts_add_up() {
        let ms = Duration::from_millis;
        let breakdown = Breakdown {
            queued: ms(3),
            batching: ms(2),
            stages: ms(15),
            dataflow: ms(1),
            epoch: ms(4),
            sink: Duration::from_micros(500),
        };
        assert_eq!(breakdown.after_read(), Duration::from_micros(22_500));
        let summary = Summary {
            elapsed: Duration::from_secs(1),
            stages: Vec::new(),
            end_to_end_p50: ms(22),
            end_to_end_p99: ms(30),
            ready_p50: ms(18),
            ready_p99: ms(25),
            results: 1,
            busy: Duration::from_secs(1),
            connectors: Vec::new(),
            exchange_bytes_in: 0,
            dead_letter_reasons: Vec::new(),
            breakdown: Some(breakdown),
        };
        let text = summary.to_string();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("latency: "), "{}", lines[0]);
        assert_eq!(
            lines[1],
            "where the time goes (mean ms per result): source queue 3.0 + batching 2.0 + \
             stages 15.0 + dataflow 1.0 + epoch 4.0 + sink 0.5 = 22.5 after the read"
        );
        assert!(lines[2].starts_with("stage "), "{}", lines[2]);
    }
}
