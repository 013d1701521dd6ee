//! One cluster per checkpoint directory and output: a supervisor's processes die with it, and a
//! second run of the same pipeline is refused while the first (or any of its processes) holds
//! the outputs. Needs the test broker (`scripts/kafka.sh start`).

mod common;

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::kafka::{brokers, topic};
use common::*;

/// A topic of `n` JSON records `{id, value}` over 2 partitions.
fn id_topic(tmp: &Path, name: &str, n: usize) -> String {
    let mut csv = String::from("id,value\n");
    for i in 0..n {
        csv.push_str(&format!("{i},{}.5\n", i % 7));
    }
    let csv = write(tmp, &format!("{name}.csv"), &csv);
    let topic = topic(name);
    riffle_ok(&[
        "produce",
        "--brokers",
        &brokers(),
        "--topic",
        &topic,
        "--partitions",
        "2",
        "--csv",
        csv.to_str().unwrap(),
    ]);
    topic
}

/// Kafka → JSON lines with checkpoints, paced to take about `n / 2 / rate` seconds.
fn paced_pipeline(dir: &Path, topic: &str, rate: u32) -> std::path::PathBuf {
    write(
        dir,
        "ids.yaml",
        &format!(
            r#"
source: {{ kafka: {{ brokers: "{brokers}", topic: {topic}, format: json, stop_at_end: true, batch_size: 8, max_records_per_second: {rate} }} }}
stages:
  - select: {{ columns: [id, value] }}
sink: {{ jsonl: {{ path: out.jsonl }} }}
runtime: {{ workers: 1, epoch_records: 8, checkpoint: {{ dir: ckpt }} }}
"#,
            brokers = brokers()
        ),
    )
}

/// `riffle run` of `pipeline` as 2 local processes on a free pair of ports.
fn run_args(pipeline: &Path) -> Vec<String> {
    let port = free_port_pair().to_string();
    let path = pipeline.to_str().unwrap();
    ["run", "-q", path, "--processes", "2", "--base-port", &port]
        .map(String::from)
        .to_vec()
}

fn start(pipeline: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_riffle"))
        .args(run_args(pipeline))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn wait_for(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "{what} within {timeout:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Each id's count in `out`, failing on any line that is not a whole JSON record.
fn id_counts(out: &Path) -> BTreeMap<i64, usize> {
    let text = std::fs::read_to_string(out).unwrap_or_default();
    let mut counts = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let row: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("{}:{}: corrupt line {line:?}: {e}", out.display(), i + 1));
        let id = row["id"]
            .as_i64()
            .unwrap_or_else(|| panic!("{}:{}: no id in {line}", out.display(), i + 1));
        *counts.entry(id).or_insert(0) += 1;
    }
    counts
}

#[test]
fn a_second_run_on_the_same_outputs_is_refused_while_the_first_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let topic = id_topic(tmp.path(), "lock", 200);
    let pipeline = paced_pipeline(tmp.path(), &topic, 40);
    let mut first = start(&pipeline);
    wait_for(
        "the first cluster's processes start",
        Duration::from_secs(30),
        || worker_pids(&pipeline).len() == 2,
    );

    let args = run_args(&pipeline);
    let second = riffle(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success(), "the second run must not start");
    assert!(
        stderr.contains("checkpoint directory")
            && stderr.contains("in use by another riffle run")
            && stderr.contains("riffle.lock"),
        "one clear error naming the checkpoint directory's lock: {stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "one line, no restarts: {stderr}");
    // A single process (no supervisor) is refused the same way.
    let single = riffle(&["run", "-q", pipeline.to_str().unwrap()]);
    assert!(!single.status.success());
    assert!(String::from_utf8_lossy(&single.stderr).contains("in use by another riffle run"));

    assert!(first.wait().unwrap().success(), "the first run finishes");
    let counts = id_counts(&tmp.path().join("out.jsonl"));
    assert_eq!(counts.len(), 200, "every record once");
    assert!(counts.values().all(|&c| c == 1), "no duplicates");
}

#[test]
fn killing_the_supervisor_kills_its_cluster_and_the_same_command_resumes_exactly_once() {
    let mut rng = Rng::seeded("RIFFLE_KILL_SEED");
    let seed = rng.seed;
    let mut next = move || rng.next();
    let tmp = tempfile::tempdir().unwrap();
    let n = 240;
    let topic = id_topic(tmp.path(), "supervisor-kill", n);
    let trials = 10;
    for trial in 0..trials {
        let dir = tmp.path().join(format!("trial{trial}"));
        std::fs::create_dir_all(&dir).unwrap();
        // 2 processes × 60 records/s: about 2 s of reading.
        let pipeline = paced_pipeline(&dir, &topic, 60);
        let out = dir.join("out.jsonl");
        let mut supervisor = start(&pipeline);
        wait_for(
            "the cluster's processes start",
            Duration::from_secs(30),
            || worker_pids(&pipeline).len() == 2,
        );
        // Even trials kill at any moment from the processes' start (before the first write
        // too); odd trials once results are being written, so that half the kills land
        // mid-output however slowly the machine starts the cluster (results seen before the
        // kill, and `written < n` below: the run had not ended).
        if trial % 2 == 1 {
            wait_for(
                &format!("trial {trial}: the first results are written"),
                Duration::from_secs(60),
                || !id_counts(&out).is_empty(),
            );
        }
        let after = Duration::from_millis(next() % if trial % 2 == 1 { 1000 } else { 1800 });
        std::thread::sleep(after);
        assert!(
            supervisor.try_wait().unwrap().is_none(),
            "trial {trial} (seed {seed}): the run was still going when killed at +{after:?}"
        );
        let written = id_counts(&out).len();
        let orphans = worker_pids(&pipeline);
        supervisor.kill().unwrap();
        supervisor.wait().unwrap();
        wait_for(
            &format!("trial {trial}: no process of the killed cluster left ({orphans:?})"),
            Duration::from_secs(5),
            || worker_pids(&pipeline).is_empty(),
        );
        assert!(
            written < n,
            "trial {trial}: the kill landed before the end ({written} of {n} written)"
        );

        // The same command again resumes from the last checkpoint.
        let args = run_args(&pipeline);
        riffle_ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
        let counts = id_counts(&out);
        let missing: Vec<i64> = (0..n as i64).filter(|i| !counts.contains_key(i)).collect();
        let twice: Vec<(&i64, &usize)> = counts.iter().filter(|(_, &c)| c > 1).collect();
        assert!(
            missing.is_empty() && twice.is_empty(),
            "trial {trial} (seed {seed}, killed at +{after:?} with {written} written): \
             missing {missing:?}, duplicated {twice:?}"
        );
        assert_eq!(counts.len(), n, "trial {trial}: only the topic's ids");
    }
}

/// Unmounts the test's tmpfs however the test ends.
struct Mounted(std::path::PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Mounts a small tmpfs for its checkpoints, which needs root: ignored by a plain `cargo test`
/// (listed as ignored, with why), run by scripts/test.sh wherever a tmpfs can be mounted (and
/// scripts/test.sh fails as root when it could be but was not). Run by hand, it fails where
/// the mount does.
#[test]
#[ignore = "needs tmpfs: root, to mount a 256 KB tmpfs under the checkpoints; scripts/test.sh runs it where it can mount one"]
fn a_full_disk_during_checkpoints_is_one_clear_error_and_the_rerun_is_exactly_once() {
    let tmp = tempfile::tempdir().unwrap();
    let n = 200;
    let topic = id_topic(tmp.path(), "disk-full", n);
    let disk = tmp.path().join("disk");
    std::fs::create_dir(&disk).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=256k", "tmpfs"])
        .arg(&disk)
        .status()
        .unwrap();
    assert!(
        mounted.success(),
        "mounting a tmpfs (needs root): run this test where `mount -t tmpfs` works"
    );
    let _mounted = Mounted(disk.clone());
    let pipeline = paced_pipeline(tmp.path(), &topic, 40);
    let ckpt = disk.join("ckpt");
    let mut run_args = run_args(&pipeline);
    run_args.extend(
        [
            "--checkpoint-dir",
            ckpt.to_str().unwrap(),
            "--max-restarts",
            "1",
        ]
        .map(String::from),
    );
    let run_args: Vec<&str> = run_args.iter().map(String::as_str).collect();
    let mut cluster = Command::new(env!("CARGO_BIN_EXE_riffle"))
        .args(&run_args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for("a first checkpoint", Duration::from_secs(60), || {
        std::fs::read_dir(&ckpt).is_ok_and(|d| {
            d.filter_map(Result::ok)
                .any(|e| e.file_name().to_string_lossy().ends_with(".ckpt"))
        })
    });
    // The disk fills up mid-run.
    let mut filler = std::fs::File::create(disk.join("filler")).unwrap();
    let chunk = vec![0u8; 4096];
    while std::io::Write::write_all(&mut filler, &chunk).is_ok() {}
    drop(filler);
    let started = Instant::now();
    let status = cluster.wait().unwrap();
    let mut stderr = String::new();
    cluster
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(!status.success(), "a full disk fails the run: {stderr}");
    assert!(
        stderr.contains("No space left on device") && stderr.contains(ckpt.to_str().unwrap()),
        "the error names the disk and the checkpoint directory: {stderr}"
    );
    assert!(
        !stderr.contains("timed out") && !stderr.contains("panicked"),
        "the disk, not a peer timeout or a panic: {stderr}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "it fails promptly ({:?}): {stderr}",
        started.elapsed()
    );
    // Space again: the same command resumes and every record lands once.
    std::fs::remove_file(disk.join("filler")).unwrap();
    riffle_ok(&run_args);
    let counts = id_counts(&tmp.path().join("out.jsonl"));
    assert_eq!(counts.len(), n, "every record");
    assert!(counts.values().all(|&c| c == 1), "no duplicates");
}

/// A checkpoint file exists in `dir`.
fn has_checkpoint(dir: &Path) -> bool {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .any(|e| e.file_name().to_string_lossy().ends_with(".ckpt"))
        })
        .unwrap_or(false)
}

#[test]
fn sigterm_finishes_the_open_epochs_checkpoints_exits_0_and_the_rerun_goes_on_exactly_once() {
    let tmp = tempfile::tempdir().unwrap();
    let n = 240;
    let topic = id_topic(tmp.path(), "sigterm", n);
    // One process, then a supervised cluster of two (the supervisor passes SIGTERM on).
    for processes in [1, 2] {
        let dir = tmp.path().join(format!("p{processes}"));
        std::fs::create_dir_all(&dir).unwrap();
        let pipeline = paced_pipeline(&dir, &topic, 40);
        let out = dir.join("out.jsonl");
        let args: Vec<String> = if processes == 1 {
            ["run", "-q", pipeline.to_str().unwrap()]
                .map(String::from)
                .to_vec()
        } else {
            run_args(&pipeline)
        };
        let mut run = Command::new(env!("CARGO_BIN_EXE_riffle"))
            .args(&args)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_for(
            &format!("{processes} process(es): results and a checkpoint"),
            Duration::from_secs(30),
            || id_counts(&out).len() >= 16 && has_checkpoint(&dir.join("ckpt")),
        );
        assert!(
            run.try_wait().unwrap().is_none(),
            "still running at the signal"
        );
        // SAFETY: kill(2) on our own child, not yet waited for.
        assert_eq!(
            unsafe { libc::kill(run.id() as libc::pid_t, libc::SIGTERM) },
            0
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(s) = run.try_wait().unwrap() {
                break s;
            }
            assert!(Instant::now() < deadline, "exits within 30 s of SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut stderr = String::new();
        run.stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .unwrap();
        assert!(
            status.success(),
            "{processes}: SIGTERM exits 0, not {status}: {stderr}"
        );
        assert!(
            worker_pids(&pipeline).is_empty(),
            "no process of the stopped run is left"
        );
        let stopped = id_counts(&out);
        assert!(
            stopped.len() < n,
            "{processes}: the stop landed before the end ({} of {n})",
            stopped.len()
        );
        assert!(
            stopped.values().all(|&c| c == 1),
            "no duplicates at the stop"
        );

        // The same command goes on from the last checkpoint, which covers what was written.
        riffle_ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
        let counts = id_counts(&out);
        assert_eq!(counts.len(), n, "{processes}: every record");
        assert!(counts.values().all(|&c| c == 1), "{processes}: each once");
    }
}
