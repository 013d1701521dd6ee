//! Video analytics over tracked detections, per camera: [`line_count`] (crossings of counting
//! lines, with running totals) and [`zone`] (entries, exits, dwell and occupancy of polygons).
//!
//! Both read the `detections` list column after a `track` stage (each struct with a nullable
//! `track_id: Int64`), keep their state per camera through [`riffle_dataflow::operators::Keyed`] (so it is
//! checkpointed and restored with any worker count) and add their columns to every frame row.
//! A track is placed by one point of its box, its [`Anchor`]; detections without a track id
//! are ignored, and a null detections list is a frame without detections. Rows of one camera
//! are processed in frame order; a row whose `frame` is null, or not after the last frame
//! processed for its camera (a duplicate or a late frame), or whose boxes are not finite, is a
//! dead letter and changes no state.

pub mod line_count;
pub mod zone;

#[cfg(test)]
mod line_count_tests;
#[cfg(test)]
mod restore_tests;
#[cfg(test)]
pub(crate) mod test_input;
#[cfg(test)]
mod zone_tests;

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, Int64Type};
use arrow_array::{Array, ArrayRef, BooleanArray, Int64Array, ListArray, RecordBatch, StructArray};
use arrow_buffer::OffsetBuffer;
use arrow_schema::{DataType, Field, FieldRef, Fields, Schema, SchemaRef};
use riffle_dataflow::dead_letter::DeadLetter;
use riffle_dataflow::{DataflowError, DataflowResult};

pub use line_count::{LineCount, LineCountConfig};
pub use zone::{Zone, ZoneConfig};

/// Which point of a box stands for the object.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Anchor {
    /// The middle of the box's bottom edge: where a person or vehicle touches the ground.
    #[default]
    BottomCenter,
    /// The box's centre.
    Center,
}

impl Anchor {
    /// As written in the configuration.
    pub fn name(self) -> &'static str {
        match self {
            Anchor::BottomCenter => "bottom_center",
            Anchor::Center => "center",
        }
    }

    /// The anchor of box `[x1, y1, x2, y2]`.
    pub fn of(self, rect: [f32; 4]) -> [f32; 2] {
        let x = (rect[0] + rect[2]) / 2.0;
        match self {
            Anchor::BottomCenter => [x, rect[3]],
            Anchor::Center => [x, (rect[1] + rect[3]) / 2.0],
        }
    }
}

/// Which side of the infinite line through `a` → `b` point `p` lies on: positive on the right
/// as seen walking from `a` to `b` on the image (y down), negative on the left, zero on it.
pub(crate) fn side(a: [f32; 2], b: [f32; 2], p: [f32; 2]) -> f64 {
    let [ax, ay] = a.map(f64::from);
    let [bx, by] = b.map(f64::from);
    let [px, py] = p.map(f64::from);
    (bx - ax) * (py - ay) - (by - ay) * (px - ax)
}

/// Whether the step `p` → `q` crosses the segment `a`–`b`: `p` and `q` strictly on opposite
/// sides of its line, and the crossing point within the segment (its ends included).
pub(crate) fn crosses(p: [f32; 2], q: [f32; 2], a: [f32; 2], b: [f32; 2]) -> bool {
    let (sp, sq) = (side(a, b, p), side(a, b, q));
    if sp == 0.0 || sq == 0.0 || (sp > 0.0) == (sq > 0.0) {
        return false;
    }
    let (sa, sb) = (side(p, q, a), side(p, q, b));
    sa == 0.0 || sb == 0.0 || (sa > 0.0) != (sb > 0.0)
}

/// Whether `p` is inside `polygon` (even-odd rule; a point on an edge may go either way, but
/// always the same way for the same point).
pub(crate) fn inside(polygon: &[[f32; 2]], p: [f32; 2]) -> bool {
    let [px, py] = p.map(f64::from);
    let mut inside = false;
    // Each vertex with the one before it, the first with the last.
    let Some(&last) = polygon.last() else {
        return false;
    };
    let mut previous = last;
    for &vertex in polygon {
        let [xi, yi] = vertex.map(f64::from);
        let [xj, yj] = previous.map(f64::from);
        if (yi > py) != (yj > py) && px < (xj - xi) * (py - yi) / (yj - yi) + xi {
            inside = !inside;
        }
        previous = vertex;
    }
    inside
}

/// One detection of a frame row.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Object {
    /// Its index in the row's list.
    pub index: usize,
    pub track_id: Option<i64>,
    pub class_id: i64,
    pub score: f32,
    pub rect: [f32; 4],
}

/// The struct fields of a detections list column this module reads (besides `track_id`).
const COORDS: [&str; 4] = ["x1", "y1", "x2", "y2"];

/// Checks that `name` is a detections list column (`List<Struct{class_id: Int64, score:
/// Float32, x1, y1, x2, y2: Float32, track_id: Int64}>`, more fields allowed); `track_id` is
/// required when `tracked`. Returns whether the structs have a `track_id`.
pub(crate) fn check_detections(schema: &Schema, name: &str, tracked: bool) -> DataflowResult<bool> {
    let expected = if tracked {
        "a detections list with `track_id` (List<Struct{class_id, score, x1, y1, x2, y2, \
         track_id}>, from a `track` stage)"
    } else {
        "a detections list (List<Struct{class_id, score, x1, y1, x2, y2}>)"
    };
    let field = schema
        .field_with_name(name)
        .map_err(|_| DataflowError::schema(name, expected, "no such column"))?;
    let DataType::List(item) = field.data_type() else {
        return Err(DataflowError::schema(
            name,
            expected,
            field.data_type().to_string(),
        ));
    };
    let DataType::Struct(fields) = item.data_type() else {
        return Err(DataflowError::schema(
            name,
            expected,
            field.data_type().to_string(),
        ));
    };
    let typed = |f: &str, t: DataType| fields.find(f).is_some_and(|(_, x)| x.data_type() == &t);
    let mut wrong: Vec<String> = Vec::new();
    if !typed("class_id", DataType::Int64) {
        wrong.push("class_id: Int64".into());
    }
    for f in ["score"].iter().chain(&COORDS) {
        if !typed(f, DataType::Float32) {
            wrong.push(format!("{f}: Float32"));
        }
    }
    let has_track = fields.find("track_id").is_some();
    if (tracked || has_track) && !typed("track_id", DataType::Int64) {
        wrong.push("track_id: Int64".into());
    }
    if !wrong.is_empty() {
        return Err(DataflowError::schema(
            name,
            expected,
            format!("{} (needs {})", field.data_type(), wrong.join(", ")),
        ));
    }
    Ok(has_track)
}

/// Checks that `name` is a column of one of `types`.
pub(crate) fn check_column(
    schema: &Schema,
    name: &str,
    expected: &str,
    types: &[DataType],
) -> DataflowResult<()> {
    match schema.field_with_name(name) {
        Ok(f) if types.contains(f.data_type()) => Ok(()),
        Ok(f) => Err(DataflowError::schema(
            name,
            expected,
            f.data_type().to_string(),
        )),
        Err(_) => Err(DataflowError::schema(name, expected, "no such column")),
    }
}

/// A detections list column's arrays, for reading rows.
pub(crate) struct DetectionsColumn<'a> {
    list: &'a ListArray,
    entries: &'a StructArray,
    track_id: Option<&'a Int64Array>,
    class_id: &'a Int64Array,
    score: &'a arrow_array::Float32Array,
    coords: [&'a arrow_array::Float32Array; 4],
}

impl<'a> DetectionsColumn<'a> {
    /// The column `name` of `batch`, checked as [`check_detections`] does.
    pub(crate) fn new(batch: &'a RecordBatch, name: &str, tracked: bool) -> DataflowResult<Self> {
        check_detections(batch.schema_ref(), name, tracked)?;
        let bad = || DataflowError::schema(name, "a detections list", "another layout");
        let list = batch
            .column_by_name(name)
            .and_then(|c| c.as_list_opt::<i32>())
            .ok_or_else(bad)?;
        let entries = list.values().as_struct_opt().ok_or_else(bad)?;
        let int = |f: &str| {
            entries
                .column_by_name(f)
                .and_then(|c| c.as_primitive_opt::<Int64Type>())
        };
        let float = |f: &str| {
            entries
                .column_by_name(f)
                .and_then(|c| c.as_primitive_opt::<Float32Type>())
                .ok_or_else(bad)
        };
        Ok(DetectionsColumn {
            list,
            entries,
            track_id: int("track_id"),
            class_id: int("class_id").ok_or_else(bad)?,
            score: float("score")?,
            coords: [float("x1")?, float("y1")?, float("x2")?, float("y2")?],
        })
    }

    /// The detections of `row` (none for a null list), or why the row cannot be used: a null
    /// detection, class or coordinate, or a box that is not finite.
    pub(crate) fn row(&self, row: usize) -> Result<Vec<Object>, String> {
        if self.list.is_null(row) {
            return Ok(Vec::new());
        }
        let Some(&[start, end]) = self.list.value_offsets().get(row..row + 2) else {
            return Err(format!("row {row} is beyond the detections column"));
        };
        let (start, end) = (start as usize, end as usize);
        let mut objects = Vec::with_capacity(end.saturating_sub(start));
        for (index, i) in (start..end).enumerate() {
            if self.entries.is_null(i) || self.class_id.is_null(i) || self.score.is_null(i) {
                return Err(format!(
                    "detection {index} is null or has no class or score"
                ));
            }
            if self.coords.iter().any(|c| c.is_null(i)) {
                return Err(format!("detection {index} has a null coordinate"));
            }
            let rect = self.coords.map(|c| c.value(i));
            if rect.iter().any(|v| !v.is_finite()) {
                return Err(format!(
                    "detection {index} has a box that is not finite: {rect:?}"
                ));
            }
            objects.push(Object {
                index,
                track_id: self
                    .track_id
                    .and_then(|t| t.is_valid(i).then(|| t.value(i))),
                class_id: self.class_id.value(i),
                score: self.score.value(i),
                rect,
            });
        }
        Ok(objects)
    }
}

/// The Int64 column `name` of `batch`, if it is one.
pub(crate) fn int64_column<'a>(
    batch: &'a RecordBatch,
    name: &str,
) -> DataflowResult<&'a Int64Array> {
    let column = batch
        .column_by_name(name)
        .ok_or_else(|| DataflowError::schema(name, "Int64", "no such column"))?;
    column
        .as_primitive_opt::<Int64Type>()
        .ok_or_else(|| DataflowError::schema(name, "Int64", column.data_type().to_string()))
}

/// A non-null list column of structs, built a row at a time.
pub(crate) struct ListColumn {
    item: FieldRef,
    lengths: Vec<usize>,
}

impl ListColumn {
    pub(crate) fn new(fields: Fields, rows: usize) -> Self {
        ListColumn {
            item: Arc::new(Field::new_list_field(DataType::Struct(fields), false)),
            lengths: Vec::with_capacity(rows),
        }
    }

    /// Ends a row of `n` entries.
    pub(crate) fn row(&mut self, n: usize) {
        self.lengths.push(n);
    }

    /// The list column over the entries' struct `columns`.
    pub(crate) fn finish(self, columns: Vec<ArrayRef>) -> DataflowResult<ArrayRef> {
        let DataType::Struct(fields) = self.item.data_type().clone() else {
            return Err(DataflowError::stage(
                "analytics",
                "list item is not a struct",
            ));
        };
        let entries = StructArray::try_new(fields, columns, None)?;
        let offsets = OffsetBuffer::<i32>::try_from_lengths(self.lengths)
            .map_err(|e| DataflowError::stage("analytics", e))?;
        Ok(Arc::new(ListArray::try_new(
            self.item,
            offsets,
            Arc::new(entries),
            None,
        )?))
    }
}

/// The field of a non-null list column of `fields` structs.
pub(crate) fn list_field(name: &str, fields: Fields) -> Field {
    Field::new(
        name,
        DataType::List(Arc::new(Field::new_list_field(
            DataType::Struct(fields),
            false,
        ))),
        false,
    )
}

/// `input` with `added` columns appended; an added name already in `input` is an error.
pub(crate) fn extend_schema(input: &Schema, added: Vec<Field>) -> DataflowResult<SchemaRef> {
    let mut fields: Vec<FieldRef> = input.fields().iter().cloned().collect();
    for field in added {
        if input.field_with_name(field.name()).is_ok() {
            return Err(DataflowError::schema(
                field.name(),
                "a column name not already in the input (this stage adds it)",
                "an existing column",
            ));
        }
        fields.push(Arc::new(field));
    }
    Ok(Arc::new(Schema::new_with_metadata(
        fields,
        input.metadata().clone(),
    )))
}

/// The rows of `batch` marked in `keep`, with `added` columns (one value per kept row).
pub(crate) fn kept_with(
    batch: &RecordBatch,
    keep: Vec<bool>,
    schema: SchemaRef,
    added: Vec<ArrayRef>,
) -> DataflowResult<RecordBatch> {
    let mut columns = if keep.iter().all(|k| *k) {
        batch.columns().to_vec()
    } else {
        arrow_select::filter::filter_record_batch(batch, &BooleanArray::from(keep))?
            .columns()
            .to_vec()
    };
    columns.extend(added);
    Ok(RecordBatch::try_new(schema, columns)?)
}

/// Runs `apply` on each row in order: the rows it accepts are kept, the others become dead
/// letters of `stage` with its reason. Returns the keep mask for [`kept_with`].
pub(crate) fn each_row(
    rows: &RecordBatch,
    stage: &str,
    mut apply: impl FnMut(usize) -> Result<(), String>,
) -> (Vec<bool>, Vec<DeadLetter>) {
    let mut keep = Vec::with_capacity(rows.num_rows());
    let mut rejected = Vec::new();
    for row in 0..rows.num_rows() {
        match apply(row) {
            Ok(()) => keep.push(true),
            Err(reason) => {
                rejected.push(DeadLetter::for_row(stage, rows, row, reason));
                keep.push(false);
            }
        }
    }
    (keep, rejected)
}

/// Why a row's frame cannot be processed after `last` (the camera's last processed frame).
pub(crate) fn frame_order(frame: Option<i64>, last: Option<i64>) -> Result<i64, String> {
    match (frame, last) {
        (None, _) => Err("null frame".into()),
        (Some(f), Some(l)) if f <= l => Err(format!(
            "frame {f} is not after frame {l}, the last processed for this camera (a duplicate \
             or late frame)"
        )),
        (Some(f), _) => Ok(f),
    }
}

/// Config errors shared by both stages: `detections` and `key` columns, the class filter.
pub(crate) fn check_common(
    input: &Schema,
    detections: &str,
    key: &str,
    frame: &str,
) -> DataflowResult<()> {
    check_detections(input, detections, true).map_err(|e| e.at("detections"))?;
    check_column(
        input,
        key,
        "a Utf8 or Int64 key column (one state per key)",
        &[DataType::Utf8, DataType::Int64],
    )
    .map_err(|e| e.at("key"))?;
    check_column(input, frame, "Int64 frame numbers", &[DataType::Int64]).map_err(|e| e.at("frame"))
}

/// A point of the configuration, checked finite; errors at `key`.
pub(crate) fn finite_point(p: [f32; 2], stage: &str, key: &str) -> DataflowResult<()> {
    if p.iter().all(|v| v.is_finite()) {
        Ok(())
    } else {
        Err(DataflowError::Config(format!("{stage}: point {p:?} is not finite")).at(key))
    }
}
