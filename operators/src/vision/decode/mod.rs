//! `decode`: encoded images (JPEG, PNG, WebP) in a binary column → RGB8 pixels plus their size.
//!
//! Each row's JPEG is decoded by zune-jpeg straight into the output column's value buffer, so
//! the pixels are written once and never copied; a PNG (by its signature) is decoded by the
//! `png` crate and a WebP (by its RIFF header) by `image-webp`, each converted to RGB8 there. A row that does not decode is dropped from the
//! output and reported as a dead letter; the rest of the batch goes on.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{
    Array, ArrayRef, BinaryArray, BinaryViewArray, BooleanArray, GenericBinaryArray,
    LargeBinaryArray, RecordBatch, UInt32Array,
};
use arrow_buffer::{Buffer, OffsetBuffer, ScalarBuffer};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use riffle_dataflow::dead_letter::DeadLetter;
use riffle_dataflow::error::{DataflowError, DataflowResult};
use riffle_dataflow::stage::{Stage, StageOutput};
use zune_jpeg::zune_core::colorspace::ColorSpace;
use zune_jpeg::zune_core::options::DecoderOptions;

mod formats;

const STAGE: &str = "decode";

/// Names of the decoded-size columns this stage adds (later stages rely on them).
pub const WIDTH_COLUMN: &str = "width";
pub const HEIGHT_COLUMN: &str = "height";

/// Configuration of the `decode` stage (its YAML block).
// Missing keys come from `impl Default`, the one place the defaults are written.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DecodeConfig {
    /// Binary (or LargeBinary / BinaryView) column holding one encoded image per row.
    pub input: String,
    /// Binary column written with RGB8 pixels, interleaved, row-major (`height*width*3` bytes).
    pub output: String,
    /// Keep the encoded column in the output (dropped by default: it is no longer needed).
    pub keep_input: bool,
    /// Largest image, in pixels, read from its header before decoding; a larger one is a dead
    /// letter (a 20 KB file can claim 16384×16384 and decode to 805 MB).
    pub max_pixels: u64,
    /// Most decoded bytes in one output batch; a batch that would exceed it is split and its
    /// halves decoded apart (an image alone may exceed it), so no image fails for its neighbours.
    pub max_batch_bytes: u64,
    /// The JPEG decoder: `zune` (zune-jpeg, the default) or `libjpeg-turbo`, whose pixels are
    /// OpenCV's and PIL's bit for bit (zune-jpeg's IDCT and upsampling differ by a few levels
    /// in some pixels).
    pub jpeg: JpegLibrary,
}

/// Which library decodes JPEGs (`decode.jpeg`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum JpegLibrary {
    /// zune-jpeg (Rust, SIMD).
    #[default]
    Zune,
    /// libjpeg-turbo with its defaults (islow IDCT, fancy upsampling), as `cv2.imdecode` and PIL.
    LibjpegTurbo,
}

/// Default `max_pixels`: 40 megapixels (120 MB of RGB).
pub const DEFAULT_MAX_PIXELS: u64 = 40_000_000;
/// Default `max_batch_bytes`: 1 GiB, half of what a Binary column can hold.
pub const DEFAULT_MAX_BATCH_BYTES: u64 = 1 << 30;
/// The most bytes a Binary column (32-bit offsets) holds.
const BINARY_LIMIT: u64 = i32::MAX as u64;

impl Default for DecodeConfig {
    fn default() -> Self {
        DecodeConfig {
            input: "bytes".to_string(),
            output: "pixels".to_string(),
            keep_input: false,
            max_pixels: DEFAULT_MAX_PIXELS,
            max_batch_bytes: DEFAULT_MAX_BATCH_BYTES,
            jpeg: JpegLibrary::Zune,
        }
    }
}

/// The `decode` stage.
///
/// Turns each row's JPEG into the RGB8 pixels and `width` / `height` columns that `resize`
/// reads. A row that does not decode goes to `rejected` (a dead letter); the others go on.
///
/// # Examples
/// ```
/// use std::sync::Arc;
/// use arrow_array::cast::AsArray;
/// use arrow_array::types::UInt32Type;
/// use arrow_array::{ArrayRef, BinaryArray, Int64Array, RecordBatch};
/// use riffle_dataflow::Stage;
/// use riffle_operators::vision::decode::Decode;
///
/// let jpeg: &[u8] = include_bytes!("../../../../data/frames/bikes/0000.jpg");
/// let batch = RecordBatch::try_from_iter(vec![
///     ("frame", Arc::new(Int64Array::from(vec![0, 1])) as ArrayRef),
///     ("jpeg", Arc::new(BinaryArray::from(vec![jpeg, b"GIF89a".as_slice()])) as _),
/// ])
/// .unwrap();
/// let config = serde_json::from_value(serde_json::json!({ "input": "jpeg" })).unwrap();
/// let out = Decode::new(config).process_batch(&batch).unwrap();
///
/// let column = |name: &str| out.records.column_by_name(name).unwrap().clone();
/// let size = |name: &str| column(name).as_primitive::<UInt32Type>().value(0);
/// assert_eq!((size("width"), size("height")), (640, 272));
/// assert_eq!(column("pixels").as_binary::<i32>().value(0).len(), 640 * 272 * 3);
/// // The second row is not a JPEG: it is a dead letter, not an output row.
/// assert_eq!(out.records.num_rows(), 1);
/// assert!(out.rejected[0].reason.starts_with("invalid JPEG"), "{}", out.rejected[0].reason);
/// ```
pub struct Decode {
    config: DecodeConfig,
    options: DecoderOptions,
    /// `jpeg: libjpeg-turbo`'s decompressor, made at the first JPEG.
    turbo: Option<turbojpeg::Decompressor>,
}

impl Decode {
    pub fn new(config: DecodeConfig) -> Self {
        // Strict mode: a truncated or corrupt stream is an error instead of an image padded
        // with grey, which would otherwise reach the model silently. `new_fast` keeps the SIMD
        // paths; the output is always RGB (grayscale and CMYK are converted by the decoder).
        let options = DecoderOptions::new_fast()
            .set_strict_mode(true)
            .jpeg_set_out_colorspace(ColorSpace::RGB);
        Decode {
            config,
            options,
            turbo: None,
        }
    }

    /// Indices of the input columns carried into the output.
    fn kept_columns(&self, input: &Schema) -> Vec<usize> {
        (0..input.fields().len())
            .filter(|&i| self.config.keep_input || input.field(i).name() != &self.config.input)
            .collect()
    }
}

/// A binary column's per-row bytes, whatever binary layout it came in.
pub(crate) enum Payloads<'a> {
    Binary(&'a BinaryArray),
    Large(&'a LargeBinaryArray),
    View(&'a BinaryViewArray),
}

impl<'a> Payloads<'a> {
    pub(crate) fn new(column: &'a dyn Array) -> Option<Self> {
        match column.data_type() {
            DataType::Binary => column.as_binary_opt::<i32>().map(Payloads::Binary),
            DataType::LargeBinary => column.as_binary_opt::<i64>().map(Payloads::Large),
            DataType::BinaryView => column.as_binary_view_opt().map(Payloads::View),
            _ => None,
        }
    }

    /// The row's bytes, `None` when null.
    pub(crate) fn get(&self, row: usize) -> Option<&'a [u8]> {
        fn generic<O: arrow_array::OffsetSizeTrait>(
            a: &GenericBinaryArray<O>,
            row: usize,
        ) -> Option<&[u8]> {
            a.is_valid(row).then(|| a.value(row))
        }
        match self {
            Payloads::Binary(a) => generic(a, row),
            Payloads::Large(a) => generic(a, row),
            Payloads::View(a) => a.is_valid(row).then(|| a.value(row)),
        }
    }
}

pub(crate) fn is_binary(data_type: &DataType) -> bool {
    matches!(
        data_type,
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView
    )
}

/// Why an image was not decoded.
enum Refused {
    /// The image is bad or over a limit: a dead letter with this reason.
    Image(String),
    /// Its pixels would take the batch past `max_batch_bytes`.
    BatchFull,
}

impl From<String> for Refused {
    fn from(reason: String) -> Self {
        Refused::Image(reason)
    }
}

/// Limits checked from an image's header, before any pixel is decoded.
#[derive(Clone, Copy)]
struct Limits {
    max_pixels: u64,
    max_batch_bytes: u64,
}

impl crate::StageKind for DecodeConfig {
    fn kind(&self) -> &'static str {
        "decode"
    }

    fn output_schema(&self, input: &SchemaRef) -> DataflowResult<SchemaRef> {
        // Building this stage is cheap (no engine): its own check is the one rule.
        Decode::new(self.clone()).output_schema(input)
    }

    fn build(
        &self,
        _ctx: &crate::StageContext<'_>,
    ) -> DataflowResult<riffle_dataflow::runtime::Step> {
        Ok(crate::kind::apply(Decode::new(self.clone())))
    }
}

impl Stage for Decode {
    fn name(&self) -> &str {
        STAGE
    }

    fn output_schema(&self, input: &SchemaRef) -> DataflowResult<SchemaRef> {
        // A single image must fit a Binary column.
        if self.config.max_pixels == 0 || self.config.max_pixels > BINARY_LIMIT / 3 {
            return Err(DataflowError::Config(format!(
                "max_pixels must be between 1 and {}",
                BINARY_LIMIT / 3
            ))
            .at("max_pixels"));
        }
        if self.config.max_batch_bytes == 0 || self.config.max_batch_bytes > BINARY_LIMIT {
            return Err(DataflowError::Config(format!(
                "max_batch_bytes must be between 1 and {BINARY_LIMIT}"
            ))
            .at("max_batch_bytes"));
        }
        let field = input.field_with_name(&self.config.input).map_err(|_| {
            DataflowError::schema(&self.config.input, "a binary column", "none").at("input")
        })?;
        if !is_binary(field.data_type()) {
            return Err(DataflowError::schema(
                &self.config.input,
                "a binary column (Binary, LargeBinary or BinaryView)",
                field.data_type().to_string(),
            )
            .at("input"));
        }
        let mut fields: Vec<Field> = self
            .kept_columns(input)
            .into_iter()
            .map(|i| input.field(i).clone())
            .collect();
        for name in [self.config.output.as_str(), WIDTH_COLUMN, HEIGHT_COLUMN] {
            // Arrow allows duplicate names, but every later lookup by name would be ambiguous.
            if fields.iter().any(|f| f.name() == name) {
                let e = DataflowError::schema(
                    name,
                    "no existing column (decode adds it)",
                    "a column of that name in the input",
                );
                // `width` and `height` are fixed names, not keys of the config.
                return Err(if name == self.config.output {
                    e.at("output")
                } else {
                    e
                });
            }
        }
        fields.push(Field::new(&self.config.output, DataType::Binary, false));
        fields.push(Field::new(WIDTH_COLUMN, DataType::UInt32, false));
        fields.push(Field::new(HEIGHT_COLUMN, DataType::UInt32, false));
        Ok(Arc::new(Schema::new_with_metadata(
            fields,
            input.metadata().clone(),
        )))
    }

    fn process_batch(&mut self, batch: &RecordBatch) -> DataflowResult<StageOutput> {
        let input_schema = batch.schema();
        let schema = self.output_schema(&input_schema)?;
        let column = batch
            .column_by_name(&self.config.input)
            .ok_or_else(|| DataflowError::schema(&self.config.input, "a binary column", "none"))?;
        let payloads = Payloads::new(column.as_ref()).ok_or_else(|| {
            DataflowError::schema(
                &self.config.input,
                "a binary column",
                column.data_type().to_string(),
            )
        })?;
        let decoded = self.decode_rows(batch, &payloads)?;
        decoded.into_output(batch, &self.kept_columns(&input_schema), schema)
    }
}

impl Decode {
    /// Decodes every row of `batch` into one pixel buffer; a row that does not decode becomes
    /// a dead letter, and a batch whose pixels would pass `max_batch_bytes` an error.
    fn decode_rows(
        &mut self,
        batch: &RecordBatch,
        payloads: &Payloads<'_>,
    ) -> DataflowResult<Decoded> {
        let rows = batch.num_rows();
        let mut decoded = Decoded::with_capacity(rows);
        let limits = Limits {
            max_pixels: self.config.max_pixels,
            max_batch_bytes: self.config.max_batch_bytes,
        };
        for row in 0..rows {
            let image = match payloads.get(row) {
                None => Err(Refused::Image("null image payload".to_string())),
                Some(bytes) => self.decode_into(bytes, limits, &mut decoded.values, rows - row),
            };
            match image {
                Ok((w, h)) => decoded.push(w, h)?,
                Err(Refused::Image(reason)) => {
                    decoded
                        .rejected
                        .push(DeadLetter::for_row(STAGE, batch, row, reason));
                    decoded.keep.push(false);
                }
                // The runtime splits the batch and decodes the halves apart.
                Err(Refused::BatchFull) => {
                    return Err(DataflowError::batch_too_large(
                        STAGE,
                        format!(
                        "decoded pixels of the batch's {rows} images exceed max_batch_bytes ({})",
                        self.config.max_batch_bytes
                    ),
                    ))
                }
            }
        }
        Ok(decoded)
    }
}

/// A batch's decoded images: the pixels column's values and offsets, each image's size, which
/// input rows decoded, and the dead letters of those that did not.
struct Decoded {
    values: Vec<u8>,
    offsets: Vec<i32>,
    widths: Vec<u32>,
    heights: Vec<u32>,
    keep: Vec<bool>,
    rejected: Vec<DeadLetter>,
}

impl Decoded {
    fn with_capacity(rows: usize) -> Decoded {
        let mut offsets = Vec::with_capacity(rows + 1);
        offsets.push(0);
        Decoded {
            values: Vec::new(),
            offsets,
            widths: Vec::with_capacity(rows),
            heights: Vec::with_capacity(rows),
            keep: Vec::with_capacity(rows),
            rejected: Vec::new(),
        }
    }

    /// Records the image just appended to `values`, `w` x `h`.
    fn push(&mut self, w: u32, h: u32) -> DataflowResult<()> {
        let end = i32::try_from(self.values.len()).map_err(|_| {
            DataflowError::stage(
                STAGE,
                "decoded pixels of one batch exceed the 2 GiB of a Binary column; \
                 use smaller batches",
            )
        })?;
        self.offsets.push(end);
        self.widths.push(w);
        self.heights.push(h);
        self.keep.push(true);
        Ok(())
    }

    /// The output: `batch`'s `kept` columns of the rows that decoded, then the pixels, widths
    /// and heights.
    fn into_output(
        self,
        batch: &RecordBatch,
        kept: &[usize],
        schema: SchemaRef,
    ) -> DataflowResult<StageOutput> {
        // Offsets start at 0 and only grow (checked as pushed), as `OffsetBuffer::new` requires.
        let offsets = OffsetBuffer::new(ScalarBuffer::from(self.offsets));
        let pixels = BinaryArray::try_new(offsets, Buffer::from_vec(self.values), None)?;

        let mut columns: Vec<ArrayRef> = if self.rejected.is_empty() {
            kept.iter().map(|&i| batch.column(i).clone()).collect()
        } else {
            let projected = batch.project(kept)?;
            let mask = BooleanArray::from(self.keep);
            arrow_select::filter::filter_record_batch(&projected, &mask)?
                .columns()
                .to_vec()
        };
        columns.push(Arc::new(pixels));
        columns.push(Arc::new(UInt32Array::from(self.widths)));
        columns.push(Arc::new(UInt32Array::from(self.heights)));
        let records = RecordBatch::try_new(schema, columns)?;
        Ok(StageOutput {
            records,
            rejected: self.rejected,
        })
    }
}

#[cfg(test)]
mod tests;
