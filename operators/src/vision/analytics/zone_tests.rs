use std::sync::Arc;

use super::test_input::{at, frames, joined, numbered, with, Det};
use super::zone::{Zone, ZoneConfig, ZoneState};
use crate::StageKind;
use arrow_array::{Int64Array, RecordBatch, StringArray};
use riffle_dataflow::operators::KeyedLogic;
use riffle_dataflow::StageOutput;

/// Zone `desk`: the square x, y in 100..200; zone `hall`: x in 0..400, y in 150..300.
fn config(extra: serde_json::Value) -> ZoneConfig {
    let mut config = serde_json::json!({
        "zones": [
            { "name": "desk", "polygon": [[100, 100], [200, 100], [200, 200], [100, 200]] },
            { "name": "hall", "polygon": [[0, 150], [400, 150], [400, 300], [0, 300]] },
        ],
    });
    if let (Some(c), Some(e)) = (config.as_object_mut(), extra.as_object()) {
        c.extend(e.clone());
    }
    serde_json::from_value(config).expect("a zone config")
}

fn run(config: ZoneConfig, state: &mut ZoneState, batch: &RecordBatch) -> StageOutput {
    let mut logic = Zone::new(config).expect("valid config");
    logic.process("cam", state, batch).expect("processed")
}

fn events(out: &RecordBatch) -> Vec<Vec<String>> {
    joined(
        out,
        "zone_events",
        &["zone", "track_id", "event", "dwell_frames", "dwell_ms"],
    )
}

fn occupancy(out: &RecordBatch) -> Vec<Vec<String>> {
    joined(out, "zone_occupancy", &["zone", "count"])
}

/// Track 5 with its bottom centre at these points, one frame each.
fn path(points: &[(f32, f32)]) -> RecordBatch {
    numbered(
        "cam",
        0,
        points.iter().map(|(x, y)| vec![at(5, *x, *y)]).collect(),
    )
}

#[test]
fn enter_exit_and_dwell_in_frames_and_ms_at_the_configured_fps() {
    // Into the desk at frame 1, out at frame 4 (still in the hall, entered at frame 2).
    let batch = path(&[
        (50.0, 50.0),
        (150.0, 120.0),
        (150.0, 160.0),
        (150.0, 170.0),
        (250.0, 170.0),
    ]);
    let mut state = ZoneState::default();
    let out = run(
        config(serde_json::json!({ "fps": 10.0 })),
        &mut state,
        &batch,
    );
    assert!(out.rejected.is_empty());
    let none: Vec<String> = Vec::new();
    assert_eq!(
        events(&out.records),
        vec![
            none.clone(),
            vec!["desk/5/enter/null/null".to_string()],
            vec!["hall/5/enter/null/null".to_string()],
            none,
            vec!["desk/5/exit/3/300".to_string()],
        ]
    );
    assert_eq!(occupancy(&out.records)[3], ["desk/1", "hall/1"]);
    assert_eq!(occupancy(&out.records)[4], ["desk/0", "hall/1"]);
    assert_eq!(state.inside["hall"][&5].entered.frame, 2);
}

#[test]
fn dwell_ms_comes_from_pts_when_the_input_has_it() {
    let batch = path(&[(150.0, 150.0), (150.0, 150.0), (50.0, 50.0)]);
    // Irregular frame times: the dwell is the presentation times', not frames / fps.
    let batch = with(
        &batch,
        "pts_ms",
        Arc::new(Int64Array::from(vec![1000, 1033, 1100])),
    );
    let out = run(
        config(serde_json::json!({})),
        &mut ZoneState::default(),
        &batch,
    );
    assert_eq!(
        events(&out.records)[2],
        ["desk/5/exit/2/100", "hall/5/exit/2/100"]
    );
}

#[test]
fn a_track_lost_inside_exits_after_forget_after_frames() {
    // Track 5 in the desk at frames 0 and 1, then unseen; track 6 keeps frames coming.
    let other = |f: i64| (Some(f), vec![at(6, 10.0, 10.0)]);
    let mut rows = vec![
        (Some(0), vec![at(5, 150.0, 120.0), at(6, 10.0, 10.0)]),
        (Some(1), vec![at(5, 150.0, 120.0), at(6, 10.0, 10.0)]),
    ];
    rows.extend((2..=6).map(other));
    let batch = frames("cam", &rows);
    let out = run(
        config(serde_json::json!({ "forget_after_frames": 5, "fps": 25.0 })),
        &mut ZoneState::default(),
        &batch,
    );
    let events = events(&out.records);
    // Inside (occupancy 1) while lost for fewer than 5 frames; exits at frame 6, its dwell
    // running to frame 1, where it was last seen inside.
    assert!(events[2..6].iter().all(Vec::is_empty), "{events:?}");
    assert_eq!(events[6], ["desk/5/exit/1/40"]);
    assert_eq!(occupancy(&out.records)[5][0], "desk/1");
    assert_eq!(occupancy(&out.records)[6][0], "desk/0");
}

#[test]
fn occupancy_counts_the_followed_tracks_only() {
    let car = Det {
        class: 3,
        ..at(8, 160.0, 160.0)
    };
    let untracked = Det {
        track: None,
        ..at(0, 170.0, 170.0)
    };
    let batch = numbered(
        "cam",
        0,
        vec![vec![
            at(1, 150.0, 150.0),
            at(2, 120.0, 190.0),
            car,
            untracked,
        ]],
    );
    let out = run(
        config(serde_json::json!({})),
        &mut ZoneState::default(),
        &batch,
    );
    assert_eq!(occupancy(&out.records)[0], ["desk/3", "hall/3"]);
    let out = run(
        config(serde_json::json!({ "classes": [3] })),
        &mut ZoneState::default(),
        &batch,
    );
    assert_eq!(occupancy(&out.records)[0], ["desk/1", "hall/1"]);
    assert_eq!(
        events(&out.records)[0],
        ["desk/8/enter/null/null", "hall/8/enter/null/null"]
    );
}

#[test]
fn bad_rows_are_dead_letters_and_leave_the_state_alone() {
    let batch = path(&[(150.0, 150.0), (150.0, 150.0), (50.0, 50.0), (50.0, 50.0)]);
    let batch = with(
        &batch,
        "pts_ms",
        Arc::new(Int64Array::from(vec![Some(0), None, Some(80), Some(120)])),
    );
    // Row 2 says frame 0 again.
    let frame = Int64Array::from(vec![0, 1, 0, 3]);
    let batch = RecordBatch::try_new(batch.schema(), {
        let mut c = batch.columns().to_vec();
        c[1] = Arc::new(frame);
        c
    })
    .expect("batch");
    let mut state = ZoneState::default();
    let out = run(config(serde_json::json!({})), &mut state, &batch);
    let reasons: Vec<&str> = out.rejected.iter().map(|d| d.reason.as_str()).collect();
    assert_eq!(reasons[0], "null `pts_ms`");
    assert!(
        reasons[1].starts_with("frame 0 is not after frame 0"),
        "{reasons:?}"
    );
    assert_eq!(reasons.len(), 2);
    assert_eq!(
        events(&out.records)[1],
        ["desk/5/exit/3/120", "hall/5/exit/3/120"]
    );
    assert!(state.inside["desk"].is_empty());
}

#[test]
fn config_and_schema_errors_are_located_at_their_keys() {
    let located = |json: serde_json::Value| -> String {
        let config: ZoneConfig = serde_json::from_value(json).expect("parses");
        let e = Zone::new(config).expect_err("invalid");
        e.located().0.unwrap_or("").to_string()
    };
    let zone = |name: &str, polygon: serde_json::Value| serde_json::json!({ "name": name, "polygon": polygon });
    let square = serde_json::json!([[0, 0], [1, 0], [1, 1]]);
    assert_eq!(located(serde_json::json!({ "zones": [] })), "zones");
    assert_eq!(
        located(serde_json::json!({ "zones": [zone("a", serde_json::json!([[0, 0], [1, 1]]))] })),
        "zones[0].polygon"
    );
    assert_eq!(
        located(
            serde_json::json!({ "zones": [zone("a", square.clone()), zone("a", square.clone())] })
        ),
        "zones[1].name"
    );
    assert_eq!(
        located(serde_json::json!({ "zones": [zone("a", square.clone())], "fps": 0.0 })),
        "fps"
    );

    let batch = path(&[(1.0, 1.0)]);
    let texts = with(&batch, "pts_ms", Arc::new(StringArray::from(vec!["0"])));
    let e = config(serde_json::json!({}))
        .output_schema(&texts.schema())
        .expect_err("pts text");
    assert_eq!(e.located().0, Some("pts"));
    let e = config(serde_json::json!({ "key": "nope" }))
        .output_schema(&batch.schema())
        .expect_err("key");
    assert_eq!(e.located().0, Some("key"));
    let out = config(serde_json::json!({}))
        .output_schema(&batch.schema())
        .expect("schema");
    assert_eq!(out.fields().len(), batch.num_columns() + 2);
    assert!(out.field_with_name("zone_occupancy").is_ok());
}
