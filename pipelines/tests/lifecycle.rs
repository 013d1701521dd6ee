//! The run lifecycle as a program embedding Riffle gets it: overrides, locks, the exit-code
//! policy (the same code path as `riffle run`, whose own tests run the binary).

use std::path::{Path, PathBuf};

use riffle_pipelines::run::{exit, run, Run, RunError, RunOptions};

/// A JSON-lines pipeline in `dir` over `lines`, whose `n` column must be an integer.
fn pipeline(dir: &Path, lines: &[&str], ratio: Option<f64>) -> PathBuf {
    std::fs::write(dir.join("in.jsonl"), lines.join("\n") + "\n").unwrap();
    let ratio = ratio.map_or(String::new(), |r| format!(", max_dead_letter_ratio: {r}"));
    let file = dir.join("p.yaml");
    std::fs::write(
        &file,
        format!(
            r#"
source: {{ jsonl: {{ path: in.jsonl, schema: {{ n: int64 }} }} }}
stages:
  - select: {{ columns: [n] }}
sink: {{ jsonl: {{ path: out.jsonl }} }}
runtime: {{ workers: 1{ratio} }}
"#
        ),
    )
    .unwrap();
    file
}

fn options(file: &Path) -> RunOptions {
    RunOptions::new(file).stop_on_signals(false)
}

#[test]
fn a_good_run_exits_0_with_its_report_and_output_override() {
    let tmp = tempfile::tempdir().unwrap();
    let file = pipeline(tmp.path(), &[r#"{"n": 1}"#, r#"{"n": 2}"#], None);
    let elsewhere = tmp.path().join("elsewhere.jsonl");
    let outcome = run(options(&file).output(&elsewhere)).unwrap();
    assert_eq!(outcome.exit_code(), exit::OK);
    assert!(outcome.dead_letters.is_none() && !outcome.stopped);
    assert_eq!(outcome.report.as_ref().unwrap().summary.results, 2);
    assert_eq!(outcome.cluster.as_ref().unwrap().processes(), 1);
    assert_eq!(
        std::fs::read_to_string(&elsewhere).unwrap().lines().count(),
        2
    );
    assert!(!tmp.path().join("out.jsonl").exists());
}

#[test]
fn every_record_in_dead_letters_is_exit_code_3_with_the_reasons_unless_allowed() {
    let tmp = tempfile::tempdir().unwrap();
    let bad = [r#"{"n": "x"}"#, r#"{"n": "y"}"#];
    let outcome = run(options(&pipeline(tmp.path(), &bad, None))).unwrap();
    assert_eq!(outcome.exit_code(), exit::DEAD_LETTERS);
    let verdict = outcome.dead_letters.as_ref().unwrap().to_string();
    assert!(
        verdict.starts_with("2 of the 2 records read went to dead letters"),
        "{verdict}"
    );
    drop(outcome);
    let allowed = run(options(&pipeline(tmp.path(), &bad, Some(1.0)))).unwrap();
    assert_eq!(allowed.exit_code(), exit::OK);
}

#[test]
fn a_second_run_on_the_same_output_is_refused_while_the_first_holds_its_locks() {
    let tmp = tempfile::tempdir().unwrap();
    let file = pipeline(tmp.path(), &[r#"{"n": 1}"#], None);
    let first = Run::prepare(options(&file)).unwrap();
    let second = Run::prepare(options(&file)).unwrap_err();
    assert!(matches!(second, RunError::Lock(_)), "{second}");
    assert!(
        second.to_string().contains("in use by another riffle run"),
        "{second}"
    );
    assert_eq!(second.exit_code(), exit::FAILED);
    let outcome = first.execute().unwrap();
    // The locks go with the outcome.
    assert!(Run::prepare(options(&file)).is_err());
    drop(outcome);
    assert!(Run::prepare(options(&file)).is_ok());
}

#[test]
fn a_bad_worker_count_and_a_bad_file_are_typed_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let file = pipeline(tmp.path(), &[r#"{"n": 1}"#], None);
    let e = run(options(&file).workers(riffle_pipelines::run::Workers::Count(0))).unwrap_err();
    assert!(matches!(e, RunError::NoWorkers), "{e}");
    let e = run(options(&tmp.path().join("missing.yaml"))).unwrap_err();
    assert!(matches!(e, RunError::Pipeline(_)), "{e}");
    assert!(
        e.to_string().contains("cannot read the pipeline file"),
        "{e}"
    );
}
