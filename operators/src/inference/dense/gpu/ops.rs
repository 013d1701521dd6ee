//! The executor's ops on the device, one method per op family: each checks the sizes and
//! buffers its launches will use before any is queued.

use cudarc::cublas::{sys::cublasOperation_t, GemmConfig};
use riffle_dataflow::DataflowResult;
use riffle_gpu::{Arg, GpuDevice};

use super::tensor::DTensor;
use super::{elements, gather_rows, grid, holds, int, mul, Dense, Inputs};
use crate::gpu_error;
use crate::inference::dense::{attr_f, attr_i, axes, err, gather_rows_of, shapes};

impl<D: GpuDevice> Dense<D> {
    /// Runs one node's op (all but Constant, which the graph walk keeps on the host too).
    pub(super) fn run_node(&self, inputs: &Inputs<'_, D>) -> DataflowResult<DTensor<D>> {
        let op = inputs.node.op_type.as_str();
        match op {
            "Identity" => Ok(inputs.get(0)?.clone()),
            "Gather" => self.gather(inputs),
            "Add" | "Sub" | "Mul" | "Div" => {
                let code = match op {
                    "Add" => 0,
                    "Sub" => 1,
                    "Mul" => 2,
                    _ => 3,
                };
                self.binary(inputs.get(0)?, inputs.get(1)?, code)
            }
            "Relu" | "Sigmoid" => self.unary(op, inputs.get(0)?),
            "ReduceSum" => self.reduce_sum(inputs),
            "Squeeze" | "Unsqueeze" | "Flatten" => reshaped(op, inputs),
            "Concat" => self.concat(inputs),
            "Gemm" | "MatMul" => self.matmul(op, inputs),
            other => Err(err(format!("op `{other}` is not supported on the GPU"))),
        }
    }

    /// Gather (axis 0) from a table held whole on this device.
    fn gather(&self, inputs: &Inputs<'_, D>) -> DataflowResult<DTensor<D>> {
        let device = &self.device;
        let (data, indices) = (inputs.get(0)?, inputs.get(1)?);
        // Indices are checked and negative ones wrapped on the host: the kernel must never
        // read outside the table. They are graph inputs, so already there, except when the
        // graph computes them.
        let host_idx = inputs.host_copy(1, device)?;
        let local: Vec<i64> = gather_rows_of(inputs.node, &data.shape, host_idx.as_i64()?)?
            .into_iter()
            .map(|r| r as i64)
            .collect();
        let row_shape = data
            .shape
            .get(1..)
            .ok_or_else(|| err("Gather of a scalar"))?;
        let width = elements("Gather", row_shape)?;
        let total = mul("Gather", elements("Gather", &indices.shape)?, width)?;
        let out = if total > 0 {
            gather_rows(device, data.f32()?, &local, width)?
        } else {
            device.alloc_zeros::<f32>(1).map_err(gpu_error)?
        };
        let mut shape = indices.shape.clone();
        shape.extend_from_slice(row_shape);
        Ok(DTensor::with_f32(shape, out))
    }

    /// Relu or Sigmoid (`op`) of every value of `x`.
    fn unary(&self, op: &str, x: &DTensor<D>) -> DataflowResult<DTensor<D>> {
        let device = &self.device;
        let n = x.len()?;
        let (n_arg, cfg) = (int(op, n)?, grid(op, n)?);
        let input = x.f32()?;
        holds(device, input, n, op)?;
        let out = device.alloc_zeros::<f32>(n.max(1)).map_err(gpu_error)?;
        let args = [
            Arg::F32(input),
            Arg::F32(&out),
            Arg::Int(i32::from(op == "Sigmoid")),
            Arg::Int(n_arg),
        ];
        // SAFETY: the kernel checks its thread index against `n`, and both buffers hold `n`
        // values (checked above).
        unsafe { device.launch("unary_f32", cfg, &args) }.map_err(gpu_error)?;
        Ok(DTensor::with_f32(x.shape.clone(), out))
    }

    /// ReduceSum over trailing axes only: each output value sums one contiguous run.
    fn reduce_sum(&self, inputs: &Inputs<'_, D>) -> DataflowResult<DTensor<D>> {
        let (op, node, device) = ("ReduceSum", inputs.node, &self.device);
        let x = inputs.get(0)?;
        let rank = x.shape.len();
        let host_axes = |i: usize| inputs.host(i);
        let mut reduce = axes(node, &host_axes, rank)?;
        if reduce.is_empty() {
            reduce = (0..rank).collect();
        }
        reduce.sort_unstable();
        // A scalar has no axes (`reduce` is empty): it is its own sum.
        let first = reduce.first().copied().unwrap_or(rank);
        if reduce != (first..rank).collect::<Vec<_>>() {
            return Err(err("ReduceSum on the GPU: only trailing axes"));
        }
        let (kept, reduced) = x
            .shape
            .split_at_checked(first)
            .ok_or_else(|| err("ReduceSum: axis out of range"))?;
        let (outer, inner) = (elements(op, kept)?, elements(op, reduced)?);
        // The kernel reads `x[t * inner + j]` in `int`: all of `x` must fit one.
        let all = mul(op, outer, inner)?;
        int(op, all)?;
        let (outer_arg, inner_arg) = (int(op, outer)?, int(op, inner)?);
        let cfg = grid(op, outer)?;
        let input = x.f32()?;
        holds(device, input, all, op)?;
        let out = device.alloc_zeros::<f32>(outer.max(1)).map_err(gpu_error)?;
        let args = [
            Arg::F32(input),
            Arg::F32(&out),
            Arg::Int(outer_arg),
            Arg::Int(inner_arg),
        ];
        // SAFETY: the kernel checks its thread index against `outer`; `out` holds `outer`
        // values and `x` `outer * inner` (checked above).
        unsafe { device.launch("reduce_inner_f32", cfg, &args) }.map_err(gpu_error)?;
        let mut shape = kept.to_vec();
        if attr_i(node, "keepdims", 1) != 0 {
            shape.extend(std::iter::repeat_n(1, rank - first));
        }
        Ok(DTensor::with_f32(shape, out))
    }

    /// Concat: one copy launch per input into its columns of the output.
    fn concat(&self, inputs: &Inputs<'_, D>) -> DataflowResult<DTensor<D>> {
        let (op, device) = ("Concat", &self.device);
        let parts: Vec<&DTensor<D>> = (0..inputs.node.input.len())
            .map(|i| inputs.get(i))
            .collect::<DataflowResult<_>>()?;
        let part_shapes: Vec<&[usize]> = parts.iter().map(|p| p.shape.as_slice()).collect();
        let (axis, outer, shape) = shapes::concat(&part_shapes, attr_i(inputs.node, "axis", 0))?;
        // `concat` checked that every part has the axis.
        let dst_chunk = elements(op, shape.get(axis..).unwrap_or_default())?;
        // Every index the kernel computes (`o * dst_chunk + offset + c`) is below this.
        let total = mul(op, outer, dst_chunk)?;
        let (outer_arg, dst_chunk_arg) = (int(op, outer)?, int(op, dst_chunk)?);
        int(op, total)?;
        // Each part's launch, checked before any is queued.
        let mut launches = Vec::with_capacity(parts.len());
        let mut offset = 0usize;
        for p in &parts {
            let chunk = elements(op, p.shape.get(axis..).unwrap_or_default())?;
            let size = mul(op, outer, chunk)?;
            let input = p.f32()?;
            holds(device, input, size, op)?;
            if offset.checked_add(chunk).is_none_or(|end| end > dst_chunk) {
                return Err(err(format!(
                    "Concat: the inputs' shapes {part_shapes:?} overrun the output's {shape:?}"
                )));
            }
            launches.push((input, int(op, chunk)?, int(op, offset)?, grid(op, size)?));
            offset += chunk;
        }
        let out = device.alloc_zeros::<f32>(total.max(1)).map_err(gpu_error)?;
        for (input, chunk, offset, cfg) in launches {
            let args = [
                Arg::F32(input),
                Arg::F32(&out),
                Arg::Int(outer_arg),
                Arg::Int(chunk),
                Arg::Int(dst_chunk_arg),
                Arg::Int(offset),
            ];
            // SAFETY: the kernel checks its thread index against `outer * chunk`, the part's
            // size (which its buffer holds, checked above); it writes row `o` at
            // `o * dst_chunk + offset` and on, up to `offset + chunk <= dst_chunk`, within
            // `out`'s `outer * dst_chunk`, which fits an `int`.
            unsafe { device.launch("copy_block_f32", cfg, &args) }.map_err(gpu_error)?;
        }
        Ok(DTensor::with_f32(shape, out))
    }

    /// Gemm (`alpha`, transposes, a bias added with beta 1) or MatMul (`op`) with cuBLAS.
    fn matmul(&self, op: &str, inputs: &Inputs<'_, D>) -> DataflowResult<DTensor<D>> {
        let (node, device) = (inputs.node, &self.device);
        let (a, b) = (inputs.get(0)?, inputs.get(1)?);
        let gemm = op == "Gemm";
        let ta = gemm && attr_i(node, "transA", 0) != 0;
        let tb = gemm && attr_i(node, "transB", 0) != 0;
        let alpha = if gemm {
            attr_f(node, "alpha", 1.0)
        } else {
            1.0
        };
        if gemm && attr_f(node, "beta", 1.0) != 1.0 {
            return Err(err("Gemm on the GPU: beta must be 1"));
        }
        let (m, k, n) = shapes::gemm(op, &a.shape, &b.shape, ta, tb)?;
        let cfg = row_major_gemm(op, m, k, n, ta, tb, alpha)?;
        let (a_buf, b_buf) = (a.f32()?, b.f32()?);
        holds(device, a_buf, mul(op, m, k)?, op)?;
        holds(device, b_buf, mul(op, k, n)?, op)?;
        let mut out = device
            .alloc_zeros::<f32>(mul(op, m, n)?.max(1))
            .map_err(gpu_error)?;
        // SAFETY: the dimensions and leading dimensions above describe the buffers, which
        // hold that many values (checked above).
        unsafe { device.gemm(cfg, b_buf, a_buf, &mut out) }.map_err(gpu_error)?;
        let product = DTensor::with_f32(vec![m, n], out);
        if gemm && node.input.get(2).is_some_and(|name| !name.is_empty()) {
            self.binary(&product, inputs.get(2)?, 0)
        } else {
            Ok(product)
        }
    }
    /// Elementwise op `code` (0 add, 1 sub, 2 mul, 3 div) with broadcasting, up to 4-D.
    fn binary(&self, a: &DTensor<D>, b: &DTensor<D>, code: i32) -> DataflowResult<DTensor<D>> {
        let rank = a.shape.len().max(b.shape.len());
        if rank > 4 {
            return Err(err("elementwise ops on the GPU: at most 4 dimensions"));
        }
        let (shape, sa, sb) = shapes::broadcast(&a.shape, &b.shape, 4)?;
        // Padded to rank 4, and the output's `rank` axes the last of them.
        let (&[_, d1, d2, d3], Some(out_shape)) = (shape.as_slice(), shape.get(4 - rank..)) else {
            return Err(err("elementwise ops on the GPU: at most 4 dimensions"));
        };
        let what = "elementwise op";
        let total = elements(what, &shape)?;
        let cfg = grid(what, total)?;
        let dims = [
            int(what, total)?,
            int(what, d1)?,
            int(what, d2)?,
            int(what, d3)?,
        ];
        let strides = sa
            .iter()
            .chain(&sb)
            .map(|s| int(what, *s))
            .collect::<DataflowResult<Vec<_>>>()?;
        let (a_buf, b_buf) = (a.f32()?, b.f32()?);
        holds(&self.device, a_buf, a.len()?, what)?;
        holds(&self.device, b_buf, b.len()?, what)?;
        let out = self
            .device
            .alloc_zeros::<f32>(total.max(1))
            .map_err(gpu_error)?;
        let mut args = vec![
            Arg::F32(a_buf),
            Arg::F32(b_buf),
            Arg::F32(&out),
            Arg::Int(code),
        ];
        args.extend(dims.into_iter().chain(strides).map(Arg::Int));
        // SAFETY: the kernel checks its thread index against `total`, `out`'s size; the
        // broadcast strides (0 along broadcast axes) keep the reads within `a` and `b`, whose
        // buffers hold their shapes' values (checked above).
        unsafe { self.device.launch("binary_f32", cfg, &args) }.map_err(gpu_error)?;
        Ok(DTensor::with_f32(out_shape.to_vec(), out))
    }
}

/// Squeeze, Unsqueeze or Flatten (`op`): the same values under a new shape.
fn reshaped<D: GpuDevice>(op: &str, inputs: &Inputs<'_, D>) -> DataflowResult<DTensor<D>> {
    let (node, x) = (inputs.node, inputs.get(0)?);
    let rank = x.shape.len();
    let host_axes = |i: usize| inputs.host(i);
    let shape = match op {
        "Squeeze" => shapes::squeeze(&x.shape, &axes(node, &host_axes, rank)?),
        "Unsqueeze" => shapes::unsqueeze(&x.shape, axes(node, &host_axes, rank + 1)?),
        _ => shapes::flatten(&x.shape, attr_i(node, "axis", 1)),
    };
    Ok(DTensor {
        shape,
        data: x.data.clone(),
    })
}

/// cuBLAS is column-major. Row-major C = op(A)·op(B) (m×k times k×n) is column-major
/// Cᵀ = op(B)ᵀ·op(A)ᵀ: the same buffers, passed with B first. cuBLAS takes `int`
/// dimensions: larger ones are an error naming `what`.
pub(super) fn row_major_gemm(
    what: &str,
    m: usize,
    k: usize,
    n: usize,
    ta: bool,
    tb: bool,
    alpha: f32,
) -> DataflowResult<GemmConfig<f32>> {
    let trans = |t: bool| {
        if t {
            cublasOperation_t::CUBLAS_OP_T
        } else {
            cublasOperation_t::CUBLAS_OP_N
        }
    };
    let (m, k, n) = (int(what, m)?, int(what, k)?, int(what, n)?);
    Ok(GemmConfig {
        transa: trans(tb),
        transb: trans(ta),
        m: n,
        n: m,
        k,
        alpha,
        lda: if tb { k } else { n },
        ldb: if ta { m } else { k },
        beta: 0.0f32,
        ldc: n,
    })
}
