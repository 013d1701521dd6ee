//! Frame rows with tracked detections, built by hand, and readers of the analytics columns.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{
    Array, ArrayRef, Float32Array, Int64Array, ListArray, RecordBatch, StringArray, StructArray,
    UInt32Array,
};
use arrow_buffer::{NullBuffer, OffsetBuffer};
use arrow_schema::{DataType, Field, Fields};

/// One detection: track, class, box.
#[derive(Clone, Copy, Debug)]
pub struct Det {
    pub track: Option<i64>,
    pub class: i64,
    pub rect: [f32; 4],
}

/// A 10×20 box of track `track` (class 1) whose bottom centre is at (`x`, `y`).
pub fn at(track: i64, x: f32, y: f32) -> Det {
    Det {
        track: Some(track),
        class: 1,
        rect: [x - 5.0, y - 20.0, x + 5.0, y],
    }
}

pub fn fields(tracked: bool) -> Fields {
    let mut fields = vec![
        Field::new("class_id", DataType::Int64, false),
        Field::new("label", DataType::Utf8, true),
        Field::new("score", DataType::Float32, false),
        Field::new("x1", DataType::Float32, false),
        Field::new("y1", DataType::Float32, false),
        Field::new("x2", DataType::Float32, false),
        Field::new("y2", DataType::Float32, false),
    ];
    if tracked {
        fields.push(Field::new("track_id", DataType::Int64, true));
    }
    Fields::from(fields)
}

/// A detections list column; a `None` row is a null list.
pub fn detections(rows: &[Option<Vec<Det>>], tracked: bool) -> ArrayRef {
    let all: Vec<Det> = rows.iter().flatten().flatten().copied().collect();
    let coord = |i: usize| -> ArrayRef {
        Arc::new(Float32Array::from_iter_values(
            all.iter().map(|d| d.rect[i]),
        ))
    };
    let mut columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from_iter_values(all.iter().map(|d| d.class))),
        Arc::new(StringArray::from(vec![None::<&str>; all.len()])),
        Arc::new(Float32Array::from(vec![0.9; all.len()])),
        coord(0),
        coord(1),
        coord(2),
        coord(3),
    ];
    if tracked {
        columns.push(Arc::new(Int64Array::from_iter(all.iter().map(|d| d.track))));
    }
    let entries = StructArray::new(fields(tracked), columns, None);
    let lengths = rows.iter().map(|r| r.as_ref().map_or(0, Vec::len));
    let nulls = NullBuffer::from(rows.iter().map(Option::is_some).collect::<Vec<_>>());
    let item = Arc::new(Field::new_list_field(
        DataType::Struct(fields(tracked)),
        false,
    ));
    Arc::new(ListArray::new(
        item,
        OffsetBuffer::from_lengths(lengths),
        Arc::new(entries),
        (nulls.null_count() > 0).then_some(nulls),
    ))
}

/// Frame rows of `camera`: `(frame, detections)`, 640×480 images.
pub fn frames(camera: &str, rows: &[(Option<i64>, Vec<Det>)]) -> RecordBatch {
    let lists: Vec<Option<Vec<Det>>> = rows.iter().map(|(_, d)| Some(d.clone())).collect();
    let n = rows.len();
    RecordBatch::try_from_iter([
        (
            "camera_id",
            Arc::new(StringArray::from(vec![camera; n])) as ArrayRef,
        ),
        (
            "frame",
            Arc::new(Int64Array::from_iter(rows.iter().map(|r| r.0))),
        ),
        ("width", Arc::new(UInt32Array::from(vec![640; n]))),
        ("height", Arc::new(UInt32Array::from(vec![480; n]))),
        ("detections", detections(&lists, true)),
    ])
    .expect("a frame batch")
}

/// Frames `first..` of `camera`, one row per list of detections.
pub fn numbered(camera: &str, first: i64, dets: Vec<Vec<Det>>) -> RecordBatch {
    let rows: Vec<(Option<i64>, Vec<Det>)> = dets
        .into_iter()
        .enumerate()
        .map(|(i, d)| (Some(first + i as i64), d))
        .collect();
    frames(camera, &rows)
}

/// `batch` with one more column.
pub fn with(batch: &RecordBatch, name: &str, column: ArrayRef) -> RecordBatch {
    let mut columns: Vec<(String, ArrayRef)> = batch
        .schema()
        .fields()
        .iter()
        .zip(batch.columns())
        .map(|(f, c)| (f.name().clone(), c.clone()))
        .collect();
    columns.push((name.to_string(), column));
    RecordBatch::try_from_iter(columns).expect("a batch")
}

/// Per row, the values of the list-of-struct column `list`'s field `field` as text
/// (`null` for nulls, integers in decimal).
pub fn entries(batch: &RecordBatch, list: &str, field: &str) -> Vec<Vec<String>> {
    let list = batch
        .column_by_name(list)
        .expect("list column")
        .as_list::<i32>();
    (0..list.len())
        .map(|row| {
            let value = list.value(row);
            let column = value
                .as_struct()
                .column_by_name(field)
                .expect("struct field")
                .clone();
            (0..column.len())
                .map(|i| match column.data_type() {
                    _ if column.is_null(i) => "null".to_string(),
                    DataType::Utf8 => column.as_string::<i32>().value(i).to_string(),
                    DataType::Int64 => column.as_primitive::<Int64Type>().value(i).to_string(),
                    other => panic!("no reader for {other}"),
                })
                .collect()
        })
        .collect()
}

/// Per row, `field`s of `list` joined, e.g. `door/7/in` for `["line", "track_id", "direction"]`.
pub fn joined(batch: &RecordBatch, list: &str, fields: &[&str]) -> Vec<Vec<String>> {
    let columns: Vec<Vec<Vec<String>>> = fields.iter().map(|f| entries(batch, list, f)).collect();
    (0..batch.num_rows())
        .map(|row| {
            (0..columns[0][row].len())
                .map(|i| {
                    columns
                        .iter()
                        .map(|c| c[row][i].clone())
                        .collect::<Vec<_>>()
                        .join("/")
                })
                .collect()
        })
        .collect()
}

/// The Int64 column `name`.
pub fn ints(batch: &RecordBatch, name: &str) -> Vec<i64> {
    batch
        .column_by_name(name)
        .expect("column")
        .as_primitive::<Int64Type>()
        .values()
        .to_vec()
}
