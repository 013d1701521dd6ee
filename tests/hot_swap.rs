//! Model versions switched while running: a repository (`<version>/model.onnx`) gains a good
//! version, a version whose signature does not fit and a corrupt one while frames flow.
//!
//! Version 2 is the person detector with its scores halved, so each row's `scores` say which
//! version really served it; the runs log each announcement (`ModelVersions: announced …`) and
//! each epoch the sink writes (`epoch E: N result row(s) written`, in output order), which
//! give every output row its epoch and the schedule in force at it.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::*;

/// The log levels that show the announcements, the epochs written and the restarts.
const LOG: &str = "warn,riffle_operators=info,riffle_dataflow::operators::announce=info,\
                   riffle_dataflow::operators::write_to_sink=debug,riffle_dataflow::runtime=info";

/// Puts `file` in the repository as `version`, atomically (copied aside, then renamed in), as
/// the docs tell users to.
fn publish(repo: &Path, version: u64, file: &Path) {
    let staging = repo.parent().unwrap().join(format!("staging-{version}"));
    std::fs::create_dir_all(&staging).unwrap();
    std::fs::copy(file, staging.join("model.onnx")).unwrap();
    std::fs::rename(&staging, repo.join(version.to_string())).unwrap();
}

/// The person detector with `detection_scores:0` multiplied by `factor` (made with the `onnx`
/// package, as tests/variants.rs does): the same signature, other outputs.
fn rescored_model(tmp: &Path, factor: f64) -> PathBuf {
    let python = cache_dir().join("python");
    assert!(
        python.join("onnx").is_dir(),
        "the onnx Python package is missing from {}: run scripts/setup.sh",
        python.display()
    );
    let out = tmp.join(format!("ssd_scores_x{factor}.onnx"));
    let script = format!(
        "import onnx, sys\n\
         from onnx import helper, TensorProto\n\
         m = onnx.load(sys.argv[1])\n\
         g = m.graph\n\
         for n in g.node:\n\
         \x20   n.output[:] = ['scores_raw' if o == 'detection_scores:0' else o for o in n.output]\n\
         \x20   assert 'detection_scores:0' not in n.input\n\
         g.initializer.append(helper.make_tensor('factor', TensorProto.FLOAT, [], [{factor}]))\n\
         g.node.append(helper.make_node('Mul', ['scores_raw', 'factor'], ['detection_scores:0']))\n\
         onnx.save(m, sys.argv[2])\n"
    );
    let status = Command::new("python3")
        .args(["-c", &script])
        .arg(model("ssdlite_person.onnx"))
        .arg(&out)
        .env("PYTHONPATH", &python)
        .status()
        .unwrap();
    assert!(status.success(), "making the rescored model");
    out
}

/// A detection pipeline from `source` (YAML flow mapping) through the model at `model_path`
/// (a file or a repository), keeping `columns`. Images are decoded first; video frames come
/// decoded.
fn pipeline_text(
    source: &str,
    model_path: &Path,
    out: &Path,
    columns: &str,
    runtime: &str,
) -> String {
    let decode = if source.contains("images:") {
        "\n  - decode: {}"
    } else {
        ""
    };
    format!(
        r#"
name: hot-swap
source: {source}
stages:{decode}
  - resize: {{ width: 300, height: 300, layout: nhwc, dtype: u8 }}
  - model:
      path: "{model}"
      poll_ms: 100
      inputs: {{ "image_tensor:0": tensor }}
      outputs:
        "detection_boxes:0": {{ column: boxes, shape: [100, 4] }}
        "detection_scores:0": {{ column: scores, shape: [100] }}
        "detection_classes:0": {{ column: classes, shape: [100] }}
      batch: {{ max_size: 4, max_delay_ms: 5 }}
  - select: {{ columns: [{columns}] }}
sink:
  jsonl: {{ path: "{out}" }}
runtime: {runtime}
"#,
        model = model_path.display(),
        out = out.display(),
    )
}

/// JPEG frames as an `images` source of 2 cameras, camera k read by worker k, each paced at 40
/// frames a second.
fn images_source(frames: &Path) -> String {
    format!(
        "{{ images: {{ path: \"{}\", cameras: 2, partition_by: camera, batch_size: 2, max_records_per_second: 40 }} }}",
        frames.display()
    )
}

type Key = (String, i64);

/// Each frame's scores in a results file.
fn scores_of(rows: &[serde_json::Value]) -> BTreeMap<Key, Vec<f64>> {
    let mut out = BTreeMap::new();
    for r in rows {
        let key = (
            r["camera_id"].as_str().unwrap().to_string(),
            r["frame"].as_i64().unwrap(),
        );
        let scores: Vec<f64> = r["scores"]
            .as_array()
            .unwrap_or_else(|| panic!("no scores in {r}"))
            .iter()
            .map(|s| s.as_f64().unwrap())
            .collect();
        assert!(out.insert(key.clone(), scores).is_none(), "{key:?} twice");
    }
    out
}

/// Each frame's scores from a run of one model file (no repository) over `source`.
fn reference(tmp: &Path, name: &str, source: &str, model_file: &Path) -> BTreeMap<Key, Vec<f64>> {
    let out = tmp.join(format!("{name}.jsonl"));
    let text = pipeline_text(
        source,
        model_file,
        &out,
        "camera_id, frame, scores",
        "{ workers: 2, epoch_records: 4 }",
    );
    let path = write(tmp, &format!("{name}.yaml"), &text);
    riffle_ok(&["run", "-q", path.to_str().unwrap()]);
    scores_of(&read_jsonl(&out))
}

/// Reference outputs of versions 1 and 2: version 1's from a run of it alone, version 2's
/// those halved (exact in binary floating point), which differ on every frame.
fn references(tmp: &Path, source: &str) -> BTreeMap<u64, BTreeMap<Key, Vec<f64>>> {
    let v1 = reference(tmp, "ref-v1", source, &model("ssdlite_person.onnx"));
    let v2: BTreeMap<Key, Vec<f64>> = v1
        .iter()
        .map(|(k, s)| (k.clone(), s.iter().map(|x| x * 0.5).collect()))
        .collect();
    for (key, s1) in &v1 {
        assert!(
            s1[0] > 0.02,
            "{key:?}: versions 1 and 2 must differ on every frame (top score {})",
            s1[0]
        );
    }
    BTreeMap::from([(1, v1), (2, v2)])
}

/// What a run's log says, one generation (cluster start) at a time.
#[derive(Debug, Default)]
struct Generation {
    /// The checkpoint epoch it resumed from (none: a fresh start).
    resumed_from: Option<u64>,
    /// Announcements: from epoch → version.
    announced: Vec<(u64, u64)>,
    /// Epochs written by the sink, in order, with their row counts.
    written: Vec<(u64, usize)>,
}

/// The text after `needle` in `line`.
fn after<'a>(line: &'a str, needle: &str) -> Option<&'a str> {
    line.find(needle).map(|i| &line[i + needle.len()..])
}

fn number(text: &str) -> u64 {
    text.chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .unwrap_or_else(|_| panic!("a number at {text:?}"))
}

/// The generations of a run's stderr (split at the supervisor's restarts).
fn generations(stderr: &str) -> Vec<Generation> {
    let mut gens = vec![Generation::default()];
    for line in stderr.lines() {
        if line.contains("restarting the cluster") {
            gens.push(Generation::default());
        }
        let g = gens.last_mut().unwrap();
        if let Some(rest) = after(line, "resuming from checkpoint epoch ") {
            let e = number(rest);
            assert!(
                g.resumed_from.is_none_or(|r| r == e),
                "processes resumed from different epochs: {stderr}"
            );
            g.resumed_from = Some(e);
        }
        if let Some(rest) = after(line, "ModelVersions: announced ") {
            let record: serde_json::Value = serde_json::from_str(rest.trim()).unwrap();
            g.announced.push((
                record["from_epoch"].as_u64().unwrap(),
                record["value"].as_u64().unwrap(),
            ));
        }
        if line.contains(" result row(s) written") {
            let rest = after(line, "epoch ").unwrap();
            let epoch = number(rest);
            let rows = number(after(rest, ": ").unwrap()) as usize;
            g.written.push((epoch, rows));
        }
    }
    gens
}

/// The epochs of the final output (in order, with row counts) and the final schedule (from
/// epoch → version): what each restart kept of the generations before it (their epochs up to
/// the checkpoint it resumed from), then its own.
fn final_layout(gens: &[Generation]) -> (Vec<(u64, usize)>, BTreeMap<u64, u64>) {
    let mut written: Vec<(u64, usize)> = Vec::new();
    let mut schedule: BTreeMap<u64, u64> = BTreeMap::new();
    for (i, g) in gens.iter().enumerate() {
        if i > 0 {
            match g.resumed_from {
                Some(e) => {
                    written.retain(|(epoch, _)| *epoch <= e);
                    schedule.retain(|epoch, _| *epoch <= e);
                }
                None => {
                    written.clear();
                    schedule.clear();
                }
            }
        }
        written.extend(g.written.iter().copied());
        for &(epoch, version) in &g.announced {
            schedule.insert(epoch, version);
        }
    }
    (written, schedule)
}

/// Every row's epoch (from the sink's log) and the checks that matter: each frame answered
/// once, by the version in force at its epoch (the same schedule on every worker), with that
/// version's output. Returns each camera's frames → version.
fn check_rows(
    rows: &[serde_json::Value],
    gens: &[Generation],
    refs: &BTreeMap<u64, BTreeMap<Key, Vec<f64>>>,
    stderr: &str,
) -> BTreeMap<String, BTreeMap<i64, u64>> {
    let (written, schedule) = final_layout(gens);
    let total: usize = written.iter().map(|(_, n)| n).sum();
    assert_eq!(
        total,
        rows.len(),
        "the sink's log accounts for every row of the output: {written:?}\n{stderr}"
    );
    assert!(
        written.windows(2).all(|w| w[0].0 < w[1].0),
        "epochs written in order, once each: {written:?}"
    );
    assert_eq!(
        schedule.values().copied().collect::<Vec<_>>(),
        vec![1, 2],
        "version 1, then version 2: {schedule:?}\n{stderr}"
    );
    let in_force = |epoch: u64| {
        schedule
            .range(..=epoch)
            .next_back()
            .map(|(_, v)| *v)
            .unwrap_or_else(|| panic!("no version in force at epoch {epoch}: {schedule:?}"))
    };
    let epochs = written
        .iter()
        .flat_map(|&(epoch, n)| std::iter::repeat_n(epoch, n));
    let mut by_camera: BTreeMap<String, BTreeMap<i64, u64>> = BTreeMap::new();
    for (r, epoch) in rows.iter().zip(epochs) {
        let camera = r["camera_id"].as_str().unwrap().to_string();
        let frame = r["frame"].as_i64().unwrap();
        let version = r["model_version"].as_u64().unwrap();
        let expected = in_force(epoch);
        assert_eq!(
            version, expected,
            "{camera} frame {frame} (epoch {epoch}) ran on version {version}, but version \
             {expected} is in force from the schedule {schedule:?}"
        );
        let scores: Vec<f64> = r["scores"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_f64().unwrap())
            .collect();
        let reference = &refs[&version][&(camera.clone(), frame)];
        let off = scores
            .iter()
            .zip(reference)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        assert!(
            scores.len() == reference.len() && off < 1e-4,
            "{camera} frame {frame}: row says version {version}, its scores are not that \
             version's (off by {off}): {:?} vs {:?}",
            &scores[..3.min(scores.len())],
            &reference[..3]
        );
        let previous = by_camera.entry(camera).or_default().insert(frame, version);
        assert!(previous.is_none(), "frame {frame} answered twice");
    }
    // Every frame of every camera answered (the references hold each exactly once).
    let answered: BTreeSet<Key> = by_camera
        .iter()
        .flat_map(|(c, frames)| frames.keys().map(move |f| (c.clone(), *f)))
        .collect();
    let expected: BTreeSet<Key> = refs[&1].keys().cloned().collect();
    let missing: Vec<&Key> = expected.difference(&answered).collect();
    assert!(missing.is_empty(), "frames never answered: {missing:?}");
    assert_eq!(answered, expected);
    by_camera
}

#[test]
fn new_versions_switch_at_one_epoch_and_bad_ones_are_refused() {
    require_onnx_runtime();
    let tmp = tempfile::tempdir().unwrap();
    let frames = frames_subset(tmp.path(), "cam", 0..240);
    let source = images_source(&frames);
    let v2 = rescored_model(tmp.path(), 0.5);
    // The references unpaced: the same frames, as fast as they are read.
    let refs = references(
        tmp.path(),
        &source.replace(", max_records_per_second: 40", ""),
    );
    let repo = tmp.path().join("models/ssd");
    std::fs::create_dir_all(&repo).unwrap();
    publish(&repo, 1, &model("ssdlite_person.onnx"));
    let out = tmp.path().join("out.jsonl");
    let text = pipeline_text(
        &source,
        &repo,
        &out,
        "camera_id, frame, model_version, scores",
        "{ workers: 2, epoch_records: 4 }",
    );
    let path = write(tmp.path(), "swap.yaml", &text);
    riffle_ok(&["validate", path.to_str().unwrap()]);

    let child = Command::new(env!("CARGO_BIN_EXE_riffle"))
        .args(["run", "-q"])
        .arg(&path)
        .env("RUST_LOG", LOG)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // 240 frames at 40 a second: about 6 s of input; version 2 comes once results do.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::fs::metadata(&out).is_ok_and(|m| m.len() > 0) {
        assert!(Instant::now() < deadline, "results before version 2");
        std::thread::sleep(Duration::from_millis(20));
    }
    publish(&repo, 2, &v2);
    std::thread::sleep(Duration::from_millis(1500));
    // Another model's inputs: refused, version 2 keeps serving.
    publish(&repo, 3, &model("mobilenet_v2_imagenet.onnx"));
    std::thread::sleep(Duration::from_millis(500));
    let corrupt = tmp.path().join("corrupt.onnx");
    std::fs::write(&corrupt, b"not an onnx model").unwrap();
    publish(&repo, 4, &corrupt);
    let result = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(result.status.success(), "{stderr}");

    let rows = read_jsonl(&out);
    assert_eq!(rows.len(), 240, "{stderr}");
    let gens = generations(&stderr);
    assert_eq!(gens.len(), 1, "no restart: {stderr}");
    let by_camera = check_rows(&rows, &gens, &refs, &stderr);
    for (camera, frames) in &by_camera {
        let versions: BTreeSet<u64> = frames.values().copied().collect();
        assert_eq!(
            versions,
            [1, 2].into(),
            "{camera} (one worker's) saw both versions"
        );
    }
    // The two bad versions: one line each, naming why.
    let refused: Vec<&str> = stderr.lines().filter(|l| l.contains("refused")).collect();
    assert_eq!(refused.len(), 2, "{stderr}");
    assert!(
        refused
            .iter()
            .any(|l| l.contains("version=3") && l.contains("input")),
        "{stderr}"
    );
    assert!(refused.iter().any(|l| l.contains("version=4")), "{stderr}");
}

/// The two test videos (scripts/setup.sh makes them), each looped to 200 frames as a camera.
fn videos(tmp: &Path, realtime: bool) -> String {
    let dir = tmp.join("videos");
    std::fs::create_dir_all(&dir).unwrap();
    for name in ["bikes-0.mp4", "bikes-1.mp4"] {
        let from = common::repo().join("data/videos").join(name);
        assert!(
            from.is_file(),
            "{} is missing: run scripts/setup.sh",
            from.display()
        );
        std::fs::copy(&from, dir.join(name)).unwrap();
    }
    format!(
        "{{ video: {{ glob: \"{}\", realtime: {realtime}, loop: true, max_frames: 200, on_overload: wait, batch_size: 2 }} }}",
        dir.join("*.mp4").display()
    )
}

/// Lines of a child's stderr as they come, and all of them once it closes.
struct Lines {
    rx: mpsc::Receiver<String>,
    all: String,
}

impl Lines {
    fn of(stderr: std::process::ChildStderr) -> Lines {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Lines {
            rx,
            all: String::new(),
        }
    }

    /// Waits for a line containing `needle`, failing after `timeout`.
    fn wait_for(&mut self, needle: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(line) => {
                    self.all.push_str(&line);
                    self.all.push('\n');
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(e) => panic!("no line with {needle:?} ({e}):\n{}", self.all),
            }
        }
    }

    /// Everything, once the child has closed its stderr.
    fn rest(mut self) -> String {
        while let Ok(line) = self.rx.recv() {
            self.all.push_str(&line);
            self.all.push('\n');
        }
        self.all
    }
}

#[test]
fn a_worker_killed_between_the_announcement_and_the_switch_epoch_switches_with_the_others() {
    require_onnx_runtime();
    let tmp = tempfile::tempdir().unwrap();
    let v2 = rescored_model(tmp.path(), 0.5);
    // References read the files as fast as they decode; the run reads them at their frame
    // rate (25 a second, 8 s), one camera per process.
    let refs = references(tmp.path(), &videos(tmp.path(), false));
    assert_eq!(refs[&1].len(), 400);
    let repo = tmp.path().join("models/ssd");
    std::fs::create_dir_all(&repo).unwrap();
    publish(&repo, 1, &model("ssdlite_person.onnx"));
    let out = tmp.path().join("out.jsonl");
    let text = pipeline_text(
        &videos(tmp.path(), true),
        &repo,
        &out,
        "camera_id, frame, model_version, scores",
        "{ workers: 1, epoch_records: 4, checkpoint: { dir: ckpt, interval_ms: 200 } }",
    );
    let path = write(tmp.path(), "swap.yaml", &text);
    riffle_ok(&["validate", path.to_str().unwrap()]);

    let port = free_port_pair().to_string();
    let mut supervisor = Command::new(env!("CARGO_BIN_EXE_riffle"))
        .args(["run", "-q", path.to_str().unwrap(), "--processes", "2"])
        .args(["--base-port", &port])
        .env("RUST_LOG", LOG)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = Lines::of(supervisor.stderr.take().unwrap());
    // Version 2 comes once a checkpoint and results exist, so the restart resumes mid-run.
    let ckpt = tmp.path().join("ckpt");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !(std::fs::read_dir(&ckpt).is_ok_and(|d| {
        d.filter_map(Result::ok)
            .any(|e| e.file_name().to_string_lossy().ends_with(".ckpt"))
    }) && std::fs::metadata(&out).is_ok_and(|m| m.len() > 0))
    {
        assert!(Instant::now() < deadline, "a checkpoint and results");
        std::thread::sleep(Duration::from_millis(10));
    }
    publish(&repo, 2, &v2);
    let announced = lines.wait_for(r#""value":2}"#, Duration::from_secs(60));
    // Killed as soon as process 0 has announced version 2 (the announcement has been sent to
    // process 1): its switch epoch is 8 epochs (frames) ahead of process 0's input.
    let mut pids = worker_pids(&path);
    assert_eq!(pids.len(), 2, "both processes run: {pids:?}");
    pids.sort();
    // Lower pid = started first: process 1 (not the announcing one) is the higher.
    let killed = Command::new("kill")
        .args(["-9", &pids[1].to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let deadline = Instant::now() + Duration::from_secs(180);
    let status = loop {
        if let Some(status) = supervisor.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the cluster did not finish");
        std::thread::sleep(Duration::from_millis(100));
    };
    let stderr = lines.rest();
    assert!(status.success(), "{stderr}");

    // The kill landed between the announcement and its epoch: before the sink wrote that
    // epoch, and before a checkpoint covered it (the restart had to announce again).
    let gens = generations(&stderr);
    assert_eq!(gens.len(), 2, "one restart: {stderr}");
    let switch_at = gens[0]
        .announced
        .iter()
        .find(|(_, v)| *v == 2)
        .map(|(e, _)| *e)
        .unwrap_or_else(|| panic!("{announced} is in the log of the first cluster"));
    let last_written = gens[0].written.last().map(|(e, _)| *e);
    assert!(
        last_written.is_some_and(|e| e < switch_at),
        "the first cluster wrote epochs {:?}, none from the switch at {switch_at}",
        gens[0].written
    );
    let resumed = gens[1]
        .resumed_from
        .unwrap_or_else(|| panic!("the restart resumes from a checkpoint: {stderr}"));
    assert!(
        resumed < switch_at,
        "resumed from epoch {resumed}, before the switch at {switch_at}"
    );
    assert!(
        gens[1].announced.iter().any(|(_, v)| *v == 2),
        "the restarted cluster announces version 2 again: {stderr}"
    );

    eprintln!(
        "version 2 announced from epoch {switch_at}; process 1 killed with epochs up to {:?} \
         written; resumed from epoch {resumed}; final schedule {:?}",
        last_written,
        final_layout(&gens).1
    );
    let rows = read_jsonl(&out);
    assert_eq!(rows.len(), 400, "{stderr}");
    let by_camera = check_rows(&rows, &gens, &refs, &stderr);
    // One camera per process: both switched, at the schedule's one epoch (checked per row).
    assert_eq!(by_camera.len(), 2);
    for (camera, frames) in &by_camera {
        let versions: Vec<u64> = frames.values().copied().collect();
        assert!(
            versions.windows(2).all(|w| w[0] <= w[1]),
            "{camera}: versions go back: {versions:?}"
        );
        assert_eq!(
            versions.iter().copied().collect::<BTreeSet<_>>(),
            [1, 2].into(),
            "{camera} ran on both versions"
        );
    }
}

#[test]
fn a_repository_without_versions_names_the_layout() {
    let tmp = tempfile::tempdir().unwrap();
    let frames = frames_subset(tmp.path(), "cam", 0..1);
    let repo = tmp.path().join("models/empty");
    std::fs::create_dir_all(&repo).unwrap();
    let text = pipeline_text(
        &images_source(&frames),
        &repo,
        &tmp.path().join("out.jsonl"),
        "camera_id, frame, model_version",
        "{ workers: 2, epoch_records: 4 }",
    );
    let path = write(tmp.path(), "empty.yaml", &text);
    let result = riffle(&["validate", path.to_str().unwrap()]);
    assert!(!result.status.success());
    let err = String::from_utf8_lossy(&result.stderr);
    assert!(err.contains("1/model.onnx"), "{err}");
}
