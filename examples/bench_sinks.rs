//! Sink benchmark (not a test, issue #28 item 8): Riffle's `parquet` (local folder and S3),
//! `postgres` (insert mode) and `redis` (`value: json`) sinks against a plain client writing
//! the same rows the way one would without Riffle, in interleaved rounds (which side goes
//! first alternates), each side's output read back by an independent path and digested: a
//! ratio only counts when both sides landed the same rows.
//!
//! Riffle's sink is built as a pipeline builds it (`SinkConfig` from JSON, `prepare`,
//! `check_input`, `build`), then timed from `open` through `write_batch` per batch, `flush`
//! every `--epoch-batches` batches (an epoch completing) and `finish`. Services come from the
//! environment (`RIFFLE_S3_BUCKET` with the `AWS_*` variables, `RIFFLE_PG_URL`,
//! `RIFFLE_REDIS_URL`); one that is unset gives a row saying so. `scripts/bench-sinks.sh` starts
//! them and writes the table to docs/benchmarks/sinks.md.
//!
//!     cargo run --release --example bench_sinks -- --rows 200000 --rounds 5

mod common;

#[path = "bench_sinks/data.rs"]
mod data;
#[path = "bench_sinks/parquet_side.rs"]
mod parquet_side;
#[path = "bench_sinks/postgres_side.rs"]
mod postgres_side;
#[path = "bench_sinks/redis_side.rs"]
mod redis_side;

use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use arrow_array::RecordBatch;
use clap::Parser;
use common::spread;
use data::Digest;
use riffle_connectors::{SinkConfig, SinkContext, SinkRole};

/// The ratio (Riffle's rows/s over the plain client's) the issue asks for.
const TARGET: f64 = 0.9;

#[derive(Parser)]
struct Args {
    /// Rows each side writes per round.
    #[arg(long, default_value_t = 200_000)]
    rows: usize,
    /// Interleaved rounds.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Rows per batch (the Kafka source's default batch).
    #[arg(long, default_value_t = 1024)]
    batch_rows: usize,
    /// Batches per epoch: the sink is flushed (the plain client commits) after this many.
    #[arg(long, default_value_t = 16)]
    epoch_batches: usize,
    /// How the plain PostgreSQL client writes: `copy` (binary COPY, the comparison), or
    /// `unnest` (the sink's own statement form written by hand, to see where a gap comes from).
    #[arg(long, value_enum, default_value = "copy")]
    postgres_plain: postgres_side::PlainWrite,
    /// Only these sinks (`parquet`, `s3`, `postgres`, `redis`); default all.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
}

/// Who writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Riffle,
    Plain,
}

impl Side {
    pub fn name(self) -> &'static str {
        match self {
            Side::Riffle => "riffle",
            Side::Plain => "plain",
        }
    }
}

/// A destination both sides write.
pub trait Target {
    fn label(&self) -> String;
    /// Removes what either side wrote.
    fn clean(&mut self) -> Result<()>;
    /// Writes `batches`, committing every `every` batches; the time it took.
    fn run(&mut self, side: Side, batches: &[RecordBatch], every: usize) -> Result<Duration>;
    /// A digest of what `side` left, read back without Riffle.
    fn read_back(&mut self, side: Side) -> Result<Digest>;
}

/// Riffle's sink for `config` (a `sink:` block as JSON), built as a pipeline builds it, then
/// timed from `open` to `finish`.
pub fn riffle_run(
    config: serde_json::Value,
    batches: &[RecordBatch],
    every: usize,
) -> Result<Duration> {
    let mut config: SinkConfig = serde_json::from_value(config).context("the sink's config")?;
    config.kind_mut().prepare(&SinkContext {
        pipeline: "bench_sinks",
        role: SinkRole::Results,
    });
    config
        .kind()
        .check_input(&data::schema())
        .map_err(|e| anyhow!("check_input: {e}"))?;
    let factory = config.build()?;
    let start = Instant::now();
    let mut sink = factory.open()?;
    for (i, batch) in batches.iter().enumerate() {
        sink.write_batch(batch)?;
        if (i + 1) % every == 0 {
            sink.flush()?;
        }
    }
    sink.finish()?;
    Ok(start.elapsed())
}

/// One sink's rounds.
#[derive(Default)]
struct Rounds {
    riffle: Vec<f64>,
    plain: Vec<f64>,
    ratios: Vec<f64>,
    riffle_digests: Vec<Digest>,
    plain_digests: Vec<Digest>,
}

enum Outcome {
    NotRun(String),
    Failed(String),
    Ran(Rounds),
}

fn main() -> Result<()> {
    let args = Args::parse();
    if args.rows == 0 || args.rounds == 0 || args.batch_rows == 0 || args.epoch_batches == 0 {
        bail!("--rows, --rounds, --batch-rows and --epoch-batches must be at least 1");
    }
    let batches = data::batches(args.rows, args.batch_rows)?;
    let base = std::env::temp_dir().join(format!("riffle-bench-sinks-{}", std::process::id()));
    let wanted = |name: &str| args.only.is_empty() || args.only.iter().any(|o| o == name);
    let env = |var: &str| std::env::var(var).ok().filter(|v| !v.is_empty());

    // Each sink in turn, or why it does not run.
    let mut targets: Vec<Result<Box<dyn Target>, String>> = Vec::new();
    if wanted("parquet") {
        targets.push(Ok(Box::new(parquet_side::LocalParquet::new(&base)?)));
    }
    if wanted("s3") {
        targets.push(match env("RIFFLE_S3_BUCKET") {
            Some(bucket) => Ok(Box::new(parquet_side::S3Parquet::new(&bucket))),
            None => Err("RIFFLE_S3_BUCKET".into()),
        });
    }
    if wanted("postgres") {
        targets.push(match env("RIFFLE_PG_URL") {
            Some(url) => Ok(Box::new(postgres_side::Postgres::new(
                url,
                args.postgres_plain,
            ))),
            None => Err("RIFFLE_PG_URL".into()),
        });
    }
    if wanted("redis") {
        targets.push(match env("RIFFLE_REDIS_URL") {
            Some(url) => Ok(Box::new(redis_side::Redis::new(&url, args.rows))),
            None => Err("RIFFLE_REDIS_URL".into()),
        });
    }

    let mut rows: Vec<(String, Outcome)> = Vec::new();
    for target in targets {
        let mut target = match target {
            Ok(target) => target,
            Err(var) => {
                let label = match var.as_str() {
                    "RIFFLE_S3_BUCKET" => parquet_side::S3_LABEL,
                    "RIFFLE_PG_URL" => postgres_side::LABEL,
                    _ => redis_side::LABEL,
                };
                rows.push((label.into(), Outcome::NotRun(format!("{var} unset"))));
                continue;
            }
        };
        let label = target.label();
        let outcome = match measure(target.as_mut(), &batches, &args) {
            Ok(rounds) => Outcome::Ran(rounds),
            Err(e) => {
                eprintln!("bench_sinks: {label}: {e:#}");
                Outcome::Failed(format!("{e:#}"))
            }
        };
        if let Err(e) = target.clean() {
            eprintln!("bench_sinks: {label}: cleaning up: {e:#}");
        }
        rows.push((label, outcome));
    }
    let _ = std::fs::remove_dir_all(&base);

    print_table(&rows, &args, batches.len());
    if rows.iter().any(|(_, o)| matches!(o, Outcome::Failed(_))) {
        bail!("a sink failed (its row says why)");
    }
    Ok(())
}

/// Interleaved rounds: clean, one side, read back, clean, the other; the first side
/// alternates.
fn measure(target: &mut dyn Target, batches: &[RecordBatch], args: &Args) -> Result<Rounds> {
    let mut rounds = Rounds::default();
    let label = target.label();
    for round in 0..args.rounds {
        let order = if round % 2 == 0 {
            [Side::Riffle, Side::Plain]
        } else {
            [Side::Plain, Side::Riffle]
        };
        let mut rates = [0.0; 2];
        for side in order {
            target.clean()?;
            let took = target
                .run(side, batches, args.epoch_batches)
                .with_context(|| format!("round {}: {}", round + 1, side.name()))?;
            let digest = target
                .read_back(side)
                .with_context(|| format!("round {}: reading back {}", round + 1, side.name()))?;
            let rate = args.rows as f64 / took.as_secs_f64();
            eprintln!(
                "bench_sinks: {label}: round {} {}: {rate:.0} rows/s, digest {}",
                round + 1,
                side.name(),
                digest.short()
            );
            match side {
                Side::Riffle => {
                    rates[0] = rate;
                    rounds.riffle.push(rate);
                    rounds.riffle_digests.push(digest);
                }
                Side::Plain => {
                    rates[1] = rate;
                    rounds.plain.push(rate);
                    rounds.plain_digests.push(digest);
                }
            }
        }
        rounds.ratios.push(rates[0] / rates[1]);
    }
    target.clean()?;
    Ok(rounds)
}

/// The digest every round agreed on, or each one seen.
fn digests(all: &[Digest]) -> String {
    let mut seen: Vec<&Digest> = Vec::new();
    for d in all {
        if !seen.contains(&d) {
            seen.push(d);
        }
    }
    let shown: Vec<String> = seen.iter().map(|d| d.short()).collect();
    if seen.len() > 1 {
        format!("varies: {}", shown.join(" / "))
    } else {
        shown.join("")
    }
}

fn print_table(rows: &[(String, Outcome)], args: &Args, batches: usize) {
    println!(
        "| sink: {} rows ({batches} batches of {}, flushed every {}), median (min–max) of {} \
         rounds | Riffle sink rows/s | plain client rows/s | Riffle / plain | Riffle digest \
         | plain digest | target ≥ {TARGET} |",
        args.rows, args.batch_rows, args.epoch_batches, args.rounds
    );
    println!("|---|---:|---:|---:|---|---|---|");
    for (label, outcome) in rows {
        match outcome {
            Outcome::NotRun(why) => println!("| {label} | not run: {why} | | | | | |"),
            Outcome::Failed(why) => {
                let why = why.replace('|', "\\|").replace('\n', " ");
                println!("| {label} | failed: {why} | | | | | |")
            }
            Outcome::Ran(r) => {
                let equal = r
                    .riffle_digests
                    .iter()
                    .zip(&r.plain_digests)
                    .all(|(a, b)| a == b);
                let median = median(&r.ratios);
                let (ratio, verdict) = if !equal {
                    ("outputs differ".to_string(), "outputs differ")
                } else if median >= TARGET {
                    (spread(&r.ratios, 2), "met")
                } else {
                    (spread(&r.ratios, 2), "below target")
                };
                println!(
                    "| {label} | {} | {} | {ratio} | {} | {} | {verdict} |",
                    spread(&r.riffle, 0),
                    spread(&r.plain, 0),
                    digests(&r.riffle_digests),
                    digests(&r.plain_digests),
                );
            }
        }
    }
}

/// The median, as `spread` shows it (the mean of the middle two of an even count).
fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}
