//! The constant-velocity Kalman filter of SORT/ByteTrack over a box's `(cx, cy, aspect, h)`
//! and their velocities, one frame per step. Noise scales with the box height, so near and
//! far objects are equally (un)certain relative to their size.
//!
//! Fixed 8×8 arithmetic on arrays: the state serializes as plain JSON numbers, and the only
//! solve is a 4×4 Cholesky.

/// `[cx, cy, aspect, h, vcx, vcy, vaspect, vh]`.
pub type Mean = [f64; 8];
pub type Covariance = [[f64; 8]; 8];

/// Position and velocity noise per unit of height (ByteTrack's tuning).
const STD_POSITION: f64 = 1.0 / 20.0;
const STD_VELOCITY: f64 = 1.0 / 160.0;

/// `[x1, y1, x2, y2]` as the measured `[cx, cy, aspect, h]`.
pub fn measure(rect: [f32; 4]) -> [f64; 4] {
    let [x1, y1, x2, y2] = rect.map(f64::from);
    let (w, h) = (x2 - x1, y2 - y1);
    [x1 + w / 2.0, y1 + h / 2.0, w / h, h]
}

/// The box `[x1, y1, x2, y2]` of a state.
pub fn rect(mean: &Mean) -> [f64; 4] {
    let (h, w) = (mean[3], mean[2] * mean[3]);
    [
        mean[0] - w / 2.0,
        mean[1] - h / 2.0,
        mean[0] + w / 2.0,
        mean[1] + h / 2.0,
    ]
}

/// A new track's state: at the measurement, motionless, velocities very uncertain.
pub fn initiate(z: [f64; 4]) -> (Mean, Covariance) {
    let h = z[3];
    let std = [
        2.0 * STD_POSITION * h,
        2.0 * STD_POSITION * h,
        1e-2,
        2.0 * STD_POSITION * h,
        10.0 * STD_VELOCITY * h,
        10.0 * STD_VELOCITY * h,
        1e-5,
        10.0 * STD_VELOCITY * h,
    ];
    let mut mean = [0.0; 8];
    mean[..4].copy_from_slice(&z);
    (mean, diagonal(std))
}

/// One frame ahead: `x = F x`, `P = F P Fᵀ + Q` with `F = [[I, I], [0, I]]`.
#[allow(
    clippy::indexing_slicing,
    reason = "fixed-size 8-vector and 8×8 matrix: every index is a counter over 0..4 or 0..8, or i + 4 with i < 4"
)]
pub fn predict(mean: &mut Mean, cov: &mut Covariance) {
    let h = mean[3];
    let q = [
        STD_POSITION * h,
        STD_POSITION * h,
        1e-2,
        STD_POSITION * h,
        STD_VELOCITY * h,
        STD_VELOCITY * h,
        1e-5,
        STD_VELOCITY * h,
    ];
    for i in 0..4 {
        mean[i] += mean[i + 4];
    }
    // F P: position rows gain their velocity rows.
    let mut fp = *cov;
    for i in 0..4 {
        for j in 0..8 {
            fp[i][j] += cov[i + 4][j];
        }
    }
    // (F P) Fᵀ: position columns gain their velocity columns.
    for (i, row) in fp.iter().enumerate() {
        for j in 0..8 {
            let add = if j < 4 { row[j + 4] } else { 0.0 };
            cov[i][j] = row[j] + add + if i == j { q[i] * q[i] } else { 0.0 };
        }
    }
}

/// Corrects the state with a measurement `[cx, cy, aspect, h]`. `None` (state untouched) when
/// the innovation covariance is not positive definite or the result is not finite.
#[allow(
    clippy::indexing_slicing,
    reason = "fixed-size 4-, 8- and 8×8 arrays: every index is a counter over 0..4 or 0..8, within those lengths"
)]
pub fn update(mean: &mut Mean, cov: &mut Covariance, z: [f64; 4]) -> Option<()> {
    let h = mean[3];
    let r = [STD_POSITION * h, STD_POSITION * h, 1e-1, STD_POSITION * h];
    // S = H P Hᵀ + R: the position block plus measurement noise.
    let mut s = [[0.0; 4]; 4];
    for i in 0..4 {
        for j in 0..4 {
            s[i][j] = cov[i][j] + if i == j { r[i] * r[i] } else { 0.0 };
        }
    }
    let l = cholesky(&s)?;
    // K = P Hᵀ S⁻¹, row by row (S is symmetric): K[i] = S⁻¹ (P Hᵀ)[i].
    let mut gain = [[0.0; 4]; 8];
    for (i, row) in gain.iter_mut().enumerate() {
        let pht = [cov[i][0], cov[i][1], cov[i][2], cov[i][3]];
        *row = cholesky_solve(&l, pht);
    }
    let innovation: [f64; 4] = std::array::from_fn(|k| z[k] - mean[k]);
    let mut new_mean = *mean;
    let mut new_cov = *cov;
    for i in 0..8 {
        new_mean[i] += (0..4).map(|k| gain[i][k] * innovation[k]).sum::<f64>();
        // P − K S Kᵀ = P − K (P Hᵀ)ᵀ.
        for j in 0..8 {
            new_cov[i][j] -= (0..4).map(|k| gain[i][k] * cov[j][k]).sum::<f64>();
        }
    }
    let finite = new_mean
        .iter()
        .chain(new_cov.iter().flatten())
        .all(|v| v.is_finite());
    if !finite {
        return None;
    }
    *mean = new_mean;
    *cov = new_cov;
    Some(())
}

#[allow(
    clippy::indexing_slicing,
    reason = "`i` enumerates the 8 entries of `std`, and the matrix is 8×8"
)]
fn diagonal(std: [f64; 8]) -> Covariance {
    let mut cov = [[0.0; 8]; 8];
    for (i, s) in std.iter().enumerate() {
        cov[i][i] = s * s;
    }
    cov
}

/// Lower-triangular `L` with `L Lᵀ = s`, or `None` when `s` is not positive definite.
#[allow(
    clippy::indexing_slicing,
    reason = "fixed-size 4×4 arrays: i < 4, j <= i and k < j, all within 0..4"
)]
fn cholesky(s: &[[f64; 4]; 4]) -> Option<[[f64; 4]; 4]> {
    let mut l = [[0.0; 4]; 4];
    for i in 0..4 {
        for j in 0..=i {
            let sum = s[i][j] - (0..j).map(|k| l[i][k] * l[j][k]).sum::<f64>();
            if i == j {
                if !(sum > 0.0 && sum.is_finite()) {
                    return None;
                }
                l[i][i] = sum.sqrt();
            } else {
                l[i][j] = sum / l[j][j];
            }
        }
    }
    Some(l)
}

/// `x` with `L Lᵀ x = b`.
#[allow(
    clippy::indexing_slicing,
    reason = "fixed-size 4-vectors and 4×4 matrix: i and k range within 0..4"
)]
fn cholesky_solve(l: &[[f64; 4]; 4], b: [f64; 4]) -> [f64; 4] {
    let mut y = [0.0; 4];
    for i in 0..4 {
        y[i] = (b[i] - (0..i).map(|k| l[i][k] * y[k]).sum::<f64>()) / l[i][i];
    }
    let mut x = [0.0; 4];
    for i in (0..4).rev() {
        x[i] = (y[i] - (i + 1..4).map(|k| l[k][i] * x[k]).sum::<f64>()) / l[i][i];
    }
    x
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_box_survives_measure_and_rect() {
        let (mean, _) = initiate(measure([10.0, 20.0, 30.0, 60.0]));
        let got = rect(&mean);
        for (g, want) in got.iter().zip([10.0, 20.0, 30.0, 60.0]) {
            assert!((g - want).abs() < 1e-9, "{got:?}");
        }
    }

    #[test]
    fn a_steadily_moving_box_is_predicted_ahead() {
        let (mut mean, mut cov) = initiate(measure([0.0, 0.0, 10.0, 20.0]));
        for step in 1..=20 {
            predict(&mut mean, &mut cov);
            let x = 3.0 * step as f32;
            update(&mut mean, &mut cov, measure([x, 0.0, x + 10.0, 20.0])).expect("update");
        }
        // The velocity was learnt: the next prediction lands near x = 63.
        predict(&mut mean, &mut cov);
        let x1 = rect(&mean)[0];
        assert!((x1 - 63.0).abs() < 1.0, "predicted x1 {x1}");
        // The covariance stays symmetric.
        for (i, row) in cov.iter().enumerate() {
            for (j, v) in row.iter().enumerate() {
                assert!((v - cov[j][i]).abs() < 1e-9);
            }
        }
    }

    #[test]
    fn a_degenerate_state_is_refused_not_propagated() {
        let (mut mean, mut cov) = initiate([0.0, 0.0, 1.0, 10.0]);
        cov[0][0] = f64::NAN;
        let before = (mean, cov);
        assert!(update(&mut mean, &mut cov, [1.0, 1.0, 1.0, 10.0]).is_none());
        assert_eq!(mean, before.0);
    }
}
