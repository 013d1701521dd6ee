//! Honest outcomes: a run whose records went to dead letters beyond `runtime.max_dead_letter_ratio`
//! (by default: every record) exits 3 with the commonest reasons, and a supervisor does not
//! restart it.

mod common;

use std::path::Path;

use common::*;

/// `good` bundled frames and `bad` files named .jpg that are not pictures, as one camera.
fn frames(tmp: &Path, good: usize, bad: usize) -> std::path::PathBuf {
    let root = frames_subset(tmp, "cam", 0..good);
    for i in 0..bad {
        std::fs::write(
            root.join("cam").join(format!("9{i:03}.jpg")),
            b"not a picture at all",
        )
        .unwrap();
    }
    root
}

fn pipeline(tmp: &Path, frames: &Path, ratio: Option<f64>) -> std::path::PathBuf {
    let ratio = ratio.map_or(String::new(), |r| format!(", max_dead_letter_ratio: {r}"));
    write(
        tmp,
        "p.yaml",
        &format!(
            r#"
source: {{ images: {{ path: "{frames}", batch_size: 2 }} }}
stages:
  - decode: {{}}
  - select: {{ columns: [camera_id, frame, width, height] }}
sink: {{ jsonl: {{ path: out.jsonl }} }}
runtime: {{ workers: 1{ratio} }}
"#,
            frames = frames.display()
        ),
    )
}

#[test]
fn a_run_in_which_every_record_fails_exits_3_with_the_reasons() {
    let tmp = tempfile::tempdir().unwrap();
    let frames = frames(tmp.path(), 0, 6);
    let p = pipeline(tmp.path(), &frames, None);
    let out = riffle(&["run", "-q", p.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("6 of the 6 records read went to dead letters")
            && stderr.contains("commonest reasons: 6 ×"),
        "{stderr}"
    );
    // The dead letters are all there, with their reasons.
    assert_eq!(
        read_jsonl(&tmp.path().join("out.dead-letters.jsonl")).len(),
        6
    );

    // Allowing every record to fail makes the same run a success.
    let p = pipeline(tmp.path(), &frames, Some(1.0));
    riffle_ok(&["run", "-q", p.to_str().unwrap()]);
}

#[test]
fn the_share_of_dead_letters_is_checked_against_the_ratio() {
    let tmp = tempfile::tempdir().unwrap();
    let frames = frames(tmp.path(), 4, 4);
    let strict = pipeline(tmp.path(), &frames, Some(0.25));
    let out = riffle(&["run", "-q", strict.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("4 of the 8 records read") && stderr.contains("(0.25)"),
        "{stderr}"
    );
    assert_eq!(
        read_jsonl(&tmp.path().join("out.jsonl")).len(),
        4,
        "the good ones are results"
    );
    let lenient = pipeline(tmp.path(), &frames, Some(0.5));
    riffle_ok(&["run", "-q", lenient.to_str().unwrap()]);
    // The default fails only when every record did.
    let default = pipeline(tmp.path(), &frames, None);
    riffle_ok(&["run", "-q", default.to_str().unwrap()]);
}

#[test]
fn a_supervisor_does_not_restart_a_cluster_that_ended_in_dead_letters() {
    let tmp = tempfile::tempdir().unwrap();
    let frames = frames(tmp.path(), 0, 6);
    let p = pipeline(tmp.path(), &frames, None);
    let port = free_port_pair().to_string();
    let out = riffle(&[
        "run",
        p.to_str().unwrap(),
        "--processes",
        "2",
        "--base-port",
        &port,
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(!stderr.contains("restarting"), "no restart: {stderr}");
    assert!(stderr.contains("dead letters"), "{stderr}");
}

#[test]
fn a_value_that_drifts_from_its_column_is_a_dead_letter_not_a_text_column() {
    let tmp = tempfile::tempdir().unwrap();
    let mut csv = String::from("user,score\n");
    for i in 0..30 {
        csv.push_str(&format!("{i},{}.25\n", i % 5));
    }
    csv.push_str("30,n/a\n");
    let data = write(tmp.path(), "scores.csv", &csv);
    let p = write(
        tmp.path(),
        "p.yaml",
        &format!(
            r#"
source: {{ csv: {{ path: "{data}" }} }}
stages:
  - select: {{ columns: [user, score] }}
sink: {{ jsonl: {{ path: out.jsonl }} }}
"#,
            data = data.display()
        ),
    );
    let validated = riffle_ok(&["validate", p.to_str().unwrap()]);
    assert!(
        String::from_utf8_lossy(&validated.stdout).contains("score: Float64"),
        "{}",
        String::from_utf8_lossy(&validated.stdout)
    );
    riffle_ok(&["run", "-q", p.to_str().unwrap()]);
    let rows = read_jsonl(&tmp.path().join("out.jsonl"));
    assert_eq!(rows.len(), 30);
    assert!(
        rows.iter().all(|r| r["score"].is_f64()),
        "numbers stay numbers"
    );
    let dead = read_jsonl(&tmp.path().join("out.dead-letters.jsonl"));
    assert_eq!(dead.len(), 1);
    let reason = dead[0]["reason"].as_str().unwrap();
    assert!(
        reason.contains("n/a") && reason.contains("line 32"),
        "{reason}"
    );
}
