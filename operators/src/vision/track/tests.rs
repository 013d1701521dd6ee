//! The tracker on synthetic scenes, and the stage on Arrow rows (validation, dead letters).

use std::sync::Arc;

use arrow_array::builder::{
    Float32Builder, Int64Builder, ListBuilder, StringBuilder, StructBuilder,
};
use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};

use super::*;
use riffle_dataflow::operators::KeyedLogic;

fn params() -> Params {
    TrackConfig::default_for_tests()
        .params()
        .expect("default params")
}

impl TrackConfig {
    fn default_for_tests() -> Self {
        serde_json::from_str("{}").expect("every key has a default")
    }
}

/// A 20×40 box with its top-left corner at (x, y).
fn det(x: f32, y: f32, score: f32) -> Detection {
    Detection {
        rect: [x, y, x + 20.0, y + 40.0],
        score,
        class_id: 1,
    }
}

#[test]
fn two_objects_crossing_paths_keep_their_ids() {
    let p = params();
    let mut cam = CameraTracks::default();
    let mut first_ids = None;
    for f in 0..60 {
        // A walks right, B walks left, 10 px lower: they cross around frame 30.
        let a = det(40.0 + 4.0 * f as f32, 100.0, 0.9);
        let b = det(280.0 - 4.0 * f as f32, 110.0, 0.8);
        let ids = cam.step(f, &[a, b], &p);
        let ids = (ids[0].expect("A tracked"), ids[1].expect("B tracked"));
        assert_ne!(ids.0, ids.1);
        assert_eq!(*first_ids.get_or_insert(ids), ids, "frame {f}");
    }
    assert_eq!(cam.last_id, 2, "no track was ever started twice");
}

#[test]
fn an_object_occluded_within_the_buffer_gets_its_id_back() {
    let p = params();
    let mut cam = CameraTracks::default();
    let x = |f: i64| 10.0 + 2.0 * f as f32;
    let mut id = None;
    for f in 0..10 {
        id = cam.step(f, &[det(x(f), 50.0, 0.9)], &p)[0];
    }
    let id = id.expect("tracked");
    // Hidden for 25 frames (< track_buffer 30): coasting on its velocity.
    for f in 10..35 {
        assert!(cam.step(f, &[], &p).is_empty());
        assert_eq!(cam.lost.len(), 1, "frame {f}");
    }
    assert_eq!(cam.step(35, &[det(x(35), 50.0, 0.9)], &p)[0], Some(id));

    // Hidden longer than the buffer: the track is dropped, the object comes back as new.
    for f in 36..80 {
        cam.step(f, &[], &p);
    }
    assert!(cam.tracked.is_empty() && cam.lost.is_empty());
    assert_eq!(cam.step(80, &[det(x(80), 50.0, 0.9)], &p)[0], None);
    assert_eq!(cam.step(81, &[det(x(81), 50.0, 0.9)], &p)[0], Some(id + 1));
}

#[test]
fn missing_frame_numbers_are_empty_frames() {
    let p = params();
    let x = |f: i64| 10.0 + 3.0 * f as f32;
    let seen = |f: i64| !(10..22).contains(&f);
    let (mut gaps, mut empties) = (CameraTracks::default(), CameraTracks::default());
    for f in 0..40 {
        let d = [det(x(f), 60.0, 0.9)];
        let with_empty = empties.step(f, if seen(f) { &d } else { &[] }, &p);
        if seen(f) {
            assert_eq!(gaps.step(f, &d, &p), with_empty, "frame {f}");
        }
    }
    assert_eq!(gaps, empties);
    assert_eq!(gaps.last_id, 1, "the id came back after the gap");
}

#[test]
fn low_scores_continue_a_track_but_never_start_one() {
    let p = params();
    let mut cam = CameraTracks::default();
    let mut id = None;
    for f in 0..5 {
        id = cam.step(f, &[det(10.0 + f as f32, 50.0, 0.9)], &p)[0];
    }
    let id = id.expect("tracked");
    for f in 5..15 {
        // The tracked object's score drops to 0.3; another object only ever scores 0.3.
        let ids = cam.step(
            f,
            &[det(10.0 + f as f32, 50.0, 0.3), det(200.0, 50.0, 0.3)],
            &p,
        );
        assert_eq!(ids, vec![Some(id), None], "frame {f}");
    }
    assert_eq!(cam.last_id, 1);
    // Below low_threshold a detection is ignored: the track is lost.
    assert_eq!(cam.step(15, &[det(25.0, 50.0, 0.05)], &p), vec![None]);
    assert_eq!(cam.lost.len(), 1);
}

#[test]
fn a_new_object_is_confirmed_on_its_second_frame() {
    let p = params();
    let mut cam = CameraTracks::default();
    // On the camera's first frame tracks start confirmed.
    assert_eq!(cam.step(0, &[det(10.0, 10.0, 0.9)], &p), vec![Some(1)]);
    let two = [det(10.0, 10.0, 0.9), det(200.0, 10.0, 0.9)];
    assert_eq!(cam.step(1, &two, &p), vec![Some(1), None]);
    assert_eq!(cam.step(2, &two, &p), vec![Some(1), Some(2)]);
    // Below new_track_threshold (0.6) nothing starts, even above high_threshold.
    let weak = [
        det(10.0, 10.0, 0.9),
        det(200.0, 10.0, 0.9),
        det(400.0, 10.0, 0.55),
    ];
    for f in 3..6 {
        assert_eq!(cam.step(f, &weak, &p), vec![Some(1), Some(2), None]);
    }
}

#[test]
fn class_aware_tracks_do_not_switch_class() {
    let config: TrackConfig = serde_json::from_str(r#"{"class_aware": true}"#).expect("config");
    let p = config.params().expect("params");
    let mut cam = CameraTracks::default();
    assert_eq!(cam.step(0, &[det(10.0, 10.0, 0.9)], &p), vec![Some(1)]);
    let other_class = Detection {
        class_id: 3,
        ..det(10.0, 10.0, 0.9)
    };
    // Same place, other class: a new (unconfirmed) track, the class-1 track is lost.
    assert_eq!(cam.step(1, &[other_class], &p), vec![None]);
    assert_eq!(cam.lost.len(), 1);
    // Class-agnostic, the same detection continues track 1.
    let mut agnostic = CameraTracks::default();
    agnostic.step(0, &[det(10.0, 10.0, 0.9)], &params());
    assert_eq!(agnostic.step(1, &[other_class], &params()), vec![Some(1)]);
}

#[test]
fn state_survives_json_exactly() {
    let p = params();
    let mut cam = CameraTracks::default();
    for f in 0..20 {
        cam.step(
            f,
            &[
                det(3.0 * f as f32, 7.0, 0.9),
                det(300.0, 1.5 * f as f32, 0.7),
            ],
            &p,
        );
    }
    let json = serde_json::to_string(&cam).expect("serializable");
    let back: CameraTracks = serde_json::from_str(&json).expect("readable");
    assert_eq!(back, cam);
}

// ---- The stage on Arrow rows ----

/// One row: its frame (`None`: null) and detections as (score, x1, y1, x2, y2).
type Row = (Option<i64>, Vec<(f32, f32, f32, f32, f32)>);

/// Rows of one camera.
fn rows(frames: &[Row]) -> RecordBatch {
    let coord = |name: &str| Field::new(name, DataType::Float32, false);
    let fields = arrow_schema::Fields::from(vec![
        Field::new("class_id", DataType::Int64, false),
        Field::new("label", DataType::Utf8, true),
        coord("score"),
        coord("x1"),
        coord("y1"),
        coord("x2"),
        coord("y2"),
    ]);
    let mut list = ListBuilder::new(StructBuilder::from_fields(fields.clone(), 0)).with_field(
        Arc::new(Field::new_list_field(DataType::Struct(fields), false)),
    );
    for (_, dets) in frames {
        let entries = list.values();
        for &(score, x1, y1, x2, y2) in dets {
            let f32s = |e: &mut StructBuilder, i: usize, v: f32| {
                e.field_builder::<Float32Builder>(i)
                    .expect("f32")
                    .append_value(v)
            };
            entries
                .field_builder::<Int64Builder>(0)
                .expect("class")
                .append_value(1);
            entries
                .field_builder::<StringBuilder>(1)
                .expect("label")
                .append_value("person");
            f32s(entries, 2, score);
            f32s(entries, 3, x1);
            f32s(entries, 4, y1);
            f32s(entries, 5, x2);
            f32s(entries, 6, y2);
            entries.append(true);
        }
        list.append(true);
    }
    let list: ArrayRef = Arc::new(list.finish());
    let schema = Schema::new(vec![
        Field::new("camera_id", DataType::Utf8, false),
        Field::new("frame", DataType::Int64, true),
        Field::new("detections", list.data_type().clone(), true),
    ]);
    let cameras = StringArray::from(vec!["cam"; frames.len()]);
    let numbers = Int64Array::from(frames.iter().map(|(f, _)| *f).collect::<Vec<_>>());
    RecordBatch::try_new(
        Arc::new(schema),
        vec![Arc::new(cameras), Arc::new(numbers), list],
    )
    .expect("rows")
}

/// Each output row's track ids.
fn track_ids(batch: &RecordBatch) -> Vec<Vec<Option<i64>>> {
    let list = batch
        .column_by_name("detections")
        .expect("detections")
        .as_list::<i32>();
    (0..list.len())
        .map(|row| {
            let entries = list.value(row);
            let ids = entries
                .as_struct()
                .column_by_name(TRACK_ID)
                .expect("track_id");
            ids.as_primitive::<Int64Type>().iter().collect()
        })
        .collect()
}

#[test]
fn the_stage_adds_track_ids_and_letters_malformed_rows() {
    let config = TrackConfig::default_for_tests();
    let mut tracker = Tracker::new(config.clone()).expect("tracker");
    let person = |x: f32| (0.9, x, 10.0, x + 20.0, 50.0);
    let batch = rows(&[
        (Some(0), vec![person(10.0), person(100.0)]),
        (None, vec![person(12.0)]),
        (
            Some(1),
            vec![person(12.0), (f32::NAN, 100.0, 10.0, 120.0, 50.0)],
        ),
        (Some(1), vec![person(14.0), person(100.0)]),
        (Some(2), vec![person(14.0), person(100.0)]),
        (Some(2), vec![]),
    ]);
    let mut state = CameraTracks::default();
    let out = tracker
        .process("cam", &mut state, &batch)
        .expect("processed");

    let expected_schema = config.output_schema(batch.schema_ref()).expect("schema");
    assert_eq!(out.records.schema(), expected_schema);
    let frames = out.records.column_by_name("frame").expect("frame");
    assert_eq!(frames.as_primitive::<Int64Type>().values(), &[0, 1, 2]);
    // Frame 1's NaN row was refused: the repeated frame 1 is tracked in its place.
    assert_eq!(
        track_ids(&out.records),
        vec![
            vec![Some(1), Some(2)],
            vec![Some(1), Some(2)],
            vec![Some(1), Some(2)]
        ]
    );
    let reasons: Vec<&str> = out.rejected.iter().map(|l| l.reason.as_str()).collect();
    assert_eq!(reasons.len(), 3, "{reasons:?}");
    assert_eq!(reasons[0], "`frame` is null");
    assert!(
        reasons[1].starts_with("detection 1 has a non-finite score or box"),
        "{}",
        reasons[1]
    );
    assert_eq!(
        reasons[2],
        "frame 2 does not follow the camera's last frame 2 (late or repeated)"
    );
    assert!(out.rejected.iter().all(|l| l.stage == "track"));
    assert_eq!(state.last_frame, Some(2));
}

#[test]
fn a_separate_output_column_keeps_the_input() {
    let config: TrackConfig = serde_json::from_str(r#"{"output": "tracked"}"#).expect("config");
    let batch = rows(&[(Some(0), vec![(0.9, 1.0, 1.0, 21.0, 41.0)])]);
    let out = Tracker::new(config)
        .expect("tracker")
        .process("cam", &mut CameraTracks::default(), &batch)
        .expect("processed")
        .records;
    assert_eq!(out.column_by_name("detections"), Some(batch.column(2)));
    let tracked = out
        .column_by_name("tracked")
        .expect("tracked")
        .as_list::<i32>();
    let ids = tracked.value(0);
    let ids = ids.as_struct().column_by_name(TRACK_ID).expect("ids");
    assert_eq!(ids.as_primitive::<Int64Type>().value(0), 1);
}

#[test]
fn bad_columns_and_keys_are_refused_at_their_key() {
    let good = rows(&[(Some(0), vec![])]).schema();
    let with = |name: &str, ty: DataType| {
        let fields: Vec<Field> = good
            .fields()
            .iter()
            .map(|f| {
                if f.name() == name {
                    Field::new(name, ty.clone(), true)
                } else {
                    f.as_ref().clone()
                }
            })
            .collect();
        Arc::new(Schema::new(fields))
    };
    let config = TrackConfig::default_for_tests();
    let cases = [
        (with("frame", DataType::Utf8), "frame", "column `frame`: expected Int64, found Utf8"),
        (with("camera_id", DataType::Float64), "camera", "column `camera_id`: expected Utf8 or Int64, found Float64"),
        (with("detections", DataType::Int32), "input", "column `detections`: expected List<Struct{class_id: Int64, score, x1, y1, x2, y2: Float32, …}>, found Int32"),
    ];
    for (schema, key, message) in cases {
        let e = config.output_schema(&schema).expect_err(key);
        assert_eq!(e.located().0, Some(key), "{e}");
        assert_eq!(crate::unlocated(e).to_string(), message);
    }
    let clash: TrackConfig = serde_json::from_str(r#"{"output": "frame"}"#).expect("config");
    let e = clash.output_schema(&good).expect_err("output clash");
    assert_eq!(e.located().0, Some("output"));

    let twice = config.output_schema(&good).expect("tracked once");
    let e = config.output_schema(&twice).expect_err("tracked twice");
    assert_eq!(e.located().0, Some("input"));
    assert!(e.to_string().contains("already has `track_id`"), "{e}");

    for (json, key) in [
        (r#"{"low_threshold": 0.7}"#, "low_threshold"),
        (r#"{"high_threshold": 1.5}"#, "high_threshold"),
        (r#"{"match_iou": 0}"#, "match_iou"),
        (r#"{"new_track_threshold": -1}"#, "new_track_threshold"),
    ] {
        let bad: TrackConfig = serde_json::from_str(json).expect("parses");
        let e = bad.output_schema(&good).expect_err(json);
        assert_eq!(e.located().0, Some(key), "{json}: {e}");
    }
}
