//! From resized RGB8 pixels to tensor values: the per-channel lookup table a normalisation
//! makes, and the batch's values in the configured dtype and layout.

use super::{Layout, TensorDtype};

/// Per channel (R, G, B), the tensor value of each u8 pixel value.
pub(crate) type Lut = [[f32; 256]; 3];

/// How u8 pixel values become tensor values.
#[derive(Clone, Copy, Debug)]
pub(super) enum Normalise {
    /// `(p / 255 - mean) / std`.
    MeanStd { mean: [f32; 3], std: [f32; 3] },
    /// `(p - offset) * scale`.
    ScaleOffset { scale: [f32; 3], offset: [f32; 3] },
}

/// The tensor value of every channel and u8 value `p`.
pub(super) fn normalisation_lut(normalise: Normalise) -> Lut {
    let mut lut = [[0.0f32; 256]; 3];
    for (c, table) in lut.iter_mut().enumerate() {
        for (p, v) in table.iter_mut().enumerate() {
            let p = p as f32;
            *v = match normalise {
                Normalise::MeanStd { mean, std } => {
                    (p / 255.0 - mean.get(c).copied().unwrap_or(0.0))
                        / std.get(c).copied().unwrap_or(1.0)
                }
                Normalise::ScaleOffset { scale, offset } => {
                    (p - offset.get(c).copied().unwrap_or(0.0))
                        * scale.get(c).copied().unwrap_or(1.0)
                }
            };
        }
    }
    lut
}

/// The tensor values of one batch, in the configured dtype.
pub(crate) enum Values {
    F32(Vec<f32>),
    U8(Vec<u8>),
}

impl Values {
    pub(crate) fn with_capacity(dtype: TensorDtype, n: usize) -> Self {
        match dtype {
            TensorDtype::F32 => Values::F32(Vec::with_capacity(n)),
            TensorDtype::U8 => Values::U8(Vec::with_capacity(n)),
        }
    }

    /// Appends one resized RGB8 image in `layout`.
    #[allow(
        clippy::indexing_slicing,
        reason = "a `Lut` table has 256 entries, indexed by u8 pixel values"
    )]
    pub(crate) fn push(&mut self, rgb: &[u8], layout: Layout, lut: &Lut) {
        match (self, layout) {
            (Values::F32(v), Layout::Nchw) => {
                for (c, table) in lut.iter().enumerate() {
                    v.extend(rgb.iter().skip(c).step_by(3).map(|&p| table[p as usize]));
                }
            }
            (Values::F32(v), Layout::Nhwc) => {
                let (pixels, _) = rgb.as_chunks::<3>();
                for px in pixels {
                    v.push(lut[0][px[0] as usize]);
                    v.push(lut[1][px[1] as usize]);
                    v.push(lut[2][px[2] as usize]);
                }
            }
            (Values::U8(v), Layout::Nchw) => {
                for c in 0..3 {
                    v.extend(rgb.iter().skip(c).step_by(3));
                }
            }
            (Values::U8(v), Layout::Nhwc) => v.extend_from_slice(rgb),
        }
    }
}
