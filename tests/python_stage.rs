//! `python:` stages from the CLI: the embedded interpreter, with the active virtual
//! environment's pyarrow (`VIRTUAL_ENV`; scripts/test.sh makes one). A function reshapes
//! batches, its exceptions become dead letters with the traceback's last line, its output
//! schema is learnt at validation, and a `kill -9` under it with checkpoints loses and repeats
//! nothing.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;

/// Keeps the even frames, labelled `camera#frame`; with `UDF_RAISE`, raises for the batch
/// holding frame 40 of bikes-1; sleeps `UDF_SLEEP` seconds per call.
const UDF: &str = r##"
import os
import time

import pyarrow as pa
import pyarrow.compute as pc


def even_frames(batch):
    time.sleep(float(os.environ.get("UDF_SLEEP", "0")))
    frames = batch["frame"].to_pylist()
    if os.environ.get("UDF_RAISE") and "bikes-1" in batch["camera_id"].to_pylist() and 40 in frames:
        raise ValueError(f"frame 40 is not allowed ({len(frames)} rows)")
    keep = batch.filter(pc.equal(pc.bit_wise_and(batch["frame"], 1), 0))
    label = pc.binary_join_element_wise(keep["camera_id"], pc.cast(keep["frame"], pa.string()), "#")
    return pa.RecordBatch.from_arrays(
        [keep["camera_id"], keep["frame"], label], names=["camera_id", "frame", "label"]
    )
"##;

const FRAMES: i64 = 60;

/// `stage` adds keys to the `python:` stage, `runtime` to `runtime:`.
fn pipeline(tmp: &Path, stage: &str, runtime: &str) -> PathBuf {
    write(tmp, "udf.py", UDF);
    write(
        tmp,
        "p.yaml",
        &format!(
            r#"
source: {{ video: {{ glob: "{videos}/*.mp4", batch_size: 4, max_frames: {FRAMES} }} }}
stages:
  - select: {{ columns: [camera_id, frame] }}
  - python: {{ path: udf.py, function: even_frames{stage} }}
sink: {{ jsonl: {{ path: out.jsonl }} }}
runtime: {{ workers: 2, epoch_records: 16{runtime} }}
"#,
            videos = repo().join("data/videos").display()
        ),
    )
}

fn labels(out: &Path) -> Vec<String> {
    read_jsonl(out)
        .iter()
        .map(|r| r["label"].as_str().unwrap().to_string())
        .collect()
}

/// Every camera's even frames, as the function labels them.
fn expected() -> BTreeSet<String> {
    (0..4)
        .flat_map(|c| {
            (0..FRAMES)
                .step_by(2)
                .map(move |f| format!("bikes-{c}#{f}"))
        })
        .collect()
}

#[test]
#[ignore = "needs python: an interpreter with pyarrow in VIRTUAL_ENV (scripts/test.sh makes one)"]
fn a_python_stage_reshapes_batches_and_its_exceptions_become_dead_letters() {
    let tmp = tempfile::tempdir().unwrap();
    let p = pipeline(tmp.path(), "", ", max_dead_letter_ratio: 0.5");

    // The output schema is learnt by calling the function with no rows.
    let valid = riffle_ok(&["validate", p.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&valid.stdout);
    assert!(
        text.contains("after python       camera_id: Utf8, frame: Int64, label: Utf8"),
        "{text}"
    );

    riffle_ok_env(&["run", "-q", p.to_str().unwrap()], &[("UDF_RAISE", "1")]);
    let letters = read_jsonl(&tmp.path().join("out.dead-letters.jsonl"));
    assert!(!letters.is_empty(), "the exception landed");
    let mut lost = BTreeSet::new();
    for letter in &letters {
        assert_eq!(letter["stage"], "python", "{letter}");
        let reason = letter["reason"].as_str().unwrap();
        assert!(
            reason.contains("ValueError: frame 40 is not allowed"),
            "the traceback's last line: {reason}"
        );
        let record: serde_json::Value =
            serde_json::from_str(letter["record"].as_str().unwrap()).unwrap();
        lost.insert(format!(
            "{}#{}",
            record["camera_id"].as_str().unwrap(),
            record["frame"]
        ));
    }
    assert!(lost.contains("bikes-1#40"), "{lost:?}");
    // Only the failing batch's rows: every other even frame came through, once.
    let got = labels(&tmp.path().join("out.jsonl"));
    let unique: BTreeSet<String> = got.iter().cloned().collect();
    assert_eq!(unique.len(), got.len(), "no duplicates");
    let missing: BTreeSet<String> = expected().difference(&unique).cloned().collect();
    assert!(
        !missing.is_empty() && missing.iter().all(|m| lost.contains(m)),
        "missing {missing:?}, dead letters {lost:?}"
    );
    assert!(letters.len() <= 8, "{} dead letters", letters.len());
}

#[test]
fn a_function_the_file_does_not_define_names_the_file_and_field() {
    let tmp = tempfile::tempdir().unwrap();
    write(
        tmp.path(),
        "udf.py",
        "def other(batch):\n    return batch\n",
    );
    let p = write(
        tmp.path(),
        "p.yaml",
        r#"
source: { csv: { path: in.csv } }
stages:
  - python: { path: udf.py, function: rule }
sink: { stdout: {} }
"#,
    );
    write(tmp.path(), "in.csv", "a\n1\n");
    let out = riffle(&["validate", p.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("p.yaml:4")
            && stderr.contains("python.function")
            && stderr.contains("defines no `rule`"),
        "{stderr}"
    );

    // A syntax error in the file is the `path`'s, with Python's reason.
    write(tmp.path(), "udf.py", "def rule(batch:\n");
    let out = riffle(&["validate", p.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("python.path") && stderr.contains("SyntaxError"),
        "{stderr}"
    );
}

#[test]
#[ignore = "needs python: an interpreter with pyarrow in VIRTUAL_ENV (scripts/test.sh makes one)"]
fn kill_9_under_a_python_stage_then_restart_is_exactly_once() {
    let tmp = tempfile::tempdir().unwrap();
    // Merged calls (`batch:`) take rows of one epoch only, so a checkpoint covers whole calls.
    let p = pipeline(
        tmp.path(),
        ", batch: { max_size: 8, max_delay_ms: 20 }",
        ", checkpoint: { dir: ckpt, interval_ms: 300 }",
    );
    let out = tmp.path().join("out.jsonl");
    let ckpt = tmp.path().join("ckpt");
    let mut run = std::process::Command::new(env!("CARGO_BIN_EXE_riffle"))
        .args(["run", "-q", p.to_str().unwrap()])
        .env("UDF_SLEEP", "0.1")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let checkpointed = || {
        std::fs::read_dir(&ckpt).is_ok_and(|d| {
            d.flatten()
                .any(|e| e.file_name().to_string_lossy().ends_with(".ckpt"))
        })
    };
    // Whole lines only: the kill may come mid-write.
    let lines = || std::fs::read_to_string(&out).map_or(0, |t| t.matches('\n').count());
    while !(checkpointed() && lines() >= 10) {
        assert!(
            run.try_wait().unwrap().is_none(),
            "the run ended before the kill"
        );
        assert!(
            Instant::now() < deadline,
            "no checkpoint and results in 60 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    run.kill().unwrap(); // SIGKILL
    run.wait().unwrap();
    let at_kill = lines();
    assert!(
        at_kill < expected().len(),
        "the kill landed mid-run: {at_kill} of {} results written",
        expected().len()
    );

    let restart = riffle_ok_env(&["run", "-q", p.to_str().unwrap()], &[("RUST_LOG", "info")]);
    let log = String::from_utf8_lossy(&restart.stderr);
    assert!(log.contains("resuming from checkpoint"), "{log}");
    let got = labels(&out);
    let unique: BTreeSet<String> = got.iter().cloned().collect();
    assert_eq!(unique.len(), got.len(), "nothing repeated");
    assert_eq!(unique, expected(), "nothing lost");
}

#[test]
#[ignore = "needs python: an interpreter with pyarrow in VIRTUAL_ENV (scripts/test.sh makes one)"]
fn the_tracks_alerts_example_raises_alerts_only_for_tracked_people_near_the_camera() {
    require_onnx_runtime();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("alerts.jsonl");
    let p = repo().join("pipelines/camera-tracks-alerts.yaml");
    riffle_ok(&["validate", p.to_str().unwrap()]);
    run_quietly(&p, &out);
    let alerts = read_jsonl(&out);
    assert!(
        !alerts.is_empty(),
        "the bundled frames have people near the camera"
    );
    let mut frames = BTreeSet::new();
    for a in &alerts {
        let feet = a["feet_y"].as_f64().unwrap();
        let height = a["frame_height"].as_f64().unwrap();
        assert!(a["track_id"].as_i64().is_some(), "{a}");
        assert!(feet >= 0.75 * height - 1e-3, "{a}");
        frames.insert((a["camera_id"].to_string(), a["frame"].as_i64().unwrap()));
    }
    // Several cameras' frames, not one batch repeated.
    assert!(frames.len() > 10, "{frames:?}");
}

/// Imported by the CLI's validation on the main thread at once; by each worker (another
/// thread) only after noting it in `UDF_LOADING` and sleeping 60 s: a stage that takes
/// minutes to build, as a large model does.
const SLOW_IMPORT: &str = r##"
import os
import threading
import time

if threading.current_thread() is not threading.main_thread():
    open(os.environ["UDF_LOADING"], "a").close()
    time.sleep(60)


def same(batch):
    return batch
"##;

#[test]
#[ignore = "needs python: an interpreter with pyarrow in VIRTUAL_ENV (scripts/test.sh makes one)"]
fn sigterm_while_the_workers_load_their_stages_ends_the_run_cleanly() {
    let tmp = tempfile::tempdir().unwrap();
    write(tmp.path(), "slow.py", SLOW_IMPORT);
    let p = write(
        tmp.path(),
        "p.yaml",
        &format!(
            r#"
source: {{ video: {{ glob: "{videos}/*.mp4", batch_size: 4, max_frames: 8 }} }}
stages:
  - select: {{ columns: [camera_id, frame] }}
  - python: {{ path: slow.py, function: same }}
sink: {{ jsonl: {{ path: out.jsonl }} }}
runtime: {{ workers: 2 }}
"#,
            videos = repo().join("data/videos").display()
        ),
    );
    let loading = tmp.path().join("loading");
    let mut run = std::process::Command::new(env!("CARGO_BIN_EXE_riffle"))
        .args(["run", "-q", p.to_str().unwrap()])
        .env("UDF_LOADING", &loading)
        .env("RUST_LOG", "warn")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !loading.exists() {
        assert!(
            run.try_wait().unwrap().is_none(),
            "the run ended before its workers loaded the stage"
        );
        assert!(Instant::now() < deadline, "no worker loading in 60 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: kill(2) on our own child, not yet waited for.
    assert_eq!(
        unsafe { libc::kill(run.id() as libc::pid_t, libc::SIGTERM) },
        0
    );
    let signalled = Instant::now();
    let status = loop {
        if let Some(s) = run.try_wait().unwrap() {
            break s;
        }
        assert!(
            signalled.elapsed() < Duration::from_secs(40),
            "exits within 40 s of SIGTERM (the import sleeps 60 s)"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut run.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(
        status.success(),
        "a stop before reading exits 0, not {status}: {stderr}"
    );
    // The stop landed while a worker was in the import, not after it.
    assert!(
        stderr.contains("stopped on request before reading anything"),
        "{stderr}"
    );
    let written = std::fs::read_to_string(tmp.path().join("out.jsonl")).unwrap_or_default();
    assert_eq!(written, "", "nothing was read, so nothing is written");
}
