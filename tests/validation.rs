//! Every validation error names the file, the line and the field, before anything runs.

mod common;

use std::path::{Path, PathBuf};

use common::*;

/// The shipped detection pipeline, with absolute paths and one edit applied.
fn edited(tmp: &Path, from: &str, to: &str) -> PathBuf {
    let text = std::fs::read_to_string(repo().join("pipelines/camera-perception.yaml")).unwrap();
    assert!(
        text.contains(from),
        "test edit `{from}` not found in the pipeline"
    );
    let text = text
        .replace("../", &format!("{}/", repo().display()))
        .replacen(from, to, 1);
    write(tmp, "p.yaml", &text)
}

fn error_of(file: &Path) -> String {
    match riffle_pipelines::load(file, None) {
        Ok(_) => panic!("{} validated, expected an error", file.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn shipped_pipelines_validate() {
    require_onnx_runtime();
    for name in ["camera-perception.yaml", "camera-classify.yaml"] {
        let p = riffle_pipelines::load(&repo().join("pipelines").join(name), None)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(p.schemas.len(), p.spec.stages.len() + 1);
    }
}

#[test]
fn unknown_key_names_line_and_key() {
    let tmp = tempfile::tempdir().unwrap();
    let f = edited(
        tmp.path(),
        "max_epochs_in_flight: 2",
        "max_epochs_in_flihgt: 2",
    );
    let e = error_of(&f);
    let line = line_of(&f, "max_epochs_in_flihgt");
    assert!(e.starts_with(&format!("{}:{line}: ", f.display())), "{e}");
    assert!(e.contains("unknown field `max_epochs_in_flihgt`"), "{e}");
    assert!(
        e.contains("max_epochs_in_flight"),
        "should list the expected keys: {e}"
    );
}

#[test]
fn wrong_value_type_names_line_and_field() {
    let tmp = tempfile::tempdir().unwrap();
    let f = edited(tmp.path(), "score_threshold: 0.5", "score_threshold: high");
    let e = error_of(&f);
    let line = line_of(&f, "score_threshold: high");
    assert!(
        e.starts_with(&format!(
            "{}:{line}: stages[3].detections.score_threshold: expected a number from 0 to 1, found high",
            f.display()
        )),
        "{e}"
    );
}

#[test]
fn missing_model_file_names_line_and_field() {
    let tmp = tempfile::tempdir().unwrap();
    let f = edited(tmp.path(), "ssdlite_person.onnx", "no_such_model.onnx");
    let e = error_of(&f);
    let line = line_of(&f, "no_such_model.onnx");
    assert!(
        e.starts_with(&format!("{}:{line}: stages[2].model.path: ", f.display())),
        "{e}"
    );
    assert!(e.contains("not found"), "{e}");
}

#[test]
fn input_dtype_mismatch_names_model_input() {
    require_onnx_runtime();
    let tmp = tempfile::tempdir().unwrap();
    let f = edited(tmp.path(), "dtype: u8", "dtype: f32");
    let e = error_of(&f);
    let line = line_of(&f, "\"image_tensor:0\": tensor");
    assert!(
        e.starts_with(&format!(
            "{}:{line}: stages[2].model.inputs.\"image_tensor:0\": ",
            f.display()
        )),
        "{e}"
    );
    assert!(
        e.contains("expected UInt8") && e.contains("found Float32"),
        "{e}"
    );
}

#[test]
fn input_shape_mismatch_against_model_signature() {
    require_onnx_runtime();
    let tmp = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(repo().join("pipelines/camera-classify.yaml"))
        .unwrap()
        .replace("../", &format!("{}/", repo().display()))
        .replace("width: 224", "width: 220");
    let f = write(tmp.path(), "c.yaml", &text);
    let e = error_of(&f);
    let line = line_of(&f, "inputs: { input: tensor }");
    assert!(
        e.starts_with(&format!(
            "{}:{line}: stages[2].model.inputs.input: ",
            f.display()
        )),
        "{e}"
    );
    assert!(
        e.contains("Float32[?,3,224,224]") && e.contains("found Float32[?,3,224,220]"),
        "{e}"
    );
}

#[test]
fn missing_column_lists_the_columns_there() {
    require_onnx_runtime();
    let tmp = tempfile::tempdir().unwrap();
    let f = edited(
        tmp.path(),
        "\"image_tensor:0\": tensor",
        "\"image_tensor:0\": pixels_typo",
    );
    let e = error_of(&f);
    assert!(e.contains("column `pixels_typo`"), "{e}");
    assert!(
        e.contains("no such column") && e.contains("tensor ("),
        "{e}"
    );
}

#[test]
fn unmapped_model_input_and_unknown_output_are_errors() {
    require_onnx_runtime();
    let tmp = tempfile::tempdir().unwrap();
    let f = edited(
        tmp.path(),
        "\"detection_scores:0\"",
        "\"detection_score:0\"",
    );
    let e = error_of(&f);
    assert!(
        e.contains("has no output `detection_score:0`") && e.contains("detection_scores:0"),
        "{e}"
    );
    let f = edited(
        tmp.path(),
        "\"image_tensor:0\": tensor",
        "\"image:0\": tensor",
    );
    let e = error_of(&f);
    assert!(e.contains("needs input `image_tensor:0`"), "{e}");
}

#[test]
fn exchange_key_must_exist() {
    let tmp = tempfile::tempdir().unwrap();
    let f = edited(
        tmp.path(),
        "  - decode: {}",
        "  - exchange: { key: camera }\n  - decode: {}",
    );
    let e = error_of(&f);
    let line = line_of(&f, "- exchange: { key: camera }");
    assert!(
        e.starts_with(&format!("{}:{line}: stages[0].exchange.key: ", f.display())),
        "{e}"
    );
    assert!(e.contains("camera_id (Utf8)"), "{e}");
}

#[test]
fn spread_settings_are_checked_against_each_other_and_the_columns() {
    let tmp = tempfile::tempdir().unwrap();
    let cases = [
        (
            "  - exchange: { spread: true, together: camera }\n  - decode: {}",
            "stages[0].exchange.together: ",
            "no column `camera` here",
        ),
        (
            "  - exchange: { together: camera_id }\n  - decode: {}",
            "stages[0].exchange.together: ",
            "needs `spread: true`",
        ),
        (
            "  - exchange: { spread: true, key: camera_id }\n  - decode: {}",
            "stages[0].exchange.spread: ",
            "cannot be combined with `key`",
        ),
    ];
    for (stage, at, expected) in cases {
        let f = edited(tmp.path(), "  - decode: {}", stage);
        let e = error_of(&f);
        let line = line_of(&f, stage.lines().next().unwrap().trim());
        assert!(
            e.starts_with(&format!("{}:{line}: {at}", f.display())),
            "{e}"
        );
        assert!(e.contains(expected), "{e}");
    }
}

#[test]
fn track_column_and_threshold_errors_name_their_keys() {
    require_onnx_runtime();
    let tmp = tempfile::tempdir().unwrap();
    let shipped = std::fs::read_to_string(repo().join("pipelines/camera-tracking.yaml")).unwrap();
    let shipped = shipped.replace("../", &format!("{}/", repo().display()));
    let cases = [
        // A Utf8 column as the frame number.
        (
            "frame: frame",
            "frame: path",
            "stages[4].track.frame: ",
            "expected Int64, found Utf8",
        ),
        (
            "low_threshold: 0.1",
            "low_threshold: 0.9",
            "stages[4].track.low_threshold: ",
            "must not exceed high_threshold",
        ),
    ];
    for (from, to, key, message) in cases {
        assert!(
            shipped.contains(from),
            "`{from}` not in camera-tracking.yaml"
        );
        let f = write(tmp.path(), "t.yaml", &shipped.replacen(from, to, 1));
        let e = error_of(&f);
        let line = line_of(&f, to);
        assert!(
            e.starts_with(&format!("{}:{line}: {key}", f.display())),
            "{e}"
        );
        assert!(e.contains(message), "{e}");
    }
}

#[test]
fn detections_column_error_names_the_key_naming_the_column() {
    let tmp = tempfile::tempdir().unwrap();
    let f = edited(tmp.path(), "scores: scores", "scores: score_typo");
    let e = error_of(&f);
    let line = line_of(&f, "scores: score_typo");
    assert!(
        e.starts_with(&format!(
            "{}:{line}: stages[3].detections.scores: ",
            f.display()
        )),
        "{e}"
    );
    assert!(
        e.contains("column `score_typo`") && e.contains("no such column"),
        "{e}"
    );
}

#[test]
fn missing_source_directory_and_zero_workers() {
    let tmp = tempfile::tempdir().unwrap();
    let f = edited(tmp.path(), "data/frames", "data/no-frames");
    let e = error_of(&f);
    assert!(
        e.contains(": source.path: ") && e.contains("does not exist"),
        "{e}"
    );
    let f = edited(tmp.path(), "workers: 2", "workers: 0");
    let e = error_of(&f);
    let line = line_of(&f, "workers: 0");
    assert!(
        e.starts_with(&format!(
            "{}:{line}: runtime.workers: expected an integer from 1 to 1024, found 0",
            f.display()
        )),
        "{e}"
    );
}

#[test]
fn cuda_device_fails_validation_without_cuda() {
    require_onnx_runtime();
    let tmp = tempfile::tempdir().unwrap();
    let f = edited(
        tmp.path(),
        "batch: { max_size: 1",
        "device: \"cuda:0\"\n      batch: { max_size: 1",
    );
    let e = error_of(&f);
    let line = line_of(&f, "device: \"cuda:0\"");
    assert!(
        e.starts_with(&format!(
            "{}:{line}: stages[2].model.device: device `cuda:0`: no CUDA device",
            f.display()
        )),
        "{e}"
    );
}

#[test]
fn dense_executor_on_a_convolutional_model_fails_validation_at_the_key() {
    require_onnx_runtime();
    let tmp = tempfile::tempdir().unwrap();
    let f = edited(
        tmp.path(),
        "batch: { max_size: 1",
        "executor: dense\n      batch: { max_size: 1",
    );
    let e = error_of(&f);
    let line = line_of(&f, "executor: dense");
    assert!(
        e.starts_with(&format!(
            "{}:{line}: stages[2].model.executor: executor `dense`: ",
            f.display()
        )) && e.contains("is not supported by the dense executor"),
        "{e}"
    );
    // Splitting tables over GPUs needs GPUs.
    let f = edited(
        tmp.path(),
        "batch: { max_size: 1",
        "embedding_devices: [\"cuda:0\", \"cuda:1\"]\n      batch: { max_size: 1",
    );
    let e = error_of(&f);
    let line = line_of(&f, "embedding_devices:");
    assert!(
        e.starts_with(&format!(
            "{}:{line}: stages[2].model.embedding_devices: embedding_devices: device `cuda:0`: no CUDA device",
            f.display()
        )),
        "{e}"
    );
}

#[test]
fn validate_command_prints_schemas_and_fails_with_location() {
    let out = riffle_ok(&[
        "validate",
        repo()
            .join("pipelines/camera-perception.yaml")
            .to_str()
            .unwrap(),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("after detections") && text.contains("detections_count"),
        "{text}"
    );
    let tmp = tempfile::tempdir().unwrap();
    let f = edited(tmp.path(), "ssdlite_person.onnx", "gone.onnx");
    let out = riffle(&["validate", f.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("stages[2].model.path"));
}

#[test]
fn auto_device_runs_on_cpu_and_says_so_once() {
    require_onnx_runtime();
    let tmp = tempfile::tempdir().unwrap();
    let frames = frames_subset(tmp.path(), "cam", [0, 1, 2, 3]);
    let out = tmp.path().join("o.jsonl");
    let text = detection_pipeline(&frames, &out, 2, 2, 2).replace(
        "batch: { max_size: 2",
        "device: auto\n      batch: { max_size: 2",
    );
    assert!(text.contains("device: auto"));
    let p = write(tmp.path(), "auto.yaml", &text);
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_riffle"))
        .args(["run", "-q", p.to_str().unwrap()])
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(
        stderr.matches("device `auto` runs on CPU").count(),
        1,
        "{stderr}"
    );
    assert_eq!(read_jsonl(&out).len(), 4);
}

#[test]
fn plan_shows_placement_and_workers_auto_follows_the_cores() {
    require_onnx_runtime();
    let file = repo().join("pipelines/camera-perception.yaml");
    let cores = std::thread::available_parallelism().unwrap().get();
    let out = riffle_ok(&["plan", file.to_str().unwrap(), "--workers", "auto"]);
    let text = String::from_utf8_lossy(&out.stdout);
    // runtime.intra_op_threads is 1 in this pipeline: one worker per core.
    assert!(
        text.contains(&format!("workers: {cores} per process × 1 process(es)")),
        "{text}"
    );
    assert!(
        text.contains("model") && text.contains("batch ≤ 1 rows / 10 ms"),
        "{text}"
    );
    // Where each model runs, as decided here (this pipeline's model says `device: cpu`).
    assert!(
        text.contains("runs on ONNX Runtime on CPU (worker 0)"),
        "{text}"
    );
    // Two local processes share the cores.
    let out = riffle_ok(&[
        "plan",
        file.to_str().unwrap(),
        "--workers",
        "auto",
        "--processes",
        "2",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    let per_process = (cores / 2).max(1);
    assert!(
        text.contains(&format!(
            "workers: {per_process} per process × 2 process(es)"
        )),
        "{text}"
    );
    let bad = riffle(&["plan", file.to_str().unwrap(), "--workers", "many"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("expected a number or `auto`"));
}

#[test]
fn every_shipped_file_pipeline_validates() {
    require_onnx_runtime();
    // camera-video.yaml reads the videos scripts/media.sh makes; validation checks they exist.
    assert!(
        repo().join("data/videos/bikes-0.mp4").is_file(),
        "data/videos/ missing: run `scripts/media.sh` (needs ffmpeg: apt-get install -y ffmpeg)"
    );
    for name in [
        "camera-perception.yaml",
        "camera-video.yaml",
        "camera-classify.yaml",
        "camera-classify-split.yaml",
        "clickstream-recs.yaml",
        "camera-tracking.yaml",
        "camera-cascade.yaml",
    ] {
        let file = repo().join("pipelines").join(name);
        riffle_ok(&["validate", file.to_str().unwrap()]);
    }
}

#[test]
fn gpu_check_compares_gpu_and_cpu_paths_or_says_there_is_no_gpu() {
    require_onnx_runtime();
    let out = riffle(&["gpu-check", "--pairs", "2000"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    match riffle_gpu::discover() {
        Err(why) => {
            assert!(!out.status.success());
            assert!(
                stderr.contains(&format!("no GPU to check: {why}")),
                "{stderr}"
            );
        }
        Ok(_) => {
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "{stdout}\n{stderr}");
            assert!(
                stdout.contains("every GPU path agrees with its CPU path"),
                "{stdout}"
            );
        }
    }
}

/// `validate` and `plan` build no engine: they succeed without ONNX Runtime's library and load
/// no ONNX Runtime or CUDA library (glibc's loader reports every library it opens, `dlopen`
/// included, under `LD_DEBUG=libs`).
#[test]
fn validate_and_plan_need_neither_onnx_runtime_nor_cuda() {
    let file = repo().join("pipelines/camera-perception.yaml");
    for command in ["validate", "plan"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_riffle"))
            .args([command, file.to_str().unwrap()])
            .env("RIFFLE_ORT_LIB", "/nonexistent/libonnxruntime.so")
            .env("LD_DEBUG", "libs")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "riffle {command}: {stderr}");
        // The loader's own lines: "find library=NAME" for each library asked for.
        let asked: Vec<&str> = stderr
            .lines()
            .filter_map(|l| l.split("find library=").nth(1))
            .collect();
        assert!(
            asked.iter().any(|l| l.starts_with("libc.so")),
            "LD_DEBUG=libs reported nothing: {stderr}"
        );
        for lib in asked {
            assert!(
                !["libonnxruntime", "libcuda", "libnvrtc", "libcublas"]
                    .iter()
                    .any(|bad| lib.starts_with(bad)),
                "riffle {command} loaded {lib}"
            );
        }
    }
}

#[test]
fn validate_into_a_closed_pipe_ends_quietly() {
    require_onnx_runtime();
    // `true` exits at once: the pipe is closed before validate (which loads the models) prints.
    let out = std::process::Command::new("bash")
        .args([
            "-c",
            r#""$0" validate "$1" | true; echo "exit ${PIPESTATUS[0]}""#,
            env!("CARGO_BIN_EXE_riffle"),
            repo()
                .join("pipelines/camera-perception.yaml")
                .to_str()
                .unwrap(),
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "no panic: {stderr}");
    // Killed by SIGPIPE (128 + 13), as `yes | true` is; never Rust's panic code 101.
    assert!(
        stdout.trim() == "exit 141" || stdout.trim() == "exit 0",
        "{stdout} {stderr}"
    );
}

#[test]
fn huge_numbers_are_refused_with_field_line_and_range() {
    require_onnx_runtime();
    let tmp = tempfile::tempdir().unwrap();
    let max = "9223372036854775807";
    for (from, to, field, range) in [
        (
            "workers: 2",
            format!("workers: {max}"),
            "runtime.workers",
            "from 1 to 1024",
        ),
        (
            "max_delay_ms: 10",
            format!("max_delay_ms: {max}"),
            "stages[2].model.batch.max_delay_ms",
            "from 0 to 60000",
        ),
        (
            "max_size: 1",
            format!("max_size: {max}"),
            "stages[2].model.batch.max_size",
            "from 1 to 65536",
        ),
        (
            "score_threshold: 0.5",
            "score_threshold: 5".to_string(),
            "stages[3].detections.score_threshold",
            "from 0 to 1",
        ),
    ] {
        let f = edited(tmp.path(), from, &to);
        let e = error_of(&f);
        let line = line_of(&f, &to);
        assert!(
            e.starts_with(&format!("{}:{line}: {field}: expected ", f.display())),
            "{e}"
        );
        assert!(e.contains(range), "{e}");
    }

    // `run` stops at once with that one line: no panic, no restarts of a supervised cluster.
    let f = edited(tmp.path(), "workers: 2", &format!("workers: {max}"));
    for extra in [&[][..], &["--processes", "2"][..]] {
        let started = std::time::Instant::now();
        let out = riffle(&[&["run", "-q", f.to_str().unwrap()][..], extra].concat());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
        assert!(stderr.contains("runtime.workers"), "{stderr}");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "refused at once"
        );
    }
}

#[test]
fn validate_catches_what_run_would_refuse() {
    require_onnx_runtime();
    let tmp = tempfile::tempdir().unwrap();
    // Checkpoints need a source that can resume from offsets.
    let f = edited(
        tmp.path(),
        "max_epochs_in_flight: 2",
        "max_epochs_in_flight: 2\n  checkpoint: { dir: ckpt }",
    );
    let e = error_of(&f);
    assert!(e.contains("runtime.checkpoint"), "{e}");
    assert!(e.contains("`images` source cannot resume"), "{e}");
    let plain = edited(tmp.path(), "workers: 2", "workers: 2");
    let plain = std::fs::copy(&plain, tmp.path().join("plain.yaml"))
        .map(|_| tmp.path().join("plain.yaml"))
        .unwrap();
    let out = riffle(&[
        "run",
        "-q",
        plain.to_str().unwrap(),
        "--checkpoint-dir",
        tmp.path().join("ckpt").to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("--checkpoint-dir") && stderr.contains("cannot resume"),
        "{stderr}"
    );

    // A sink path that is a directory, or below a file.
    let dir = tmp.path().join("results");
    std::fs::create_dir(&dir).unwrap();
    // (`edited` makes paths absolute first, so the sink's path is swapped here.)
    let sink_at = |path: &Path| {
        let text = std::fs::read_to_string(&plain).unwrap().replace(
            &format!("{}/out/camera-perception.jsonl", repo().display()),
            &path.display().to_string(),
        );
        write(tmp.path(), "sink.yaml", &text)
    };
    let f = sink_at(&dir);
    let e = error_of(&f);
    assert!(
        e.contains("sink.path") && e.contains("is a directory"),
        "{e}"
    );
    let file = write(tmp.path(), "plain-file", "");
    let f = sink_at(&file.join("sub/out.jsonl"));
    let e = error_of(&f);
    assert!(
        e.contains("sink.path") && e.contains("is a file, not a directory"),
        "{e}"
    );
}

#[test]
fn output_moves_the_dead_letters_beside_it() {
    let tmp = tempfile::tempdir().unwrap();
    let f = edited(tmp.path(), "workers: 2", "workers: 2");
    let out = tmp.path().join("run1.jsonl");
    let p = riffle_pipelines::load(&f, Some(&out)).unwrap();
    let paths = riffle_pipelines::lock::lock_paths(&p);
    assert!(
        paths.contains(&tmp.path().join(".run1.dead-letters.jsonl.lock")),
        "the dead letters follow --output: {paths:?}"
    );
    assert!(
        paths.iter().all(|l| l.starts_with(tmp.path())),
        "nothing is left beside the shipped output: {paths:?}"
    );
}

#[test]
fn a_gpu_map_without_an_auto_device_stage_is_an_error_at_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let p = edited(tmp.path(), "  workers: 2", "  workers: 2\n  gpus: [0, 1]");
    let e = error_of(&p);
    assert!(e.contains("runtime.gpus"), "{e}");
    assert!(e.contains("device: auto"), "{e}");
    assert!(e.contains("p.yaml"), "{e}");
}

#[test]
fn events_from_a_column_the_results_lack_names_it() {
    require_onnx_runtime();
    let tmp = tempfile::tempdir().unwrap();
    let f = edited(
        tmp.path(),
        "\nsink:",
        "\nevents:\n  from: [line_events]\n  sink: { jsonl: { path: events.jsonl } }\nsink:",
    );
    let e = error_of(&f);
    let line = line_of(&f, "from: [line_events]");
    assert!(
        e.starts_with(&format!("{}:{line}: events.from: no column", f.display())),
        "{e}"
    );
    assert!(e.contains("no column `line_events` in the results"), "{e}");
}

/// `riffle bench` compares a pipeline with a straight loop over the same stages: a stage that
/// only runs as a dataflow operator (here the tracker) is refused by name before any round,
/// not skipped by the loop (which would then compare different work).
#[test]
fn bench_refuses_a_stage_its_straight_loop_cannot_run_before_any_round() {
    require_onnx_runtime();
    let file = repo().join("pipelines/camera-tracking.yaml");
    let out = riffle(&["bench", file.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "bench must refuse: {stderr}");
    assert!(
        stderr.contains("camera-tracking.yaml")
            && stderr.contains("(`track`) keeps state inside the dataflow"),
        "the file and the stage by name: {stderr}"
    );
    assert!(
        out.stdout.is_empty(),
        "no round started: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}
