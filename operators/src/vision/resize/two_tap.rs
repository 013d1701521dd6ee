//! `antialias: false`: two taps per axis at any scale, bit for bit what OpenCV's
//! `cv2.resize(img, size, interpolation=cv2.INTER_LINEAR)` gives for an 8-bit RGB image (and so
//! Ultralytics' letterbox and the Python peers' classify pre-processing).
//!
//! OpenCV's arithmetic, step by step (imgproc `resize.cpp`; held to cv2 5.0 by golden files in
//! `operators/tests/data/resize/` and, where the peers' venv exists, by cv2 itself):
//! - a same-size resize is a copy (an exact 2× shrink on both axes takes `INTER_AREA`'s 2×2
//!   mean, `(a + b + c + d + 2) >> 2`, which the steps below give too: weights 1024 each);
//! - otherwise output index `d` samples the source at `f = (float)((d + 0.5) * scale - 0.5)`,
//!   `scale = 1 / (dst / src)` in f64; `s = floor(f)`, the fraction `f - s` in f32, and the
//!   weights `1 - frac` and `frac` become 11-bit fixed point (`round_half_even(w * 2048)`);
//! - columns: an index left of the image, or on or after its last column, takes that edge
//!   column with weights (2048, 0); rows: the two row indices are clamped to the image but the
//!   weights are kept (OpenCV does not reset them), which changes the rounding below;
//! - horizontal pass into i32: `S[s] * a0 + S[s + 1] * a1`;
//! - vertical pass as OpenCV's vector kernel (`VResizeLinearVec_32s8u`) computes it, for every
//!   element: `(mulhi(S0 >> 4, b0) + mulhi(S1 >> 4, b1) + 2) >> 2` with
//!   `mulhi(a, b) = (a * b) >> 16`. The exact `(S0 * b0 + S1 * b1 + 2^21) >> 22` (OpenCV's
//!   scalar code) is one lower or higher in some pixels; cv2 matches the vector form even in a
//!   row's last few elements.

/// OpenCV's `INTER_RESIZE_COEF_SCALE`: weights in 1/2048.
const COEF_SCALE: f32 = 2048.0;

/// One output index's two source indices (already clamped) and weights (in 1/2048).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Tap {
    at: [usize; 2],
    weights: [i32; 2],
}

/// The taps of `dst` outputs over `src` inputs (`src`, `dst` > 0). `columns`: OpenCV's
/// `xofs`/`ialpha` (an out-of-image position takes the edge with weights (2048, 0)); otherwise
/// its `yofs`/`ibeta` and row clip (indices clamped, weights kept).
fn taps(src: usize, dst: usize, columns: bool) -> Vec<Tap> {
    let scale = 1.0 / (dst as f64 / src as f64);
    let last = src.saturating_sub(1) as i64;
    (0..dst)
        .map(|d| {
            let f = ((d as f64 + 0.5) * scale - 0.5) as f32;
            let floor = f.floor();
            let mut frac = f - floor;
            let mut s = floor as i64;
            if columns && (s < 0 || s >= last) {
                frac = 0.0;
                s = s.clamp(0, last);
            }
            let fixed = |w: f32| (w * COEF_SCALE).round_ties_even() as i32;
            Tap {
                at: [s.clamp(0, last) as usize, (s + 1).clamp(0, last) as usize],
                weights: [fixed(1.0 - frac), fixed(frac)],
            }
        })
        .collect()
}

/// The taps of one (source, target) size pair.
struct Plan {
    sizes: [usize; 4],
    columns: Vec<Tap>,
    rows: Vec<Tap>,
}

/// OpenCV's `INTER_LINEAR` on RGB8 images, with its tables and row buffers kept between calls so
/// that images of one size allocate nothing once warm.
#[derive(Default)]
pub(super) struct TwoTap {
    plan: Option<Plan>,
    rows: Rows,
}

/// The horizontal pass of two source rows (`dst_w * 3` values each) and which rows they are.
#[derive(Default)]
struct Rows {
    values: [Vec<i32>; 2],
    held: [Option<usize>; 2],
}

/// What the vertical pass gives for horizontal sums `s0`, `s1` and weights `b0`, `b1`: OpenCV's
/// vector arithmetic (see the module docs). Sums are at most 255·2048, so `>> 4` fits an i16
/// and no step saturates.
fn vertical(s0: i32, s1: i32, b0: i32, b1: i32) -> u8 {
    let mulhi = |s: i32, b: i32| ((s >> 4) * b) >> 16;
    ((mulhi(s0, b0) + mulhi(s1, b1) + 2) >> 2).clamp(0, 255) as u8
}

impl TwoTap {
    /// Resizes `src` (`sw * sh * 3` bytes) into `dst` (`dw * dh * 3` bytes). Sizes must be
    /// non-zero and the buffers that long: the caller checks (see
    /// [`check_row`](super::check_row)); a mismatch is an error, not a panic.
    pub(super) fn resize(
        &mut self,
        src: &[u8],
        (sw, sh): (usize, usize),
        dst: &mut [u8],
        (dw, dh): (usize, usize),
    ) -> Result<(), String> {
        if sw == 0 || sh == 0 || dw == 0 || dh == 0 {
            return Err(format!("cannot resize {sw}x{sh} to {dw}x{dh}"));
        }
        if src.len() != sw * sh * 3 || dst.len() != dw * dh * 3 {
            return Err(format!(
                "buffers of {} and {} bytes for {sw}x{sh} → {dw}x{dh} RGB8",
                src.len(),
                dst.len()
            ));
        }
        if (sw, sh) == (dw, dh) {
            dst.copy_from_slice(src);
            return Ok(());
        }
        let sizes = [sw, sh, dw, dh];
        if self.plan.as_ref().is_none_or(|p| p.sizes != sizes) {
            self.plan = Some(Plan {
                sizes,
                columns: taps(sw, dw, true),
                rows: taps(sh, dh, false),
            });
            self.rows.held = [None, None];
        }
        let Some(plan) = &self.plan else {
            return Err("no resize plan".to_string());
        };
        let width = dw * 3;
        for buffer in &mut self.rows.values {
            buffer.resize(width, 0);
        }
        for (row, out) in plan.rows.iter().zip(dst.chunks_exact_mut(width)) {
            let [y0, y1] = row.at;
            let first = self.rows.hold(y0, None, src, sw, &plan.columns)?;
            let second = self.rows.hold(y1, Some(first), src, sw, &plan.columns)?;
            let [r0, r1] = &self.rows.values;
            let pick = |slot: usize| if slot == 0 { r0 } else { r1 };
            let [b0, b1] = row.weights;
            for ((o, &a), &b) in out.iter_mut().zip(pick(first)).zip(pick(second)) {
                *o = vertical(a, b, b0, b1);
            }
        }
        Ok(())
    }
}

impl Rows {
    /// The slot holding source row `y`'s horizontal pass, computing it into a slot other than
    /// `keep` (the slot the other tap reads) if no slot holds it. Rows only move down, so two
    /// slots compute each source row once.
    fn hold(
        &mut self,
        y: usize,
        keep: Option<usize>,
        src: &[u8],
        sw: usize,
        columns: &[Tap],
    ) -> Result<usize, String> {
        if let Some(slot) = self.held.iter().position(|&h| h == Some(y)) {
            return Ok(slot);
        }
        let slot = match keep {
            Some(0) => 1,
            Some(_) => 0,
            // The slot not holding the higher row, which the next output row may still need.
            None => match self.held {
                [Some(a), Some(b)] if a > b => 1,
                [Some(_), Some(_)] => 0,
                [None, _] => 0,
                [Some(_), None] => 1,
            },
        };
        let line = src
            .get(y * sw * 3..(y + 1) * sw * 3)
            .ok_or_else(|| format!("source row {y} outside the image"))?;
        let buffer = self
            .values
            .get_mut(slot)
            .ok_or_else(|| "no row buffer".to_string())?;
        horizontal(line, columns, buffer);
        if let Some(h) = self.held.get_mut(slot) {
            *h = Some(y);
        }
        Ok(slot)
    }
}

/// OpenCV's horizontal pass of one RGB8 source row: per output element, the two taps' weighted
/// sum in 1/2048.
fn horizontal(line: &[u8], columns: &[Tap], out: &mut [i32]) {
    for (tap, px) in columns.iter().zip(out.chunks_exact_mut(3)) {
        let [a0, a1] = tap.weights;
        let [x0, x1] = tap.at;
        for (c, v) in px.iter_mut().enumerate() {
            let at = |x: usize| i32::from(line.get(x * 3 + c).copied().unwrap_or(0));
            *v = at(x0) * a0 + at(x1) * a1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// cv2's outputs for the cases of `make_golden.py` (one line per case, see there).
    const GOLDEN: &str = include_str!("../../../tests/data/resize/cv2_inter_linear.txt");

    /// `make_golden.py`'s `synthetic`: gradients, every fifth byte noise from a 32-bit LCG.
    fn synthetic(w: usize, h: usize, seed: u32) -> Vec<u8> {
        let mut state = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
        let mut px = Vec::with_capacity(w * h * 3);
        for y in 0..h {
            for x in 0..w {
                for c in 0..3 {
                    state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    let smooth = (x * 7 + y * 3 + c * 50) % 256;
                    let noisy = (x + y + c) % 5 == 0;
                    px.push(if noisy {
                        (state >> 24) as u8
                    } else {
                        smooth as u8
                    });
                }
            }
        }
        px
    }

    fn fnv1a64(data: &[u8]) -> u64 {
        data.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        })
    }

    /// `(sw, sh, dw, dh, seed, fnv1a64, bytes if small)` of one golden line.
    type Case = (usize, usize, usize, usize, u32, u64, Option<Vec<u8>>);

    fn parse(line: &str) -> Case {
        let f: Vec<&str> = line.split_whitespace().collect();
        let n = |i: usize| f[i].parse::<usize>().unwrap();
        let bytes = f.get(6).map(|hex| {
            (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                .collect()
        });
        let hash = u64::from_str_radix(f[5], 16).unwrap();
        (n(0), n(1), n(2), n(3), n(4) as u32, hash, bytes)
    }

    fn ours(sw: usize, sh: usize, dw: usize, dh: usize, seed: u32) -> Vec<u8> {
        let mut out = vec![0u8; dw * dh * 3];
        TwoTap::default()
            .resize(&synthetic(sw, sh, seed), (sw, sh), &mut out, (dw, dh))
            .unwrap();
        out
    }

    /// Where two outputs first differ, as `(x, y, channel): ours vs cv2`.
    fn first_difference(ours: &[u8], cv2: &[u8], dw: usize) -> String {
        match ours.iter().zip(cv2).position(|(a, b)| a != b) {
            Some(i) => format!(
                "first at (x {}, y {}, channel {}): {} vs cv2 {}",
                i / 3 % dw,
                i / 3 / dw,
                i % 3,
                ours[i],
                cv2[i]
            ),
            None => format!("{} vs {} bytes", ours.len(), cv2.len()),
        }
    }

    #[test]
    fn matches_cv2_inter_linear_byte_for_byte_on_the_golden_cases() {
        let cases: Vec<Case> = GOLDEN
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .map(parse)
            .collect();
        assert!(cases.len() >= 20, "{} golden cases", cases.len());
        let mut wrong = Vec::new();
        for (sw, sh, dw, dh, seed, hash, bytes) in cases {
            let out = ours(sw, sh, dw, dh, seed);
            let what = format!("{sw}x{sh} → {dw}x{dh} (seed {seed})");
            if let Some(cv2) = bytes {
                if out != cv2 {
                    wrong.push(format!("{what}: {}", first_difference(&out, &cv2, dw)));
                }
            } else if fnv1a64(&out) != hash {
                wrong.push(format!("{what}: output hash differs from cv2's"));
            }
        }
        assert!(wrong.is_empty(), "differs from cv2:\n{}", wrong.join("\n"));
    }

    /// The golden cases plus random sizes, each compared with cv2 run now.
    #[test]
    #[ignore = "needs cv2: a Python with OpenCV in RIFFLE_CV2_PYTHON (scripts/test.sh sets it to \
                scripts/setup.sh's YOLO venv and runs this)"]
    fn matches_cv2_inter_linear_run_now_on_random_sizes() {
        // No default: run without OpenCV's Python, this test fails rather than pass unchecked.
        let python = std::env::var("RIFFLE_CV2_PYTHON").expect(
            "RIFFLE_CV2_PYTHON: a Python with opencv-python-headless (scripts/test.sh sets it)",
        );
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/resize/make_golden.py"
        );
        let mut state = 12_345u32;
        let mut next = |max: u32| {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (state >> 8) % max + 1
        };
        let mut wrong = Vec::new();
        for seed in 100..140u32 {
            let (sw, sh) = (next(300) as usize, next(200) as usize);
            let (dw, dh) = (next(300) as usize, next(200) as usize);
            let args = [sw, sh, dw, dh, seed as usize].map(|v| v.to_string());
            let run = std::process::Command::new(&python)
                .arg(script)
                .arg("--check")
                .args(&args)
                .output()
                .unwrap_or_else(|e| panic!("cannot run {python}: {e}"));
            assert!(
                run.status.success(),
                "{}",
                String::from_utf8_lossy(&run.stderr)
            );
            let (.., hash, bytes) = parse(String::from_utf8_lossy(&run.stdout).trim());
            let out = ours(sw, sh, dw, dh, seed);
            let what = format!("{sw}x{sh} → {dw}x{dh} (seed {seed})");
            match bytes {
                Some(cv2) if out != cv2 => {
                    wrong.push(format!("{what}: {}", first_difference(&out, &cv2, dw)))
                }
                None if fnv1a64(&out) != hash => wrong.push(format!("{what}: hash differs")),
                _ => {}
            }
        }
        assert!(wrong.is_empty(), "differs from cv2:\n{}", wrong.join("\n"));
    }

    #[test]
    fn taps_clamp_columns_and_keep_row_weights() {
        // 2× up: position -0.25 at the left edge. Columns: edge pixel, weights (2048, 0).
        let columns = taps(4, 8, true);
        assert_eq!(
            columns[0],
            Tap {
                at: [0, 1],
                weights: [2048, 0]
            }
        );
        assert_eq!(
            columns[1],
            Tap {
                at: [0, 1],
                weights: [1536, 512]
            }
        );
        // Last output: position 3.25, on the last column: edge pixel again.
        assert_eq!(
            columns[7],
            Tap {
                at: [3, 3],
                weights: [2048, 0]
            }
        );
        // Rows: the indices clamp (-1 → 0) but the weights of frac 0.75 stay.
        let rows = taps(4, 8, false);
        assert_eq!(
            rows[0],
            Tap {
                at: [0, 0],
                weights: [512, 1536]
            }
        );
        assert_eq!(
            rows[7],
            Tap {
                at: [3, 3],
                weights: [1536, 512]
            }
        );
    }

    #[test]
    fn vertical_rounds_as_the_vector_kernel_not_exactly() {
        // Row 0 of a 2× upscale reads row 0 twice with weights (512, 1536). For a horizontal
        // sum of 3200 (1.5625 in pixel units) the exact form gives round(1.5625) = 2; the
        // vector form truncates on the way: (200·512 >> 16) + (200·1536 >> 16) = 1 + 4, and
        // (5 + 2) >> 2 = 1.
        assert_eq!((3200 * 512 + 3200 * 1536 + (1 << 21)) >> 22, 2);
        assert_eq!(vertical(3200, 3200, 512, 1536), 1);
        assert_eq!(vertical(255 * 2048, 255 * 2048, 512, 1536), 255);
    }
}
