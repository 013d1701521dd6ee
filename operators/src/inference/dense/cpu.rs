//! The CPU executor's ops: the reference the GPU kernels are checked against.

use riffle_dataflow::DataflowResult;

use super::buffers::{take, zeros};
use super::{err, gather_rows_of, proto, scatter_rows, shapes, Data, SplitTable, Tensor};

pub(crate) fn attr<'a>(
    node: &'a proto::NodeProto,
    name: &str,
) -> Option<&'a proto::AttributeProto> {
    node.attribute.iter().find(|a| a.name == name)
}

pub(crate) fn attr_i(node: &proto::NodeProto, name: &str, default: i64) -> i64 {
    attr(node, name).map_or(default, |a| a.i)
}

pub(crate) fn attr_f(node: &proto::NodeProto, name: &str, default: f32) -> f32 {
    attr(node, name).map_or(default, |a| a.f)
}

/// Axes from the node's second input (opset ≥ 13) or its `axes` attribute, made non-negative.
pub(crate) fn axes<'a>(
    node: &proto::NodeProto,
    get: &dyn Fn(usize) -> DataflowResult<&'a Tensor>,
    rank: usize,
) -> DataflowResult<Vec<usize>> {
    let raw: Vec<i64> = if node.input.get(1).is_some_and(|name| !name.is_empty()) {
        get(1)?.as_i64()?.to_vec()
    } else {
        attr(node, "axes").map_or_else(Vec::new, |a| a.ints.clone())
    };
    raw.iter()
        .map(|a| {
            let a = if *a < 0 { *a + rank as i64 } else { *a };
            usize::try_from(a)
                .ok()
                .filter(|a| *a < rank.max(1))
                .ok_or_else(|| err(format!("{}: axis {a} out of range", node.op_type)))
        })
        .collect()
}

/// The input of a node's op at position `i`.
type Get<'g, 'a> = &'g dyn Fn(usize) -> DataflowResult<&'a Tensor>;

pub(super) fn run_node<'a>(node: &proto::NodeProto, get: Get<'_, 'a>) -> DataflowResult<Tensor> {
    let op = node.op_type.as_str();
    match op {
        "Constant" => {
            let t = attr(node, "value")
                .and_then(|a| a.t.as_ref())
                .ok_or_else(|| err("Constant without a tensor `value`"))?;
            Tensor::from_proto(t)
        }
        "Identity" => Ok(copied(get(0)?)),
        "Gather" => gather(node, get),
        // One instance of `broadcast` per op, so that its loops inline the arithmetic.
        "Add" => broadcast(get(0)?, get(1)?, |a, b| a + b),
        "Sub" => broadcast(get(0)?, get(1)?, |a, b| a - b),
        "Mul" => broadcast(get(0)?, get(1)?, |a, b| a * b),
        "Div" => broadcast(get(0)?, get(1)?, |a, b| a / b),
        "Relu" => map(get(0)?, |x| x.max(0.0)),
        "Sigmoid" => map(get(0)?, |x| 1.0 / (1.0 + (-x).exp())),
        "ReduceSum" => {
            let x = get(0)?;
            let rank = x.shape.len();
            let mut reduce = axes(node, get, rank)?;
            if reduce.is_empty() {
                reduce = (0..rank).collect();
            }
            let keep = attr_i(node, "keepdims", 1) != 0;
            reduce_sum(x, &reduce, keep)
        }
        "Squeeze" | "Unsqueeze" | "Flatten" => reshaped(node, get),
        "Concat" => concat(node, get),
        "Gemm" | "MatMul" => gemm(node, get),
        other => Err(err(format!("op `{other}` is not supported"))),
    }
}

/// Gather (axis 0) from a whole table, float or int64.
fn gather<'a>(node: &proto::NodeProto, get: Get<'_, 'a>) -> DataflowResult<Tensor> {
    let (data, indices) = (get(0)?, get(1)?);
    let idx = gather_rows_of(node, &data.shape, indices.as_i64()?)?;
    let row_shape = data
        .shape
        .get(1..)
        .ok_or_else(|| err("Gather of a scalar"))?;
    let width: usize = row_shape.iter().product();
    let mut shape = indices.shape.clone();
    shape.extend_from_slice(row_shape);
    Ok(match &data.data {
        Data::F32(v) => Tensor::f32(shape, gather_rows(v, width, &idx, take(idx.len() * width))?),
        Data::I64(v) => Tensor::i64(shape, gather_rows(v, width, &idx, Vec::new())?),
    })
}

/// Squeeze, Unsqueeze or Flatten: the same values under a new shape.
fn reshaped<'a>(node: &proto::NodeProto, get: Get<'_, 'a>) -> DataflowResult<Tensor> {
    let x = get(0)?;
    let shape = match node.op_type.as_str() {
        "Squeeze" => shapes::squeeze(&x.shape, &axes(node, get, x.shape.len())?),
        "Unsqueeze" => shapes::unsqueeze(&x.shape, axes(node, get, x.shape.len() + 1)?),
        _ => shapes::flatten(&x.shape, attr_i(node, "axis", 1)),
    };
    Ok(Tensor { shape, ..copied(x) })
}

/// A copy of `x`, its floats in a reused buffer.
fn copied(x: &Tensor) -> Tensor {
    let data = match &x.data {
        Data::F32(v) => {
            let mut out = take(v.len());
            out.extend_from_slice(v);
            Data::F32(out)
        }
        Data::I64(v) => Data::I64(v.clone()),
    };
    Tensor {
        shape: x.shape.clone(),
        data,
    }
}

/// Concat: each outer row of the output is that row of every input, in order.
fn concat<'a>(node: &proto::NodeProto, get: Get<'_, 'a>) -> DataflowResult<Tensor> {
    let parts: Vec<&Tensor> = (0..node.input.len())
        .map(get)
        .collect::<DataflowResult<_>>()?;
    let part_shapes: Vec<&[usize]> = parts.iter().map(|p| p.shape.as_slice()).collect();
    let (axis, outer, shape) = shapes::concat(&part_shapes, attr_i(node, "axis", 0))?;
    let mut out = take(shape.iter().product());
    for o in 0..outer {
        for p in &parts {
            // `concat` checked that every part has the axis.
            let chunk: usize = p.shape.get(axis..).unwrap_or_default().iter().product();
            let block = p
                .as_f32()?
                .get(o * chunk..(o + 1) * chunk)
                .ok_or_else(|| err("Concat: an input's data does not match its shape"))?;
            out.extend_from_slice(block);
        }
    }
    Ok(Tensor::f32(shape, out))
}

/// Gemm (`alpha`, `beta`, transposes, an optional bias) or MatMul.
fn gemm<'a>(node: &proto::NodeProto, get: Get<'_, 'a>) -> DataflowResult<Tensor> {
    let op = node.op_type.as_str();
    let (a, b) = (get(0)?, get(1)?);
    let (ta, tb) = if op == "Gemm" {
        (
            attr_i(node, "transA", 0) != 0,
            attr_i(node, "transB", 0) != 0,
        )
    } else {
        (false, false)
    };
    let (alpha, beta) = if op == "Gemm" {
        (attr_f(node, "alpha", 1.0), attr_f(node, "beta", 1.0))
    } else {
        (1.0, 0.0)
    };
    let (m, k, n) = shapes::gemm(op, &a.shape, &b.shape, ta, tb)?;
    let out = matmul(op, a.as_f32()?, b.as_f32()?, (m, k, n), (ta, tb), alpha)?;
    let product = Tensor::f32(vec![m, n], out);
    if op == "Gemm" && node.input.get(2).is_some_and(|name| !name.is_empty()) {
        let c = map(get(2)?, |x| beta * x)?;
        broadcast(&product, &c, |a, b| a + b)
    } else {
        Ok(product)
    }
}

/// `alpha · op(A)·op(B)` for row-major `av` (m×k, or k×m when `ta`) and `bv` (k×n, or n×k
/// when `tb`); an error when they hold fewer values than that. A transpose is only a change of
/// strides, so `matrixmultiply`'s blocked kernel reads either layout in place.
pub(super) fn matmul(
    op: &str,
    av: &[f32],
    bv: &[f32],
    (m, k, n): (usize, usize, usize),
    (ta, tb): (bool, bool),
    alpha: f32,
) -> DataflowResult<Vec<f32>> {
    if av.len() < m * k || bv.len() < k * n {
        return Err(err(format!(
            "{op}: the operands' data does not match their shapes"
        )));
    }
    let mut out = zeros(m * n);
    if m == 0 || k == 0 || n == 0 {
        return Ok(out);
    }
    let (rsa, csa) = if ta { (1, m) } else { (k, 1) };
    let (rsb, csb) = if tb { (1, k) } else { (n, 1) };
    // SAFETY: with these strides sgemm reads A at i·rsa + p·csa < m·k and B at p·rsb + j·csb
    // < k·n (i < m, p < k, j < n), which `av` and `bv` hold (checked above); it writes C at
    // i·n + j < m·n, the length of `out` (beta 0: C is not read), a buffer of its own.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            alpha,
            av.as_ptr(),
            rsa as isize,
            csa as isize,
            bv.as_ptr(),
            rsb as isize,
            csb as isize,
            0.0,
            out.as_mut_ptr(),
            n as isize,
            1,
        );
    }
    Ok(out)
}

/// The rows `idx` of a table of rows `width` values long, one after the other; an error when
/// one lies outside `values`.
fn gather_rows<T: Copy>(
    values: &[T],
    width: usize,
    idx: &[usize],
    mut out: Vec<T>,
) -> DataflowResult<Vec<T>> {
    out.reserve(idx.len() * width);
    for &i in idx {
        let row = values.get(i * width..(i + 1) * width).ok_or_else(|| {
            err(format!(
                "Gather: row {i} is beyond the table's {} values",
                values.len()
            ))
        })?;
        out.extend_from_slice(row);
    }
    Ok(out)
}

/// A Gather from a table split by rows: each part serves its rows, scattered back in order.
pub(super) fn gather_split(table: &SplitTable, indices: &Tensor) -> DataflowResult<Tensor> {
    let first = table
        .parts
        .first()
        .ok_or_else(|| err("Gather: a split table without parts"))?;
    let row_shape = first
        .shape
        .get(1..)
        .ok_or_else(|| err("Gather of a scalar"))?;
    let width: usize = row_shape.iter().product();
    let routes = table.rows.route(indices.as_i64()?)?;
    let mut out = zeros(indices.len() * width);
    for (part, route) in table.parts.iter().zip(&routes) {
        let local: Vec<usize> = route.local.iter().map(|&i| i as usize).collect();
        let rows = gather_rows(part.as_f32()?, width, &local, Vec::new())?;
        scatter_rows(&mut out, width, &route.positions, &rows)?;
    }
    let mut shape = indices.shape.clone();
    shape.extend_from_slice(row_shape);
    Ok(Tensor::f32(shape, out))
}

pub(super) fn map(x: &Tensor, f: impl Fn(f32) -> f32) -> DataflowResult<Tensor> {
    Ok(Tensor::f32(x.shape.clone(), {
        let v = x.as_f32()?;
        let mut out = take(v.len());
        out.extend(v.iter().map(|v| f(*v)));
        out
    }))
}

/// Elementwise `f` with numpy broadcasting.
pub(super) fn broadcast(
    a: &Tensor,
    b: &Tensor,
    f: impl Fn(f32, f32) -> f32 + Copy,
) -> DataflowResult<Tensor> {
    let rank = a.shape.len().max(b.shape.len());
    let (shape, _, _) = shapes::broadcast(&a.shape, &b.shape, rank)?;
    let (av, bv) = (a.as_f32()?, b.as_f32()?);
    let total: usize = shape.iter().product();
    // The common cases in one pass, no index arithmetic: an operand that is the whole output,
    // the other repeating (equal shapes, a scalar, a bias row over a batch).
    let consistent = av.len() == a.len() && bv.len() == b.len();
    if consistent && av.len() == total && repeats(&b.shape, &shape) {
        if let Some(out) = cycled(av, bv, f) {
            return Ok(Tensor::f32(shape, out));
        }
    }
    if consistent && bv.len() == total && repeats(&a.shape, &shape) {
        if let Some(out) = cycled(bv, av, |y, x| f(x, y)) {
            return Ok(Tensor::f32(shape, out));
        }
    }
    broadcast_walk(a, b, f)
}

/// Elementwise `f` with numpy broadcasting, index by index: any shapes.
pub(super) fn broadcast_walk(
    a: &Tensor,
    b: &Tensor,
    f: impl Fn(f32, f32) -> f32,
) -> DataflowResult<Tensor> {
    let rank = a.shape.len().max(b.shape.len());
    let (shape, ta, tb) = shapes::broadcast(&a.shape, &b.shape, rank)?;
    let (av, bv) = (a.as_f32()?, b.as_f32()?);
    let total: usize = shape.iter().product();
    let mut out = Vec::with_capacity(total);
    let mut index = vec![0usize; rank];
    for _ in 0..total {
        let ia: usize = index.iter().zip(&ta).map(|(i, s)| i * s).sum();
        let ib: usize = index.iter().zip(&tb).map(|(i, s)| i * s).sum();
        let (Some(&x), Some(&y)) = (av.get(ia), bv.get(ib)) else {
            return Err(err(
                "an elementwise operand's data does not match its shape",
            ));
        };
        out.push(f(x, y));
        // The next index, row-major: the last axis first, carrying into the ones before.
        for (i, &size) in index.iter_mut().zip(&shape).rev() {
            *i += 1;
            if *i < size {
                break;
            }
            *i = 0;
        }
    }
    Ok(Tensor::f32(shape, out))
}

/// Whether a tensor of shape `part` broadcast to `whole` repeats its values end to end: after
/// any leading 1s, `part` is `whole`'s trailing dimensions.
fn repeats(part: &[usize], whole: &[usize]) -> bool {
    let ones = part.iter().take_while(|d| **d == 1).count();
    let rest = part.get(ones..).unwrap_or_default();
    part.len() <= whole.len() && whole.get(whole.len() - rest.len()..) == Some(rest)
}

/// `f(full[i], cycle[i mod cycle.len()])` for every `i`; `None` when `cycle` does not divide
/// `full` evenly.
fn cycled(full: &[f32], cycle: &[f32], f: impl Fn(f32, f32) -> f32) -> Option<Vec<f32>> {
    if cycle.is_empty() || !full.len().is_multiple_of(cycle.len()) {
        return None;
    }
    let mut out = take(full.len());
    if let [c] = cycle {
        out.extend(full.iter().map(|x| f(*x, *c)));
    } else {
        for chunk in full.chunks_exact(cycle.len()) {
            out.extend(chunk.iter().zip(cycle).map(|(x, c)| f(*x, *c)));
        }
    }
    Some(out)
}

pub(super) fn reduce_sum(x: &Tensor, axes: &[usize], keep: bool) -> DataflowResult<Tensor> {
    let v = x.as_f32()?;
    let rank = x.shape.len();
    // Over the last axis only: each row summed in order, as the general walk below adds them.
    if let (&[axis], Some(&width)) = (axes, x.shape.last()) {
        if axis + 1 == rank && width > 0 && v.len() == x.len() {
            let mut out = take(v.len() / width);
            out.extend(
                v.chunks_exact(width)
                    .map(|row| row.iter().fold(0.0, |acc, x| acc + x)),
            );
            let mut shape = x.shape.clone();
            shape.truncate(axis);
            if keep {
                shape.push(1);
            }
            return Ok(Tensor::f32(shape, out));
        }
    }
    reduce_walk(x, axes, keep)
}

/// ReduceSum over any axes, element by element in row-major order.
pub(super) fn reduce_walk(x: &Tensor, axes: &[usize], keep: bool) -> DataflowResult<Tensor> {
    let v = x.as_f32()?;
    let rank = x.shape.len();
    let kept: Vec<usize> = x
        .shape
        .iter()
        .enumerate()
        .map(|(d, &size)| if axes.contains(&d) { 1 } else { size })
        .collect();
    let total: usize = kept.iter().product();
    let mut out = vec![0f32; total];
    let mut index = vec![0usize; rank];
    for value in v {
        let mut o = 0;
        for (d, (&k, &i)) in kept.iter().zip(&index).enumerate() {
            o = o * k + if axes.contains(&d) { 0 } else { i };
        }
        *out.get_mut(o)
            .ok_or_else(|| err("ReduceSum: the data does not match its shape"))? += value;
        // The next index, row-major: the last axis first, carrying into the ones before.
        for (i, &size) in index.iter_mut().zip(&x.shape).rev() {
            *i += 1;
            if *i < size {
                break;
            }
            *i = 0;
        }
    }
    let shape = if keep {
        kept
    } else {
        x.shape
            .iter()
            .enumerate()
            .filter(|(d, _)| !axes.contains(d))
            .map(|(_, &size)| size)
            .collect()
    };
    Ok(Tensor::f32(shape, out))
}
