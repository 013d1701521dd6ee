use super::*;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, Int64Type};
use arrow_array::{Array, ArrayRef, Int64Array, RecordBatch, UInt32Array};
use arrow_schema::{DataType, Field, Schema};
use riffle_dataflow::tensor::{tensor_column, tensor_field};

fn config() -> DetectionsConfig {
    DetectionsConfig {
        boxes: "detection_boxes".to_string(),
        scores: "detection_scores".to_string(),
        classes: "detection_classes".to_string(),
        box_format: BoxFormat::default(),
        score_threshold: 0.5,
        keep_classes: Vec::new(),
        iou_threshold: 0.5,
        class_agnostic: false,
        labels: BTreeMap::from([(1, "person".to_string())]),
        labels_file: None,
        yolo: None,
        max_detections: 100,
        output: "detections".to_string(),
        drop_inputs: true,
    }
}

/// Two rows, K = 3, normalized `[ymin, xmin, ymax, xmax]` boxes, 200×100 images.
fn batch() -> RecordBatch {
    let boxes = tensor_field("detection_boxes", DataType::Float32, &[3, 4]);
    let scores = tensor_field("detection_scores", DataType::Float32, &[3]);
    let classes = tensor_field("detection_classes", DataType::Float32, &[3]);
    #[rustfmt::skip]
    let box_values = vec![
        // Row 0: a person, a near-duplicate of it, and a low-scoring class-3 box.
        0.1, 0.1, 0.5, 0.5,
        0.1, 0.12, 0.5, 0.52,
        0.0, 0.6, 0.2, 0.9,
        // Row 1: a class-2 box spilling past the image, a class-1 box, a disjoint person.
        0.5, 0.5, 1.2, 1.1,
        0.0, 0.0, 0.3, 0.3,
        0.6, 0.0, 1.0, 0.2,
    ];
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(vec![1, 2])),
        tensor_column::<Float32Type>(&boxes, box_values).unwrap(),
        tensor_column::<Float32Type>(&scores, vec![0.9, 0.8, 0.3, 0.7, 0.95, 0.6]).unwrap(),
        tensor_column::<Float32Type>(&classes, vec![1.0, 1.0, 3.0, 2.0, 1.0, 1.0]).unwrap(),
        Arc::new(UInt32Array::from(vec![200, 200])),
        Arc::new(UInt32Array::from(vec![100, 100])),
    ];
    let schema = Arc::new(Schema::new(vec![
        Field::new("frame", DataType::Int64, false),
        boxes,
        scores,
        classes,
        Field::new("width", DataType::UInt32, false),
        Field::new("height", DataType::UInt32, false),
    ]));
    RecordBatch::try_new(schema, columns).unwrap()
}

/// (class_id, label, score, [x1, y1, x2, y2]) of every detection of `row`.
type Row = Vec<(i64, Option<String>, f32, [f32; 4])>;

fn rows_of(out: &RecordBatch) -> Vec<Row> {
    let list = out.column_by_name("detections").unwrap().as_list::<i32>();
    (0..list.len())
        .map(|r| {
            let entries = list.value(r);
            let s = entries.as_struct();
            let f = |i: usize| s.column(i).as_primitive::<Float32Type>().clone();
            let (ids, labels) = (s.column(0).as_primitive::<Int64Type>(), s.column(1));
            let (score, x1, y1, x2, y2) = (f(2), f(3), f(4), f(5), f(6));
            (0..s.len())
                .map(|i| {
                    let label = labels
                        .is_valid(i)
                        .then(|| labels.as_string::<i32>().value(i).to_string());
                    let rect = [x1.value(i), y1.value(i), x2.value(i), y2.value(i)];
                    (ids.value(i), label, score.value(i), rect)
                })
                .collect()
        })
        .collect()
}

fn assert_rect(actual: [f32; 4], expected: [f32; 4]) {
    for (a, e) in actual.iter().zip(expected) {
        assert!((a - e).abs() < 1e-4, "{actual:?} != {expected:?}");
    }
}

#[test]
fn decodes_thresholds_and_suppresses() {
    let mut stage = Detections::new(config()).unwrap();
    let input = batch();
    let expected = stage.output_schema(input.schema_ref()).unwrap();
    let out = stage.process_batch(&input).unwrap().records;
    assert_eq!(out.schema(), expected);
    assert!(out.column_by_name("detection_boxes").is_none());
    assert!(out.column_by_name("width").is_some());

    let rows = rows_of(&out);
    // Row 0: the duplicate person (IoU ≈ 0.9) is suppressed, class 3 is under threshold.
    assert_eq!(rows[0].len(), 1);
    let (id, label, score, rect) = rows[0][0].clone();
    assert_eq!((id, label.as_deref(), score), (1, Some("person"), 0.9));
    assert_rect(rect, [20.0, 10.0, 100.0, 50.0]);

    // Row 1: sorted by score; the class-2 box is clamped to the 200×100 image.
    let ids: Vec<i64> = rows[1].iter().map(|d| d.0).collect();
    assert_eq!(ids, vec![1, 2, 1]);
    assert_rect(rows[1][0].3, [0.0, 0.0, 60.0, 30.0]);
    assert_rect(rows[1][1].3, [100.0, 50.0, 200.0, 100.0]);
    assert_eq!(rows[1][1].1, None);
    assert_rect(rows[1][2].3, [0.0, 60.0, 40.0, 100.0]);

    let counts = out.column_by_name("detections_count").unwrap();
    assert_eq!(
        counts
            .as_primitive::<arrow_array::types::Int32Type>()
            .values()
            .as_ref(),
        &[1, 3]
    );
}

#[test]
fn keep_classes_nms_off_and_max_detections() {
    let mut cfg = config();
    cfg.keep_classes = vec![1];
    cfg.iou_threshold = 1.0;
    cfg.max_detections = 2;
    cfg.drop_inputs = false;
    let mut stage = Detections::new(cfg).unwrap();
    let out = stage.process_batch(&batch()).unwrap().records;
    assert!(out.column_by_name("detection_boxes").is_some());
    let rows = rows_of(&out);
    // NMS disabled: both overlapping persons stay.
    assert_eq!(
        rows[0].iter().map(|d| d.2).collect::<Vec<_>>(),
        vec![0.9, 0.8]
    );
    // Class 2 filtered out; both persons kept.
    assert_eq!(rows[1].iter().map(|d| d.0).collect::<Vec<_>>(), vec![1, 1]);
    assert_eq!(
        rows[1].iter().map(|d| d.2).collect::<Vec<_>>(),
        vec![0.95, 0.6]
    );
}

#[test]
fn schema_errors() {
    let stage = Detections::new(config()).unwrap();
    let input = batch();
    let no_width = Arc::new(input.schema().project(&[0, 1, 2, 3, 5]).unwrap());
    let err = stage.output_schema(&no_width).unwrap_err();
    assert!(err.to_string().contains("width"), "{err}");

    let mut cfg = config();
    cfg.scores = "missing".to_string();
    let err = Detections::new(cfg)
        .unwrap()
        .output_schema(input.schema_ref())
        .unwrap_err();
    assert!(err.to_string().contains("missing"), "{err}");

    let mut cfg = config();
    cfg.iou_threshold = 1.5;
    assert!(Detections::new(cfg).is_err());
}

#[test]
fn nms_suppresses_overlap_and_keeps_disjoint() {
    let boxes = [
        [0.0, 0.0, 10.0, 10.0],
        [1.0, 1.0, 11.0, 11.0],
        [50.0, 50.0, 60.0, 60.0],
    ];
    // Box 1 scores best, so box 0 (IoU ≈ 0.68 with it) is the one suppressed.
    assert_eq!(
        non_max_suppression(&boxes, &[0.8, 0.9, 0.3], 0.5),
        vec![1, 2]
    );
    // A looser threshold keeps both overlapping boxes.
    assert_eq!(
        non_max_suppression(&boxes, &[0.8, 0.9, 0.3], 0.7),
        vec![1, 0, 2]
    );
    assert!(non_max_suppression(&[], &[], 0.5).is_empty());
}

/// One 640×272 frame letterboxed into 640×640 (gain 1, 184 rows of padding above), with YOLOv8
/// predictions of two classes over four anchors: an object of class 1, a near-duplicate of it
/// as class 0, a weak box, and a box reaching past the image.
fn yolo_batch() -> RecordBatch {
    // Per anchor: cx, cy, w, h, class 0, class 1; three empty anchors make the candidate axis
    // the longer one, as in every real head.
    let anchors: [[f32; 6]; 7] = [
        [100.0, 284.0, 40.0, 80.0, 0.1, 0.9],
        [102.0, 284.0, 40.0, 80.0, 0.7, 0.2],
        [300.0, 300.0, 10.0, 10.0, 0.1, 0.2],
        [630.0, 300.0, 40.0, 40.0, 0.6, 0.1],
        [0.0; 6],
        [0.0; 6],
        [0.0; 6],
    ];
    let predictions = tensor_field("output0", DataType::Float32, &[6, 7]);
    let letterbox = tensor_field("letterbox", DataType::Float32, &[3]);
    // Laid out [attrs, anchors], as Ultralytics exports.
    let values: Vec<f32> = (0..6)
        .flat_map(|attr| anchors.iter().map(move |a| a[attr]))
        .collect();
    let columns: Vec<ArrayRef> = vec![
        tensor_column::<Float32Type>(&predictions, values).unwrap(),
        tensor_column::<Float32Type>(&letterbox, vec![1.0, 0.0, 184.0]).unwrap(),
        Arc::new(UInt32Array::from(vec![640])),
        Arc::new(UInt32Array::from(vec![272])),
    ];
    let size = |name| Field::new(name, DataType::UInt32, false);
    let schema = Schema::new(vec![predictions, letterbox, size("width"), size("height")]);
    RecordBatch::try_new(Arc::new(schema), columns).unwrap()
}

fn yolo_config(class_agnostic: bool) -> DetectionsConfig {
    DetectionsConfig {
        yolo: Some(serde_json::from_value(serde_json::json!({})).unwrap()),
        class_agnostic,
        score_threshold: 0.25,
        iou_threshold: 0.45,
        labels: BTreeMap::from([(0, "person".to_string()), (1, "bicycle".to_string())]),
        ..config()
    }
}

/// (class, score, box) of row 0.
fn found(out: &RecordBatch) -> Vec<(i64, f32, [f32; 4])> {
    let list = out
        .column_by_name("detections")
        .unwrap()
        .as_list::<i32>()
        .value(0);
    let s = list.as_struct();
    let col = |c: &str| {
        s.column_by_name(c)
            .unwrap()
            .as_primitive::<Float32Type>()
            .clone()
    };
    let ids = s
        .column_by_name("class_id")
        .unwrap()
        .as_primitive::<Int64Type>()
        .clone();
    let (score, x1, y1, x2, y2) = (col("score"), col("x1"), col("y1"), col("x2"), col("y2"));
    (0..s.len())
        .map(|i| {
            let rect = [x1.value(i), y1.value(i), x2.value(i), y2.value(i)];
            (ids.value(i), score.value(i), rect)
        })
        .collect()
}

#[test]
fn yolo_boxes_are_decoded_suppressed_per_class_and_mapped_back_through_the_letterbox() {
    let mut stage = Detections::new(yolo_config(false)).unwrap();
    let out = stage.process_batch(&yolo_batch()).unwrap().records;
    // The predictions and the letterbox column are consumed.
    assert!(out.column_by_name("output0").is_none());
    assert!(out.column_by_name("letterbox").is_none());
    assert_eq!(
        found(&out),
        [
            // cy 284 - 184 = 100 in the frame.
            (1, 0.9, [80.0, 60.0, 120.0, 140.0]),
            // Another class: per-class NMS keeps it.
            (0, 0.7, [82.0, 60.0, 122.0, 140.0]),
            // Clamped to the 640-wide frame.
            (0, 0.6, [610.0, 96.0, 640.0, 136.0]),
        ]
    );
}

#[test]
fn class_agnostic_nms_suppresses_across_classes() {
    let mut stage = Detections::new(yolo_config(true)).unwrap();
    let out = stage.process_batch(&yolo_batch()).unwrap().records;
    let classes: Vec<i64> = found(&out).iter().map(|d| d.0).collect();
    assert_eq!(classes, [1, 0]);
    let labels = out
        .column_by_name("detections")
        .unwrap()
        .as_list::<i32>()
        .value(0);
    let labels = labels
        .as_struct()
        .column_by_name("label")
        .unwrap()
        .as_string::<i32>()
        .clone();
    assert_eq!(labels.value(0), "bicycle");
}

#[test]
fn yolo_without_a_way_back_to_the_frame_is_a_config_error() {
    let batch = yolo_batch();
    let without = batch.project(&[0, 2, 3]).unwrap();
    let stage = Detections::new(yolo_config(false)).unwrap();
    let e = stage.output_schema(without.schema_ref()).unwrap_err();
    assert!(e.to_string().contains("input_size"), "{e}");
    // Stretched frames: the model's input size maps boxes back.
    let mut config = yolo_config(false);
    config.yolo.as_mut().unwrap().input_size = Some([640, 544]);
    let mut stage = Detections::new(config).unwrap();
    let out = stage.process_batch(&without).unwrap().records;
    // y scales by 272 / 544.
    assert_eq!(found(&out)[0], (1, 0.9, [80.0, 122.0, 120.0, 162.0]));
}

#[test]
fn labels_come_from_a_file_with_map_entries_winning() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("labels.txt");
    std::fs::write(&path, "person\r\nbicycle\n").unwrap();
    let mut config = yolo_config(false);
    config.labels = BTreeMap::from([(0, "pedestrian".to_string())]);
    config.labels_file = Some(path);
    let stage = Detections::new(config).unwrap();
    assert_eq!(stage.labels.get(&0).map(String::as_str), Some("pedestrian"));
    assert_eq!(stage.labels.get(&1).map(String::as_str), Some("bicycle"));
}
