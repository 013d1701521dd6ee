//! Output shapes, shared by the CPU and GPU executors so both read a graph the same way.

use riffle_dataflow::DataflowResult;

use super::err;

/// `(m, k, n)` of `op(A)·op(B)` for 2-D operands (`op`: transposed or not).
pub fn gemm(
    op: &str,
    a: &[usize],
    b: &[usize],
    ta: bool,
    tb: bool,
) -> DataflowResult<(usize, usize, usize)> {
    let (&[a0, a1], &[b0, b1]) = (a, b) else {
        return Err(err(format!("{op}: only 2-D operands are supported")));
    };
    let (m, k) = if ta { (a1, a0) } else { (a0, a1) };
    let (k2, n) = if tb { (b1, b0) } else { (b0, b1) };
    if k != k2 {
        return Err(err(format!("{op}: inner dimensions {k} and {k2} differ")));
    }
    Ok((m, k, n))
}

/// Without the `drop` axes (without every 1 when `drop` is empty).
pub fn squeeze(shape: &[usize], drop: &[usize]) -> Vec<usize> {
    shape
        .iter()
        .enumerate()
        .filter(|(i, d)| {
            !(if drop.is_empty() {
                **d == 1
            } else {
                drop.contains(i)
            })
        })
        .map(|(_, d)| *d)
        .collect()
}

/// With a 1 inserted at each of the `add` axes (of the output).
pub fn unsqueeze(shape: &[usize], mut add: Vec<usize>) -> Vec<usize> {
    add.sort_unstable();
    let mut out = shape.to_vec();
    for a in add {
        out.insert(a.min(out.len()), 1);
    }
    out
}

/// The 2-D shape Flatten gives at `axis`.
pub fn flatten(shape: &[usize], axis: i64) -> Vec<usize> {
    let axis = axis.clamp(0, shape.len() as i64) as usize;
    let outer: usize = shape.iter().take(axis).product();
    let total: usize = shape.iter().product();
    vec![outer, total / outer.max(1)]
}

/// Concat of `parts` at `axis`: the axis made non-negative, the rows before it, and the
/// output shape. Every part has the axis (an error otherwise).
pub fn concat(parts: &[&[usize]], axis: i64) -> DataflowResult<(usize, usize, Vec<usize>)> {
    let first = parts.first().ok_or_else(|| err("Concat of nothing"))?;
    let rank = first.len();
    let axis = if axis < 0 { axis + rank as i64 } else { axis } as usize;
    let mut shape = first.to_vec();
    let Some((before, [size, ..])) = shape.split_at_mut_checked(axis) else {
        return Err(err("Concat: axis out of range"));
    };
    let outer: usize = before.iter().product();
    // Every part matches the first outside the axis: the executors copy whole rows of each.
    let same_outside = |p: &[usize]| {
        p.len() == rank
            && p.iter()
                .zip(first.iter())
                .enumerate()
                .all(|(d, (x, y))| d == axis || x == y)
    };
    if let Some(other) = parts.iter().find(|p| !same_outside(p)) {
        return Err(err(format!(
            "Concat: input shapes {first:?} and {other:?} differ on an axis other than {axis}"
        )));
    }
    *size = parts.iter().try_fold(0usize, |sum, p| {
        p.get(axis)
            .and_then(|d| sum.checked_add(*d))
            .ok_or_else(|| err(format!("Concat: shapes {parts:?} along axis {axis}")))
    })?;
    Ok((axis, outer, shape))
}

/// Numpy broadcasting of `a` and `b` at `rank` (≥ both ranks): the output shape padded to
/// `rank`, and each operand's element strides into it (0 along broadcast axes).
pub fn broadcast(
    a: &[usize],
    b: &[usize],
    rank: usize,
) -> DataflowResult<(Vec<usize>, Vec<usize>, Vec<usize>)> {
    let pad = |s: &[usize]| -> Vec<usize> {
        let mut p = vec![1; rank.saturating_sub(s.len())];
        p.extend_from_slice(s);
        p
    };
    let (sa, sb) = (pad(a), pad(b));
    let mut shape = Vec::with_capacity(rank);
    for (x, y) in sa.iter().zip(&sb) {
        shape.push(match (x, y) {
            (x, y) if x == y => *x,
            (1, y) => *y,
            (x, 1) => *x,
            _ => return Err(err(format!("shapes {a:?} and {b:?} do not broadcast"))),
        });
    }
    let strides = |s: &[usize]| -> Vec<usize> {
        let mut st = vec![0; s.len()];
        let mut acc = 1;
        for (st, &size) in st.iter_mut().zip(s).rev() {
            *st = if size == 1 { 0 } else { acc };
            acc *= size;
        }
        st
    };
    Ok((shape, strides(&sa), strides(&sb)))
}
