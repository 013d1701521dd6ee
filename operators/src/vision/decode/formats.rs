//! The image formats `decode` reads, one function each: JPEG (zune-jpeg or libjpeg-turbo),
//! PNG and WebP, every one appending RGB8 pixels to the batch's buffer within its limits.

use zune_jpeg::zune_core::bytestream::ZCursor;
use zune_jpeg::zune_core::options::DecoderOptions;
use zune_jpeg::JpegDecoder;

use super::{Decode, JpegLibrary, Limits, Refused};

const PNG_MAGIC: &[u8] = b"\x89PNG\r\n\x1a\n";

impl Decode {
    /// Decodes one image (PNG and WebP by their magic bytes, else JPEG with the configured
    /// library), appending its RGB8 pixels to `out`; returns (width, height).
    pub(super) fn decode_into(
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
