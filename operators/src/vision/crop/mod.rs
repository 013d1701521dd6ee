//! `crop`: frames with detections → one row per object with its pixel crop, resized for a
//! second model (`resize` + `model` + `topk` then classify the crops).
//!
//! Each output row carries its frame row's other columns (`camera_id`, `frame`, …; not the
//! frame's pixels, detections or size) and adds:
//! - `track_id` (Int64, nullable; when the detections have it), `object_index` (Int32, the
//!   object's index in the frame's list), `class_id` (Int64), `score` (Float32), `x1`, `y1`,
//!   `x2`, `y2` (Float32, the detection's box in source pixels);
//! - the crop: `pixels` (Binary RGB8, or the `output` name), `width`, `height` (UInt32, the
//!   configured crop size).
//!
//! The region cut is the box grown by `padding` (a fraction of its width and height on each
//! side), clipped to the image and rounded outwards to whole pixels; it is resized (bilinear,
//! fast_image_resize) to `width` × `height` without keeping its aspect ratio. Boxes whose
//! clipped width or height is under `min_size` pixels are skipped. With `reinfer_every: N` the
//! stage is stateful per camera: a track is cropped at most once every N frames (tracks without
//! id every frame), so a classifier re-runs on each object every N frames only.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::UInt32Type;
use arrow_array::{
    Array, ArrayRef, BinaryArray, Float32Array, Int32Array, Int64Array, RecordBatch, UInt32Array,
};
use arrow_schema::{DataType, Field, FieldRef, Schema, SchemaRef};
use fast_image_resize::images::{Image, ImageRef};
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};
use riffle_dataflow::dead_letter::DeadLetter;
use riffle_dataflow::runtime::Step;
use riffle_dataflow::{DataflowError, DataflowResult, Stage, StageOutput};
use serde::{Deserialize, Serialize};
use serde_inline_default::serde_inline_default;

use crate::vision::analytics::{check_column, check_detections, DetectionsColumn, Object};
use crate::vision::decode::{is_binary, Payloads, HEIGHT_COLUMN, WIDTH_COLUMN};
use crate::vision::resize::check_row;
use riffle_dataflow::operators::{Keyed, KeyedLogic};

mod region;
#[cfg(test)]
mod tests;

pub use region::{crop_region, Region};

const NAME: &str = "crop";

/// YAML block of a `crop` stage.
#[serde_inline_default]
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CropConfig {
    /// Binary RGB8 pixels of the frame (with `width` / `height` columns, as `decode` makes).
    #[serde_inline_default("pixels".to_string())]
    pub input: String,
    /// The detections list column (boxes in source pixels).
    #[serde_inline_default("detections".to_string())]
    pub detections: String,
    /// Size of every crop, in pixels.
    pub width: u32,
    pub height: u32,
    /// The box grows by this fraction of its width (height) on the left and right (top and
    /// bottom) before it is clipped to the image.
    #[serde(default)]
    pub padding: f32,
    /// Class ids cropped; empty crops every class.
    #[serde(default)]
    pub classes: Vec<i64>,
    /// Boxes narrower or lower than this many pixels (clipped to the image, before padding)
    /// are skipped.
    #[serde_inline_default(1.0)]
    pub min_size: f32,
    /// Crop each track at most once every this many frames (needs `track_id` in the
    /// detections; makes the stage stateful, per `key`). Unset: every object of every frame.
    #[serde(default)]
    pub reinfer_every: Option<i64>,
    /// Crop only objects on a track (`track_id` not null): a tracker's unconfirmed, low-score
    /// detections are left out (needs `track_id` in the detections).
    #[serde(default)]
    pub tracked_only: bool,
    /// With `reinfer_every`: the column whose values each have their own state.
    #[serde_inline_default("camera_id".to_string())]
    pub key: String,
    /// With `reinfer_every`: the Int64 frame-number column.
    #[serde_inline_default("frame".to_string())]
    pub frame: String,
    /// The crop's pixel column.
    #[serde_inline_default("pixels".to_string())]
    pub output: String,
}

/// Per camera with `reinfer_every`: the frame each track was last cropped at.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CropState {
    pub cropped: BTreeMap<i64, i64>,
}

/// The `crop` stage (stateless; with `reinfer_every` it runs as [`CropPerTrack`]).
///
/// # Examples
/// Two objects on a 100×50 frame, one partly outside it: two crop rows of 8×8 pixels.
/// ```
/// use std::sync::Arc;
/// use arrow_array::cast::AsArray;
/// use arrow_array::types::{Float32Type, Int64Type, UInt32Type};
/// use arrow_array::{ArrayRef, BinaryArray, Float32Array, Int64Array, ListArray, RecordBatch, StructArray, UInt32Array};
/// use arrow_buffer::OffsetBuffer;
/// use arrow_schema::{DataType, Field, Fields};
/// use riffle_dataflow::Stage;
/// use riffle_operators::vision::crop::Crop;
///
/// let f32s = |v: [f32; 2]| Arc::new(Float32Array::from(v.to_vec())) as ArrayRef;
/// let fields = Fields::from(vec![
///     Field::new("class_id", DataType::Int64, false),
///     Field::new("score", DataType::Float32, false),
///     Field::new("x1", DataType::Float32, false),
///     Field::new("y1", DataType::Float32, false),
///     Field::new("x2", DataType::Float32, false),
///     Field::new("y2", DataType::Float32, false),
/// ]);
/// let boxes = StructArray::new(fields.clone(), vec![
///     Arc::new(Int64Array::from(vec![1, 3])),
///     f32s([0.9, 0.6]),
///     f32s([10.0, 80.0]), f32s([10.0, 20.0]), f32s([30.0, 130.0]), f32s([40.0, 60.0]),
/// ], None);
/// let item = Arc::new(Field::new_list_field(DataType::Struct(fields), false));
/// let detections = ListArray::new(item, OffsetBuffer::from_lengths([2]), Arc::new(boxes), None);
/// let pixels = vec![128u8; 100 * 50 * 3];
/// let batch = RecordBatch::try_from_iter([
///     ("frame", Arc::new(Int64Array::from(vec![42])) as ArrayRef),
///     ("pixels", Arc::new(BinaryArray::from(vec![pixels.as_slice()])) as _),
///     ("width", Arc::new(UInt32Array::from(vec![100])) as _),
///     ("height", Arc::new(UInt32Array::from(vec![50])) as _),
///     ("detections", Arc::new(detections) as _),
/// ])
/// .unwrap();
///
/// let config = serde_json::json!({ "width": 8, "height": 8, "padding": 0.1 });
/// let mut stage = Crop::new(serde_json::from_value(config).unwrap()).unwrap();
/// let out = stage.process_batch(&batch).unwrap().records;
///
/// assert_eq!(out.num_rows(), 2);
/// let ints = |c: &str| out.column_by_name(c).unwrap().as_primitive::<Int64Type>().values().to_vec();
/// assert_eq!(ints("frame"), [42, 42]);
/// assert_eq!(ints("class_id"), [1, 3]);
/// assert_eq!(out.column_by_name("width").unwrap().as_primitive::<UInt32Type>().value(1), 8);
/// assert_eq!(out.column_by_name("pixels").unwrap().as_binary::<i32>().value(1), &[128u8; 8 * 8 * 3]);
/// // The box is the detection's, as found (the crop was clipped, the box is not).
/// assert_eq!(out.column_by_name("x2").unwrap().as_primitive::<Float32Type>().value(1), 130.0);
/// ```
pub struct Crop {
    config: CropConfig,
    resizer: Resizer,
    /// Destination of every crop, reused.
    dst: Image<'static>,
}

impl Crop {
    /// The stage, after checking the configuration (errors at their keys).
    pub fn new(config: CropConfig) -> DataflowResult<Self> {
        let bad =
            |key: &str, msg: String| Err(DataflowError::Config(format!("{NAME}: {msg}")).at(key));
        if config.width == 0 || config.height == 0 {
            let key = if config.width == 0 { "width" } else { "height" };
            return bad(
                key,
                format!(
                    "crop size {}x{} must be non-zero",
                    config.width, config.height
                ),
            );
        }
        let bytes = (config.width as usize)
            .checked_mul(config.height as usize)
            .and_then(|n| n.checked_mul(3));
        if bytes.is_none_or(|n| i32::try_from(n).is_err()) {
            return bad(
                "width",
                format!("crop size {}x{} is too large", config.width, config.height),
            );
        }
        if !(config.padding.is_finite() && config.padding >= 0.0) {
            return bad(
                "padding",
                format!("must be a fraction ≥ 0, got {}", config.padding),
            );
        }
        if !(config.min_size.is_finite() && config.min_size >= 0.0) {
            return bad(
                "min_size",
                format!("must be ≥ 0 pixels, got {}", config.min_size),
            );
        }
        if config.reinfer_every.is_some_and(|n| n < 1) {
            return bad("reinfer_every", "must be at least 1".into());
        }
        Ok(Crop {
            dst: Image::new(config.width, config.height, PixelType::U8x3),
            resizer: Resizer::new(),
            config,
        })
    }

    fn is_frame_column(&self, name: &str) -> bool {
        let c = &self.config;
        name == c.input || name == c.detections || name == WIDTH_COLUMN || name == HEIGHT_COLUMN
    }

    /// The output schema for `input`.
    pub fn output_schema(&self, input: &SchemaRef) -> DataflowResult<SchemaRef> {
        let c = &self.config;
        let binary = |t: &DataType| is_binary(t);
        match input.field_with_name(&c.input) {
            Ok(f) if binary(f.data_type()) => {}
            Ok(f) => {
                return Err(DataflowError::schema(
                    &c.input,
                    "a binary column of RGB8 pixels",
                    f.data_type().to_string(),
                )
                .at("input"))
            }
            Err(_) => {
                return Err(DataflowError::schema(
                    &c.input,
                    "a binary column of RGB8 pixels",
                    "no such column",
                )
                .at("input"))
            }
        }
        for name in [WIDTH_COLUMN, HEIGHT_COLUMN] {
            check_column(
                input,
                name,
                "UInt32 image size (from decode)",
                &[DataType::UInt32],
            )?;
        }
        let tracked =
            check_detections(input, &c.detections, false).map_err(|e| e.at("detections"))?;
        if c.tracked_only && !tracked {
            return Err(DataflowError::Config(format!(
                "{NAME}: tracked_only needs `track_id` in `{}` (a `track` stage before)",
                c.detections
            ))
            .at("tracked_only"));
        }
        if c.reinfer_every.is_some() {
            if !tracked {
                return Err(DataflowError::Config(format!(
                    "{NAME}: reinfer_every needs `track_id` in `{}` (a `track` stage before)",
                    c.detections
                ))
                .at("reinfer_every"));
            }
            check_column(
                input,
                &c.key,
                "a Utf8 or Int64 key column",
                &[DataType::Utf8, DataType::Int64],
            )
            .map_err(|e| e.at("key"))?;
            check_column(input, &c.frame, "Int64 frame numbers", &[DataType::Int64])
                .map_err(|e| e.at("frame"))?;
        }
        let mut fields: Vec<FieldRef> = input
            .fields()
            .iter()
            .filter(|f| !self.is_frame_column(f.name()))
            .cloned()
            .collect();
        let coord = |name: &str| Field::new(name, DataType::Float32, false);
        let mut added = Vec::new();
        if tracked {
            added.push(Field::new("track_id", DataType::Int64, true));
        }
        added.extend([
            Field::new("object_index", DataType::Int32, false),
            Field::new("class_id", DataType::Int64, false),
            Field::new("score", DataType::Float32, false),
            coord("x1"),
            coord("y1"),
            coord("x2"),
            coord("y2"),
            Field::new(&c.output, DataType::Binary, false),
            Field::new(WIDTH_COLUMN, DataType::UInt32, false),
            Field::new(HEIGHT_COLUMN, DataType::UInt32, false),
        ]);
        for field in added {
            if fields.iter().any(|f| f.name() == field.name()) {
                return Err(DataflowError::schema(
                    field.name(),
                    "a column name free for crop's output (rename the input column with `select`)",
                    "an existing column",
                )
                .at("output"));
            }
            fields.push(Arc::new(field));
        }
        Ok(Arc::new(Schema::new_with_metadata(
            fields,
            input.metadata().clone(),
        )))
    }

    /// Crops every row; with `memory`, a track's objects only when it is due (see
    /// [`CropState`]).
    fn run(
        &mut self,
        batch: &RecordBatch,
        mut memory: Option<&mut CropState>,
    ) -> DataflowResult<StageOutput> {
        let schema = self.output_schema(batch.schema_ref())?;
        let c = &self.config;
        let pixel_column = batch
            .column_by_name(&c.input)
            .ok_or_else(|| DataflowError::schema(&c.input, "a binary column", "none"))?;
        let pixels = Payloads::new(pixel_column.as_ref()).ok_or_else(|| {
            DataflowError::schema(
                &c.input,
                "a binary column",
                pixel_column.data_type().to_string(),
            )
        })?;
        let size = |name: &str| {
            batch
                .column_by_name(name)
                .and_then(|col| col.as_primitive_opt::<UInt32Type>())
                .ok_or_else(|| DataflowError::schema(name, "UInt32", "another type"))
        };
        let (widths, heights) = (size(WIDTH_COLUMN)?, size(HEIGHT_COLUMN)?);
        let detections = DetectionsColumn::new(batch, &c.detections, false)?;
        let frames = if memory.is_some() {
            Some(crate::vision::analytics::int64_column(batch, &c.frame)?)
        } else {
            None
        };

        let mut out = Objects::default();
        let mut rejected = Vec::new();
        for row in 0..batch.num_rows() {
            let checked = (|| {
                let p = pixels
                    .get(row)
                    .ok_or_else(|| format!("null `{}`", c.input))?;
                if !(widths.is_valid(row) && heights.is_valid(row)) {
                    return Err("null image width or height".to_string());
                }
                let (w, h) = (widths.value(row), heights.value(row));
                check_row(p, w, h)?;
                let frame = match frames {
                    Some(f) if f.is_null(row) => return Err("null frame".to_string()),
                    Some(f) => Some(f.value(row)),
                    None => None,
                };
                Ok((p, w, h, frame, detections.row(row)?))
            })();
            let (p, w, h, frame, objects) = match checked {
                Ok(found) => found,
                Err(reason) => {
                    rejected.push(DeadLetter::for_row(NAME, batch, row, reason));
                    continue;
                }
            };
            let src = ImageRef::new(w, h, p, PixelType::U8x3)
                .map_err(|e| DataflowError::stage(NAME, format!("bad source image: {e}")))?;
            for object in objects {
                if !c.classes.is_empty() && !c.classes.contains(&object.class_id) {
                    continue;
                }
                if c.tracked_only && object.track_id.is_none() {
                    continue;
                }
                let Some(region) = crop_region(object.rect, c.padding, c.min_size, w, h) else {
                    continue;
                };
                if let (Some(state), Some(frame), Some(every)) =
                    (memory.as_deref_mut(), frame, c.reinfer_every)
                {
                    if !due(state, object.track_id, frame, every) {
                        continue;
                    }
                }
                let [left, top, rw, rh] = region.map(f64::from);
                let options = ResizeOptions::new()
                    .resize_alg(ResizeAlg::Convolution(FilterType::Bilinear))
                    .crop(left, top, rw, rh);
                self.resizer
                    .resize(&src, &mut self.dst, &options)
                    .map_err(|e| DataflowError::stage(NAME, format!("resize failed: {e}")))?;
                out.push(row, object, self.dst.buffer());
            }
        }
        if let (Some(state), Some(every)) = (memory, c.reinfer_every) {
            forget(state, every);
        }
        let records = out.finish(
            batch,
            schema,
            |name| self.is_frame_column(name),
            &self.config,
        )?;
        Ok(StageOutput { records, rejected })
    }
}

/// Whether a track's object is cropped at `frame`, noting it when it is: tracks without id
/// always; others when never cropped, or cropped `every` frames ago or more (or at a later
/// frame: the camera's numbering restarted).
fn due(state: &mut CropState, track_id: Option<i64>, frame: i64, every: i64) -> bool {
    let Some(t) = track_id else {
        return true;
    };
    let due = state
        .cropped
        .get(&t)
        .is_none_or(|&last| frame < last || frame.saturating_sub(last) >= every);
    if due {
        state.cropped.insert(t, frame);
    }
    due
}

/// Drops the tracks that are due again anyway, so the state holds only the last `every`
/// frames' tracks.
fn forget(state: &mut CropState, every: i64) {
    if let Some(&newest) = state.cropped.values().max() {
        state
            .cropped
            .retain(|_, last| newest.saturating_sub(*last) < every);
    }
}

/// The output rows, one per crop.
#[derive(Default)]
struct Objects {
    parent: Vec<u32>,
    track_id: Vec<Option<i64>>,
    index: Vec<i32>,
    class_id: Vec<i64>,
    score: Vec<f32>,
    rect: [Vec<f32>; 4],
    pixels: Vec<u8>,
    offsets: Vec<i32>,
}

impl Objects {
    fn push(&mut self, row: usize, object: Object, pixels: &[u8]) {
        self.parent.push(row as u32);
        self.track_id.push(object.track_id);
        self.index
            .push(i32::try_from(object.index).unwrap_or(i32::MAX));
        self.class_id.push(object.class_id);
        self.score.push(object.score);
        for (column, v) in self.rect.iter_mut().zip(object.rect) {
            column.push(v);
        }
        if self.offsets.is_empty() {
            self.offsets.push(0);
        }
        self.pixels.extend_from_slice(pixels);
        // Each crop is at most i32::MAX bytes (checked in `Crop::new`); the sum is checked here.
        let end = i32::try_from(self.pixels.len()).unwrap_or(i32::MAX);
        self.offsets.push(end);
    }

    fn finish(
        self,
        batch: &RecordBatch,
        schema: SchemaRef,
        dropped: impl Fn(&str) -> bool,
        config: &CropConfig,
    ) -> DataflowResult<RecordBatch> {
        let n = self.parent.len();
        if self.pixels.len() > i32::MAX as usize {
            return Err(DataflowError::stage(
                NAME,
                format!("{n} crops of one batch exceed 2 GiB; make batches smaller"),
            ));
        }
        let parents = UInt32Array::from(self.parent);
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
        for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
            if !dropped(field.name()) {
                columns.push(arrow_select::take::take(column.as_ref(), &parents, None)?);
            }
        }
        if schema.field_with_name("track_id").is_ok() {
            columns.push(Arc::new(Int64Array::from(self.track_id)));
        }
        let [x1, y1, x2, y2] = self.rect;
        columns.extend([
            Arc::new(Int32Array::from(self.index)) as ArrayRef,
            Arc::new(Int64Array::from(self.class_id)),
            Arc::new(Float32Array::from(self.score)),
            Arc::new(Float32Array::from(x1)),
            Arc::new(Float32Array::from(y1)),
            Arc::new(Float32Array::from(x2)),
            Arc::new(Float32Array::from(y2)),
        ]);
        let offsets = if self.offsets.is_empty() {
            vec![0]
        } else {
            self.offsets
        };
        let pixels = BinaryArray::try_new(
            arrow_buffer::OffsetBuffer::new(offsets.into()),
            self.pixels.into(),
            None,
        )?;
        columns.push(Arc::new(pixels));
        columns.push(Arc::new(UInt32Array::from(vec![config.width; n])));
        columns.push(Arc::new(UInt32Array::from(vec![config.height; n])));
        Ok(RecordBatch::try_new(schema, columns)?)
    }
}

impl Stage for Crop {
    fn name(&self) -> &str {
        NAME
    }

    fn output_schema(&self, input: &SchemaRef) -> DataflowResult<SchemaRef> {
        Crop::output_schema(self, input)
    }

    fn process_batch(&mut self, batch: &RecordBatch) -> DataflowResult<StageOutput> {
        self.run(batch, None)
    }
}

/// `crop` with `reinfer_every`: per camera, each track cropped once every N frames.
pub struct CropPerTrack(pub Crop);

impl KeyedLogic for CropPerTrack {
    type State = CropState;

    fn name(&self) -> &str {
        NAME
    }

    fn process(
        &mut self,
        _key: &str,
        state: &mut CropState,
        rows: &RecordBatch,
    ) -> DataflowResult<StageOutput> {
        self.0.run(rows, Some(state))
    }
}

impl crate::StageKind for CropConfig {
    fn kind(&self) -> &'static str {
        NAME
    }

    fn output_schema(&self, input: &SchemaRef) -> DataflowResult<SchemaRef> {
        Crop::new(self.clone())?.output_schema(input)
    }

    fn build(&self, _ctx: &crate::StageContext<'_>) -> DataflowResult<Step> {
        let crop = Crop::new(self.clone())?;
        Ok(match self.reinfer_every {
            Some(_) => Step::Stateful(Box::new(Keyed {
                logic: CropPerTrack(crop),
                key: self.key.clone(),
            })),
            None => crate::kind::apply(crop),
        })
    }

    fn describe(&self, _ctx: &crate::StageContext<'_>) -> String {
        match self.reinfer_every {
            Some(n) => format!(
                "rows sharded by `{}`; {}x{} crops, each track every {n} frames",
                self.key, self.width, self.height
            ),
            None => format!(
                "{}x{} crops, {}",
                self.width, self.height, "on the worker holding the batch"
            ),
        }
    }

    fn stateful(&self) -> bool {
        self.reinfer_every.is_some()
    }
}
