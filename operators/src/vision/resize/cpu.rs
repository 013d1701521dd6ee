//! The CPU engine: fast_image_resize's SIMD bilinear convolution (`antialias: true`) or
//! OpenCV's two-tap `INTER_LINEAR` ([`TwoTap`], `antialias: false`) into one reused destination
//! image, and letterboxing (scale to fit, centre, pad).

use fast_image_resize::images::{Image, ImageRef};
use fast_image_resize::{PixelType, ResizeOptions, Resizer};

use super::two_tap::TwoTap;

/// fast_image_resize (or OpenCV's two taps) with one destination image reused for every row.
pub(super) struct CpuResizer {
    pub(super) resizer: Resizer,
    pub(super) options: ResizeOptions,
    /// `Some` for `antialias: false`: resized as OpenCV does, not by `resizer`.
    pub(super) two_tap: Option<TwoTap>,
    /// Destination of every row's resize, reused so rows allocate nothing.
    pub(super) dst: Image<'static>,
    /// A letterboxed row's scaled image before it is placed in `dst`; reallocated only
    /// when the source size changes.
    pub(super) inner: Image<'static>,
}

impl CpuResizer {
    /// Resizes one checked row (see [`check_row`](super::check_row)) into `self.dst`.
    pub(super) fn resize(&mut self, pixels: &[u8], width: u32, height: u32) -> Result<(), String> {
        scale_into(
            &mut self.resizer,
            &self.options,
            self.two_tap.as_mut(),
            (pixels, width, height),
            &mut self.dst,
        )
    }

    /// Letterboxes one checked row into `self.dst` (filled with `pad` around the scaled
    /// image), returning its `[gain, pad_x, pad_y]`.
    pub(super) fn letterbox(
        &mut self,
        pixels: &[u8],
        width: u32,
        height: u32,
        pad: u8,
    ) -> Result<[f32; 3], String> {
        let fit = letterbox_fit((width, height), (self.dst.width(), self.dst.height()));
        let (inner_w, inner_h) = fit.inner;
        // Scaled unless the image already has the inner size (then copied as is, like
        // Ultralytics' LetterBox).
        let scaled: &[u8] = if (inner_w, inner_h) == (width, height) {
            pixels
        } else {
            if self.inner.width() != inner_w || self.inner.height() != inner_h {
                self.inner = Image::new(inner_w, inner_h, PixelType::U8x3);
            }
            scale_into(
                &mut self.resizer,
                &self.options,
                self.two_tap.as_mut(),
                (pixels, width, height),
                &mut self.inner,
            )?;
            self.inner.buffer()
        };
        let dst_w = self.dst.width() as usize;
        let canvas = self.dst.buffer_mut();
        canvas.fill(pad);
        let row_bytes = inner_w as usize * 3;
        for (y, line) in scaled.chunks_exact(row_bytes).enumerate() {
            let start = ((y + fit.top as usize) * dst_w + fit.left as usize) * 3;
            let target = canvas
                .get_mut(start..start + row_bytes)
                .ok_or_else(|| "letterbox row outside the canvas".to_string())?;
            target.copy_from_slice(line);
        }
        Ok([fit.gain, fit.left as f32, fit.top as f32])
    }
}

/// Resizes one checked RGB8 image into `dst` with OpenCV's two taps when `two_tap` is given,
/// fast_image_resize otherwise.
fn scale_into(
    resizer: &mut Resizer,
    options: &ResizeOptions,
    two_tap: Option<&mut TwoTap>,
    (pixels, width, height): (&[u8], u32, u32),
    dst: &mut Image<'static>,
) -> Result<(), String> {
    if let Some(two_tap) = two_tap {
        let size = (dst.width() as usize, dst.height() as usize);
        return two_tap.resize(
            pixels,
            (width as usize, height as usize),
            dst.buffer_mut(),
            size,
        );
    }
    let src = ImageRef::new(width, height, pixels, PixelType::U8x3)
        .map_err(|e| format!("bad source image: {e}"))?;
    resizer
        .resize(&src, dst, options)
        .map_err(|e| format!("resize failed: {e}"))
}

/// Where a letterboxed image lands in the target.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LetterboxFit {
    /// Scale factor, the same on both axes.
    pub gain: f32,
    /// Size of the scaled image inside the target.
    pub inner: (u32, u32),
    /// Padding left of and above it.
    pub left: u32,
    pub top: u32,
}

/// The letterbox of a `source` image in a `target` of (width, height): scaled by
/// `min(target / source)` with sides rounded to whole pixels, centred, the odd pixel of
/// padding going right and below (as Ultralytics' `LetterBox(center=True)`).
pub fn letterbox_fit(source: (u32, u32), target: (u32, u32)) -> LetterboxFit {
    let (sw, sh) = (f64::from(source.0.max(1)), f64::from(source.1.max(1)));
    let (tw, th) = (f64::from(target.0), f64::from(target.1));
    let gain = (tw / sw).min(th / sh);
    let side = |s: f64, t: u32| ((s * gain).round() as u32).clamp(1, t.max(1));
    let inner = (side(sw, target.0), side(sh, target.1));
    LetterboxFit {
        gain: gain as f32,
        inner,
        left: (target.0 - inner.0) / 2,
        top: (target.1 - inner.1) / 2,
    }
}
