//! The dense-graph executor on a CUDA GPU: matrix products with cuBLAS, the other ops as NVRTC
//! kernels compiled at start, weights uploaded once. Outputs must match
//! [`crate::inference::dense::DenseGraph::run_cpu`] (and so ONNX Runtime on CPU) within 1e-4; `riffle
//! gpu-check` compares them on a GPU host. Needs the CUDA driver, NVRTC and cuBLAS libraries
//! (loaded at run time; [`riffle_gpu::discover`] says whether there is a GPU at all).
//!
//! The executor (`Dense`) walks the graph and builds every launch's grid and arguments over
//! [`riffle_gpu::GpuDevice`]: [`riffle_gpu::CudaDevice`] maps it onto cudarc, and the tests
//! run the same code on the CPU kernel emulator (`riffle_gpu::emulated`, feature `emulator`).

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::cublas::{sys::cublasOperation_t, GemmConfig};
use cudarc::driver::LaunchConfig;
use riffle_dataflow::DataflowResult;
use riffle_gpu::{check_gpu, Arg, CudaDevice, Elem, GpuDevice, Kernels, Stream};

use crate::gpu_error;
use crate::inference::dense::{
    attr, attr_f, attr_i, axes, err, gather_rows_of, scatter_rows, shapes, Data, DenseGraph,
    RowShards, Tensor,
};

use tensor::{download, upload, DTensor};

/// The executor's kernels (`gpu/kernels/dense.cu`), compiled and loaded on each of its GPUs.
const KERNEL_SET: Kernels = riffle_gpu::kernels::DENSE;

/// A dense graph loaded onto one GPU, its embedding tables optionally spread over several.
pub struct CudaDense {
    dense: Dense<CudaDevice>,
}

/// The executor over any [`GpuDevice`]: the graph, its weights on `device`, and its embedding
/// tables when they are split over devices.
struct Dense<D: GpuDevice> {
    graph: DenseGraph,
    device: D,
    weights: HashMap<String, DTensor<D>>,
    tables: HashMap<String, DeviceTable<D>>,
}

/// An embedding table split by row range, part `k` on its own device.
struct DeviceTable<D: GpuDevice> {
    rows: RowShards,
    /// Values per row and the shape of a row.
    width: usize,
    row_shape: Vec<usize>,
    parts: Vec<TablePart<D>>,
}

struct TablePart<D: GpuDevice> {
    device: Arc<D>,
    values: D::Buf<f32>,
}

impl CudaDense {
    /// Compiles the kernels and uploads the weights to GPU `ordinal`.
    pub fn new(graph: DenseGraph, ordinal: usize) -> DataflowResult<CudaDense> {
        Self::with_tables_on(graph, ordinal, &[])
    }

    /// As [`CudaDense::new`], with the embedding tables split by row range over
    /// `table_devices` (one part per GPU) when it names more than one: tables larger than one
    /// GPU's memory, or kept off the GPU that runs the dense layers.
    pub fn with_tables_on(
        graph: DenseGraph,
        ordinal: usize,
        table_devices: &[usize],
    ) -> DataflowResult<CudaDense> {
        // Every GPU asked for exists before any is touched.
        check_gpu(KERNEL_SET.stage, ordinal).map_err(gpu_error)?;
        for d in table_devices {
            check_gpu(KERNEL_SET.stage, *d).map_err(gpu_error)?;
        }
        let kernels = KERNEL_SET.compile(ordinal).map_err(gpu_error)?;
        let device = CudaDevice::open(ordinal, &kernels, Stream::Default)
            .map_err(gpu_error)?
            .with_blas()
            .map_err(gpu_error)?;
        let parts = if table_devices.len() > 1 {
            table_devices
                .iter()
                .map(|d| CudaDevice::open(*d, &kernels, Stream::Default).map_err(gpu_error))
                .collect::<DataflowResult<_>>()?
        } else {
            Vec::new()
        };
        Ok(CudaDense {
            dense: Dense::new(graph, device, parts)?,
        })
    }

    /// The graph's output names, in the order [`CudaDense::run`] returns them.
    pub fn output_names(&self) -> &[String] {
        &self.dense.graph.outputs
    }

    /// Runs the graph on the GPU: inputs from host memory, outputs back to it.
    pub fn run(&self, inputs: &[(&str, Tensor)]) -> DataflowResult<Vec<Tensor>> {
        self.dense.run(inputs)
    }
}

/// `v` as a kernel's `int` argument. The kernels index with `int`: a count past `i32::MAX`
/// is refused here rather than wrapped into a launch that reads the wrong elements.
fn int(what: &str, v: usize) -> DataflowResult<i32> {
    i32::try_from(v).map_err(|_| {
        err(format!(
            "{what}: {v} elements is more than one GPU kernel launch indexes (at most {})",
            i32::MAX
        ))
    })
}

/// The launch grid for `n` threads (at least one block), `n` checked as [`int`] does.
fn grid(what: &str, n: usize) -> DataflowResult<LaunchConfig> {
    let n = int(what, n.max(1))?;
    let n = u32::try_from(n).map_err(|_| err(format!("{what}: {n} threads")))?;
    Ok(LaunchConfig::for_num_elems(n))
}

/// `a · b`, an error when it overflows.
fn mul(what: &str, a: usize, b: usize) -> DataflowResult<usize> {
    a.checked_mul(b)
        .ok_or_else(|| err(format!("{what}: {a} × {b} elements overflows")))
}

/// The elements of `shape`, an error when their count overflows.
fn elements(what: &str, shape: &[usize]) -> DataflowResult<usize> {
    shape.iter().try_fold(1, |n, &d| mul(what, n, d))
}

/// An error unless `buf` holds at least the `n` values a kernel will be told it has: a tensor
/// whose data does not match its shape would be read or written past its end. (The CPU
/// executor refuses such tensors as it reads them.)
fn holds<D: GpuDevice, T: Elem>(
    device: &D,
    buf: &D::Buf<T>,
    n: usize,
    what: &str,
) -> DataflowResult<()> {
    let len = device.buf_len(buf);
    if len < n {
        return Err(err(format!(
            "{what}: the data does not match its shape ({n} values expected, {len} on the GPU)"
        )));
    }
    Ok(())
}

/// Rows `local` (each within `table`, `width` values a row) gathered into a new buffer.
fn gather_rows<D: GpuDevice>(
    device: &D,
    table: &D::Buf<f32>,
    local: &[i64],
    width: usize,
) -> DataflowResult<D::Buf<f32>> {
    let what = "Gather";
    let total = mul(what, local.len(), width)?;
    let (width_arg, total_arg) = (int(what, width)?, int(what, total)?);
    let cfg = grid(what, total)?;
    // Every row read must lie within the table's buffer, as the CPU executor checks.
    let rows = local
        .iter()
        .map(|&r| usize::try_from(r).map_err(|_| err(format!("{what}: row {r} is negative"))))
        .try_fold(0, |most, r| r.map(|r| most.max(r + 1)))?;
    holds(device, table, mul(what, rows, width)?, "Gather: the table")?;
    let idx = device.upload(local).map_err(gpu_error)?;
    let out = device.alloc_zeros::<f32>(total.max(1)).map_err(gpu_error)?;
    let args = [
        Arg::F32(table),
        Arg::I64(&idx),
        Arg::F32(&out),
        Arg::Int(width_arg),
        Arg::Int(total_arg),
    ];
    // SAFETY: the kernel checks its thread index against `total`; `out` holds `total` values,
    // `idx` one per row of them, and every row of `idx` lies within `table` (checked above).
    unsafe { device.launch("gather_f32", cfg, &args) }.map_err(gpu_error)?;
    Ok(out)
}

impl<D: GpuDevice> Dense<D> {
    /// Uploads the weights to `device`. With more than one of `table_devices`, the embedding
    /// tables are split by row range into as many parts, part `k` uploaded to
    /// `table_devices[k]`, and the host copies dropped (these tables can be large).
    fn new(mut graph: DenseGraph, device: D, table_devices: Vec<D>) -> DataflowResult<Dense<D>> {
        if table_devices.len() > 1 {
            graph.split_tables(table_devices.len())?;
        }
        let mut weights = HashMap::new();
        for (name, t) in &graph.weights {
            weights.insert(name.clone(), upload(&device, t)?);
        }
        let table_devices: Vec<Arc<D>> = table_devices.into_iter().map(Arc::new).collect();
        let mut tables = HashMap::new();
        for (name, split) in std::mem::take(&mut graph.split) {
            let row_shape = split
                .parts
                .first()
                .and_then(|p| p.shape.get(1..))
                .map(<[usize]>::to_vec)
                .unwrap_or_default();
            let mut parts = Vec::with_capacity(split.parts.len());
            for (k, part) in split.parts.iter().enumerate() {
                let device = table_devices
                    .get(k)
                    .ok_or_else(|| err(format!("table `{name}`: no device for part {k}")))?;
                parts.push(TablePart {
                    values: device.upload(part.as_f32()?).map_err(gpu_error)?,
                    device: device.clone(),
                });
            }
            tables.insert(
                name,
                DeviceTable {
                    rows: split.rows,
                    width: row_shape.iter().product(),
                    row_shape,
                    parts,
                },
            );
        }
        Ok(Dense {
            graph,
            device,
            weights,
            tables,
        })
    }

    /// A Gather from a table split over devices: each part's device gathers its rows, which
    /// come back through the host into one tensor on the main device. (Peer-to-peer copies
    /// would skip the host; the rows are few next to the tables.)
    fn gather_split(&self, table: &DeviceTable<D>, indices: &Tensor) -> DataflowResult<DTensor<D>> {
        let routes = table.rows.route(indices.as_i64()?)?;
        let width = table.width;
        let n = mul("Gather", elements("Gather", &indices.shape)?, width)?;
        // Refused before the host buffer is allocated: no kernel could fill it.
        int("Gather", n)?;
        let mut host = vec![0f32; n];
        for (part, route) in table.parts.iter().zip(&routes) {
            if route.local.is_empty() || width == 0 {
                continue;
            }
            let device = part.device.as_ref();
            let total = mul("Gather", route.local.len(), width)?;
            let out = gather_rows(device, &part.values, &route.local, width)?;
            let rows = device.download(&out, total).map_err(gpu_error)?;
            scatter_rows(&mut host, width, &route.positions, &rows)?;
        }
        let mut shape = indices.shape.clone();
        shape.extend_from_slice(&table.row_shape);
        upload(&self.device, &Tensor::f32(shape, host))
    }

    /// Runs the graph: inputs from host memory, outputs back to it.
    fn run(&self, inputs: &[(&str, Tensor)]) -> DataflowResult<Vec<Tensor>> {
        // Small integer tensors (axes) are also kept on the host, where the ops read them.
        let mut host: HashMap<String, Tensor> = self
            .graph
            .weights
            .iter()
            .filter(|(_, t)| matches!(t.data, Data::I64(_)))
            .map(|(n, t)| (n.clone(), t.clone()))
            .collect();
        let mut values: HashMap<String, DTensor<D>> = HashMap::new();
        for (name, t) in inputs {
            values.insert(name.to_string(), upload(&self.device, t)?);
            host.insert(name.to_string(), t.clone());
        }
        for node in &self.graph.nodes {
            let out_name = node
                .output
                .first()
                .ok_or_else(|| err(format!("{} has no output", node.op_type)))?
                .clone();
            if node.op_type == "Constant" {
                let t = attr(node, "value")
                    .and_then(|a| a.t.as_ref())
                    .ok_or_else(|| err("Constant without a tensor `value`"))?;
                let t = Tensor::from_proto(t)?;
                values.insert(out_name.clone(), upload(&self.device, &t)?);
                host.insert(out_name, t);
                continue;
            }
            let get = |i: usize| -> DataflowResult<&DTensor<D>> {
                let name = node
                    .input
                    .get(i)
                    .ok_or_else(|| err(format!("{}: missing input {i}", node.op_type)))?;
                values
                    .get(name)
                    .or_else(|| self.weights.get(name))
                    .ok_or_else(|| err(format!("{}: no value `{name}`", node.op_type)))
            };
            let host_get = |i: usize| -> DataflowResult<&Tensor> {
                let name = node
                    .input
                    .get(i)
                    .ok_or_else(|| err(format!("{}: missing input {i}", node.op_type)))?;
                host.get(name)
                    .ok_or_else(|| err(format!("{}: `{name}` must be a constant", node.op_type)))
            };
            let split = node
                .input
                .first()
                .and_then(|n| self.tables.get(n))
                .filter(|_| node.op_type == "Gather");
            let out = match split {
                Some(table) => {
                    let indices = match host_get(1) {
                        Ok(t) => t.clone(),
                        Err(_) => download(&self.device, get(1)?)?,
                    };
                    self.gather_split(table, &indices)?
                }
                None => self.run_node(node, &get, &host_get)?,
            };
            values.insert(out_name, out);
        }
        self.graph
            .outputs
            .iter()
            .map(|o| {
                let t = values
                    .get(o)
                    .ok_or_else(|| err(format!("output `{o}` was not computed")))?;
                download(&self.device, t)
            })
            .collect()
    }

    fn run_node<'a>(
        &self,
        node: &crate::inference::dense::proto::NodeProto,
        get: &dyn Fn(usize) -> DataflowResult<&'a DTensor<D>>,
        host_get: &dyn Fn(usize) -> DataflowResult<&'a Tensor>,
    ) -> DataflowResult<DTensor<D>> {
        let op = node.op_type.as_str();
        let device = &self.device;
        let reshape = |x: &DTensor<D>, shape: Vec<usize>| DTensor {
            shape,
            data: x.data.clone(),
        };
        Ok(match op {
            "Identity" => get(0)?.clone(),
            "Gather" => {
                let (data, indices) = (get(0)?, get(1)?);
                // Indices are checked and negative ones wrapped on the host: the kernel must
                // never read outside the table. They are graph inputs, so already there, except
                // when the graph computes them.
                let host_idx = match host_get(1) {
                    Ok(t) => t.clone(),
                    Err(_) => download(device, indices)?,
                };
                let local: Vec<i64> = gather_rows_of(node, &data.shape, host_idx.as_i64()?)?
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
                DTensor::with_f32(shape, out)
            }
            "Add" | "Sub" | "Mul" | "Div" => {
                let code = match op {
                    "Add" => 0,
                    "Sub" => 1,
                    "Mul" => 2,
                    _ => 3,
                };
                self.binary(get(0)?, get(1)?, code)?
            }
            "Relu" | "Sigmoid" => {
                let x = get(0)?;
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
                // SAFETY: the kernel checks its thread index against `n`, and both buffers
                // hold `n` values (checked above).
                unsafe { device.launch("unary_f32", cfg, &args) }.map_err(gpu_error)?;
                DTensor::with_f32(x.shape.clone(), out)
            }
            "ReduceSum" => {
                let x = get(0)?;
                let rank = x.shape.len();
                let host_axes = |i: usize| host_get(i);
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
                // SAFETY: the kernel checks its thread index against `outer`; `out` holds
                // `outer` values and `x` `outer * inner` (checked above).
                unsafe { device.launch("reduce_inner_f32", cfg, &args) }.map_err(gpu_error)?;
                let mut shape = kept.to_vec();
                if attr_i(node, "keepdims", 1) != 0 {
                    shape.extend(std::iter::repeat_n(1, rank - first));
                }
                DTensor::with_f32(shape, out)
            }
            "Squeeze" | "Unsqueeze" | "Flatten" => {
                let x = get(0)?;
                let rank = x.shape.len();
                let host_axes = |i: usize| host_get(i);
                let shape = match op {
                    "Squeeze" => shapes::squeeze(&x.shape, &axes(node, &host_axes, rank)?),
                    "Unsqueeze" => shapes::unsqueeze(&x.shape, axes(node, &host_axes, rank + 1)?),
                    _ => shapes::flatten(&x.shape, attr_i(node, "axis", 1)),
                };
                reshape(x, shape)
            }
            "Concat" => {
                let parts: Vec<&DTensor<D>> = (0..node.input.len())
                    .map(get)
                    .collect::<DataflowResult<_>>()?;
                let part_shapes: Vec<&[usize]> = parts.iter().map(|p| p.shape.as_slice()).collect();
                let (axis, outer, shape) = shapes::concat(&part_shapes, attr_i(node, "axis", 0))?;
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
                    // SAFETY: the kernel checks its thread index against `outer * chunk`, the
                    // part's size (which its buffer holds, checked above); it writes row `o` at
                    // `o * dst_chunk + offset` and on, up to `offset + chunk <= dst_chunk`,
                    // within `out`'s `outer * dst_chunk`, which fits an `int`.
                    unsafe { device.launch("copy_block_f32", cfg, &args) }.map_err(gpu_error)?;
                }
                DTensor::with_f32(shape, out)
            }
            "Gemm" | "MatMul" => {
                let (a, b) = (get(0)?, get(1)?);
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
                // SAFETY: the dimensions and leading dimensions above describe the buffers,
                // which hold that many values (checked above).
                unsafe { device.gemm(cfg, b_buf, a_buf, &mut out) }.map_err(gpu_error)?;
                let product = DTensor::with_f32(vec![m, n], out);
                if gemm && node.input.get(2).is_some_and(|name| !name.is_empty()) {
                    self.binary(&product, get(2)?, 0)?
                } else {
                    product
                }
            }
            other => return Err(err(format!("op `{other}` is not supported on the GPU"))),
        })
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

/// cuBLAS is column-major. Row-major C = op(A)·op(B) (m×k times k×n) is column-major
/// Cᵀ = op(B)ᵀ·op(A)ᵀ: the same buffers, passed with B first. cuBLAS takes `int`
/// dimensions: larger ones are an error naming `what`.
fn row_major_gemm(
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

mod tensor;
#[cfg(test)]
mod tests;
