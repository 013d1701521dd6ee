//! The dense-graph executor on a CUDA GPU: matrix products with cuBLAS, the other ops as NVRTC
//! kernels compiled at start, weights uploaded once. Outputs must match
//! [`crate::dense::DenseGraph::run_cpu`] (and so ONNX Runtime on CPU) within 1e-4; `riffle
//! gpu-check` compares them on a GPU host. Needs the CUDA driver, NVRTC and cuBLAS libraries
//! (loaded at run time; [`crate::gpu::discover`] says whether there is a GPU at all).
//!
//! The executor (`Dense`) walks the graph and builds every launch's grid and arguments over
//! the `Device` trait of `crate::cuda_device`: `CudaDevice` maps it onto cudarc, and the tests
//! run the same code on the CPU kernel emulator (`crate::kernel_emulation`).

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::cublas::{sys::cublasOperation_t, GemmConfig};
use cudarc::driver::LaunchConfig;
use riffle_dataflow::DataflowResult;

use crate::cuda_device::{check_gpu, Arg, CudaDevice, Device, Kernels, Stream};
use crate::dense::{
    attr, attr_f, attr_i, axes, err, gather_rows_of, scatter_rows, shapes, Data, DenseGraph,
    RowShards, Tensor,
};

const KERNELS: &str = r#"
extern "C" __global__ void gather_f32(const float* data, const long long* idx, float* out,
                                      int width, int total) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= total) return;
    int r = t / width, c = t % width;
    out[t] = data[idx[r] * width + c];
}
extern "C" __global__ void binary_f32(const float* a, const float* b, float* out, int op, int total,
                                      int d1, int d2, int d3,
                                      int sa0, int sa1, int sa2, int sa3,
                                      int sb0, int sb1, int sb2, int sb3) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= total) return;
    int i3 = t % d3; int r = t / d3;
    int i2 = r % d2; r /= d2;
    int i1 = r % d1; int i0 = r / d1;
    float x = a[i0 * sa0 + i1 * sa1 + i2 * sa2 + i3 * sa3];
    float y = b[i0 * sb0 + i1 * sb1 + i2 * sb2 + i3 * sb3];
    out[t] = op == 0 ? x + y : op == 1 ? x - y : op == 2 ? x * y : x / y;
}
extern "C" __global__ void unary_f32(const float* x, float* out, int op, int n) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n) return;
    float v = x[t];
    out[t] = op == 0 ? fmaxf(v, 0.0f) : 1.0f / (1.0f + expf(-v));
}
extern "C" __global__ void reduce_inner_f32(const float* x, float* out, int outer, int inner) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= outer) return;
    float acc = 0.0f;
    for (int j = 0; j < inner; ++j) acc += x[t * inner + j];
    out[t] = acc;
}
extern "C" __global__ void copy_block_f32(const float* src, float* dst, int outer, int chunk,
                                          int dst_chunk, int offset) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= outer * chunk) return;
    int o = t / chunk, c = t % chunk;
    dst[o * dst_chunk + offset + c] = src[t];
}
"#;

/// The kernels of [`KERNELS`], by name.
const KERNEL_NAMES: [&str; 5] = [
    "gather_f32",
    "binary_f32",
    "unary_f32",
    "reduce_inner_f32",
    "copy_block_f32",
];

/// The executor's kernels, compiled and loaded on each of its GPUs.
const KERNEL_SET: Kernels = Kernels {
    stage: "dense",
    source: KERNELS,
    names: &KERNEL_NAMES,
};

enum DData<D: Device> {
    F32(Arc<D::Buf<f32>>),
    I64(Arc<D::Buf<i64>>),
}

// By hand: derived, they would ask for `D: Clone`.
impl<D: Device> Clone for DData<D> {
    fn clone(&self) -> Self {
        match self {
            DData::F32(s) => DData::F32(s.clone()),
            DData::I64(s) => DData::I64(s.clone()),
        }
    }
}

/// A tensor on a device.
struct DTensor<D: Device> {
    shape: Vec<usize>,
    data: DData<D>,
}

impl<D: Device> Clone for DTensor<D> {
    fn clone(&self) -> Self {
        DTensor {
            shape: self.shape.clone(),
            data: self.data.clone(),
        }
    }
}

impl<D: Device> DTensor<D> {
    fn len(&self) -> usize {
        self.shape.iter().product()
    }

    fn f32(&self) -> DataflowResult<&D::Buf<f32>> {
        match &self.data {
            DData::F32(s) => Ok(s),
            DData::I64(_) => Err(err("expected a float tensor on the GPU, found int64")),
        }
    }

    fn with_f32(shape: Vec<usize>, buf: D::Buf<f32>) -> DTensor<D> {
        DTensor {
            shape,
            data: DData::F32(Arc::new(buf)),
        }
    }
}

/// A dense graph loaded onto one GPU, its embedding tables optionally spread over several.
pub struct CudaDense {
    dense: Dense<CudaDevice>,
}

/// The executor over any [`Device`]: the graph, its weights on `device`, and its embedding
/// tables when they are split over devices.
struct Dense<D: Device> {
    graph: DenseGraph,
    device: D,
    weights: HashMap<String, DTensor<D>>,
    tables: HashMap<String, DeviceTable<D>>,
}

/// An embedding table split by row range, part `k` on its own device.
struct DeviceTable<D: Device> {
    rows: RowShards,
    /// Values per row and the shape of a row.
    width: usize,
    row_shape: Vec<usize>,
    parts: Vec<TablePart<D>>,
}

struct TablePart<D: Device> {
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
        check_gpu(KERNEL_SET.stage, ordinal)?;
        for d in table_devices {
            check_gpu(KERNEL_SET.stage, *d)?;
        }
        let kernels = KERNEL_SET.compile(ordinal)?;
        let device = CudaDevice::open(ordinal, &kernels, Stream::Default)?.with_blas()?;
        let parts = if table_devices.len() > 1 {
            table_devices
                .iter()
                .map(|d| CudaDevice::open(*d, &kernels, Stream::Default))
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

/// Rows `local` (each within `table`, `width` values a row) gathered into a new buffer.
fn gather_rows<D: Device>(
    device: &D,
    table: &D::Buf<f32>,
    local: &[i64],
    width: usize,
) -> DataflowResult<D::Buf<f32>> {
    let total = local.len() * width;
    let idx = device.upload(local)?;
    let out = device.alloc_zeros::<f32>(total)?;
    let args = [
        Arg::F32(table),
        Arg::I64(&idx),
        Arg::F32(&out),
        Arg::Int(width as i32),
        Arg::Int(total as i32),
    ];
    // SAFETY: the kernel checks its thread index against `total`; `out` holds `total` values,
    // `idx` one per row of them, and the callers give only rows of `table` (indices checked and
    // wrapped, or routed to their part, on the host).
    unsafe {
        device.launch(
            "gather_f32",
            LaunchConfig::for_num_elems(total as u32),
            &args,
        )
    }?;
    Ok(out)
}

impl<D: Device> Dense<D> {
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
                .map(|p| p.shape[1..].to_vec())
                .unwrap_or_default();
            let mut parts = Vec::with_capacity(split.parts.len());
            for (k, part) in split.parts.iter().enumerate() {
                let device = table_devices
                    .get(k)
                    .ok_or_else(|| err(format!("table `{name}`: no device for part {k}")))?;
                parts.push(TablePart {
                    values: device.upload(part.as_f32()?)?,
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
        let mut host = vec![0f32; indices.len() * width];
        for (part, route) in table.parts.iter().zip(&routes) {
            if route.local.is_empty() || width == 0 {
                continue;
            }
            let device = part.device.as_ref();
            let total = route.local.len() * width;
            let out = gather_rows(device, &part.values, &route.local, width)?;
            let rows = device.download(&out, total)?;
            scatter_rows(&mut host, width, &route.positions, &rows);
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
        node: &crate::dense::proto::NodeProto,
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
                let width: usize = data.shape[1..].iter().product();
                let total = indices.len() * width;
                let out = if total > 0 {
                    gather_rows(device, data.f32()?, &local, width)?
                } else {
                    device.alloc_zeros::<f32>(1)?
                };
                let mut shape = indices.shape.clone();
                shape.extend_from_slice(&data.shape[1..]);
                DTensor::with_f32(shape, out)
            }
            "Add" | "Sub" | "Mul" | "Div" => {
                let code = ["Add", "Sub", "Mul", "Div"]
                    .iter()
                    .position(|o| *o == op)
                    .unwrap_or(0) as i32;
                self.binary(get(0)?, get(1)?, code)?
            }
            "Relu" | "Sigmoid" => {
                let x = get(0)?;
                let n = x.len();
                let out = device.alloc_zeros::<f32>(n.max(1))?;
                let args = [
                    Arg::F32(x.f32()?),
                    Arg::F32(&out),
                    Arg::Int(i32::from(op == "Sigmoid")),
                    Arg::Int(n as i32),
                ];
                // SAFETY: the kernel checks its thread index against `n`, and both buffers
                // hold `n` values.
                unsafe {
                    device.launch(
                        "unary_f32",
                        LaunchConfig::for_num_elems(n.max(1) as u32),
                        &args,
                    )
                }?;
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
                let outer: usize = x.shape[..first].iter().product();
                let inner: usize = x.shape[first..].iter().product();
                let out = device.alloc_zeros::<f32>(outer.max(1))?;
                let args = [
                    Arg::F32(x.f32()?),
                    Arg::F32(&out),
                    Arg::Int(outer as i32),
                    Arg::Int(inner as i32),
                ];
                // SAFETY: the kernel checks its thread index against `outer`; `out` holds
                // `outer` values and `x` `outer * inner`.
                unsafe {
                    device.launch(
                        "reduce_inner_f32",
                        LaunchConfig::for_num_elems(outer.max(1) as u32),
                        &args,
                    )
                }?;
                let mut shape = x.shape[..first].to_vec();
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
                let dst_chunk: usize = shape[axis..].iter().product();
                let out = device.alloc_zeros::<f32>((outer * dst_chunk).max(1))?;
                let mut offset = 0usize;
                for p in &parts {
                    let chunk: usize = p.shape[axis..].iter().product();
                    let args = [
                        Arg::F32(p.f32()?),
                        Arg::F32(&out),
                        Arg::Int(outer as i32),
                        Arg::Int(chunk as i32),
                        Arg::Int(dst_chunk as i32),
                        Arg::Int(offset as i32),
                    ];
                    // SAFETY: the kernel checks its thread index against `outer * chunk`, the
                    // part's size; it writes row `o` at `o * dst_chunk + offset` and on, up to
                    // `offset + chunk <= dst_chunk`, within `out`'s `outer * dst_chunk`.
                    unsafe {
                        device.launch(
                            "copy_block_f32",
                            LaunchConfig::for_num_elems((outer * chunk).max(1) as u32),
                            &args,
                        )
                    }?;
                    offset += chunk;
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
                let mut out = device.alloc_zeros::<f32>((m * n).max(1))?;
                let cfg = row_major_gemm(m, k, n, ta, tb, alpha);
                // SAFETY: the dimensions and leading dimensions above describe the buffers.
                unsafe { device.gemm(cfg, b.f32()?, a.f32()?, &mut out) }?;
                let product = DTensor::with_f32(vec![m, n], out);
                if gemm && node.input.len() > 2 && !node.input[2].is_empty() {
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
        let total: usize = shape.iter().product();
        let out = self.device.alloc_zeros::<f32>(total.max(1))?;
        let mut args = vec![
            Arg::F32(a.f32()?),
            Arg::F32(b.f32()?),
            Arg::F32(&out),
            Arg::Int(code),
            Arg::Int(total as i32),
            Arg::Int(shape[1] as i32),
            Arg::Int(shape[2] as i32),
            Arg::Int(shape[3] as i32),
        ];
        args.extend(sa.iter().chain(&sb).map(|s| Arg::Int(*s as i32)));
        // SAFETY: the kernel checks its thread index against `total`, `out`'s size; the
        // broadcast strides (0 along broadcast axes) keep the reads within `a` and `b`.
        unsafe {
            self.device.launch(
                "binary_f32",
                LaunchConfig::for_num_elems(total.max(1) as u32),
                &args,
            )
        }?;
        Ok(DTensor::with_f32(shape[4 - rank..].to_vec(), out))
    }
}

/// cuBLAS is column-major. Row-major C = op(A)·op(B) (m×k times k×n) is column-major
/// Cᵀ = op(B)ᵀ·op(A)ᵀ: the same buffers, passed with B first.
fn row_major_gemm(m: usize, k: usize, n: usize, ta: bool, tb: bool, alpha: f32) -> GemmConfig<f32> {
    let op = |t: bool| {
        if t {
            cublasOperation_t::CUBLAS_OP_T
        } else {
            cublasOperation_t::CUBLAS_OP_N
        }
    };
    GemmConfig {
        transa: op(tb),
        transb: op(ta),
        m: n as i32,
        n: m as i32,
        k: k as i32,
        alpha,
        lda: if tb { k as i32 } else { n as i32 },
        ldb: if ta { m as i32 } else { k as i32 },
        beta: 0.0f32,
        ldc: n as i32,
    }
}

fn upload<D: Device>(device: &D, t: &Tensor) -> DataflowResult<DTensor<D>> {
    let data = match &t.data {
        Data::F32(v) => DData::F32(Arc::new(device.upload(v)?)),
        Data::I64(v) => DData::I64(Arc::new(device.upload(v)?)),
    };
    Ok(DTensor {
        shape: t.shape.clone(),
        data,
    })
}

/// `t` in host memory (its buffer may be longer: empty tensors get one element).
fn download<D: Device>(device: &D, t: &DTensor<D>) -> DataflowResult<Tensor> {
    Ok(match &t.data {
        DData::F32(s) => Tensor::f32(t.shape.clone(), device.download(s, t.len())?),
        DData::I64(s) => Tensor::i64(t.shape.clone(), device.download(s, t.len())?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The arguments given to cuBLAS compute the row-major product for every transpose
    /// combination (checked against the CPU executor's Gemm).
    #[test]
    fn gemm_arguments_give_the_row_major_product() {
        let (m, k, n) = (3, 4, 5);
        let a: Vec<f32> = (0..m * k).map(|v| v as f32 * 0.5 - 2.0).collect();
        let b: Vec<f32> = (0..k * n).map(|v| (v % 7) as f32 - 3.0).collect();
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            // Row-major A is m×k (k×m stored when transposed), B k×n (n×k when transposed).
            let (a_shape, b_shape) = (
                if ta { vec![k, m] } else { vec![m, k] },
                if tb { vec![n, k] } else { vec![k, n] },
            );
            let graph_gemm = |x: &Tensor, y: &Tensor| -> Vec<f32> {
                let node = crate::dense::proto::NodeProto {
                    input: vec!["a".into(), "b".into()],
                    output: vec!["c".into()],
                    op_type: "Gemm".into(),
                    attribute: vec![
                        crate::dense::proto::AttributeProto {
                            name: "transA".into(),
                            i: i64::from(ta),
                            ..Default::default()
                        },
                        crate::dense::proto::AttributeProto {
                            name: "transB".into(),
                            i: i64::from(tb),
                            ..Default::default()
                        },
                    ],
                };
                let graph = DenseGraph {
                    nodes: vec![node],
                    weights: HashMap::new(),
                    split: HashMap::new(),
                    inputs: vec!["a".into(), "b".into()],
                    outputs: vec!["c".into()],
                    input_specs: Vec::new(),
                    output_specs: Vec::new(),
                };
                let out = graph
                    .run_cpu(&[("a", x.clone()), ("b", y.clone())])
                    .unwrap();
                out[0].as_f32().unwrap().to_vec()
            };
            let expected = graph_gemm(
                &Tensor::f32(a_shape, a.clone()),
                &Tensor::f32(b_shape, b.clone()),
            );
            let cfg = row_major_gemm(m, k, n, ta, tb, 1.0);
            let mut c = vec![0f32; m * n];
            // As the executor calls it: B's buffer first.
            sgemm_reference(&cfg, &b, &a, &mut c);
            assert_eq!(c, expected, "transA {ta}, transB {tb}");
        }
    }

    /// Where NVRTC is installed (a GPU host, or the `nvidia-cuda-nvrtc` wheel on the library
    /// path), the kernels compile; elsewhere the executor refuses to start with a reason.
    #[test]
    fn kernels_compile_where_nvrtc_is_present() {
        // SAFETY: only tries to dlopen the NVRTC library by its usual names.
        crate::gpu::expect_nvrtc_where_asked();
        if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            let ptx = cudarc::nvrtc::compile_ptx(KERNELS).unwrap().to_src();
            for name in KERNEL_NAMES {
                assert!(ptx.contains(&format!(".entry {name}(")), "{name} missing");
            }
        }
        if let Err(why) = crate::gpu::discover() {
            let graph = DenseGraph {
                nodes: Vec::new(),
                weights: HashMap::new(),
                split: HashMap::new(),
                inputs: Vec::new(),
                outputs: Vec::new(),
                input_specs: Vec::new(),
                output_specs: Vec::new(),
            };
            let e = CudaDense::new(graph, 0).err().expect("no GPU here");
            assert!(e.to_string().contains(&why), "{e}");
        }
    }

    // The kernels executed on the CPU (crate::kernel_emulation): `KERNELS` compiled by g++ and
    // launched by the executor itself (`Dense`, which `CudaDense` runs) on an emulated
    // `Device` (`crate::cuda_device::emulated`), with cuBLAS's part done on the host by
    // `sgemm_reference`; the results compared with the CPU executor's.

    use crate::cuda_device::emulated::{sgemm_reference, Emulated};
    use crate::dense::proto::{AttributeProto, NodeProto};
    use crate::kernel_emulation::Emulator;

    /// `CudaDense::with_tables_on` with `table_devices` emulated table devices.
    fn emulated_dense(
        emulator: &Emulator,
        graph: DenseGraph,
        table_devices: usize,
    ) -> DataflowResult<Dense<Emulated<'_>>> {
        let parts = if table_devices > 1 {
            (0..table_devices)
                .map(|_| Emulated::new(emulator, KERNEL_SET.stage))
                .collect()
        } else {
            Vec::new()
        };
        Dense::new(graph, Emulated::new(emulator, KERNEL_SET.stage), parts)
    }

    /// Deterministic values in ±[0.25, 4.25): no zero divisors, both signs.
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..n)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let v = 0.25 + (state >> 40) as f32 / (1u64 << 24) as f32 * 4.0;
                if state & 1 == 0 {
                    v
                } else {
                    -v
                }
            })
            .collect()
    }

    fn random(shape: &[usize], seed: u64) -> Tensor {
        Tensor::f32(shape.to_vec(), values(shape.iter().product(), seed))
    }

    fn int_attr(name: &str, i: i64) -> AttributeProto {
        AttributeProto {
            name: name.into(),
            i,
            ..Default::default()
        }
    }

    fn ints_attr(name: &str, ints: &[i64]) -> AttributeProto {
        AttributeProto {
            name: name.into(),
            ints: ints.to_vec(),
            ..Default::default()
        }
    }

    /// One node reading `inputs` (graph inputs named `x0`, `x1`, ...).
    struct Case {
        label: String,
        node: NodeProto,
        inputs: Vec<Tensor>,
    }

    impl Case {
        fn new(
            label: String,
            op: &str,
            attribute: Vec<AttributeProto>,
            inputs: Vec<Tensor>,
        ) -> Case {
            let node = NodeProto {
                input: (0..inputs.len()).map(|i| format!("x{i}")).collect(),
                output: vec!["y".into()],
                op_type: op.into(),
                attribute,
            };
            Case {
                label,
                node,
                inputs,
            }
        }

        fn graph(&self) -> DenseGraph {
            DenseGraph {
                nodes: vec![self.node.clone()],
                weights: HashMap::new(),
                split: HashMap::new(),
                inputs: self.node.input.clone(),
                outputs: vec!["y".into()],
                input_specs: Vec::new(),
                output_specs: Vec::new(),
            }
        }

        /// The emulated kernels' output against the CPU executor's: `Err` says how they differ.
        fn check(&self, emulator: &Emulator) -> Result<(), String> {
            let names = self.graph().inputs;
            let inputs: Vec<(&str, Tensor)> = names
                .iter()
                .map(String::as_str)
                .zip(self.inputs.iter().cloned())
                .collect();
            let expected = self.graph().run_cpu(&inputs).unwrap().remove(0);
            let got = emulated_dense(emulator, self.graph(), 1)
                .and_then(|dense| dense.run(&inputs))
                .map_err(|e| format!("{}: {e}", self.label))?
                .remove(0);
            same(&self.label, &got, &expected)
        }
    }

    /// Equal shapes, values within 1e-6.
    fn same(label: &str, got: &Tensor, expected: &Tensor) -> Result<(), String> {
        if got.shape != expected.shape {
            return Err(format!(
                "{label}: shape {:?}, expected {:?}",
                got.shape, expected.shape
            ));
        }
        let (g, e) = (got.as_f32().unwrap(), expected.as_f32().unwrap());
        for (i, (x, y)) in g.iter().zip(e).enumerate() {
            if !((x - y).abs() <= 1e-6 || (x.is_nan() && y.is_nan())) {
                return Err(format!("{label}: element {i} is {x}, expected {y}"));
            }
        }
        Ok(())
    }

    fn check_all(emulator: &Emulator, cases: &[Case]) {
        for case in cases {
            case.check(emulator).unwrap();
        }
    }

    fn gather_cases() -> Vec<Case> {
        // (table shape, index shape): totals around and past one 1024-thread block.
        let shapes: [(&[usize], &[usize]); 6] = [
            (&[7, 3, 5], &[2, 3]),
            (&[300, 7], &[13, 17]),
            (&[2000, 1], &[1500]),
            (&[5], &[4]),
            (&[4, 2], &[]),
            (&[9, 1, 1, 3], &[1, 11]),
        ];
        shapes
            .iter()
            .enumerate()
            .map(|(k, (table, idx))| {
                let rows = table[0] as u64;
                let n: usize = idx.iter().product();
                let mut state = 0x5851_f42d_4c95_7f2du64 + k as u64;
                let indices: Vec<i64> = (0..n)
                    .map(|_| {
                        state = state
                            .wrapping_mul(6_364_136_223_846_793_005)
                            .wrapping_add(1_442_695_040_888_963_407);
                        let row = ((state >> 33) % rows) as i64;
                        // Some negative (from the end, as ONNX allows): the host wraps them.
                        if state >> 62 == 0 {
                            row - rows as i64
                        } else {
                            row
                        }
                    })
                    .collect();
                Case::new(
                    format!("Gather {table:?}[{idx:?}]"),
                    "Gather",
                    Vec::new(),
                    vec![random(table, k as u64), Tensor::i64(idx.to_vec(), indices)],
                )
            })
            .collect()
    }

    fn binary_cases() -> Vec<Case> {
        let pairs: [(&[usize], &[usize]); 9] = [
            (&[2, 1, 3, 1], &[1, 4, 1, 5]),
            (&[1, 4, 1, 5], &[2, 1, 3, 1]),
            (&[3, 1, 7], &[5, 1]),
            (&[37, 29], &[29]),
            (&[37, 29], &[37, 1]),
            (&[1], &[2, 3, 4, 5]),
            (&[2, 3, 4, 5], &[2, 3, 4, 5]),
            (&[], &[33, 33]),
            (&[3, 1, 5, 1], &[3, 7, 1, 11]),
        ];
        let mut cases = Vec::new();
        for (k, (a, b)) in pairs.iter().enumerate() {
            for op in ["Add", "Sub", "Mul", "Div"] {
                cases.push(Case::new(
                    format!("{op} {a:?} {b:?}"),
                    op,
                    Vec::new(),
                    vec![random(a, 2 * k as u64), random(b, 2 * k as u64 + 1)],
                ));
            }
        }
        cases
    }

    fn unary_cases() -> Vec<Case> {
        let shapes: [&[usize]; 6] = [&[1], &[5], &[1023], &[1024], &[3, 7, 49], &[2049]];
        let mut cases = Vec::new();
        for (k, shape) in shapes.iter().enumerate() {
            for op in ["Relu", "Sigmoid"] {
                let mut x = random(shape, 40 + k as u64);
                if let Data::F32(v) = &mut x.data {
                    // Saturating and signed-zero inputs too.
                    for (slot, s) in v.iter_mut().zip([-100.0, 100.0, 0.0, -0.0, 20.0]) {
                        *slot = s;
                    }
                }
                cases.push(Case::new(
                    format!("{op} {shape:?}"),
                    op,
                    Vec::new(),
                    vec![x],
                ));
            }
        }
        cases
    }

    fn reduce_cases() -> Vec<Case> {
        // (shape, axes, keepdims); axes empty: all of them.
        let cases: [(&[usize], &[i64], i64); 9] = [
            (&[], &[], 1),
            (&[], &[], 0),
            (&[3, 5, 7], &[2], 1),
            (&[3, 5, 7], &[1, 2], 0),
            (&[3, 5, 7], &[-1, -2], 1),
            (&[1500, 3], &[1], 0),
            (&[4, 1025], &[], 1),
            (&[1030, 1], &[1], 1),
            (&[2, 3, 1, 4], &[3], 0),
        ];
        let mut out = Vec::new();
        for (k, (shape, axes, keep)) in cases.iter().enumerate() {
            let x = random(shape, 60 + k as u64);
            // Axes as an attribute (opset < 13) and as a second input (opset ≥ 13).
            out.push(Case::new(
                format!("ReduceSum {shape:?} axes {axes:?} keepdims {keep}"),
                "ReduceSum",
                vec![ints_attr("axes", axes), int_attr("keepdims", *keep)],
                vec![x.clone()],
            ));
            if !axes.is_empty() {
                out.push(Case::new(
                    format!("ReduceSum {shape:?} axes input {axes:?} keepdims {keep}"),
                    "ReduceSum",
                    vec![int_attr("keepdims", *keep)],
                    vec![x, Tensor::i64(vec![axes.len()], axes.to_vec())],
                ));
            }
        }
        out
    }

    fn concat_cases() -> Vec<Case> {
        let cases: [(&[&[usize]], i64); 6] = [
            (&[&[2, 3, 4], &[2, 1, 4], &[2, 5, 4]], 1),
            (&[&[2, 3, 4], &[2, 3, 1], &[2, 3, 6]], -1),
            (&[&[1, 3], &[4, 3]], 0),
            (&[&[401, 3], &[401, 2], &[401, 1]], 1),
            (&[&[7], &[1100]], 0),
            (&[&[3, 2, 1, 5], &[3, 2, 2, 5]], 2),
        ];
        cases
            .iter()
            .enumerate()
            .map(|(k, (shapes, axis))| {
                Case::new(
                    format!("Concat {shapes:?} axis {axis}"),
                    "Concat",
                    vec![int_attr("axis", *axis)],
                    shapes
                        .iter()
                        .enumerate()
                        .map(|(j, s)| random(s, 80 + 10 * k as u64 + j as u64))
                        .collect(),
                )
            })
            .collect()
    }

    fn gemm_bias_cases() -> Vec<Case> {
        // The bias goes through binary_f32: a row, a column, a full matrix.
        let biases: [&[usize]; 4] = [&[5], &[1, 5], &[3, 1], &[3, 5]];
        biases
            .iter()
            .enumerate()
            .map(|(k, bias)| {
                Case::new(
                    format!("Gemm with bias {bias:?}"),
                    "Gemm",
                    vec![int_attr("transB", 1)],
                    vec![
                        random(&[3, 4], 100 + k as u64),
                        random(&[5, 4], 110 + k as u64),
                        random(bias, 120 + k as u64),
                    ],
                )
            })
            .collect()
    }

    #[test]
    fn emulated_gather_matches_the_cpu_executor() {
        check_all(&Emulator::shared(KERNELS, &KERNEL_NAMES), &gather_cases());
    }

    /// Indices past either end of the table stop the run before any kernel reads them.
    #[test]
    fn emulated_gather_rejects_indices_out_of_range() {
        let emulator = Emulator::shared(KERNELS, &KERNEL_NAMES);
        let table = random(&[7, 3], 1);
        for bad in [7, -8] {
            let case = Case::new(
                format!("Gather index {bad}"),
                "Gather",
                Vec::new(),
                vec![table.clone(), Tensor::i64(vec![3], vec![0, bad, 6])],
            );
            let inputs = [
                ("x0", case.inputs[0].clone()),
                ("x1", case.inputs[1].clone()),
            ];
            let e = emulated_dense(&emulator, case.graph(), 1)
                .and_then(|dense| dense.run(&inputs))
                .expect_err("out of range");
            assert!(e.to_string().contains("out of range"), "{e}");
        }
    }

    #[test]
    fn emulated_binary_ops_match_the_cpu_executor_with_broadcasting() {
        let emulator = Emulator::shared(KERNELS, &KERNEL_NAMES);
        check_all(&emulator, &binary_cases());
        check_all(&emulator, &gemm_bias_cases());
    }

    #[test]
    fn emulated_relu_and_sigmoid_match_the_cpu_executor() {
        check_all(&Emulator::shared(KERNELS, &KERNEL_NAMES), &unary_cases());
    }

    #[test]
    fn emulated_reduce_sum_matches_the_cpu_executor() {
        check_all(&Emulator::shared(KERNELS, &KERNEL_NAMES), &reduce_cases());
    }

    #[test]
    fn emulated_concat_matches_the_cpu_executor() {
        check_all(&Emulator::shared(KERNELS, &KERNEL_NAMES), &concat_cases());
    }

    /// The bundled CTR model end to end, its tables whole and split over 3 devices.
    #[test]
    fn emulated_kernels_run_the_ctr_model_like_the_cpu_executor() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/ml100k_ncf_ctr.onnx");
        let emulator = Emulator::shared(KERNELS, &KERNEL_NAMES);
        let n = 1500;
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = |m: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % m) as i64 + 1
        };
        let users: Vec<i64> = (0..n).map(|_| next(943)).collect();
        let items: Vec<i64> = (0..n).map(|_| next(1682)).collect();
        let inputs = [
            ("user_id", Tensor::i64(vec![n], users)),
            ("item_id", Tensor::i64(vec![n], items)),
        ];
        let graph = || DenseGraph::load(&path).unwrap();
        let expected = graph().run_cpu(&inputs).unwrap();
        for parts in [1, 3] {
            let got = emulated_dense(&emulator, graph(), parts)
                .and_then(|dense| dense.run(&inputs))
                .unwrap();
            assert_eq!(got.len(), expected.len());
            for (g, e) in got.iter().zip(&expected) {
                same(&format!("CTR model, {parts} table part(s)"), g, e).unwrap();
            }
        }
    }

    /// Each test above fails for a wrong index, stride or bound: in every mutant of `KERNELS`
    /// below, each changed kernel makes some case of its own differ from the CPU executor or
    /// fault. (The cases launch one kernel each, so one compile covers a change per kernel.)
    #[test]
    fn emulated_tests_catch_broken_kernels() {
        type Mutation = (&'static str, &'static str, fn() -> Vec<Case>);
        let indices: [Mutation; 5] = [
            (
                "data[idx[r] * width + c]",
                "data[idx[c] * width + r]",
                gather_cases,
            ),
            ("i2 * sa2 + i3 * sa3", "i2 * sa3 + i3 * sa2", binary_cases),
            (
                "op == 0 ? fmaxf(v, 0.0f)",
                "op == 1 ? fmaxf(v, 0.0f)",
                unary_cases,
            ),
            (
                "acc += x[t * inner + j]",
                "acc += x[t + j * outer]",
                reduce_cases,
            ),
            (
                "dst[o * dst_chunk + offset + c]",
                "dst[o * chunk + offset + c]",
                concat_cases,
            ),
        ];
        // Bounds one off and a wrong extent: threads read or write outside the buffers.
        let bounds: [Mutation; 5] = [
            (
                "if (t >= total) return;\n    int r",
                "if (t > total) return;\n    int r",
                gather_cases,
            ),
            (
                "int i1 = r % d1; int i0 = r / d1;",
                "int i1 = r % d2; int i0 = r / d2;",
                binary_cases,
            ),
            ("if (t >= n) return;", "if (t > n) return;", unary_cases),
            (
                "if (t >= outer) return;",
                "if (t > outer) return;",
                reduce_cases,
            ),
            (
                "if (t >= outer * chunk) return;",
                "if (t >= outer * dst_chunk) return;",
                concat_cases,
            ),
        ];
        for mutations in [indices, bounds] {
            let mut source = KERNELS.to_string();
            for (from, to, _) in &mutations {
                assert_eq!(
                    source.matches(from).count(),
                    1,
                    "`{from}` not in KERNELS once"
                );
                source = source.replace(from, to);
            }
            let mutant = Emulator::new(&source, &KERNEL_NAMES);
            for (from, to, cases) in mutations {
                let caught = cases().iter().any(|c| c.check(&mutant).is_err());
                assert!(caught, "replacing `{from}` by `{to}` went unnoticed");
            }
        }
    }
}
