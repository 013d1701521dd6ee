//! Reliability trials (not a test: it counts outcomes instead of stopping at the first bad
//! one). `scripts/reliability.sh` runs it with a broker and writes docs/reliability.md.
//!
//!     RIFFLE_BIN=target/release/riffle cargo run --release --example reliability -- BROKERS [TRIALS]
//!
//! Each kind of trial runs TRIALS times (default 10) at moments drawn from a printed seed and
//! prints one table row: tries, clean (every record exactly once, exit 0, no orphan process),
//! faults that did not land, panics, hangs (no end within the time limit, or a process left
//! behind), lost and duplicated records (summed over the tries), and how long after the fault
//! `read_committed` readers waited for new output (Kafka output only).
//!
//! A fault counts only when it is known to have landed mid-run: after a checkpoint (or a
//! committed transaction), before the output is complete, with the run still in flight, and
//! with the recovery it must cause observed (a resume from a checkpoint, a supervisor restart,
//! a broker back up, a survivor taking the killed member's partitions). A try whose fault did
//! not land is drawn again, up to `ATTEMPTS` times; one that never lands is counted in "fault
//! did not land", not as clean. A run that fails or hangs after its fault counts as landed
//! even when the recovery was not seen: a broken recovery must show as a failure, not a retry.
//! - kill -9 of the supervisor at a random moment, then the same command again;
//! - kill -9 of one worker process at a random moment (the supervisor restarts the cluster);
//! - the checkpoints' disk filling up mid-run, then the same command once there is space
//!   (needs root for a tmpfs; skipped with a line otherwise);
//! - kill -9 of one of two clusters reading a topic, written while they run, as one consumer
//!   group (Kafka → Kafka in transactions): the survivor takes its partitions over, and the
//!   killed member's open transaction holds back every `read_committed` reader until the
//!   broker aborts it (the row's output stall);
//! - the broker crashing and restarting under a Kafka → Kafka exactly-once run (fewer tries:
//!   each takes a minute), counted from what a `read_committed` kcat reads.
//!
//! `RIFFLE_RELIABILITY_TRANSACTION_TIMEOUT_MS` sets the Kafka sinks' `transaction_timeout_ms`
//! (default: the sink's), to see the stall follow it; `RIFFLE_RELIABILITY_KINDS` picks kinds
//! (`supervisor,worker,disk,group,broker`; default all); `RIFFLE_RELIABILITY_KEEP=1` keeps the
//! runs' pipelines and logs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// Records of the topic most trials read (2 partitions).
const RECORDS: usize = 240;
/// The consumer-group trial's topic: its partitions, and records written a second while the
/// clusters read it.
const GROUP_PARTITIONS: usize = 4;
const GROUP_RATE: u64 = 40;
const LIMIT: Duration = Duration::from_secs(180);
/// Draws of one try until its fault lands.
const ATTEMPTS: usize = 4;
/// The runs' log filter: the default one, which shows the lines recovery is observed by.
const RUN_LOG: &str = "warn,riffle=info";

#[derive(Default)]
struct Row {
    tries: usize,
    clean: usize,
    not_landed: usize,
    panics: usize,
    hangs: usize,
    lost: usize,
    duplicated: usize,
    /// Per counted try with Kafka output: from the fault to the next output a
    /// `read_committed` reader sees.
    stalls: Vec<Duration>,
}

impl Row {
    fn print(&self, what: &str) {
        let stall = match (self.stalls.iter().min(), self.stalls.iter().max()) {
            (Some(a), Some(b)) if a == b => format!("{:.1} s", a.as_secs_f64()),
            (Some(a), Some(b)) => format!("{:.1}–{:.1} s", a.as_secs_f64(), b.as_secs_f64()),
            _ => "–".to_string(),
        };
        println!(
            "| {what} | {} | {} | {} | {} | {} | {} | {} | {stall} |",
            self.tries,
            self.clean,
            self.not_landed,
            self.panics,
            self.hangs,
            self.lost,
            self.duplicated
        );
    }
}

/// What one try ended with.
struct Outcome {
    /// Why the fault did not land (`None`: it did).
    missed: Option<String>,
    ok: bool,
    panicked: bool,
    hung: bool,
    /// Each id's count in the output, and the ids it should hold (each once).
    counts: BTreeMap<i64, usize>,
    expected: BTreeSet<i64>,
    /// From the fault to the next output a `read_committed` reader saw (Kafka output).
    stall: Option<Duration>,
    /// What went wrong, for a try that is not clean.
    detail: String,
}

impl Outcome {
    fn missed(why: impl Into<String>) -> Outcome {
        Outcome {
            missed: Some(why.into()),
            ok: false,
            panicked: false,
            hung: false,
            counts: BTreeMap::new(),
            expected: BTreeSet::new(),
            stall: None,
            detail: String::new(),
        }
    }
}

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// What every trial needs.
struct Trials {
    riffle: PathBuf,
    brokers: String,
    /// `RECORDS` ids in 2 partitions.
    topic: String,
    /// Extra keys of the Kafka sinks (`transaction_timeout_ms`).
    sink_extra: String,
    rng: Rng,
}

fn main() -> Result<()> {
    let brokers = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:9092".into());
    let trials: usize = std::env::args()
        .nth(2)
        .map(|t| t.parse())
        .transpose()?
        .unwrap_or(10);
    let riffle = PathBuf::from(std::env::var("RIFFLE_BIN").context(
        "RIFFLE_BIN: the riffle binary to run (scripts/reliability.sh builds and sets it)",
    )?);
    let sink_extra = match std::env::var("RIFFLE_RELIABILITY_TRANSACTION_TIMEOUT_MS") {
        Ok(ms) if !ms.is_empty() => format!(
            ", transaction_timeout_ms: {}",
            ms.parse::<u64>()
                .context("RIFFLE_RELIABILITY_TRANSACTION_TIMEOUT_MS: expected milliseconds")?
        ),
        _ => String::new(),
    };
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos() as u64
        | 1;
    eprintln!("seed {seed}");
    let tmp = tempfile::tempdir()?;
    let kinds = std::env::var("RIFFLE_RELIABILITY_KINDS").ok();
    let runs = |kind: &str| {
        kinds
            .as_deref()
            .is_none_or(|k| k.split(',').any(|k| k.trim() == kind))
    };
    let suffix = std::process::id();
    let topic = id_topic(
        &riffle,
        &brokers,
        tmp.path(),
        &format!("reliability-{suffix}"),
        RECORDS,
        2,
    )?;
    let mut t = Trials {
        riffle,
        brokers,
        topic,
        sink_extra,
        rng: Rng(seed),
    };
    println!(
        "| trial | tries | clean | fault did not land | panics | hangs | lost | duplicated | output stall |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");

    let dir = |kind: &str, trial: usize, attempt: usize| {
        tmp.path().join(format!("{kind}{trial}-{attempt}"))
    };
    if runs("supervisor") {
        rows(
            "`kill -9` of the supervisor, then the same command",
            trials,
            |trial, attempt| t.supervisor_kill(&dir("supervisor", trial, attempt)),
        )?;
    }
    if runs("worker") {
        rows(
            "`kill -9` of a worker process (the supervisor restarts the cluster)",
            trials,
            |trial, attempt| t.worker_kill(&dir("worker", trial, attempt)),
        )?;
    }
    if runs("disk") {
        if tmpfs_allowed() {
            rows(
                "the checkpoints' disk full mid-run, then the same command",
                trials.div_ceil(3),
                |trial, attempt| t.disk_full(&dir("disk", trial, attempt)),
            )?;
        } else {
            eprintln!("no tmpfs (needs root): the disk-full trials are left out");
        }
    }
    if runs("group") {
        let what = "`kill -9` of one of two clusters sharing a consumer group, not restarted \
                    (Kafka → Kafka, exactly-once)";
        rows(what, trials.div_ceil(5), |trial, attempt| {
            t.group_member_kill(&dir("group", trial, attempt))
        })?;
    }
    if runs("broker") {
        rows(
            "the broker crashes and restarts (Kafka → Kafka, exactly-once)",
            trials.div_ceil(5),
            |trial, attempt| t.broker_restart(&dir("broker", trial, attempt)),
        )?;
    }
    if std::env::var_os("RIFFLE_RELIABILITY_KEEP").is_some() {
        eprintln!("the runs' files are kept in {}", tmp.keep().display());
    }
    Ok(())
}

/// Runs `tries` tries of one kind, each drawn again until its fault lands, and prints their
/// row.
fn rows(
    what: &str,
    tries: usize,
    mut trial: impl FnMut(usize, usize) -> Result<Outcome>,
) -> Result<()> {
    let mut row = Row::default();
    for t in 0..tries {
        let mut landed = false;
        for attempt in 0..ATTEMPTS {
            let o = trial(t, attempt)?;
            if let Some(why) = &o.missed {
                eprintln!("{what}: try {t}, draw {attempt}: the fault did not land ({why})");
                continue;
            }
            tally(&mut row, o, what, t);
            landed = true;
            break;
        }
        if !landed {
            row.tries += 1;
            row.not_landed += 1;
        }
    }
    row.print(what);
    Ok(())
}

fn tally(row: &mut Row, o: Outcome, what: &str, t: usize) {
    row.tries += 1;
    let lost = o
        .expected
        .iter()
        .filter(|i| !o.counts.contains_key(i))
        .count();
    let duplicated: usize = o.counts.values().map(|&c| c.saturating_sub(1)).sum();
    row.lost += lost;
    row.duplicated += duplicated;
    row.panics += usize::from(o.panicked);
    row.hangs += usize::from(o.hung);
    row.stalls.extend(o.stall);
    if let Some(stall) = o.stall {
        eprintln!(
            "{what}: try {t}: output stalled {:.1} s",
            stall.as_secs_f64()
        );
    }
    if o.ok && !o.panicked && !o.hung && lost == 0 && duplicated == 0 {
        row.clean += 1;
    } else {
        eprintln!(
            "{what}: try {t} not clean: exit ok {}, panicked {}, hung {}, {lost} lost, \
             {duplicated} duplicated\n{}",
            o.ok, o.panicked, o.hung, o.detail
        );
    }
}

/// A topic of `records` JSON records `{id, value}`, keyed by id, in `partitions` partitions.
fn id_topic(
    riffle: &Path,
    brokers: &str,
    tmp: &Path,
    topic: &str,
    records: usize,
    partitions: usize,
) -> Result<String> {
    let mut csv = String::from("id,value\n");
    for i in 0..records {
        csv.push_str(&format!("{i},{}.5\n", i % 7));
    }
    let file = tmp.join(format!("{topic}.csv"));
    std::fs::write(&file, csv)?;
    let out = Command::new(riffle)
        .args(["produce", "--brokers", brokers, "--topic", topic])
        .args([
            "--partitions",
            &partitions.to_string(),
            "--key",
            "id",
            "--csv",
        ])
        .arg(&file)
        .output()?;
    if !out.status.success() {
        bail!("producing: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(topic.to_string())
}

/// Kafka → `sink` with checkpoints every 200 ms, each worker paced to `rate` records a second.
fn pipeline(dir: &Path, brokers: &str, topic: &str, sink: &str, rate: u32) -> Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let file = dir.join("ids.yaml");
    std::fs::write(
        &file,
        format!(
            "source: {{ kafka: {{ brokers: \"{brokers}\", topic: {topic}, format: json, stop_at_end: true, batch_size: 8, max_records_per_second: {rate}, options: {{ queued.max.messages.kbytes: \"64\" }} }} }}\n\
             stages:\n  - select: {{ columns: [id, value] }}\n\
             sink: {sink}\n\
             runtime: {{ workers: 1, epoch_records: 8, checkpoint: {{ dir: ckpt, interval_ms: 200 }} }}\n"
        ),
    )?;
    Ok(file)
}

/// A run and the file its stderr goes to.
struct Run {
    child: Child,
    log: PathBuf,
}

impl Run {
    fn in_flight(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// `riffle run` of `pipeline` with `--processes 2` (`processes`: else one process), stderr
/// into `log`.
fn start(
    riffle: &Path,
    pipeline: &Path,
    processes: bool,
    extra: &[&str],
    log: &Path,
) -> Result<Run> {
    let mut command = Command::new(riffle);
    command.args(["run", "-q"]).arg(pipeline);
    if processes {
        command.args([
            "--processes",
            "2",
            "--base-port",
            &free_port_pair().to_string(),
        ]);
    }
    let child = command
        .args(extra)
        .env("RUST_LOG", RUN_LOG)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log)?)
        .spawn()?;
    Ok(Run {
        child,
        log: log.to_path_buf(),
    })
}

/// How a run ended.
struct Ended {
    ok: bool,
    panicked: bool,
    hung: bool,
    log: String,
}

/// Waits for `run` up to `LIMIT`.
fn finish(mut run: Run) -> Result<Ended> {
    let started = Instant::now();
    let status = loop {
        if let Some(status) = run.child.try_wait()? {
            break Some(status);
        }
        if started.elapsed() > LIMIT {
            let _ = run.child.kill();
            let _ = run.child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let log = run.log();
    Ok(Ended {
        ok: status.is_some_and(|s| s.success()),
        panicked: log.contains("panicked"),
        hung: status.is_none(),
        log,
    })
}

/// The last lines of a log, for a try that is not clean.
fn tail(name: &str, log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    let from = lines.len().saturating_sub(15);
    format!("--- {name}:\n{}", lines[from..].join("\n"))
}

fn worker_pids(pipeline: &Path) -> Vec<u32> {
    let needle = pipeline.to_string_lossy().into_owned();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            cmdline.contains(&needle) && cmdline.contains("--process ")
        })
        .collect()
}

fn wait_until(timeout: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while !done() {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// Whether `dir` holds a complete checkpoint (`epoch-N.ckpt`; one being written ends `.tmp`).
fn checkpointed(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|d| {
        d.filter_map(Result::ok)
            .any(|e| e.file_name().to_string_lossy().ends_with(".ckpt"))
    })
}

/// Each id's count in `out`; a line that is not a whole record counts as a lost one.
fn id_counts(out: &Path) -> BTreeMap<i64, usize> {
    ids(&std::fs::read_to_string(out).unwrap_or_default())
}

fn ids(text: &str) -> BTreeMap<i64, usize> {
    let mut counts = BTreeMap::new();
    for line in text.lines() {
        if let Some(id) = serde_json::from_str::<serde_json::Value>(line)
            .ok()
            .and_then(|r| r["id"].as_i64())
        {
            *counts.entry(id).or_insert(0) += 1;
        }
    }
    counts
}

fn total(counts: &BTreeMap<i64, usize>) -> usize {
    counts.values().sum()
}

fn free_port_pair() -> u16 {
    (21000..40000)
        .step_by(2)
        .find(|p| {
            std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok()
                && std::net::TcpListener::bind(("127.0.0.1", *p + 1)).is_ok()
        })
        .unwrap_or(21000)
}

const FILE_SINK: &str = "{ jsonl: { path: out.jsonl } }";
const OUT: &str = "out.jsonl";

/// `kill -9 pid`; whether the signal was delivered.
fn kill_9(pid: u32) -> bool {
    Command::new("kill")
        .args(["-9", &pid.to_string()])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Waits until both processes of `run` run and `ckpt` holds a checkpoint, then for a random
/// moment (0–1.5 s), and says why the run is not mid-run then (`None`: it is: in flight,
/// checkpointed, its output in `out` short of `RECORDS`).
fn reach_mid_run(
    run: &mut Run,
    pipeline: &Path,
    ckpt: &Path,
    out: &Path,
    rng: &mut Rng,
) -> Option<String> {
    let mut ended = false;
    let ready = wait_until(LIMIT, || {
        ended = !run.in_flight();
        ended || (worker_pids(pipeline).len() == 2 && checkpointed(ckpt))
    });
    if ended {
        return Some("the run ended before it was checkpointed with both processes up".into());
    }
    if !ready {
        return Some(format!(
            "no checkpoint with both processes up within {} s",
            LIMIT.as_secs()
        ));
    }
    std::thread::sleep(Duration::from_millis(rng.below(1500)));
    mid_run(run, out)
}

/// Why `run` is no longer mid-run (`None`: still in flight, its output short of `RECORDS`).
fn mid_run(run: &mut Run, out: &Path) -> Option<String> {
    if !run.in_flight() {
        return Some("the run had ended".into());
    }
    let written = total(&id_counts(out));
    (written >= RECORDS).then(|| format!("the output was complete ({written} records)"))
}

/// Ends `run` of `pipeline` and its worker processes (for a try whose fault did not land).
fn abandon(mut run: Run, pipeline: &Path, why: String) -> Result<Outcome> {
    let _ = run.child.kill();
    let _ = run.child.wait();
    for pid in worker_pids(pipeline) {
        kill_9(pid);
    }
    Ok(Outcome::missed(why))
}

const RESUMED: &str = "resuming from checkpoint epoch";
const RESTARTED: &str = "restarting the cluster";

impl Trials {
    fn supervisor_kill(&mut self, dir: &Path) -> Result<Outcome> {
        let p = pipeline(dir, &self.brokers, &self.topic, FILE_SINK, 40)?;
        let mut first = start(&self.riffle, &p, true, &[], &dir.join("first.log"))?;
        let (ckpt, out) = (dir.join("ckpt"), dir.join(OUT));
        if let Some(why) = reach_mid_run(&mut first, &p, &ckpt, &out, &mut self.rng) {
            return abandon(first, &p, why);
        }
        first.child.kill()?;
        first.child.wait()?;
        // Processes left behind are a hang: they would write beside the next run.
        let orphans = !wait_until(Duration::from_secs(5), || worker_pids(&p).is_empty());
        worker_pids(&p).into_iter().for_each(|pid| {
            kill_9(pid);
        });
        let second = finish(start(&self.riffle, &p, true, &[], &dir.join("second.log"))?)?;
        // The checkpoint that existed at the kill (or a later one) is where it must resume.
        let resumed = second.log.contains(RESUMED);
        Ok(Outcome {
            missed: None,
            ok: second.ok && resumed,
            panicked: second.panicked,
            hung: second.hung || orphans,
            counts: id_counts(&out),
            expected: (0..RECORDS as i64).collect(),
            stall: None,
            detail: format!(
                "resumed from a checkpoint: {resumed}; processes left behind: {orphans}\n{}",
                tail("second run", &second.log)
            ),
        })
    }

    fn worker_kill(&mut self, dir: &Path) -> Result<Outcome> {
        let p = pipeline(dir, &self.brokers, &self.topic, FILE_SINK, 40)?;
        let mut run = start(&self.riffle, &p, true, &[], &dir.join("run.log"))?;
        let (ckpt, out) = (dir.join("ckpt"), dir.join(OUT));
        if let Some(why) = reach_mid_run(&mut run, &p, &ckpt, &out, &mut self.rng) {
            return abandon(run, &p, why);
        }
        let pids = worker_pids(&p);
        let victim = pids
            .get(self.rng.below(pids.len() as u64) as usize)
            .copied();
        if !victim.is_some_and(kill_9) {
            return abandon(run, &p, "no worker process to kill".into());
        }
        let end = finish(run)?;
        let restarted = end.log.contains(RESTARTED);
        // A kill that never disturbed the run (its process was leaving anyway) did not land;
        // one followed by a failure or a hang without a restart is the supervisor's fault.
        let missed = (!restarted && end.ok && !end.hung)
            .then(|| "the run ended without a restart".to_string());
        Ok(Outcome {
            missed,
            ok: end.ok && restarted,
            panicked: end.panicked,
            hung: end.hung,
            counts: id_counts(&out),
            expected: (0..RECORDS as i64).collect(),
            stall: None,
            detail: format!("restarted: {restarted}\n{}", tail("run", &end.log)),
        })
    }

    fn disk_full(&mut self, dir: &Path) -> Result<Outcome> {
        let p = pipeline(dir, &self.brokers, &self.topic, FILE_SINK, 40)?;
        let disk = dir.join("disk");
        std::fs::create_dir_all(&disk)?;
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=256k", "tmpfs"])
            .arg(&disk)
            .status()?;
        if !status.success() {
            bail!("mounting a tmpfs on {}", disk.display());
        }
        let outcome = self.disk_full_on(dir, &p, &disk);
        let _ = Command::new("umount").arg("-l").arg(&disk).status();
        outcome
    }

    fn disk_full_on(&mut self, dir: &Path, p: &Path, disk: &Path) -> Result<Outcome> {
        let ckpt = disk.join("ckpt");
        let flags = [
            "--checkpoint-dir",
            ckpt.to_str()
                .context("a checkpoint path that is not UTF-8")?,
            "--max-restarts",
            "1",
        ];
        let out = dir.join(OUT);
        let mut first = start(&self.riffle, p, true, &flags, &dir.join("first.log"))?;
        if let Some(why) = reach_mid_run(&mut first, p, &ckpt, &out, &mut self.rng) {
            return abandon(first, p, why);
        }
        if !fill(&disk.join("filler")) {
            return abandon(first, p, "the disk did not fill".into());
        }
        // The full disk must end the first run with an error (its next checkpoint cannot be
        // written, and the restart finds the disk still full), not hang it or pass.
        let first_end = finish(first)?;
        let _ = std::fs::remove_file(disk.join("filler"));
        let second = finish(start(
            &self.riffle,
            p,
            true,
            &flags,
            &dir.join("second.log"),
        )?)?;
        let resumed = second.log.contains(RESUMED);
        Ok(Outcome {
            missed: None,
            ok: !first_end.ok && !first_end.hung && second.ok && resumed,
            panicked: second.panicked || first_end.panicked,
            hung: second.hung || first_end.hung,
            counts: id_counts(&out),
            expected: (0..RECORDS as i64).collect(),
            stall: None,
            detail: format!(
                "first run failed: {}; resumed from a checkpoint: {resumed}\n{}\n{}",
                !first_end.ok,
                tail("first run", &first_end.log),
                tail("second run", &second.log)
            ),
        })
    }

    /// Clusters A and B run the same pipeline as one consumer group, each with its own
    /// `transactional.id`, reading a topic written at `GROUP_RATE` records a second while they
    /// run (so both always have a transaction with results open); A is killed once B holds
    /// partitions, and never comes back. B is stopped with SIGTERM once it has committed
    /// everything written.
    fn group_member_kill(&mut self, dir: &Path) -> Result<Outcome> {
        std::fs::create_dir_all(dir)?;
        let suffix = rand_suffix();
        let input = format!("reliability-group-{}-{suffix}", std::process::id());
        let (output, group) = (format!("{input}-out"), format!("{input}-group"));
        let mut csv = String::from("id,value\n");
        for i in 0..GROUP_RATE * LIMIT.as_secs() {
            csv.push_str(&format!("{i},{}.5\n", i % 7));
        }
        std::fs::write(dir.join("ids.csv"), csv)?;
        let mut producer = Command::new(&self.riffle)
            .args(["produce", "--brokers", &self.brokers, "--topic", &input])
            .args(["--partitions", &GROUP_PARTITIONS.to_string(), "--key", "id"])
            .args(["--rate", &GROUP_RATE.to_string(), "--csv"])
            .arg(dir.join("ids.csv"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        // The clusters infer the schema from the topic's first messages: a second of them.
        let written = wait_until(LIMIT, || {
            total(&kcat_ids(&self.brokers, &input, true)) >= GROUP_RATE as usize
        });
        let outcome = if written {
            self.group_member_kill_reading(dir, &input, &output, &group, &mut producer)
        } else {
            Ok(Outcome::missed("the input topic stayed empty"))
        };
        let _ = producer.kill();
        let _ = producer.wait();
        outcome
    }

    fn group_member_kill_reading(
        &mut self,
        dir: &Path,
        input: &str,
        output: &str,
        group: &str,
        producer: &mut Child,
    ) -> Result<Outcome> {
        let cluster = |name: &str| -> Result<PathBuf> {
            let dir = dir.join(name);
            std::fs::create_dir_all(&dir)?;
            let file = dir.join("ids.yaml");
            std::fs::write(
                &file,
                format!(
                    "source: {{ kafka: {{ brokers: \"{b}\", topic: {input}, format: json, batch_size: 8, group_id: {group} }} }}\n\
                     stages:\n  - select: {{ columns: [id, value] }}\n\
                     sink: {{ kafka: {{ brokers: \"{b}\", topic: {output}, partitions: 2, key: id, exactly_once: transactions, transactional_id: riffle-{name}-{output}{extra} }} }}\n\
                     runtime: {{ workers: 1, epoch_records: 8, epoch_ms: 200, checkpoint: {{ dir: ckpt, interval_ms: 1000 }} }}\n",
                    b = self.brokers,
                    extra = self.sink_extra,
                ),
            )?;
            Ok(file)
        };
        let (pa, pb) = (cluster("a")?, cluster("b")?);
        let brokers = self.brokers.clone();
        let committed = || total(&kcat_ids(&brokers, output, true));
        let mut a = start(&self.riffle, &pa, false, &[], &dir.join("a.log"))?;
        if !wait_until(LIMIT, || !a.in_flight() || committed() > 0) || !a.in_flight() {
            return abandon(a, &pa, "cluster A committed nothing while in flight".into());
        }
        let mut b = start(&self.riffle, &pb, false, &[], &dir.join("b.log"))?;
        let b_log = b.log.clone();
        let b_assigned = || assigned(&std::fs::read_to_string(&b_log).unwrap_or_default());
        let holds = wait_until(LIMIT, || !b_assigned().is_empty());
        std::thread::sleep(Duration::from_millis(1000 + self.rng.below(2000)));
        // Records written after this are the ones that show the stall: those already in
        // B's open transaction may sit before A's in the log, and become readable at B's
        // next commit.
        let last_in = kcat_ids(&self.brokers, input, true).into_keys().max();
        let missed = if !holds {
            Some("cluster B was assigned no partition")
        } else if !a.in_flight() || !b.in_flight() {
            Some("a cluster had ended")
        } else if !matches!(producer.try_wait(), Ok(None)) {
            Some("the input was complete")
        } else {
            None
        };
        if let Some(why) = missed {
            let _ = abandon(a, &pa, String::new());
            return abandon(b, &pb, why.into());
        }
        let killed = Instant::now();
        a.child.kill()?;
        a.child.wait()?;
        let stall = stall(killed, &mut b, || {
            let newest = kcat_ids(&brokers, output, true).into_keys().max();
            newest > last_in
        });
        // The survivor takes A's partitions once the group's session times out.
        let took_over = wait_until(LIMIT, || b_assigned().len() == GROUP_PARTITIONS);
        // Then the input ends, and B must commit every record of it once.
        let _ = producer.kill();
        let _ = producer.wait();
        let written: BTreeSet<i64> = kcat_ids(&self.brokers, input, true).into_keys().collect();
        let caught_up = wait_until(LIMIT, || {
            let out = kcat_ids(&self.brokers, output, true);
            written.iter().all(|id| out.contains_key(id))
        });
        let _ = Command::new("kill")
            .args(["-TERM", &b.child.id().to_string()])
            .status();
        let end = finish(b)?;
        let counts = kcat_ids(&self.brokers, output, true);
        let aborted = total(&kcat_ids(&self.brokers, output, false)).saturating_sub(total(&counts));
        // Without results in an open transaction at the kill, nothing held readers back.
        let missed =
            (aborted == 0).then(|| "the killed member had no open transaction".to_string());
        Ok(Outcome {
            missed,
            ok: end.ok && took_over && caught_up && stall.is_some(),
            panicked: end.panicked,
            hung: end.hung,
            counts,
            expected: written,
            stall,
            detail: format!(
                "took over: {took_over}; caught up: {caught_up}; stall {stall:?}; {aborted} \
                 aborted records\n{}",
                tail("cluster B", &end.log)
            ),
        })
    }

    fn broker_restart(&mut self, dir: &Path) -> Result<Outcome> {
        let output = format!("{}-out-{}", self.topic, rand_suffix());
        let sink = format!(
            "{{ kafka: {{ brokers: \"{}\", topic: {output}, partitions: 2, exactly_once: transactions{} }} }}",
            self.brokers, self.sink_extra
        );
        // Slower than the others: the run must still be writing after its first commit (the
        // pace counts from the source's first poll, so a slow start is made up in a burst).
        let p = pipeline(dir, &self.brokers, &self.topic, &sink, 20)?;
        let brokers = self.brokers.clone();
        let committed = || total(&kcat_ids(&brokers, &output, true));
        let mut run = start(&self.riffle, &p, true, &[], &dir.join("run.log"))?;
        wait_until(LIMIT, || !run.in_flight() || committed() > 0);
        std::thread::sleep(Duration::from_millis(self.rng.below(1000)));
        let before = committed();
        if !run.in_flight() {
            return abandon(run, &p, "the run had ended".into());
        }
        if before == 0 || before >= RECORDS {
            return abandon(
                run,
                &p,
                format!("{before} of {RECORDS} records were committed"),
            );
        }
        let killed = Instant::now();
        let restarted = Command::new("scripts/kafka.sh")
            .arg("restart")
            .stdout(Stdio::null())
            .status()?;
        if !restarted.success() {
            bail!("scripts/kafka.sh restart failed");
        }
        let stall = stall(killed, &mut run, || committed() > before);
        let end = finish(run)?;
        Ok(Outcome {
            missed: None,
            ok: end.ok && stall.is_some(),
            panicked: end.panicked,
            hung: end.hung,
            counts: kcat_ids(&self.brokers, &output, true),
            expected: (0..RECORDS as i64).collect(),
            stall,
            detail: format!("stall {stall:?}\n{}", tail("run", &end.log)),
        })
    }
}

/// Every partition a group member's log says it was assigned.
fn assigned(log: &str) -> BTreeSet<i64> {
    log.lines()
        .filter_map(|l| l.split("kafka group: assigned partitions [").nth(1))
        .filter_map(|rest| rest.split(']').next())
        .flat_map(|list| list.split(',').filter_map(|p| p.trim().parse().ok()))
        .collect()
}

/// From `since` until `visible()` (`None`: not while `run` ran, nor once it ended).
fn stall(since: Instant, run: &mut Run, visible: impl Fn() -> bool) -> Option<Duration> {
    let mut ended = false;
    let seen = wait_until(LIMIT, || {
        ended = !run.in_flight();
        ended || visible()
    });
    // A run that ended has committed all it will: its output shows it or it does not.
    (seen && (!ended || visible())).then(|| since.elapsed())
}

fn tmpfs_allowed() -> bool {
    let probe = std::env::temp_dir().join(format!("riffle-tmpfs-probe-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&probe);
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
        .arg(&probe)
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if mounted {
        let _ = Command::new("umount").arg(&probe).status();
    }
    let _ = std::fs::remove_dir(&probe);
    mounted
}

/// Writes `file` until its file system is full, down to the last byte; whether it filled
/// (something written, then no space left).
fn fill(file: &Path) -> bool {
    use std::io::Write;
    let Ok(mut f) = std::fs::File::create(file) else {
        return false;
    };
    let mut written = 0usize;
    for chunk in [65536usize, 4096, 1] {
        let block = vec![0u8; chunk];
        loop {
            match f.write(&block) {
                Ok(0) => break,
                Ok(n) => written += n,
                Err(e) if e.kind() == std::io::ErrorKind::StorageFull => break,
                Err(_) => return false,
            }
        }
    }
    let _ = f.sync_all();
    written > 0 && f.write(&[0]).is_err()
}

fn rand_suffix() -> usize {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() as usize)
}

/// Ids a `read_committed` (or `read_uncommitted`) reader sees in `topic` (empty while the
/// topic does not exist or the broker does not answer within 10 s).
fn kcat_ids(brokers: &str, topic: &str, committed: bool) -> BTreeMap<i64, usize> {
    let isolation = if committed {
        "isolation.level=read_committed"
    } else {
        "isolation.level=read_uncommitted"
    };
    let out = Command::new("timeout")
        .args(["10", "kcat", "-C", "-b", brokers, "-t", topic])
        .args(["-o", "beginning", "-e", "-q", "-X", isolation, "-f", "%s\n"])
        .stderr(Stdio::null())
        .output();
    match out {
        Ok(out) => ids(&String::from_utf8_lossy(&out.stdout)),
        Err(_) => BTreeMap::new(),
    }
}
