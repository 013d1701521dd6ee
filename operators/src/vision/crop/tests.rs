use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, Int64Type, UInt32Type};
use arrow_array::{ArrayRef, BinaryArray, Int64Array, RecordBatch, StringArray, UInt32Array};

use super::*;
use crate::vision::analytics::test_input::{detections, Det};
use crate::StageKind;

/// A `w`×`h` image whose pixel (x, y) is (x, y, 7).
fn image(w: u32, h: u32) -> Vec<u8> {
    (0..h)
        .flat_map(|y| (0..w).flat_map(move |x| [x as u8, y as u8, 7]))
        .collect()
}

fn det(track: Option<i64>, class: i64, rect: [f32; 4]) -> Det {
    Det { track, class, rect }
}

/// Frame rows of camera `cam` on 64×32 images: `(frame, detections)`.
fn frames(rows: Vec<(i64, Vec<Det>)>, tracked: bool) -> RecordBatch {
    let n = rows.len();
    let pixels = image(64, 32);
    let lists: Vec<Option<Vec<Det>>> = rows.iter().map(|r| Some(r.1.clone())).collect();
    RecordBatch::try_from_iter([
        (
            "camera_id",
            Arc::new(StringArray::from(vec!["cam"; n])) as ArrayRef,
        ),
        (
            "frame",
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
        ),
        (
            "pixels",
            Arc::new(BinaryArray::from(vec![pixels.as_slice(); n])),
        ),
        ("width", Arc::new(UInt32Array::from(vec![64; n]))),
        ("height", Arc::new(UInt32Array::from(vec![32; n]))),
        ("detections", detections(&lists, tracked)),
    ])
    .expect("a frame batch")
}

fn config(extra: serde_json::Value) -> CropConfig {
    let mut config = serde_json::json!({ "width": 4, "height": 4 });
    if let (Some(c), Some(e)) = (config.as_object_mut(), extra.as_object()) {
        c.extend(e.clone());
    }
    serde_json::from_value(config).expect("a crop config")
}

fn crop(config: CropConfig, batch: &RecordBatch) -> StageOutput {
    Crop::new(config)
        .expect("valid")
        .process_batch(batch)
        .expect("processed")
}

#[test]
fn regions_are_padded_clipped_and_rounded_outwards() {
    // Inside the image: rounded outwards to whole pixels.
    assert_eq!(
        crop_region([10.4, 5.5, 20.2, 9.0], 0.0, 1.0, 64, 32),
        Some([10, 5, 11, 4])
    );
    // Padding: 10% of 20 (width) and of 10 (height) on each side.
    assert_eq!(
        crop_region([20.0, 10.0, 40.0, 20.0], 0.1, 1.0, 64, 32),
        Some([18, 9, 24, 12])
    );
    // Partly outside: clipped to the image, padding too.
    assert_eq!(
        crop_region([-10.0, 25.0, 10.0, 50.0], 0.5, 1.0, 64, 32),
        Some([0, 12, 20, 20])
    );
    // Swapped corners are ordered.
    assert_eq!(
        crop_region([20.0, 9.0, 10.0, 5.0], 0.0, 1.0, 64, 32),
        Some([10, 5, 10, 4])
    );
    // Entirely outside, or under min_size once clipped: no crop.
    assert_eq!(crop_region([70.0, 0.0, 90.0, 10.0], 0.0, 1.0, 64, 32), None);
    assert_eq!(crop_region([60.0, 0.0, 90.0, 10.0], 0.0, 5.0, 64, 32), None);
    assert_eq!(
        crop_region([58.0, 0.0, 90.0, 10.0], 0.0, 5.0, 64, 32),
        Some([58, 0, 6, 10])
    );
    // A zero-size box gives nothing even with min_size 0.
    assert_eq!(crop_region([5.0, 5.0, 5.0, 9.0], 0.0, 0.0, 64, 32), None);
}

#[test]
fn crops_hold_the_clipped_region_pixels() {
    // A box spilling over the right edge: x 60..64 of 60..70 is inside; 4×4 at y 10..14.
    let batch = frames(
        vec![(3, vec![det(Some(9), 1, [60.0, 10.0, 70.0, 14.0])])],
        true,
    );
    let out = crop(config(serde_json::json!({})), &batch);
    assert!(out.rejected.is_empty());
    let records = &out.records;
    assert_eq!(records.num_rows(), 1);
    // Same size as the region: the crop is the region's pixels exactly.
    let expected: Vec<u8> = (10..14u8)
        .flat_map(|y| (60..64u8).flat_map(move |x| [x, y, 7]))
        .collect();
    let pixels = records
        .column_by_name("pixels")
        .expect("pixels")
        .as_binary::<i32>();
    assert_eq!(pixels.value(0), expected.as_slice());
    let size = |c: &str| {
        records
            .column_by_name(c)
            .expect(c)
            .as_primitive::<UInt32Type>()
            .value(0)
    };
    assert_eq!((size("width"), size("height")), (4, 4));
    let int = |c: &str| {
        records
            .column_by_name(c)
            .expect(c)
            .as_primitive::<Int64Type>()
            .value(0)
    };
    assert_eq!((int("frame"), int("track_id"), int("class_id")), (3, 9, 1));
    assert_eq!(
        records
            .column_by_name("camera_id")
            .expect("camera")
            .as_string::<i32>()
            .value(0),
        "cam"
    );
}

#[test]
fn one_row_per_object_in_order_with_filters() {
    let batch = frames(
        vec![
            (
                0,
                vec![
                    det(Some(1), 1, [0.0, 0.0, 8.0, 8.0]),
                    det(None, 3, [10.0, 0.0, 18.0, 8.0]),
                    det(Some(2), 1, [20.0, 0.0, 20.5, 8.0]),
                ],
            ),
            (1, vec![]),
            (2, vec![det(Some(1), 1, [1.0, 1.0, 9.0, 9.0])]),
        ],
        true,
    );
    let out = crop(config(serde_json::json!({})), &batch);
    let records = &out.records;
    let ints = |c: &str| -> Vec<Option<i64>> {
        records
            .column_by_name(c)
            .expect(c)
            .as_primitive::<Int64Type>()
            .iter()
            .collect()
    };
    // Track 2's box is half a pixel wide: under min_size (1).
    assert_eq!(ints("frame"), [Some(0), Some(0), Some(2)]);
    assert_eq!(ints("track_id"), [Some(1), None, Some(1)]);
    let index = records
        .column_by_name("object_index")
        .expect("index")
        .as_primitive::<Int32Type>();
    assert_eq!(index.values().to_vec(), [0, 1, 0]);
    // The frame's own pixels, size and detections are not carried.
    let names: Vec<&str> = records
        .schema_ref()
        .fields()
        .iter()
        .map(|f| f.name().as_str())
        .collect();
    assert_eq!(
        names,
        [
            "camera_id",
            "frame",
            "track_id",
            "object_index",
            "class_id",
            "score",
            "x1",
            "y1",
            "x2",
            "y2",
            "pixels",
            "width",
            "height"
        ]
    );

    let out = crop(
        config(serde_json::json!({ "classes": [3], "min_size": 0.25 })),
        &batch,
    );
    assert_eq!(out.records.num_rows(), 1);
    let out = crop(config(serde_json::json!({ "min_size": 0.25 })), &batch);
    assert_eq!(out.records.num_rows(), 4);
}

#[test]
fn untracked_detections_give_no_track_id_column() {
    let batch = frames(vec![(0, vec![det(None, 1, [0.0, 0.0, 8.0, 8.0])])], false);
    let out = crop(config(serde_json::json!({})), &batch);
    assert_eq!(out.records.num_rows(), 1);
    assert!(out.records.column_by_name("track_id").is_none());
    // reinfer_every needs track ids.
    let e = config(serde_json::json!({ "reinfer_every": 5 }))
        .output_schema(batch.schema_ref())
        .expect_err("untracked");
    assert_eq!(e.located().0, Some("reinfer_every"));
}

#[test]
fn bad_rows_are_dead_letters_and_the_others_go_on() {
    let good = det(Some(1), 1, [0.0, 0.0, 8.0, 8.0]);
    let nan = det(Some(2), 1, [f32::NAN, 0.0, 8.0, 8.0]);
    let batch = frames(
        vec![
            (0, vec![good]),
            (1, vec![good]),
            (2, vec![nan]),
            (3, vec![good]),
        ],
        true,
    );
    // Row 1's pixels are too short for 64×32.
    let mut columns = batch.columns().to_vec();
    let full = image(64, 32);
    let short = vec![0u8; 10];
    columns[2] = Arc::new(BinaryArray::from(vec![
        Some(full.as_slice()),
        Some(short.as_slice()),
        Some(full.as_slice()),
        None,
    ]));
    let names = batch
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect::<Vec<_>>();
    let batch = RecordBatch::try_from_iter(names.into_iter().zip(columns)).expect("batch");
    let out = crop(config(serde_json::json!({})), &batch);
    let reasons: Vec<&str> = out.rejected.iter().map(|d| d.reason.as_str()).collect();
    assert_eq!(reasons.len(), 3, "{reasons:?}");
    assert!(reasons[0].contains("expected 6144"), "{}", reasons[0]);
    assert!(reasons[1].contains("not finite"), "{}", reasons[1]);
    assert_eq!(reasons[2], "null `pixels`");
    let frames = out
        .records
        .column_by_name("frame")
        .expect("frame")
        .as_primitive::<Int64Type>();
    assert_eq!(frames.values().to_vec(), [0]);
}

#[test]
fn reinfer_every_crops_a_track_once_every_n_frames() {
    // Track 1 on every frame 0..=7, an untracked object on every frame too.
    let rows: Vec<(i64, Vec<Det>)> = (0..8)
        .map(|f| {
            (
                f,
                vec![
                    det(Some(1), 1, [0.0, 0.0, 8.0, 8.0]),
                    det(None, 1, [9.0, 0.0, 17.0, 8.0]),
                ],
            )
        })
        .collect();
    let batch = frames(rows, true);
    let cfg = config(serde_json::json!({ "reinfer_every": 3 }));
    assert!(cfg.stateful());
    let mut logic = CropPerTrack(Crop::new(cfg).expect("valid"));
    // In two calls, the state carried between them (as checkpoints carry it).
    let mut state = CropState::default();
    let first = logic
        .process("cam", &mut state, &batch.slice(0, 4))
        .expect("first");
    let mut state: CropState =
        serde_json::from_str(&serde_json::to_string(&state).expect("json")).expect("state");
    let second = logic
        .process("cam", &mut state, &batch.slice(4, 4))
        .expect("second");
    let tracked = |out: &StageOutput| -> Vec<i64> {
        let frames = out
            .records
            .column_by_name("frame")
            .expect("frame")
            .as_primitive::<Int64Type>();
        let tracks = out
            .records
            .column_by_name("track_id")
            .expect("track")
            .as_primitive::<Int64Type>();
        (0..frames.len())
            .filter(|&i| tracks.is_valid(i))
            .map(|i| frames.value(i))
            .collect()
    };
    let mut frames_of_track = tracked(&first);
    frames_of_track.extend(tracked(&second));
    assert_eq!(frames_of_track, [0, 3, 6]);
    // The untracked object: every frame.
    assert_eq!(first.records.num_rows() + second.records.num_rows(), 3 + 8);
    assert_eq!(state.cropped.get(&1), Some(&6));
}

#[test]
fn config_errors_are_located_at_their_keys() {
    let located = |extra: serde_json::Value| {
        Crop::new(config(extra))
            .err()
            .and_then(|e| e.located().0.map(str::to_string))
    };
    assert_eq!(
        located(serde_json::json!({ "width": 0 })).as_deref(),
        Some("width")
    );
    assert_eq!(
        located(serde_json::json!({ "height": 0 })).as_deref(),
        Some("height")
    );
    assert_eq!(
        located(serde_json::json!({ "padding": -0.1 })).as_deref(),
        Some("padding")
    );
    assert_eq!(
        located(serde_json::json!({ "min_size": -1.0 })).as_deref(),
        Some("min_size")
    );
    assert_eq!(
        located(serde_json::json!({ "reinfer_every": 0 })).as_deref(),
        Some("reinfer_every")
    );

    let batch = frames(vec![(0, vec![])], true);
    let schema_error = |extra: serde_json::Value| {
        config(extra)
            .output_schema(batch.schema_ref())
            .err()
            .and_then(|e| e.located().0.map(str::to_string))
    };
    assert_eq!(
        schema_error(serde_json::json!({ "input": "frame" })).as_deref(),
        Some("input")
    );
    assert_eq!(
        schema_error(serde_json::json!({ "detections": "pixels" })).as_deref(),
        Some("detections")
    );
    assert_eq!(
        schema_error(serde_json::json!({ "output": "camera_id" })).as_deref(),
        Some("output")
    );
    assert_eq!(
        schema_error(serde_json::json!({ "reinfer_every": 2, "key": "site" })).as_deref(),
        Some("key")
    );
}

#[test]
fn tracked_only_leaves_out_objects_without_a_track() {
    let batch = frames(
        vec![(
            0,
            vec![
                det(Some(3), 1, [0.0, 0.0, 8.0, 8.0]),
                det(None, 1, [10.0, 10.0, 20.0, 20.0]),
                det(Some(5), 1, [30.0, 0.0, 40.0, 8.0]),
            ],
        )],
        true,
    );
    let all = crop(config(serde_json::json!({})), &batch);
    assert_eq!(all.records.num_rows(), 3);
    let tracked = crop(config(serde_json::json!({ "tracked_only": true })), &batch);
    let ids = tracked
        .records
        .column_by_name("track_id")
        .expect("track_id")
        .as_primitive::<Int64Type>();
    assert_eq!(ids.iter().collect::<Vec<_>>(), vec![Some(3), Some(5)]);
    // Without track ids the option cannot apply: an error at its key.
    let untracked = frames(vec![(0, vec![det(None, 1, [0.0, 0.0, 8.0, 8.0])])], false);
    let err = config(serde_json::json!({ "tracked_only": true }))
        .output_schema(&untracked.schema())
        .expect_err("tracked_only needs track ids");
    assert_eq!(err.located().0, Some("tracked_only"));
}
