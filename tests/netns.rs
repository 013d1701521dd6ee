//! Many hosts for real: a 3-process cluster in 3 network namespaces with their own addresses
//! (`scripts/netns.sh`), reading from a broker on the bridge, with one host cut off mid-run.
//! The other hosts notice the silence (`runtime.peer_timeout_ms`), their supervisors restart
//! them, the cluster re-forms when the host is back, resumes from the shared checkpoint
//! directory, and the output holds every frame exactly once.
//!
//! A second test loses the host of process 0 with its disk and brings that process back on
//! another host: the cluster resumes from checkpoints on an object store (s3proxy on the
//! bridge) and a read_committed reader of the results topic finds every frame once.
//!
//! Needs root and network namespaces, so both are `#[ignore = "needs netns: …"]`: a plain
//! `cargo test` lists them as ignored, with why. scripts/test.sh runs them (`--ignored`)
//! wherever `scripts/netns.sh check` passes, and fails as root when namespaces work but they
//! did not run. Run by hand where namespaces do not work, they fail saying so.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::*;

const BROKER_HOST: &str = "10.77.0.1";
const BROKER_PORT: &str = "19292";
const S3_PORT: &str = "19392";

/// Both tests use the same namespaces and bridge: one at a time.
static NAMESPACES: Mutex<()> = Mutex::new(());

/// The namespaces, the bridge and the broker's address on it are the machine's, not this test
/// run's: one test at a time in this process (the mutex) and across the machine's test runs
/// (two clones' scripts/test.sh: `scripts/netns.sh up` tears down what is there), through a
/// file lock. Both are held until the guard is dropped.
fn namespaces() -> (std::sync::MutexGuard<'static, ()>, std::fs::File) {
    let guard = NAMESPACES.lock().unwrap_or_else(|e| e.into_inner());
    let path = std::env::temp_dir().join("riffle-netns.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("opening {}: {e}", path.display()));
    file.lock()
        .unwrap_or_else(|e| panic!("locking {}: {e}", path.display()));
    (guard, file)
}

fn script(name: &str) -> PathBuf {
    repo().join("scripts").join(name)
}

fn sh(cmd: &Path, args: &[&str], env: &[(&str, &str)]) {
    let out = Command::new(cmd)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{} {args:?}: {}{}",
        cmd.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Tears the namespaces and the test's broker down, however the test ends.
struct Network;

impl Drop for Network {
    fn drop(&mut self) {
        let _ = Command::new(script("kafka.sh"))
            .arg("stop")
            .env("RIFFLE_KAFKA_HOST", BROKER_HOST)
            .env("RIFFLE_KAFKA_PORT", BROKER_PORT)
            .output();
        let _ = Command::new(script("s3.sh"))
            .arg("stop")
            .env("RIFFLE_S3_HOST", BROKER_HOST)
            .env("RIFFLE_S3_PORT", S3_PORT)
            .output();
        let _ = Command::new(script("netns.sh")).arg("down").output();
    }
}

/// A host's supervisor: runs process `i` in namespace `rf-h<i>` until it exits cleanly;
/// returns the exit codes of its attempts.
fn supervise(i: usize, pipeline: PathBuf, hosts: PathBuf, log: PathBuf) -> Vec<i32> {
    let host = Host {
        process: i,
        namespace: i,
        dir: None,
        env: Vec::new(),
        lost: None,
    };
    host.supervise(pipeline, hosts, log)
}

/// Where a supervisor runs its process: the namespace ("host"), a working directory of the
/// host's own, environment, and a flag that says the host is gone (no more restarts).
struct Host {
    process: usize,
    namespace: usize,
    dir: Option<PathBuf>,
    env: Vec<(String, String)>,
    lost: Option<Arc<AtomicBool>>,
}

impl Host {
    fn supervise(&self, pipeline: PathBuf, hosts: PathBuf, log: PathBuf) -> Vec<i32> {
        let mut codes = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(240);
        while Instant::now() < deadline && codes.len() < 10 {
            let mut command = Command::new("ip");
            command
                .args(["netns", "exec", &format!("rf-h{}", self.namespace)])
                .arg(env!("CARGO_BIN_EXE_riffle"))
                .args(["run", "-q"])
                .arg(&pipeline)
                .arg("--hostfile")
                .arg(&hosts)
                .args(["--process", &self.process.to_string()])
                .env("RUST_LOG", "warn,riffle_dataflow=info")
                .env("RUST_BACKTRACE", "0")
                .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
            if let Some(dir) = &self.dir {
                std::fs::create_dir_all(dir).unwrap();
                command.current_dir(dir);
            }
            let out = command.output().unwrap();
            let mut text = std::fs::read_to_string(&log).unwrap_or_default();
            text.push_str(&String::from_utf8_lossy(&out.stderr));
            std::fs::write(&log, text).unwrap();
            let code = out.status.code().unwrap_or(-1);
            codes.push(code);
            if code == 0 || self.lost.as_ref().is_some_and(|l| l.load(Ordering::SeqCst)) {
                break;
            }
            thread::sleep(Duration::from_millis(300));
        }
        codes
    }
}

/// Fails, saying why, unless network namespaces work here.
fn require_netns() {
    let out = Command::new(repo().join("scripts/netns.sh"))
        .arg("check")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "this test needs root and network namespaces (`scripts/netns.sh check` fails here: {})",
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

#[test]
#[ignore = "needs netns: root and network namespaces (scripts/netns.sh check); scripts/test.sh runs it where they work"]
fn a_host_cut_off_mid_run_rejoins_and_the_output_is_exactly_once() {
    // Under the locks: the namespaces and the bridge are the machine's.
    let _namespaces = namespaces();
    require_netns();
    require_onnx_runtime();
    sh(&script("netns.sh"), &["up"], &[]);
    let _network = Network;
    sh(
        &script("kafka.sh"),
        &["start"],
        &[
            ("RIFFLE_KAFKA_HOST", BROKER_HOST),
            ("RIFFLE_KAFKA_PORT", BROKER_PORT),
        ],
    );
    let brokers = format!("{BROKER_HOST}:{BROKER_PORT}");
    let tmp = tempfile::tempdir().unwrap();
    let frames = frames_subset(tmp.path(), "street", 0..150);
    riffle_ok(&[
        "produce",
        "--brokers",
        &brokers,
        "--topic",
        "netns-in",
        "--partitions",
        "3",
        "--frames",
        frames.to_str().unwrap(),
        "--cameras",
        "3",
    ]);
    // The checkpoint directory and the results file stand for a shared volume (NFS/EFS).
    let out = tmp.path().join("out.jsonl");
    let pipeline = write(
        tmp.path(),
        "hosts.yaml",
        &common::kafka::detection_from_kafka(
            &brokers,
            "netns-in",
            4,
            Some(12),
            &format!(
                "sink: {{ jsonl: {{ path: \"{}\" }} }}\n\
                 runtime: {{ workers: 1, epoch_records: 4, peer_timeout_ms: 3000, checkpoint: {{ dir: \"{}\" }} }}",
                out.display(),
                tmp.path().join("ckpt").display()
            ),
        ),
    );
    let hosts = write(
        tmp.path(),
        "hosts.txt",
        "10.77.0.10:7800\n10.77.0.11:7800\n10.77.0.12:7800\n",
    );
    let supervisors: Vec<_> = (0..3)
        .map(|i| {
            let (p, h) = (pipeline.clone(), hosts.clone());
            let log = tmp.path().join(format!("host{i}.log"));
            thread::spawn(move || supervise(i, p, h, log))
        })
        .collect();
    // Mid-run: once the first results are written (the sources are paced, so the rest take
    // seconds more), host 2's process dies and its host drops off the network.
    let started = std::time::Instant::now();
    let mut before = read_jsonl_lines(&out);
    while before < 20 && started.elapsed() < Duration::from_secs(120) {
        thread::sleep(Duration::from_millis(50));
        before = read_jsonl_lines(&out);
    }
    assert!(
        before > 0 && before < 150,
        "cut mid-run: {before} results so far"
    );
    let pids = Command::new("ip")
        .args(["netns", "pids", "rf-h2"])
        .output()
        .unwrap();
    for pid in String::from_utf8_lossy(&pids.stdout).split_whitespace() {
        let _ = Command::new("kill").args(["-9", pid]).status();
    }
    sh(&script("netns.sh"), &["cut", "2"], &[]);
    thread::sleep(Duration::from_secs(6));
    sh(&script("netns.sh"), &["heal", "2"], &[]);
    let codes: Vec<Vec<i32>> = supervisors.into_iter().map(|s| s.join().unwrap()).collect();
    let logs: Vec<String> = (0..3)
        .map(|i| {
            std::fs::read_to_string(tmp.path().join(format!("host{i}.log"))).unwrap_or_default()
        })
        .collect();
    for (i, c) in codes.iter().enumerate() {
        assert_eq!(
            c.last(),
            Some(&0),
            "host {i} finished: attempts {c:?}\n{}",
            logs[i]
        );
        assert!(c.len() >= 2, "host {i} was restarted: attempts {c:?}");
    }
    for i in [0, 1] {
        // Usually the peer timeout notices the silence; on a loaded machine the connection to
        // host 2 may fail first (its supervisor restarting it as the cut lands): both are the
        // host noticing, which is what is checked.
        assert!(
            logs[i].contains("has been silent") || logs[i].contains("cluster connection lost"),
            "host {i} noticed host 2 was gone:\n{}",
            logs[i]
        );
    }
    let got = camera_frames(&out);
    let expected = split_cameras("street", 150, 3);
    assert_eq!(got.len(), expected.len(), "every frame exactly once");
    assert_eq!(got, expected);
}

fn read_jsonl_lines(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .map(|t| t.lines().count())
        .unwrap_or(0)
}

/// Every message value of `topic` that a read_committed kcat (Debian's, an independent
/// client) reads.
fn kcat_committed(brokers: &str, topic: &str) -> String {
    let out = kcat_read_committed(brokers, topic);
    assert!(
        out.status.success(),
        "kcat: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn kcat_read_committed(brokers: &str, topic: &str) -> std::process::Output {
    Command::new("kcat")
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
        .output()
        .expect("kcat (Debian package `kcat`; scripts/test.sh installs it)")
}

/// Results committed so far; none while the sink has not created its topic yet.
fn committed_so_far(brokers: &str, topic: &str) -> usize {
    let out = kcat_read_committed(brokers, topic);
    if out.status.success() {
        String::from_utf8_lossy(&out.stdout).lines().count()
    } else {
        0
    }
}

fn frames_of(text: &str) -> Vec<(String, i64)> {
    let mut got: Vec<(String, i64)> = text
        .lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("kcat: not a result ({e}): {line:?}"));
            (
                v["camera_id"].as_str().unwrap().to_string(),
                v["frame"].as_i64().unwrap(),
            )
        })
        .collect();
    got.sort();
    got
}

/// The S3 settings of `scripts/s3.sh env` for the server on the bridge.
fn s3_env() -> Vec<(String, String)> {
    let out = Command::new(script("s3.sh"))
        .arg("env")
        .env("RIFFLE_S3_HOST", BROKER_HOST)
        .env("RIFFLE_S3_PORT", S3_PORT)
        .output()
        .unwrap();
    assert!(out.status.success(), "scripts/s3.sh env");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.trim().strip_prefix("export "))
        .flat_map(|l| l.split_whitespace().map(str::to_string).collect::<Vec<_>>())
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            Some((k.to_string(), v.trim_matches(['"', '\'']).to_string()))
        })
        .collect()
}

#[test]
#[ignore = "needs netns: root and network namespaces (scripts/netns.sh check); scripts/test.sh runs it where they work"]
fn the_host_of_process_0_lost_with_its_disk_comes_back_elsewhere_and_resumes_from_the_object_store()
{
    // Under the locks: the namespaces and the bridge are the machine's.
    let _namespaces = namespaces();
    require_netns();
    require_onnx_runtime();
    sh(&script("netns.sh"), &["up"], &[]);
    let _network = Network;
    let on_bridge = [
        ("RIFFLE_KAFKA_HOST", BROKER_HOST),
        ("RIFFLE_KAFKA_PORT", BROKER_PORT),
    ];
    sh(&script("kafka.sh"), &["start"], &on_bridge);
    sh(
        &script("s3.sh"),
        &["start"],
        &[("RIFFLE_S3_HOST", BROKER_HOST), ("RIFFLE_S3_PORT", S3_PORT)],
    );
    let env = s3_env();
    let var = |name: &str| {
        env.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("scripts/s3.sh env names {name}: {env:?}"))
    };
    let bucket = var("RIFFLE_S3_BUCKET");
    let brokers = format!("{BROKER_HOST}:{BROKER_PORT}");
    let tmp = tempfile::tempdir().unwrap();
    let frames = frames_subset(tmp.path(), "street", 0..150);
    riffle_ok(&[
        "produce",
        "--brokers",
        &brokers,
        "--topic",
        "lost-in",
        "--partitions",
        "3",
        "--frames",
        frames.to_str().unwrap(),
        "--cameras",
        "3",
    ]);
    // Nothing is shared between the hosts but the network: checkpoints on the object store,
    // results in a transactional topic, each host's own files in its own directory.
    let prefix = format!("lost-host-{}", std::process::id());
    let pipeline = write(
        tmp.path(),
        "lost.yaml",
        &common::kafka::detection_from_kafka(
            &brokers,
            "lost-in",
            4,
            Some(12),
            &format!(
                "sink: {{ kafka: {{ brokers: \"{brokers}\", topic: lost-out, key: camera_id, partitions: 2, exactly_once: transactions }} }}\n\
                 dead_letter: {{ jsonl: {{ path: dead.jsonl }} }}\n\
                 runtime: {{ workers: 1, epoch_records: 4, peer_timeout_ms: 3000, checkpoint: {{ url: \"s3://{bucket}/{prefix}\", interval_ms: 300, lease_s: 3 }} }}"
            ),
        ),
    );
    let hosts = write(
        tmp.path(),
        "hosts.txt",
        "10.77.0.10:7800\n10.77.0.11:7800\n10.77.0.12:7800\n",
    );
    let dirs: Vec<PathBuf> = (0..4)
        .map(|h| tmp.path().join(format!("host{h}")))
        .collect();
    let lost = Arc::new(AtomicBool::new(false));
    let start = |process: usize, namespace: usize, lost: Option<Arc<AtomicBool>>| {
        let host = Host {
            process,
            namespace,
            dir: Some(dirs[namespace].clone()),
            env: env.clone(),
            lost,
        };
        let (p, h) = (pipeline.clone(), hosts.clone());
        let log = tmp.path().join(format!("host{namespace}.log"));
        thread::spawn(move || host.supervise(p, h, log))
    };
    let first = start(0, 0, Some(lost.clone()));
    let others: Vec<_> = (1..3).map(|i| start(i, i, None)).collect();
    // Mid-run: once results are committed (so a checkpoint exists on the store) and well
    // before the paced input ends, host 0 dies with its disk.
    let started = Instant::now();
    let mut before = 0;
    while before < 20 && started.elapsed() < Duration::from_secs(120) {
        thread::sleep(Duration::from_millis(200));
        before = committed_so_far(&brokers, "lost-out");
    }
    assert!(
        before > 0 && before < 150,
        "host 0 is lost mid-run: {before} results committed so far"
    );
    lost.store(true, Ordering::SeqCst);
    let pids = Command::new("ip")
        .args(["netns", "pids", "rf-h0"])
        .output()
        .unwrap();
    let pids = String::from_utf8_lossy(&pids.stdout).into_owned();
    assert!(!pids.trim().is_empty(), "host 0 was running its process");
    for pid in pids.split_whitespace() {
        let _ = Command::new("kill").args(["-9", pid]).status();
    }
    sh(&script("netns.sh"), &["cut", "0"], &[]);
    let codes0 = first.join().unwrap();
    std::fs::remove_dir_all(&dirs[0]).unwrap();
    // Process 0 comes back on host 3, at another address.
    std::fs::write(
        &hosts,
        "10.77.0.13:7800\n10.77.0.11:7800\n10.77.0.12:7800\n",
    )
    .unwrap();
    let replacement = start(0, 3, None);
    let codes3 = replacement.join().unwrap();
    let codes: Vec<Vec<i32>> = others.into_iter().map(|s| s.join().unwrap()).collect();
    let log = |h: usize| {
        std::fs::read_to_string(tmp.path().join(format!("host{h}.log"))).unwrap_or_default()
    };
    assert_ne!(
        codes0.last(),
        Some(&0),
        "host 0's process was killed: {codes0:?}"
    );
    assert_eq!(
        codes3.last(),
        Some(&0),
        "process 0 on host 3: {codes3:?}\n{}",
        log(3)
    );
    assert!(
        log(3).contains("resuming from checkpoint"),
        "process 0 resumed from the object store:\n{}",
        log(3)
    );
    for (i, c) in codes.iter().enumerate() {
        assert_eq!(c.last(), Some(&0), "host {}: {c:?}\n{}", i + 1, log(i + 1));
    }
    assert!(!dirs[0].exists(), "host 0's disk stayed lost");
    let got = frames_of(&kcat_committed(&brokers, "lost-out"));
    let expected = split_cameras("street", 150, 3);
    assert_eq!(got.len(), expected.len(), "every frame exactly once");
    assert_eq!(got, expected);
}
