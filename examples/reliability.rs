//! Reliability trials (not a test: it counts outcomes instead of stopping at the first bad
//! one). `scripts/reliability.sh` runs it with a broker and writes docs/reliability.md.
//!
//!     RIFFLE_BIN=target/release/riffle cargo run --release --example reliability -- BROKERS [TRIALS]
//!
//! Each kind of trial runs TRIALS times (default 10) at moments drawn from a printed seed and
//! prints one table row: tries, clean (every record exactly once, exit 0, no orphan process),
//! panics, hangs (no end within the time limit, or a process left behind), lost and duplicated
//! records (summed over the tries).
//! - kill -9 of the supervisor at a random moment, then the same command again;
//! - kill -9 of one worker process at a random moment (the supervisor restarts the cluster);
//! - the checkpoints' disk filling up mid-run, then the same command once there is space
//!   (needs root for a tmpfs; skipped with a line otherwise);
//! - the broker crashing and restarting under a Kafka → Kafka exactly-once run (fewer tries:
//!   each takes a minute), counted from what a `read_committed` kcat reads.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

const RECORDS: usize = 240;
const LIMIT: Duration = Duration::from_secs(180);

#[derive(Default)]
struct Row {
    tries: usize,
    clean: usize,
    panics: usize,
    hangs: usize,
    lost: usize,
    duplicated: usize,
}

impl Row {
    fn print(&self, what: &str) {
        println!(
            "| {what} | {} | {} | {} | {} | {} | {} |",
            self.tries, self.clean, self.panics, self.hangs, self.lost, self.duplicated
        );
    }
}

/// What one trial ended with.
struct Outcome {
    ok: bool,
    panicked: bool,
    hung: bool,
    counts: BTreeMap<i64, usize>,
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
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos() as u64
        | 1;
    eprintln!("seed {seed}");
    let mut rng = Rng(seed);
    let tmp = tempfile::tempdir()?;
    let topic = id_topic(&riffle, &brokers, tmp.path())?;
    println!("| trial | tries | clean | panics | hangs | lost | duplicated |");
    println!("|---|---:|---:|---:|---:|---:|---:|");

    let dir = |kind: &str, trial: usize| tmp.path().join(format!("{kind}{trial}"));
    rows(
        "`kill -9` of the supervisor, then the same command",
        trials,
        |t| supervisor_kill(&riffle, &brokers, &topic, &dir("supervisor", t), &mut rng),
    )?;
    rows(
        "`kill -9` of a worker process (the supervisor restarts the cluster)",
        trials,
        |t| worker_kill(&riffle, &brokers, &topic, &dir("worker", t), &mut rng),
    )?;
    if tmpfs_allowed() {
        rows(
            "the checkpoints' disk full mid-run, then the same command",
            trials.div_ceil(3),
            |t| disk_full(&riffle, &brokers, &topic, &dir("disk", t)),
        )?;
    } else {
        eprintln!("no tmpfs (needs root): the disk-full trials are left out");
    }
    rows(
        "the broker crashes and restarts (Kafka → Kafka, exactly-once)",
        trials.div_ceil(5),
        |t| broker_restart(&riffle, &brokers, &topic, &dir("broker", t)),
    )?;
    Ok(())
}

/// Runs `tries` trials of one kind and prints their row.
fn rows(what: &str, tries: usize, mut trial: impl FnMut(usize) -> Result<Outcome>) -> Result<()> {
    let mut row = Row::default();
    for t in 0..tries {
        tally(&mut row, trial(t)?);
    }
    row.print(what);
    Ok(())
}

fn tally(row: &mut Row, o: Outcome) {
    row.tries += 1;
    let lost = (0..RECORDS as i64)
        .filter(|i| !o.counts.contains_key(i))
        .count();
    let duplicated: usize = o.counts.values().map(|&c| c.saturating_sub(1)).sum();
    row.lost += lost;
    row.duplicated += duplicated;
    row.panics += usize::from(o.panicked);
    row.hangs += usize::from(o.hung);
    if o.ok && !o.panicked && !o.hung && lost == 0 && duplicated == 0 {
        row.clean += 1;
    }
}

/// A topic of `RECORDS` JSON records `{id, value}` in 2 partitions.
fn id_topic(riffle: &Path, brokers: &str, tmp: &Path) -> Result<String> {
    let mut csv = String::from("id,value\n");
    for i in 0..RECORDS {
        csv.push_str(&format!("{i},{}.5\n", i % 7));
    }
    let file = tmp.join("ids.csv");
    std::fs::write(&file, csv)?;
    let topic = format!("reliability-{}", std::process::id());
    let out = Command::new(riffle)
        .args(["produce", "--brokers", brokers, "--topic", &topic])
        .args(["--partitions", "2", "--csv"])
        .arg(&file)
        .output()?;
    if !out.status.success() {
        bail!("producing: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(topic)
}

/// Kafka → JSON lines with checkpoints, paced to read for about 3 s.
fn pipeline(dir: &Path, brokers: &str, topic: &str, sink: &str) -> Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let file = dir.join("ids.yaml");
    std::fs::write(
        &file,
        format!(
            "source: {{ kafka: {{ brokers: \"{brokers}\", topic: {topic}, format: json, stop_at_end: true, batch_size: 8, max_records_per_second: 40, options: {{ queued.max.messages.kbytes: \"64\" }} }} }}\n\
             stages:\n  - select: {{ columns: [id, value] }}\n\
             sink: {sink}\n\
             runtime: {{ workers: 1, epoch_records: 8, checkpoint: {{ dir: ckpt, interval_ms: 200 }} }}\n"
        ),
    )?;
    Ok(file)
}

fn start(riffle: &Path, pipeline: &Path, extra: &[&str]) -> Result<Child> {
    Ok(Command::new(riffle)
        .args(["run", "-q"])
        .arg(pipeline)
        .args([
            "--processes",
            "2",
            "--base-port",
            &free_port_pair().to_string(),
        ])
        .args(extra)
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?)
}

/// Waits for `child` up to `LIMIT`: (exited successfully, stderr said "panicked", hung).
fn finish(mut child: Child) -> Result<(bool, bool, bool)> {
    let mut stderr = child.stderr.take().context("stderr")?;
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if started.elapsed() > LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = reader.join().unwrap_or_default();
    Ok((
        status.is_some_and(|s| s.success()),
        text.contains("panicked"),
        status.is_none(),
    ))
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

/// Each id's count in `out`; a line that is not a whole record counts as a lost one.
fn id_counts(out: &Path) -> BTreeMap<i64, usize> {
    let text = std::fs::read_to_string(out).unwrap_or_default();
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

/// Starts `pipeline` and returns once both processes run and a random moment (0.2–2.7 s) has
/// passed.
fn start_until_a_random_moment(riffle: &Path, pipeline: &Path, rng: &mut Rng) -> Result<Child> {
    let child = start(riffle, pipeline, &[])?;
    wait_until(LIMIT, || worker_pids(pipeline).len() == 2);
    std::thread::sleep(Duration::from_millis(200 + rng.below(2500)));
    Ok(child)
}

fn kill_9(pid: u32) {
    let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
}

fn supervisor_kill(
    riffle: &Path,
    brokers: &str,
    topic: &str,
    dir: &Path,
    rng: &mut Rng,
) -> Result<Outcome> {
    let p = pipeline(dir, brokers, topic, FILE_SINK)?;
    let mut first = start_until_a_random_moment(riffle, &p, rng)?;
    first.kill()?;
    first.wait()?;
    // Processes left behind are a hang: they would write beside the next run.
    let orphans = !wait_until(Duration::from_secs(5), || worker_pids(&p).is_empty());
    worker_pids(&p).into_iter().for_each(kill_9);
    let (ok, panicked, hung) = finish(start(riffle, &p, &[])?)?;
    Ok(Outcome {
        ok,
        panicked,
        hung: hung || orphans,
        counts: id_counts(&dir.join("out.jsonl")),
    })
}

fn worker_kill(
    riffle: &Path,
    brokers: &str,
    topic: &str,
    dir: &Path,
    rng: &mut Rng,
) -> Result<Outcome> {
    let p = pipeline(dir, brokers, topic, FILE_SINK)?;
    let run = start_until_a_random_moment(riffle, &p, rng)?;
    let pids = worker_pids(&p);
    if let Some(&pid) = pids.get(rng.below(pids.len() as u64) as usize) {
        kill_9(pid);
    }
    let (ok, panicked, hung) = finish(run)?;
    Ok(Outcome {
        ok,
        panicked,
        hung,
        counts: id_counts(&dir.join("out.jsonl")),
    })
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

fn disk_full(riffle: &Path, brokers: &str, topic: &str, dir: &Path) -> Result<Outcome> {
    let p = pipeline(dir, brokers, topic, FILE_SINK)?;
    let disk = dir.join("disk");
    std::fs::create_dir_all(&disk)?;
    let status = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=256k", "tmpfs"])
        .arg(&disk)
        .status()?;
    if !status.success() {
        bail!("mounting a tmpfs on {}", disk.display());
    }
    let ckpt = disk.join("ckpt");
    let flags = [
        "--checkpoint-dir",
        ckpt.to_str().unwrap_or_default(),
        "--max-restarts",
        "1",
    ];
    let first = start(riffle, &p, &flags)?;
    let checkpointed = wait_until(LIMIT, || {
        std::fs::read_dir(&ckpt).is_ok_and(|d| {
            d.filter_map(Result::ok)
                .any(|e| e.file_name().to_string_lossy().ends_with(".ckpt"))
        })
    });
    if checkpointed {
        let mut filler = std::fs::File::create(disk.join("filler"))?;
        while std::io::Write::write_all(&mut filler, &[0u8; 4096]).is_ok() {}
    }
    // The full disk must end the first run (with an error), not hang it.
    let (_, first_panicked, first_hung) = finish(first)?;
    let _ = std::fs::remove_file(disk.join("filler"));
    let (ok, panicked, hung) = finish(start(riffle, &p, &flags)?)?;
    let _ = Command::new("umount").arg("-l").arg(&disk).status();
    Ok(Outcome {
        ok,
        panicked: panicked || first_panicked,
        hung: hung || first_hung,
        counts: id_counts(&dir.join("out.jsonl")),
    })
}

fn broker_restart(riffle: &Path, brokers: &str, topic: &str, dir: &Path) -> Result<Outcome> {
    let output = format!("{topic}-out-{}", rand_suffix());
    let sink = format!(
        "{{ kafka: {{ brokers: \"{brokers}\", topic: {output}, partitions: 2, exactly_once: transactions }} }}"
    );
    let p = pipeline(dir, brokers, topic, &sink)?;
    let run = start(riffle, &p, &[])?;
    let committed = || kcat_ids(brokers, &output).values().sum::<usize>();
    wait_until(LIMIT, || committed() > 0);
    let restarted = Command::new("scripts/kafka.sh")
        .arg("restart")
        .stdout(Stdio::null())
        .status()?;
    if !restarted.success() {
        bail!("scripts/kafka.sh restart failed");
    }
    let (ok, panicked, hung) = finish(run)?;
    Ok(Outcome {
        ok,
        panicked,
        hung,
        counts: kcat_ids(brokers, &output),
    })
}

fn rand_suffix() -> usize {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() as usize)
}

/// Ids a `read_committed` reader sees in `topic` (empty while the topic does not exist).
fn kcat_ids(brokers: &str, topic: &str) -> BTreeMap<i64, usize> {
    let out = Command::new("kcat")
        .args([
            "-C",
            "-b",
            brokers,
            "-t",
            topic,
            "-o",
            "beginning",
            "-e",
            "-q",
        ])
        .args(["-X", "isolation.level=read_committed", "-f", "%s\n"])
        .output();
    let mut counts = BTreeMap::new();
    if let Ok(out) = out {
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            if let Some(id) = serde_json::from_str::<serde_json::Value>(line)
                .ok()
                .and_then(|r| r["id"].as_i64())
            {
                *counts.entry(id).or_insert(0) += 1;
            }
        }
    }
    counts
}
