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
use zune_jpeg::zune_core::bytestream::ZCursor;
use zune_jpeg::zune_core::colorspace::ColorSpace;
use zune_jpeg::zune_core::options::DecoderOptions;
use zune_jpeg::JpegDecoder;

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

const PNG_MAGIC: &[u8] = b"\x89PNG\r\n\x1a\n";

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

impl Decode {
    /// Decodes one image (PNG and WebP by their magic bytes, else JPEG with the configured
    /// library), appending its RGB8 pixels to `out`; returns (width, height).
    fn decode_into(
        &mut self,
        bytes: &[u8],
        limits: Limits,
        out: &mut Vec<u8>,
        rows_left: usize,
    ) -> Result<(u32, u32), Refused> {
        if bytes.is_empty() {
            return Err(Refused::Image("empty image payload".to_string()));
        }
        if bytes.starts_with(PNG_MAGIC) {
            return decode_png_into(bytes, limits, out, rows_left);
        }
        if bytes.get(..4) == Some(b"RIFF") && bytes.get(8..12) == Some(b"WEBP") {
            return decode_webp_into(bytes, limits, out, rows_left);
        }
        match self.config.jpeg {
            JpegLibrary::LibjpegTurbo => {
                decode_turbo_into(bytes, &mut self.turbo, limits, out, rows_left)
            }
            JpegLibrary::Zune => decode_jpeg_into(bytes, self.options, limits, out, rows_left),
        }
    }
}

/// Decodes one JPEG with zune-jpeg, appending its RGB8 pixels to `out`; returns (width, height).
///
/// On error `out` is left as it was. `rows_left` sizes the first reservation: frames of one
/// stream usually share a size, so one allocation then holds the whole batch.
fn decode_jpeg_into(
    bytes: &[u8],
    options: DecoderOptions,
    limits: Limits,
    out: &mut Vec<u8>,
    rows_left: usize,
) -> Result<(u32, u32), Refused> {
    let invalid = |e: zune_jpeg::errors::DecodeErrors| {
        // zune-jpeg's messages for static errors are Debug-quoted.
        format!("invalid JPEG: {}", e.to_string().trim_matches('"'))
    };
    let mut decoder = JpegDecoder::new_with_options(ZCursor::new(bytes), options);
    decoder.decode_headers().map_err(invalid)?;
    let (width, height) = decoder
        .dimensions()
        .ok_or_else(|| "invalid JPEG: no image dimensions".to_string())?;
    check_pixels(width as u64, height as u64, limits)?;
    let size = decoder
        .output_buffer_size()
        .ok_or_else(|| format!("invalid JPEG: image size {width}x{height} overflows"))?;
    if width == 0 || height == 0 || size != width * height * 3 {
        return Err(format!("invalid JPEG: cannot decode {width}x{height} image to RGB").into());
    }
    let (w, h) = match (u32::try_from(width), u32::try_from(height)) {
        (Ok(w), Ok(h)) => (w, h),
        _ => return Err(format!("invalid JPEG: image size {width}x{height} too large").into()),
    };

    let (start, size) = make_room(out, (w, h), limits, rows_left, "JPEG")?;
    out.resize(start + size, 0);
    // `out` was just resized to `start + size`: the slice is never missing.
    let image = out.get_mut(start..).unwrap_or_default();
    if let Err(e) = decoder.decode_into(image) {
        out.truncate(start);
        return Err(invalid(e).into());
    }
    Ok((w, h))
}

/// [`decode_jpeg_into`] with libjpeg-turbo (`jpeg: libjpeg-turbo`); `turbo` is its
/// decompressor, made here the first time.
fn decode_turbo_into(
    bytes: &[u8],
    turbo: &mut Option<turbojpeg::Decompressor>,
    limits: Limits,
    out: &mut Vec<u8>,
    rows_left: usize,
) -> Result<(u32, u32), Refused> {
    let invalid = |e: turbojpeg::Error| format!("invalid JPEG: {e}");
    let decompressor = match turbo {
        Some(d) => d,
        None => turbo.insert(
            turbojpeg::Decompressor::new()
                .map_err(|e| format!("libjpeg-turbo cannot start: {e}"))?,
        ),
    };
    let header = decompressor.read_header(bytes).map_err(invalid)?;
    check_pixels(header.width as u64, header.height as u64, limits)?;
    let (w, h) = match (u32::try_from(header.width), u32::try_from(header.height)) {
        (Ok(w), Ok(h)) if w > 0 && h > 0 => (w, h),
        _ => {
            return Err(format!(
                "invalid JPEG: image size {}x{}",
                header.width, header.height
            )
            .into())
        }
    };
    let (start, size) = make_room(out, (w, h), limits, rows_left, "JPEG")?;
    out.resize(start + size, 0);
    // `out` was just resized to `start + size`: the slice is never missing.
    let pixels = out.get_mut(start..).unwrap_or_default();
    let image = turbojpeg::Image {
        pixels,
        width: header.width,
        pitch: header.width * 3,
        height: header.height,
        format: turbojpeg::PixelFormat::RGB,
    };
    // A warning (a truncated or corrupt stream) is an error too, as zune-jpeg's strict mode.
    if let Err(e) = decompressor.decompress(bytes, image) {
        out.truncate(start);
        return Err(invalid(e).into());
    }
    Ok((w, h))
}

/// Refuses an image whose header claims more than `max_pixels`.
fn check_pixels(width: u64, height: u64, limits: Limits) -> Result<(), Refused> {
    let pixels = width.saturating_mul(height);
    if pixels > limits.max_pixels {
        return Err(format!(
            "image of {width}x{height} ({pixels} pixels) exceeds max_pixels ({})",
            limits.max_pixels
        )
        .into());
    }
    Ok(())
}

/// Makes room in `out` for one `width` x `height` RGB8 image: (where it starts, its bytes), or
/// `BatchFull` when it would take the batch past `max_batch_bytes`. The first image of a batch
/// reserves for `rows_left` like it.
fn make_room(
    out: &mut Vec<u8>,
    (width, height): (u32, u32),
    limits: Limits,
    rows_left: usize,
    format: &str,
) -> Result<(usize, usize), Refused> {
    let size = (width as usize)
        .checked_mul(height as usize)
        .and_then(|p| p.checked_mul(3))
        .ok_or_else(|| format!("invalid {format}: image size {width}x{height} overflows"))?;
    let start = out.len();
    if start > 0 && (start + size) as u64 > limits.max_batch_bytes {
        return Err(Refused::BatchFull);
    }
    if start == 0 {
        // Capped: the rest of the batch need not be the size of its first image.
        let budget = usize::try_from(limits.max_batch_bytes).unwrap_or(usize::MAX);
        out.reserve(size.saturating_mul(rows_left).min(budget));
    }
    Ok((start, size))
}

/// Decodes one WebP (lossy or lossless; alpha dropped; an animation's first frame), appending
/// its RGB8 pixels to `out`; returns (width, height). On error `out` is left as it was.
fn decode_webp_into(
    bytes: &[u8],
    limits: Limits,
    out: &mut Vec<u8>,
    rows_left: usize,
) -> Result<(u32, u32), Refused> {
    let invalid = |e: image_webp::DecodingError| format!("invalid WebP: {e}");
    let mut decoder = image_webp::WebPDecoder::new(std::io::Cursor::new(bytes)).map_err(invalid)?;
    let (width, height) = decoder.dimensions();
    check_pixels(u64::from(width), u64::from(height), limits)?;
    let channels = if decoder.has_alpha() { 4 } else { 3 };
    let buffer = decoder
        .output_buffer_size()
        .ok_or_else(|| format!("invalid WebP: image size {width}x{height} overflows"))?;
    let mut decoded = vec![0u8; buffer];
    decoder.read_image(&mut decoded).map_err(invalid)?;
    let (start, size) = make_room(out, (width, height), limits, rows_left, "WebP")?;
    if channels == 3 {
        out.extend_from_slice(decoded.get(..size).unwrap_or_default());
    } else {
        for px in decoded.chunks_exact(4) {
            out.extend_from_slice(px.get(..3).unwrap_or_default());
        }
    }
    if out.len() != start + size {
        out.truncate(start);
        return Err(format!("invalid WebP: {width}x{height} image decoded short").into());
    }
    Ok((width, height))
}

/// Decodes one PNG (any bit depth and colour type; alpha dropped, 16 bits cut to 8), appending
/// its RGB8 pixels to `out`; returns (width, height). On error `out` is left as it was.
fn decode_png_into(
    bytes: &[u8],
    limits: Limits,
    out: &mut Vec<u8>,
    rows_left: usize,
) -> Result<(u32, u32), Refused> {
    let invalid = |e: png::DecodingError| format!("invalid PNG: {e}");
    let mut decoder = png::Decoder::new(std::io::Cursor::new(bytes));
    decoder.set_transformations(png::Transformations::normalize_to_color8());
    // The header's size is checked before any pixel buffer exists.
    let mut reader = decoder.read_info().map_err(invalid)?;
    let (width, height) = {
        let info = reader.info();
        (info.width, info.height)
    };
    check_pixels(u64::from(width), u64::from(height), limits)?;
    let mut decoded = vec![0u8; reader.output_buffer_size()];
    let frame = reader.next_frame(&mut decoded).map_err(invalid)?;
    let channels = match frame.color_type {
        png::ColorType::Grayscale => 1,
        png::ColorType::GrayscaleAlpha => 2,
        png::ColorType::Rgb => 3,
        png::ColorType::Rgba => 4,
        png::ColorType::Indexed => {
            return Err("invalid PNG: palette left unexpanded".to_string().into())
        }
    };
    let (start, size) = make_room(out, (width, height), limits, rows_left, "PNG")?;
    let line = frame.line_size;
    let rows = decoded.get(..line * height as usize).unwrap_or_default();
    for row in rows.chunks_exact(line.max(1)) {
        for px in row.chunks_exact(channels).take(width as usize) {
            match px {
                [g] | [g, _] => out.extend_from_slice(&[*g, *g, *g]),
                [r, g, b] | [r, g, b, _] => out.extend_from_slice(&[*r, *g, *b]),
                _ => {}
            }
        }
    }
    if out.len() != start + size {
        out.truncate(start);
        return Err(format!("invalid PNG: {width}x{height} image decoded short").into());
    }
    Ok((width, height))
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

        let rows = batch.num_rows();
        let mut values: Vec<u8> = Vec::new();
        let mut offsets: Vec<i32> = Vec::with_capacity(rows + 1);
        offsets.push(0);
        let mut widths: Vec<u32> = Vec::with_capacity(rows);
        let mut heights: Vec<u32> = Vec::with_capacity(rows);
        let mut keep: Vec<bool> = Vec::with_capacity(rows);
        let mut rejected = Vec::new();

        let limits = Limits {
            max_pixels: self.config.max_pixels,
            max_batch_bytes: self.config.max_batch_bytes,
        };
        for row in 0..rows {
            let decoded = match payloads.get(row) {
                None => Err(Refused::Image("null image payload".to_string())),
                Some(bytes) => self.decode_into(bytes, limits, &mut values, rows - row),
            };
            match decoded {
                Ok((w, h)) => {
                    let end = i32::try_from(values.len()).map_err(|_| {
                        DataflowError::stage(
                            STAGE,
                            "decoded pixels of one batch exceed the 2 GiB of a Binary column; \
                             use smaller batches",
                        )
                    })?;
                    offsets.push(end);
                    widths.push(w);
                    heights.push(h);
                    keep.push(true);
                }
                Err(Refused::Image(reason)) => {
                    rejected.push(DeadLetter::for_row(STAGE, batch, row, reason));
                    keep.push(false);
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

        // Offsets start at 0 and only grow (checked above), as `OffsetBuffer::new` requires.
        let offsets = OffsetBuffer::new(ScalarBuffer::from(offsets));
        let pixels = BinaryArray::try_new(offsets, Buffer::from_vec(values), None)?;

        let kept = self.kept_columns(&input_schema);
        let mut columns: Vec<ArrayRef> = if rejected.is_empty() {
            kept.iter().map(|&i| batch.column(i).clone()).collect()
        } else {
            let projected = batch.project(&kept)?;
            let mask = BooleanArray::from(keep);
            arrow_select::filter::filter_record_batch(&projected, &mask)?
                .columns()
                .to_vec()
        };
        columns.push(Arc::new(pixels));
        columns.push(Arc::new(UInt32Array::from(widths)));
        columns.push(Arc::new(UInt32Array::from(heights)));
        let records = RecordBatch::try_new(schema, columns)?;
        Ok(StageOutput { records, rejected })
    }
}

#[cfg(test)]
mod tests;
