//! The `track` stage: multi-object tracking per camera, ByteTrack-style (Kalman filter on
//! `(cx, cy, aspect, h)`, two-pass IoU association with linear assignment). Each detection of
//! the list column gets a `track_id` (Int64, null while the object is not on a confirmed
//! track), stable per camera and counted from 1.
//!
//! Rows are routed by camera and processed frame by frame through [`Keyed`], whose checkpoints
//! hold each camera's tracks and id counter: after a restart with any worker count, ids go on
//! as in an uninterrupted run. Rows whose frame does not follow the camera's last one (late or
//! repeated), or whose detections hold non-finite numbers, become dead letters.

mod kalman;
mod tracker;

pub use tracker::{CameraTracks, Detection, Params};

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, Int64Type};
use arrow_array::{Array, ArrayRef, Int64Array, ListArray, RecordBatch, StructArray};
use arrow_schema::{DataType, Field, FieldRef, Fields, Schema, SchemaRef};
use riffle_dataflow::dead_letter::DeadLetter;
use riffle_dataflow::runtime::Step;
use riffle_dataflow::{DataflowError, DataflowResult, StageOutput};
use serde_inline_default::serde_inline_default;

use riffle_dataflow::operators::{Keyed, KeyedLogic};

const NAME: &str = "track";
/// The field added to each detection.
pub const TRACK_ID: &str = "track_id";
const COORDS: [&str; 4] = ["x1", "y1", "x2", "y2"];

/// YAML block of a `track` stage.
#[serde_inline_default]
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrackConfig {
    /// Camera id column (Utf8 or Int64): tracks and ids are per camera.
    #[serde_inline_default("camera_id".to_string())]
    pub camera: String,
    /// Frame number column (Int64); a camera's frames must arrive in increasing order.
    #[serde_inline_default("frame".to_string())]
    pub frame: String,
    /// Detections list column (as the `detections` stage writes it).
    #[serde_inline_default("detections".to_string())]
    pub input: String,
    /// Column written: `input` with `track_id` added to each detection (may be `input`).
    #[serde_inline_default("detections".to_string())]
    pub output: String,
    /// Detections scoring at least this are matched first, and may start tracks.
    #[serde_inline_default(0.5)]
    pub high_threshold: f32,
    /// Detections from this up to `high_threshold` only continue tracks (second pass).
    #[serde_inline_default(0.1)]
    pub low_threshold: f32,
    /// Unmatched high-score detections scoring at least this start a track.
    #[serde_inline_default(0.6)]
    pub new_track_threshold: f32,
    /// Least IoU × score for a first-pass match (ByteTrack's `match_thresh` 0.8 is 1 − this).
    #[serde_inline_default(0.2)]
    pub match_iou: f32,
    /// Frames an object may go undetected and keep its id.
    #[serde_inline_default(30)]
    pub track_buffer: u32,
    /// Match tracks only to detections of their own class.
    #[serde(default)]
    pub class_aware: bool,
}

impl TrackConfig {
    /// The tracker's parameters, after checking each key's range.
    pub fn params(&self) -> DataflowResult<Params> {
        let unit = |key: &str, v: f32| -> DataflowResult<()> {
            if (0.0..=1.0).contains(&v) {
                Ok(())
            } else {
                Err(
                    DataflowError::Config(format!("{NAME}: {key} must be within 0..=1, got {v}"))
                        .at(key),
                )
            }
        };
        unit("high_threshold", self.high_threshold)?;
        unit("low_threshold", self.low_threshold)?;
        unit("new_track_threshold", self.new_track_threshold)?;
        unit("match_iou", self.match_iou)?;
        if self.low_threshold > self.high_threshold {
            return Err(DataflowError::Config(format!(
                "{NAME}: low_threshold ({}) must not exceed high_threshold ({})",
                self.low_threshold, self.high_threshold
            ))
            .at("low_threshold"));
        }
        if self.match_iou == 0.0 {
            // Zero would match a track to a detection anywhere in the frame.
            return Err(
                DataflowError::Config(format!("{NAME}: match_iou must be above 0")).at("match_iou"),
            );
        }
        Ok(Params {
            high_threshold: self.high_threshold,
            low_threshold: self.low_threshold,
            new_track_threshold: self.new_track_threshold,
            match_iou: f64::from(self.match_iou),
            track_buffer: i64::from(self.track_buffer),
            class_aware: self.class_aware,
        })
    }

    /// The output schema, after checking the configuration and every column it names.
    pub fn output_schema(&self, input: &SchemaRef) -> DataflowResult<SchemaRef> {
        self.params()?;
        self.check_columns(input)?;
        let (_, list_field) = self.entries(input)?;
        let list = Arc::new(Field::new(&self.output, DataType::List(list_field), true));
        let mut fields: Vec<FieldRef> = input.fields().iter().cloned().collect();
        if self.output == self.input {
            if let Some(slot) = fields.iter_mut().find(|f| f.name() == &self.input) {
                *slot = list;
            }
        } else if fields.iter().any(|f| f.name() == &self.output) {
            return Err(DataflowError::schema(
                &self.output,
                "a column name not already in the input (or the input's own)",
                "an existing column",
            )
            .at("output"));
        } else {
            fields.push(list);
        }
        Ok(Arc::new(Schema::new_with_metadata(
            fields,
            input.metadata().clone(),
        )))
    }

    fn check_columns(&self, input: &Schema) -> DataflowResult<()> {
        match input.field_with_name(&self.camera).map(|f| f.data_type()) {
            Ok(DataType::Utf8 | DataType::Int64) => {}
            Ok(other) => {
                return Err(
                    DataflowError::schema(&self.camera, "Utf8 or Int64", other.to_string())
                        .at("camera"),
                )
            }
            Err(_) => {
                return Err(
                    DataflowError::schema(&self.camera, "Utf8 or Int64", "no such column")
                        .at("camera"),
                )
            }
        }
        match input.field_with_name(&self.frame).map(|f| f.data_type()) {
            Ok(DataType::Int64) => Ok(()),
            Ok(other) => {
                Err(DataflowError::schema(&self.frame, "Int64", other.to_string()).at("frame"))
            }
            Err(_) => {
                Err(DataflowError::schema(&self.frame, "Int64", "no such column").at("frame"))
            }
        }
    }

    /// The output entry fields (the input's plus `track_id`) and the output list's item field.
    fn entries(&self, input: &Schema) -> DataflowResult<(Fields, FieldRef)> {
        let expected = "List<Struct{class_id: Int64, score, x1, y1, x2, y2: Float32, …}>";
        let bad = |found: String| DataflowError::schema(&self.input, expected, found).at("input");
        let field = input
            .field_with_name(&self.input)
            .map_err(|_| bad("no such column".into()))?;
        let DataType::List(item) = field.data_type() else {
            return Err(bad(field.data_type().to_string()));
        };
        let DataType::Struct(fields) = item.data_type() else {
            return Err(bad(field.data_type().to_string()));
        };
        let has = |name: &str, ty: &DataType| {
            fields
                .iter()
                .any(|f| f.name() == name && f.data_type() == ty)
        };
        let floats = ["score"].iter().chain(COORDS.iter());
        for name in floats {
            if !has(name, &DataType::Float32) {
                return Err(bad(format!("{} (no Float32 `{name}`)", field.data_type())));
            }
        }
        if self.class_aware && !has("class_id", &DataType::Int64) {
            return Err(bad(format!("{} (no Int64 `class_id`)", field.data_type())));
        }
        if fields.iter().any(|f| f.name() == TRACK_ID) {
            return Err(bad(format!(
                "{} (already has `{TRACK_ID}`)",
                field.data_type()
            )));
        }
        let mut out: Vec<FieldRef> = fields.iter().cloned().collect();
        out.push(Arc::new(Field::new(TRACK_ID, DataType::Int64, true)));
        let out = Fields::from(out);
        let item = Arc::new(Field::new(
            item.name(),
            DataType::Struct(out.clone()),
            item.is_nullable(),
        ));
        Ok((out, item))
    }
}

impl crate::StageKind for TrackConfig {
    fn kind(&self) -> &'static str {
        NAME
    }

    fn output_schema(&self, input: &SchemaRef) -> DataflowResult<SchemaRef> {
        TrackConfig::output_schema(self, input)
    }

    fn build(&self, _ctx: &crate::StageContext<'_>) -> DataflowResult<Step> {
        let params = self.params()?;
        Ok(Step::Stateful(Box::new(Keyed {
            logic: Tracker {
                config: self.clone(),
                params,
            },
            key: self.camera.clone(),
        })))
    }

    fn describe(&self, _ctx: &crate::StageContext<'_>) -> String {
        format!(
            "rows sharded by `{}`; tracks kept {} frames after their object was last seen",
            self.camera, self.track_buffer
        )
    }

    fn stateful(&self) -> bool {
        true
    }
}

/// The stage's logic for one worker: each camera's rows, in frame order.
pub struct Tracker {
    config: TrackConfig,
    params: Params,
}

impl Tracker {
    pub fn new(config: TrackConfig) -> DataflowResult<Self> {
        let params = config.params()?;
        Ok(Tracker { config, params })
    }
}

/// One row's detections, or why the row cannot be tracked.
fn row_detections(list: &ListArray, row: usize) -> Result<Vec<Detection>, String> {
    if list.is_null(row) {
        return Ok(Vec::new());
    }
    let entries = list.value(row);
    let entries = entries
        .as_struct_opt()
        .ok_or("detections are not structs")?;
    let float = |name: &str| {
        entries
            .column_by_name(name)
            .and_then(|c| c.as_primitive_opt::<Float32Type>())
            .ok_or_else(|| format!("detections have no Float32 `{name}`"))
    };
    let (score, x1, y1, x2, y2) = (
        float("score")?,
        float("x1")?,
        float("y1")?,
        float("x2")?,
        float("y2")?,
    );
    let class = entries
        .column_by_name("class_id")
        .and_then(|c| c.as_primitive_opt::<Int64Type>());
    let mut out = Vec::with_capacity(entries.len());
    for k in 0..entries.len() {
        let columns = [score, x1, y1, x2, y2];
        if entries.is_null(k) || columns.iter().any(|c| c.is_null(k)) {
            return Err(format!("detection {k} is null or has a null score or box"));
        }
        let values = columns.map(|c| c.value(k));
        if values.iter().any(|v| !v.is_finite()) {
            return Err(format!(
                "detection {k} has a non-finite score or box: {values:?}"
            ));
        }
        let class_id = class.filter(|c| c.is_valid(k)).map_or(-1, |c| c.value(k));
        out.push(Detection {
            rect: [values[1], values[2], values[3], values[4]],
            score: values[0],
            class_id,
        });
    }
    Ok(out)
}

impl KeyedLogic for Tracker {
    type State = CameraTracks;

    fn name(&self) -> &str {
        NAME
    }

    fn process(
        &mut self,
        _key: &str,
        state: &mut CameraTracks,
        rows: &RecordBatch,
    ) -> DataflowResult<StageOutput> {
        let cfg = &self.config;
        let schema = cfg.output_schema(rows.schema_ref())?;
        let (entry_fields, item) = cfg.entries(rows.schema_ref())?;
        let column = |name: &str, key: &str| {
            rows.column_by_name(name)
                .ok_or_else(|| DataflowError::schema(name, "a column", "none").at(key))
        };
        let frames = column(&cfg.frame, "frame")?
            .as_primitive_opt::<Int64Type>()
            .ok_or_else(|| {
                DataflowError::schema(&cfg.frame, "Int64", "another type").at("frame")
            })?;
        let lists = column(&cfg.input, "input")?
            .as_list_opt::<i32>()
            .ok_or_else(|| {
                DataflowError::schema(&cfg.input, "a list", "another type").at("input")
            })?;

        let mut kept: Vec<u32> = Vec::with_capacity(rows.num_rows());
        let mut ids: Vec<Vec<Option<i64>>> = Vec::with_capacity(rows.num_rows());
        let mut rejected = Vec::new();
        for row in 0..rows.num_rows() {
            let reject = |reason: String| DeadLetter::for_row(NAME, rows, row, reason);
            if frames.is_null(row) {
                rejected.push(reject(format!("`{}` is null", cfg.frame)));
                continue;
            }
            let frame = frames.value(row);
            if let Some(last) = state.last_frame.filter(|&last| frame <= last) {
                rejected.push(reject(format!(
                    "frame {frame} does not follow the camera's last frame {last} (late or repeated)"
                )));
                continue;
            }
            match row_detections(lists, row) {
                Ok(dets) => {
                    ids.push(state.step(frame, &dets, &self.params));
                    kept.push(row as u32);
                }
                Err(reason) => rejected.push(reject(reason)),
            }
        }

        let rows = if kept.len() == rows.num_rows() {
            rows.clone()
        } else {
            take(rows, kept)?
        };
        let input = rows
            .column_by_name(&cfg.input)
            .and_then(|c| c.as_list_opt::<i32>())
            .ok_or_else(|| DataflowError::stage(NAME, "the detections column went missing"))?;
        let tracked = with_track_ids(input, &ids, entry_fields, item)?;
        let mut columns: Vec<ArrayRef> = rows.columns().to_vec();
        if cfg.output == cfg.input {
            let i = rows.schema().index_of(&cfg.input)?;
            let slot = columns
                .get_mut(i)
                .ok_or_else(|| DataflowError::stage(NAME, "the detections column went missing"))?;
            *slot = tracked;
        } else {
            columns.push(tracked);
        }
        Ok(StageOutput {
            records: RecordBatch::try_new(schema, columns)?,
            rejected,
        })
    }
}

/// `list` with a `track_id` child added: `ids[row][k]` for the k-th detection of each row.
fn with_track_ids(
    list: &ListArray,
    ids: &[Vec<Option<i64>>],
    fields: Fields,
    item: FieldRef,
) -> DataflowResult<ArrayRef> {
    let values = list.values();
    let entries = values
        .as_struct_opt()
        .ok_or_else(|| DataflowError::stage(NAME, "detections are not structs"))?;
    if ids.len() != list.len() {
        return Err(DataflowError::stage(
            NAME,
            "track ids do not match the rows",
        ));
    }
    let mut track_ids: Vec<Option<i64>> = vec![None; entries.len()];
    let offsets = list.value_offsets();
    let bounds = offsets.iter().zip(offsets.iter().skip(1));
    for (row_ids, (&from, &to)) in ids.iter().zip(bounds) {
        let slots = usize::try_from(from)
            .ok()
            .zip(usize::try_from(to).ok())
            .and_then(|(from, to)| track_ids.get_mut(from..to))
            .ok_or_else(|| {
                DataflowError::stage(NAME, "a detections list's offsets are out of range")
            })?;
        // Detections beyond a row's ids (none for valid rows) keep a null id.
        for (slot, &id) in slots.iter_mut().zip(row_ids) {
            *slot = id;
        }
    }
    let mut children: Vec<ArrayRef> = entries.columns().to_vec();
    children.push(Arc::new(Int64Array::from(track_ids)));
    let entries = StructArray::try_new(fields, children, entries.nulls().cloned())?;
    let list = ListArray::try_new(
        item,
        list.offsets().clone(),
        Arc::new(entries),
        list.nulls().cloned(),
    )?;
    Ok(Arc::new(list))
}

fn take(batch: &RecordBatch, rows: Vec<u32>) -> DataflowResult<RecordBatch> {
    let indices = arrow_array::UInt32Array::from(rows);
    let columns = batch
        .columns()
        .iter()
        .map(|c| arrow_select::take::take(c.as_ref(), &indices, None))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(RecordBatch::try_new(batch.schema(), columns)?)
}

#[cfg(test)]
mod tests;
