//! Thumbnails of raw video frames for the page.

use jpeg_encoder::{ColorType, Encoder};

/// Widest thumbnail sent to the page; wider frames are shrunk by a whole factor.
const MAX_WIDTH: u32 = 960;
const QUALITY: u8 = 80;

/// `pixels` (packed RGB, `width` × `height`) as a JPEG, shrunk to at most 960 pixels wide.
/// `None` when the sizes do not match the pixels or the encoder refuses them.
pub fn rgb_to_jpeg(width: u32, height: u32, pixels: &[u8]) -> Option<Vec<u8>> {
    let (w, h) = (width as usize, height as usize);
    if w == 0 || h == 0 || pixels.len() != w.checked_mul(h)?.checked_mul(3)? {
        return None;
    }
    let step = width.div_ceil(MAX_WIDTH).max(1) as usize;
    let (tw, th) = (w.div_ceil(step), h.div_ceil(step));
    let shrunk;
    let data = if step == 1 {
        pixels
    } else {
        // Nearest pixel: a preview, not a measurement.
        let mut out = Vec::with_capacity(tw * th * 3);
        for row in pixels.chunks_exact(w * 3).step_by(step) {
            for px in row.chunks_exact(3).step_by(step) {
                out.extend_from_slice(px);
            }
        }
        shrunk = out;
        &shrunk
    };
    let mut jpeg = Vec::new();
    Encoder::new(&mut jpeg, QUALITY)
        .encode(
            data,
            u16::try_from(tw).ok()?,
            u16::try_from(th).ok()?,
            ColorType::Rgb,
        )
        .ok()?;
    Some(jpeg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_and_shrinks_wide_frames() {
        let (w, h) = (1920u32, 1080u32);
        let pixels = vec![128u8; (w * h * 3) as usize];
        let jpeg = rgb_to_jpeg(w, h, &pixels).unwrap();
        assert_eq!(&jpeg[..2], &[0xFF, 0xD8], "a JPEG starts with SOI");
        // SOF0 holds height then width: 540 × 960 after halving.
        let sof = jpeg.windows(2).position(|m| m == [0xFF, 0xC0]).unwrap();
        let size = |at: usize| u16::from_be_bytes([jpeg[at], jpeg[at + 1]]);
        assert_eq!((size(sof + 7), size(sof + 5)), (960, 540));
        assert!(rgb_to_jpeg(4, 4, &pixels[..10]).is_none());
    }
}
