//! `resize`: decoded RGB8 images → one model-ready tensor column.
//!
//! Each row is resized into one reused destination image, then scaled / normalised and laid
//! out (NCHW or NHWC) straight into the batch's single value buffer, which becomes the tensor
//! column without another copy. Two resize filters:
//! - `antialias: true` (the default for `mode: stretch`): bilinear convolution, every source
//!   pixel under an output pixel counts when shrinking, as PIL and torchvision resize
//!   (fast_image_resize's SIMD paths);
//! - `antialias: false` (the default for `mode: letterbox`): two taps per axis at any scale,
//!   bit for bit OpenCV's `cv2.resize(..., interpolation=cv2.INTER_LINEAR)` on u8 images
//!   (the `two_tap` module), which Ultralytics' letterbox and most OpenCV-based pre-processing use.
//!
//! [`Resize::on_gpu`] runs the same stage as CUDA kernels (`gpu`, kernels in riffle-gpu) that
//! reproduce fast_image_resize's fixed-point arithmetic ([`mod@reference`]), so both paths give the
//! same tensor; [`check::compare_on_gpu`] measures that on a GPU host. The kernels do the
//! antialiased stretch only: with `device: auto` a letterbox or `antialias: false` resize runs
//! on the CPU (logged once), and with `device: cuda:N` it is a configuration error at the key.
//!
//! [`output_schema`] is the stage's schema rule without a stage: validation calls it with no
//! kernels compiled and no GPU touched.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, UInt32Type, UInt8Type};
use arrow_array::{Array, ArrayRef, BooleanArray, RecordBatch, UInt32Array};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use fast_image_resize::images::Image;
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};
use riffle_dataflow::dead_letter::DeadLetter;
use riffle_dataflow::error::{DataflowError, DataflowResult};
use riffle_dataflow::stage::{Stage, StageOutput};
use riffle_dataflow::tensor::{tensor_column, tensor_field};
use riffle_formats::picture::pixels_size;

use riffle_gpu::DeviceSpec;
use serde_inline_default::serde_inline_default;

use crate::vision::decode::{is_binary, Payloads, HEIGHT_COLUMN, WIDTH_COLUMN};
use cpu::CpuResizer;
pub use cpu::{letterbox_fit, LetterboxFit};
use gpu::CudaResize;
use two_tap::TwoTap;
use values::{normalisation_lut, Normalise};
pub(crate) use values::{Lut, Values};

pub mod check;
mod cpu;
mod gpu;
pub mod reference;
#[cfg(test)]
mod tests;

pub use check::{compare_on_gpu, GpuResizeCheck};
pub use reference::{reference_tensor, resize_rgb8, Taps};

mod kind;
mod two_tap;
mod values;

const STAGE: &str = "resize";

/// Order of a tensor's axes per row.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Layout {
    /// `[3, H, W]`: channel planes (most ONNX vision models).
    #[default]
    Nchw,
    /// `[H, W, 3]`: interleaved pixels.
    Nhwc,
}

/// Element type of the tensor column.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TensorDtype {
    /// `p / 255`, then `(x - mean) / std` when given.
    #[default]
    F32,
    /// Raw pixel values.
    U8,
}

/// How an image's aspect ratio is treated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ResizeMode {
    /// Scaled to exactly the target size; the aspect ratio may change.
    #[default]
    Stretch,
    /// Scaled by one factor to fit inside the target, centred, the rest filled with
    /// `pad_value` (YOLO-style). Adds the [`LETTERBOX_COLUMN`] so boxes can be mapped back.
    Letterbox,
}

/// Column `mode: letterbox` adds: per row `[gain, pad_x, pad_y]`, so that a point `(x, y)` of
/// the model's input is `((x - pad_x) / gain, (y - pad_y) / gain)` in the source image.
pub const LETTERBOX_COLUMN: &str = "letterbox";

/// A per-channel value written either once for all channels (`0.5`) or per channel (`[r, g, b]`).
#[derive(Clone, Copy, Debug, PartialEq, serde::Deserialize)]
#[serde(untagged)]
pub enum PerChannel {
    All(f32),
    Rgb([f32; 3]),
}

impl PerChannel {
    fn rgb(self) -> [f32; 3] {
        match self {
            PerChannel::All(v) => [v; 3],
            PerChannel::Rgb(v) => v,
        }
    }
}

/// Configuration of the `resize` stage (its YAML block).
#[serde_inline_default]
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResizeConfig {
    /// Binary column of RGB8 pixels; the `width` and `height` columns give each row's size.
    #[serde_inline_default("pixels".to_string())]
    pub input: String,
    /// Tensor column written.
    #[serde_inline_default("tensor".to_string())]
    pub output: String,
    /// Target size.
    pub width: u32,
    pub height: u32,
    #[serde(default)]
    pub layout: Layout,
    #[serde(default)]
    pub dtype: TensorDtype,
    /// Per-channel (R, G, B) mean subtracted after scaling to 0..1 (f32 only).
    #[serde(default)]
    pub mean: Option<[f32; 3]>,
    /// Per-channel divisor applied after the mean (f32 only).
    #[serde(default)]
    pub std: Option<[f32; 3]>,
    /// `(p - offset) * scale` on raw 0..255 pixel values, the form DeepStream and OpenVINO
    /// use (e.g. `(p - 127.5) / 128`: `offset: 127.5, scale: 0.0078125`); instead of mean/std.
    #[serde(default)]
    pub scale: Option<PerChannel>,
    #[serde(default)]
    pub offset: Option<PerChannel>,
    #[serde(default)]
    pub mode: ResizeMode,
    /// `true`: average over every source pixel under each output pixel when shrinking
    /// (bilinear convolution, as PIL and torchvision resize). `false`: two taps per axis
    /// whatever the scale, bit for bit OpenCV's u8 `INTER_LINEAR` (and so Ultralytics'
    /// letterbox), for models trained on that pre-processing; CPU only. Unset: `false` for
    /// `mode: letterbox` (YOLO models expect it), `true` otherwise; see
    /// [`ResizeConfig::antialiased`].
    #[serde(default)]
    pub antialias: Option<bool>,
    /// Pixel value of the letterbox's padding (114, Ultralytics' grey, by default).
    #[serde_inline_default(114)]
    pub pad_value: u8,
    /// Keep the pixel column (dropped by default; `width` / `height` are always kept since
    /// later stages map results back to the original image size).
    #[serde(default)]
    pub keep_input: bool,
    /// `cpu`, `auto` or `cuda:N`. Read by the planner, which picks the constructor
    /// ([`Resize::new`] or [`Resize::on_gpu`]); the stage itself does not look at it.
    #[serde(default)]
    pub device: DeviceSpec,
}

impl ResizeConfig {
    /// Whether the resize antialiases: `antialias` when set, else `true` except for a letterbox,
    /// which resizes as Ultralytics' `LetterBox` does (OpenCV's two-tap `INTER_LINEAR`).
    pub fn antialiased(&self) -> bool {
        self.antialias.unwrap_or(self.mode != ResizeMode::Letterbox)
    }

    /// The key and the reason the GPU kernels cannot run this resize, if they cannot: they do
    /// the antialiased stretch only.
    pub fn gpu_unsupported(&self) -> Option<(&'static str, &'static str)> {
        if self.mode == ResizeMode::Letterbox {
            Some(("mode", "mode letterbox"))
        } else if !self.antialiased() {
            Some(("antialias", "antialias: false"))
        } else {
            None
        }
    }
}

/// The `resize` stage.
///
/// Gives a vision model the fixed-size, normalised input tensor it expects, whatever the size
/// of the decoded images. A row whose pixels do not match its `width` x `height` is rejected.
///
/// # Examples
/// ```
/// use std::sync::Arc;
/// use arrow_array::types::Float32Type;
/// use arrow_array::{ArrayRef, BinaryArray, RecordBatch, UInt32Array};
/// use riffle_dataflow::tensor::{row_shape, tensor_values};
/// use riffle_dataflow::Stage;
/// use riffle_operators::vision::resize::Resize;
///
/// // A flat magenta 4x2 image, and a row whose 5 bytes cannot be a 4x2 RGB8 image.
/// let magenta = [255u8, 0, 255].repeat(8);
/// let batch = RecordBatch::try_from_iter(vec![
///     ("pixels", Arc::new(BinaryArray::from(vec![&magenta[..], &[0u8; 5][..]])) as ArrayRef),
///     ("width", Arc::new(UInt32Array::from(vec![4, 4])) as _),
///     ("height", Arc::new(UInt32Array::from(vec![2, 2])) as _),
/// ])
/// .unwrap();
/// let config = serde_json::json!({
///     "width": 2, "height": 1, "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5],
/// });
/// let mut stage = Resize::new(serde_json::from_value(config).unwrap()).unwrap();
/// let out = stage.process_batch(&batch).unwrap();
///
/// let field = out.records.schema().field_with_name("tensor").unwrap().clone();
/// assert_eq!(row_shape(&field).unwrap(), [3, 1, 2]); // NCHW
/// let tensor = out.records.column_by_name("tensor").unwrap();
/// // (p / 255 - 0.5) / 0.5, one channel plane after another.
/// assert_eq!(tensor_values::<Float32Type>(tensor).unwrap(), [1.0, 1.0, -1.0, -1.0, 1.0, 1.0]);
/// assert_eq!(out.rejected.len(), 1);
/// ```
pub struct Resize {
    config: ResizeConfig,
    /// The output tensor field (shape metadata included).
    field: Field,
    engine: Engine,
    /// Per channel, the f32 value of each u8 pixel: the normalisation done once, not per pixel.
    lut: Lut,
}

/// Where the pixels are resized.
enum Engine {
    // Both boxed: one is chosen per stage, and their sizes differ a lot.
    Cpu(Box<CpuResizer>),
    Gpu(Box<CudaResize>),
}

/// Why a row's pixels cannot be resized, if they cannot: the checks both engines share.
pub(crate) fn check_row(pixels: &[u8], width: u32, height: u32) -> Result<(), String> {
    if width == 0 || height == 0 {
        // The resizer silently does nothing for an empty source, leaving the last row.
        return Err(format!("empty image {width}x{height}"));
    }
    let expected = width as usize * height as usize * 3;
    if pixels.len() != expected {
        return Err(format!(
            "pixels has {} bytes, expected {expected} for a {width}x{height} RGB8 image",
            pixels.len()
        ));
    }
    Ok(())
}

/// What [`checked`] makes of a config.
struct Checked {
    /// The output tensor field (shape metadata included).
    field: Field,
    normalise: Normalise,
}

/// The config checked, each error at its key, and the output field it gives.
fn checked(config: &ResizeConfig) -> DataflowResult<Checked> {
    let bad =
        |key: &str, msg: String| Err(DataflowError::Config(format!("{STAGE}: {msg}")).at(key));
    if config.width == 0 || config.height == 0 {
        let key = if config.width == 0 { "width" } else { "height" };
        return bad(
            key,
            format!(
                "target size {}x{} must be non-zero",
                config.width, config.height
            ),
        );
    }
    let mean_std = config.mean.is_some() || config.std.is_some();
    let scale_offset = config.scale.is_some() || config.offset.is_some();
    if config.dtype == TensorDtype::U8 && (mean_std || scale_offset) {
        let key = [
            ("mean", config.mean.is_some()),
            ("std", config.std.is_some()),
            ("scale", config.scale.is_some()),
        ]
        .into_iter()
        .find_map(|(k, set)| set.then_some(k))
        .unwrap_or("offset");
        return bad(
            key,
            "normalisation (mean/std, scale/offset) needs dtype f32, not u8".to_string(),
        );
    }
    if mean_std && scale_offset {
        let key = if config.scale.is_some() {
            "scale"
        } else {
            "offset"
        };
        return bad(
            key,
            "give either mean/std or scale/offset, not both".to_string(),
        );
    }
    let normalise = if scale_offset {
        let scale = config.scale.map_or([1.0; 3], PerChannel::rgb);
        let offset = config.offset.map_or([0.0; 3], PerChannel::rgb);
        if scale.iter().chain(&offset).any(|v| !v.is_finite()) {
            let key = if scale.iter().all(|v| v.is_finite()) {
                "offset"
            } else {
                "scale"
            };
            return bad(
                key,
                format!("scale {scale:?} and offset {offset:?} must be finite"),
            );
        }
        Normalise::ScaleOffset { scale, offset }
    } else {
        let mean = config.mean.unwrap_or([0.0; 3]);
        let std = config.std.unwrap_or([1.0; 3]);
        if mean.iter().chain(&std).any(|v| !v.is_finite()) {
            let key = if mean.iter().all(|v| v.is_finite()) {
                "std"
            } else {
                "mean"
            };
            return bad(key, format!("mean {mean:?} and std {std:?} must be finite"));
        }
        if std.contains(&0.0) {
            return bad("std", format!("std {std:?} has a zero"));
        }
        Normalise::MeanStd { mean, std }
    };
    // The per-row size is a FixedSizeList length (i32).
    let (w, h) = (config.width as usize, config.height as usize);
    let elems = w.checked_mul(h).and_then(|p| p.checked_mul(3));
    if elems.is_none_or(|n| i32::try_from(n).is_err()) {
        return bad("width", format!("target size {w}x{h} is too large"));
    }
    let shape = match config.layout {
        Layout::Nchw => [3, h, w],
        Layout::Nhwc => [h, w, 3],
    };
    let element = match config.dtype {
        TensorDtype::F32 => DataType::Float32,
        TensorDtype::U8 => DataType::UInt8,
    };
    Ok(Checked {
        field: tensor_field(&config.output, element, &shape),
        normalise,
    })
}

/// The schema the `resize` stage configured by `config` gives for `input`: the stage's own
/// rule ([`Stage::output_schema`] calls it), without a stage, kernels or GPU. Errors about a
/// config key are located at it (`DataflowError::at`).
pub fn output_schema(config: &ResizeConfig, input: &SchemaRef) -> DataflowResult<SchemaRef> {
    let Checked { field, .. } = checked(config)?;
    input_field(
        input,
        &config.input,
        "a binary column of RGB8 pixels",
        is_binary,
    )
    .map_err(|e| e.at("input"))?;
    for name in [WIDTH_COLUMN, HEIGHT_COLUMN] {
        input_field(input, name, "UInt32 (image size from decode)", |t| {
            *t == DataType::UInt32
        })?;
    }
    let mut fields: Vec<Field> = kept_columns(config, input)
        .into_iter()
        .map(|i| input.field(i).clone())
        .collect();
    if fields.iter().any(|f| f.name() == &config.output) {
        return Err(DataflowError::schema(
            &config.output,
            "no existing column (resize adds it)",
            "a column of that name in the input",
        )
        .at("output"));
    }
    fields.push(field);
    if config.mode == ResizeMode::Letterbox {
        if fields.iter().any(|f| f.name() == LETTERBOX_COLUMN) {
            return Err(DataflowError::schema(
                LETTERBOX_COLUMN,
                "no existing column (a letterbox resize adds it)",
                "a column of that name in the input",
            )
            .at("mode"));
        }
        fields.push(tensor_field(LETTERBOX_COLUMN, DataType::Float32, &[3]));
    }
    Ok(Arc::new(Schema::new_with_metadata(
        fields,
        input.metadata().clone(),
    )))
}

/// Indices of the input columns carried into the output.
fn kept_columns(config: &ResizeConfig, input: &Schema) -> Vec<usize> {
    (0..input.fields().len())
        .filter(|&i| config.keep_input || input.field(i).name() != &config.input)
        .collect()
}

impl Resize {
    /// The stage on GPU `ordinal`: same checks, schema and values as [`Resize::new`]'s.
    pub fn on_gpu(config: ResizeConfig, ordinal: usize) -> DataflowResult<Self> {
        if let Some((key, what)) = config.gpu_unsupported() {
            return Err(DataflowError::Config(format!(
                "{STAGE}: {what} runs on the CPU only; set `device: cpu` or `auto`"
            ))
            .at(key));
        }
        let mut stage = Resize::new(config)?;
        let gpu =
            CudaResize::new(&stage.config, &stage.lut, ordinal).map_err(|e| e.at("device"))?;
        stage.engine = Engine::Gpu(Box::new(gpu));
        Ok(stage)
    }

    /// The stage on the CPU; `config.device` is not looked at.
    pub fn new(config: ResizeConfig) -> DataflowResult<Self> {
        let Checked { field, normalise } = checked(&config)?;
        let antialiased = config.antialiased();
        Ok(Resize {
            engine: Engine::Cpu(Box::new(CpuResizer {
                dst: Image::new(config.width, config.height, PixelType::U8x3),
                inner: Image::new(1, 1, PixelType::U8x3),
                options: ResizeOptions::new()
                    .resize_alg(ResizeAlg::Convolution(FilterType::Bilinear)),
                two_tap: (!antialiased).then(TwoTap::default),
                resizer: Resizer::new(),
            })),
            field,
            lut: normalisation_lut(normalise),
            config,
        })
    }

    /// Whether `process_batch` runs on a GPU.
    pub fn is_on_gpu(&self) -> bool {
        matches!(self.engine, Engine::Gpu(_))
    }

    /// The normalisation table, built from a config `new` has checked.
    pub(crate) fn lut(&self) -> &Lut {
        &self.lut
    }
}

/// Looks up a column the stage reads, checking its type with `ok`.
fn input_field<'a>(
    schema: &'a Schema,
    name: &str,
    expected: &str,
    ok: impl Fn(&DataType) -> bool,
) -> DataflowResult<&'a Field> {
    let field = schema
        .field_with_name(name)
        .map_err(|_| DataflowError::schema(name, expected, "none"))?;
    if !ok(field.data_type()) {
        return Err(DataflowError::schema(
            name,
            expected,
            field.data_type().to_string(),
        ));
    }
    Ok(field)
}

impl Stage for Resize {
    fn name(&self) -> &str {
        STAGE
    }

    /// Not row-preserving: a row whose pixels do not match its size is dropped as a dead
    /// letter, so output row `i` need not be input row `i`.
    fn preserves_rows(&self) -> bool {
        false
    }

    fn output_schema(&self, input: &SchemaRef) -> DataflowResult<SchemaRef> {
        output_schema(&self.config, input)
    }

    fn process_batch(&mut self, batch: &RecordBatch) -> DataflowResult<StageOutput> {
        let input_schema = batch.schema();
        let schema = self.output_schema(&input_schema)?;
        let column = |name: &str| {
            batch
                .column_by_name(name)
                .ok_or_else(|| DataflowError::schema(name, "a column", "none"))
        };
        let pixel_column = column(&self.config.input)?;
        let pixels = Payloads::new(pixel_column.as_ref()).ok_or_else(|| {
            DataflowError::schema(
                &self.config.input,
                "a binary column",
                pixel_column.data_type().to_string(),
            )
        })?;
        let size_column = |name: &str| -> DataflowResult<UInt32Array> {
            let c = column(name)?;
            c.as_primitive_opt::<UInt32Type>()
                .cloned()
                .ok_or_else(|| DataflowError::schema(name, "UInt32", c.data_type().to_string()))
        };
        let widths = size_column(WIDTH_COLUMN)?;
        let heights = size_column(HEIGHT_COLUMN)?;
        // Pixels a source already scaled (the video source's one-pass conversion) are that
        // size; `width` / `height` still give the picture's own, which results map back to.
        let prescaled = input_schema
            .field_with_name(&self.config.input)
            .ok()
            .and_then(pixels_size);
        let target = (self.config.width, self.config.height);

        let rows = batch.num_rows();
        let per_row = 3 * self.config.width as usize * self.config.height as usize;
        // The GPU resizes the batch's good rows in one go, after the loop, into its own Vec.
        let capacity = match self.engine {
            Engine::Cpu(_) => rows * per_row,
            Engine::Gpu(_) => 0,
        };
        let mut values = Values::with_capacity(self.config.dtype, capacity);
        let letterboxed = self.config.mode == ResizeMode::Letterbox;
        let mut fits: Vec<f32> = Vec::new();
        let mut for_gpu: Vec<(&[u8], u32, u32)> = Vec::new();
        let mut keep = Vec::with_capacity(rows);
        let mut rejected = Vec::new();
        for row in 0..rows {
            let size = (widths.is_valid(row) && heights.is_valid(row))
                .then(|| prescaled.unwrap_or((widths.value(row), heights.value(row))));
            let resized = match (pixels.get(row), size) {
                (Some(p), Some((w, h))) => {
                    check_row(p, w, h).and_then(|()| match &mut self.engine {
                        Engine::Cpu(_) if (w, h) == target && !letterboxed => {
                            values.push(p, self.config.layout, &self.lut);
                            Ok(())
                        }
                        Engine::Cpu(cpu) if letterboxed => {
                            cpu.letterbox(p, w, h, self.config.pad_value).map(|fit| {
                                fits.extend(fit);
                                values.push(cpu.dst.buffer(), self.config.layout, &self.lut);
                            })
                        }
                        Engine::Cpu(cpu) => cpu.resize(p, w, h).map(|()| {
                            values.push(cpu.dst.buffer(), self.config.layout, &self.lut);
                        }),
                        Engine::Gpu(_) => {
                            for_gpu.push((p, w, h));
                            Ok(())
                        }
                    })
                }
                (None, _) => Err(format!("null `{}`", self.config.input)),
                (_, None) => Err("null image width or height".to_string()),
            };
            keep.push(resized.is_ok());
            if let Err(reason) = resized {
                rejected.push(DeadLetter::for_row(STAGE, batch, row, reason));
            }
        }
        if let Engine::Gpu(gpu) = &mut self.engine {
            values = gpu.run(&for_gpu)?;
        }

        let tensor = match values {
            Values::F32(v) => tensor_column::<Float32Type>(&self.field, v)?,
            Values::U8(v) => tensor_column::<UInt8Type>(&self.field, v)?,
        };
        let kept = kept_columns(&self.config, &input_schema);
        let mut columns: Vec<ArrayRef> = if rejected.is_empty() {
            kept.iter().map(|&i| batch.column(i).clone()).collect()
        } else {
            let projected = batch.project(&kept)?;
            let mask = BooleanArray::from(keep);
            arrow_select::filter::filter_record_batch(&projected, &mask)?
                .columns()
                .to_vec()
        };
        columns.push(tensor);
        if letterboxed {
            let field = tensor_field(LETTERBOX_COLUMN, DataType::Float32, &[3]);
            columns.push(tensor_column::<Float32Type>(&field, fits)?);
        }
        let records = RecordBatch::try_new(schema, columns)?;
        Ok(StageOutput { records, rejected })
    }
}
