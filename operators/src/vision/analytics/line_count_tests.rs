use super::line_count::{LineCount, LineCountConfig, LineState};
use super::test_input::{at, frames, joined, numbered, Det};
use crate::StageKind;
use arrow_array::RecordBatch;
use riffle_dataflow::operators::KeyedLogic;
use riffle_dataflow::StageOutput;

/// One line `door` along y = 100 from x = 0 to x = 200, drawn left to right: walking down
/// (y growing) across it is `in`.
fn config(extra: serde_json::Value) -> LineCountConfig {
    let mut config = serde_json::json!({
        "lines": [{ "name": "door", "from": [0, 100], "to": [200, 100] }],
    });
    if let (Some(c), Some(e)) = (config.as_object_mut(), extra.as_object()) {
        c.extend(e.clone());
    }
    serde_json::from_value(config).expect("a line_count config")
}

fn run(config: LineCountConfig, state: &mut LineState, batch: &RecordBatch) -> StageOutput {
    let mut logic = LineCount::new(config).expect("valid config");
    logic.process("cam", state, batch).expect("processed")
}

/// Track 7 at x = 50 moving through these anchor heights, one frame each.
fn walk(ys: &[f32]) -> RecordBatch {
    numbered("cam", 0, ys.iter().map(|y| vec![at(7, 50.0, *y)]).collect())
}

fn events(out: &RecordBatch) -> Vec<Vec<String>> {
    joined(
        out,
        "line_events",
        &["line", "track_id", "class_id", "direction"],
    )
}

fn totals(out: &RecordBatch) -> Vec<Vec<String>> {
    joined(out, "line_totals", &["line", "class_id", "in", "out"])
}

#[test]
fn a_track_crossing_in_and_back_out_is_counted_once_each_way() {
    let mut state = LineState::default();
    let out = run(
        config(serde_json::json!({})),
        &mut state,
        &walk(&[80.0, 95.0, 110.0, 120.0, 90.0]),
    );
    assert!(out.rejected.is_empty());
    let none: Vec<String> = Vec::new();
    assert_eq!(
        events(&out.records),
        vec![
            none.clone(),
            none.clone(),
            vec!["door/7/1/in".to_string()],
            none.clone(),
            vec!["door/7/1/out".to_string()],
        ]
    );
    let last = totals(&out.records).pop();
    assert_eq!(last, Some(vec!["door/1/1/1".to_string()]));
    // Before any crossing there is no total entry.
    assert_eq!(totals(&out.records)[0], none);
    assert_eq!(state.totals["door"][&1], [1, 1]);
}

#[test]
fn a_track_jittering_on_the_line_is_counted_consistently() {
    // Across and back four times: every step across is one crossing, alternating.
    let mut state = LineState::default();
    let out = run(
        config(serde_json::json!({})),
        &mut state,
        &walk(&[99.0, 101.0, 99.5, 100.5, 99.0]),
    );
    let directions: Vec<String> = events(&out.records).concat();
    assert_eq!(
        directions,
        ["door/7/1/in", "door/7/1/out", "door/7/1/in", "door/7/1/out"]
    );
    assert_eq!(state.totals["door"][&1], [2, 2]);

    // Landing exactly on the line and going back is no crossing; landing on it and going on
    // is one, counted once however long it stays on the line.
    for (ys, expected) in [
        (vec![90.0, 100.0, 90.0], [0, 0]),
        (vec![90.0, 100.0, 110.0], [1, 0]),
        (vec![90.0, 100.0, 100.0, 100.0, 110.0], [1, 0]),
        (vec![110.0, 100.0, 90.0, 100.0, 110.0], [1, 1]),
    ] {
        let mut state = LineState::default();
        let out = run(config(serde_json::json!({})), &mut state, &walk(&ys));
        let counted = state.totals.get("door").and_then(|c| c.get(&1)).copied();
        assert_eq!(counted.unwrap_or([0, 0]), expected, "{ys:?}");
        let n: usize = events(&out.records).iter().map(Vec::len).sum();
        assert_eq!(n as i64, expected[0] + expected[1], "{ys:?}");
    }
}

#[test]
fn only_the_segment_counts_not_the_infinite_line() {
    // At x = 300 the step crosses y = 100 beyond the line's end (x = 200).
    let batch = numbered(
        "cam",
        0,
        vec![vec![at(1, 300.0, 90.0)], vec![at(1, 300.0, 110.0)]],
    );
    let mut state = LineState::default();
    let out = run(config(serde_json::json!({})), &mut state, &batch);
    assert!(events(&out.records).concat().is_empty());
    // A diagonal step whose crossing point lies within the segment counts.
    let batch = numbered(
        "cam",
        0,
        vec![vec![at(1, 250.0, 50.0)], vec![at(1, 150.0, 150.0)]],
    );
    let out = run(
        config(serde_json::json!({})),
        &mut LineState::default(),
        &batch,
    );
    assert_eq!(events(&out.records).concat(), ["door/1/1/in"]);
}

#[test]
fn untracked_and_filtered_detections_are_ignored() {
    let car = |track, y| Det {
        class: 3,
        ..at(track, 60.0, y)
    };
    let untracked = |y| Det {
        track: None,
        ..at(0, 70.0, y)
    };
    let batch = numbered(
        "cam",
        0,
        vec![
            vec![at(1, 50.0, 90.0), car(2, 90.0), untracked(90.0)],
            vec![at(1, 50.0, 110.0), car(2, 110.0), untracked(110.0)],
        ],
    );
    let mut state = LineState::default();
    let out = run(
        config(serde_json::json!({ "classes": [3] })),
        &mut state,
        &batch,
    );
    assert_eq!(events(&out.records).concat(), ["door/2/3/in"]);
    assert_eq!(state.tracks.keys().copied().collect::<Vec<_>>(), [2]);

    // Every class: the person and the car, totals per class.
    let out = run(
        config(serde_json::json!({})),
        &mut LineState::default(),
        &batch,
    );
    assert_eq!(totals(&out.records)[1], ["door/1/1/0", "door/3/1/0"]);
}

#[test]
fn the_centre_anchor_counts_where_the_bottom_centre_does_not() {
    // Feet cross y = 100 (frames 0 → 1), the centre (10 px higher) only at frames 1 → 2.
    let batch = walk(&[95.0, 105.0, 115.0]);
    let out = run(
        config(serde_json::json!({ "anchor": "center" })),
        &mut LineState::default(),
        &batch,
    );
    assert_eq!(events(&out.records)[2], ["door/7/1/in"]);
    assert!(events(&out.records)[1].is_empty());
}

#[test]
fn window_totals_restart_every_n_frames() {
    // Crossings at frames 1 (in), 2 (out), 5 (in); windows of 4 frames: 0..3, 4..7.
    let batch = walk(&[90.0, 110.0, 90.0, 90.0, 90.0, 110.0]);
    let mut state = LineState::default();
    let out = run(
        config(serde_json::json!({ "window_frames": 4 })),
        &mut state,
        &batch,
    );
    let totals = totals(&out.records);
    assert_eq!(totals[2], ["door/1/1/1"]);
    assert_eq!(totals[3], ["door/1/1/1"]);
    // Frame 4 starts a window: nothing counted yet.
    assert!(totals[4].is_empty());
    assert_eq!(totals[5], ["door/1/1/0"]);
    assert_eq!(state.window, Some(1));
}

#[test]
fn a_forgotten_track_coming_back_on_the_other_side_is_not_counted() {
    // Track 1 seen at frame 0 above the line, then at frame 40 below it: forgotten after 30.
    let batch = frames(
        "cam",
        &[
            (Some(0), vec![at(1, 50.0, 90.0)]),
            (Some(20), vec![at(2, 150.0, 90.0)]),
            (Some(40), vec![at(1, 50.0, 110.0), at(2, 150.0, 110.0)]),
        ],
    );
    let mut state = LineState::default();
    let out = run(config(serde_json::json!({})), &mut state, &batch);
    assert_eq!(events(&out.records)[2], ["door/2/1/in"]);
}

#[test]
fn bad_rows_are_dead_letters_and_leave_the_state_alone() {
    let bad_box = Det {
        rect: [f32::NAN, 0.0, 1.0, 1.0],
        ..at(1, 0.0, 0.0)
    };
    let batch = frames(
        "cam",
        &[
            (Some(0), vec![at(1, 50.0, 90.0)]),
            (None, vec![at(1, 50.0, 110.0)]),
            (Some(0), vec![at(1, 50.0, 110.0)]),
            (Some(1), vec![bad_box]),
            (Some(2), vec![at(1, 50.0, 110.0)]),
        ],
    );
    let mut state = LineState::default();
    let out = run(config(serde_json::json!({})), &mut state, &batch);
    let reasons: Vec<&str> = out.rejected.iter().map(|d| d.reason.as_str()).collect();
    assert_eq!(reasons.len(), 3, "{reasons:?}");
    assert_eq!(reasons[0], "null frame");
    assert!(
        reasons[1].starts_with("frame 0 is not after frame 0"),
        "{}",
        reasons[1]
    );
    assert!(reasons[2].contains("not finite"), "{}", reasons[2]);
    assert!(out.rejected.iter().all(|d| d.stage == "line_count"));
    // The good rows went on: frame 0, then frame 2 with the crossing.
    assert_eq!(super::test_input::ints(&out.records, "frame"), [0, 2]);
    assert_eq!(events(&out.records)[1], ["door/1/1/in"]);
    assert_eq!(state.last_frame, Some(2));
}

#[test]
fn state_through_json_between_batches_counts_as_one_batch_does() {
    let ys = [80.0, 110.0, 90.0, 120.0, 70.0, 130.0];
    let mut whole = LineState::default();
    let one = run(config(serde_json::json!({})), &mut whole, &walk(&ys));

    let all = walk(&ys);
    let mut state = LineState::default();
    let first = run(config(serde_json::json!({})), &mut state, &all.slice(0, 3));
    let json = serde_json::to_string(&state).expect("serializable");
    let mut state: LineState = serde_json::from_str(&json).expect("readable");
    let second = run(config(serde_json::json!({})), &mut state, &all.slice(3, 3));
    assert_eq!(state, whole);
    let mut split = events(&first.records);
    split.extend(events(&second.records));
    assert_eq!(split, events(&one.records));
}

#[test]
fn config_errors_are_located_at_their_keys() {
    let located = |json: serde_json::Value| -> String {
        let config: LineCountConfig = serde_json::from_value(json).expect("parses");
        let e = LineCount::new(config).expect_err("invalid");
        e.located().0.unwrap_or("").to_string()
    };
    let line =
        |name: &str, to: [f32; 2]| serde_json::json!({ "name": name, "from": [0, 0], "to": to });
    assert_eq!(located(serde_json::json!({ "lines": [] })), "lines");
    assert_eq!(
        located(serde_json::json!({ "lines": [line("a", [1.0, 0.0]), line("a", [2.0, 0.0])] })),
        "lines[1].name"
    );
    assert_eq!(
        located(serde_json::json!({ "lines": [line("a", [0.0, 0.0])] })),
        "lines[0].to"
    );
    assert_eq!(
        located(serde_json::json!({ "lines": [line("a", [1.0, 0.0])], "window_frames": 0 })),
        "window_frames"
    );
    assert_eq!(
        located(serde_json::json!({ "lines": [line("a", [1.0, 0.0])], "forget_after_frames": 0 })),
        "forget_after_frames"
    );
    let unknown = serde_json::from_value::<LineCountConfig>(
        serde_json::json!({ "lines": [], "anchor": "top" }),
    );
    assert!(unknown.is_err());
}

#[test]
fn schema_errors_are_located_at_the_column_keys() {
    let batch = walk(&[1.0]);
    let schema = batch.schema();
    let located = |extra: serde_json::Value| {
        let e = config(extra).output_schema(&schema).expect_err("invalid");
        (e.located().0.unwrap_or("").to_string(), e.to_string())
    };
    assert_eq!(located(serde_json::json!({ "key": "site" })).0, "key");
    assert_eq!(located(serde_json::json!({ "frame": "width" })).0, "frame");
    assert_eq!(
        located(serde_json::json!({ "detections": "camera_id" })).0,
        "detections"
    );

    // Detections without `track_id` (no `track` stage before) are refused, saying so.
    let untracked = super::test_input::detections(&[Some(vec![at(1, 0.0, 0.0)])], false);
    let plain = RecordBatch::try_from_iter([
        (
            "camera_id",
            std::sync::Arc::new(arrow_array::StringArray::from(vec!["c"])) as _,
        ),
        (
            "frame",
            std::sync::Arc::new(arrow_array::Int64Array::from(vec![0])) as _,
        ),
        ("detections", untracked),
    ])
    .expect("batch");
    let e = config(serde_json::json!({}))
        .output_schema(&plain.schema())
        .expect_err("untracked");
    assert_eq!(e.located().0, Some("detections"));
    assert!(e.to_string().contains("track_id"), "{e}");

    // The output: the input's columns, then the two lists.
    let out = config(serde_json::json!({}))
        .output_schema(&schema)
        .expect("schema");
    let names: Vec<&str> = out.fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(
        names,
        [
            "camera_id",
            "frame",
            "width",
            "height",
            "detections",
            "line_events",
            "line_totals"
        ]
    );
    assert!(config(serde_json::json!({})).stateful());
}

#[test]
fn totals_of_lines_no_longer_configured_are_dropped() {
    // A checkpoint from a configuration that had a line `old`.
    let mut state = LineState::default();
    state.totals.insert(
        "old".into(),
        std::collections::BTreeMap::from([(1, [4, 2])]),
    );
    let out = run(
        config(serde_json::json!({})),
        &mut state,
        &walk(&[90.0, 110.0]),
    );
    assert!(!state.totals.contains_key("old"));
    assert_eq!(totals(&out.records)[1], ["door/1/1/0"]);
}
