//! The dense-graph executor on a CUDA GPU: matrix products with cuBLAS, the other ops as NVRTC
//! kernels compiled at start, weights uploaded once. Outputs must match
//! [`crate::dense::DenseGraph::run_cpu`] (and so ONNX Runtime on CPU) within 1e-4; `riffle
//! gpu-check` compares them on a GPU host. Needs the CUDA driver, NVRTC and cuBLAS libraries
//! (loaded at run time; [`crate::gpu::discover`] says whether there is a GPU at all).

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::cublas::{sys::cublasOperation_t, CudaBlas, Gemm, GemmConfig};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg,
};
use riffle_dataflow::DataflowResult;

use crate::dense::{
    attr, attr_f, attr_i, axes, err, scatter_rows, shapes, Data, DenseGraph, RowShards, Tensor,
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

#[derive(Clone)]
enum DData {
    F32(Arc<CudaSlice<f32>>),
    I64(Arc<CudaSlice<i64>>),
}

#[derive(Clone)]
struct DTensor {
    shape: Vec<usize>,
    data: DData,
}

impl DTensor {
    fn len(&self) -> usize {
        self.shape.iter().product()
    }

    fn f32(&self) -> DataflowResult<&Arc<CudaSlice<f32>>> {
        match &self.data {
            DData::F32(s) => Ok(s),
            DData::I64(_) => Err(err("expected a float tensor on the GPU, found int64")),
        }
    }
}

fn cuda(e: impl std::fmt::Debug) -> riffle_dataflow::DataflowError {
    err(format!("CUDA: {e:?}"))
}

/// A dense graph loaded onto one GPU, its embedding tables optionally spread over several.
pub struct CudaDense {
    graph: DenseGraph,
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    functions: HashMap<&'static str, CudaFunction>,
    weights: HashMap<String, DTensor>,
    tables: HashMap<String, DeviceTable>,
}

/// An embedding table split by row range, part `k` on its own GPU.
struct DeviceTable {
    rows: RowShards,
    /// Values per row and the shape of a row.
    width: usize,
    row_shape: Vec<usize>,
    parts: Vec<TablePart>,
}

struct TablePart {
    stream: Arc<CudaStream>,
    gather: CudaFunction,
    values: CudaSlice<f32>,
}

fn check_ordinal(ordinal: usize) -> DataflowResult<()> {
    match crate::gpu::discover() {
        Ok(gpus) if ordinal < gpus.len() => Ok(()),
        Ok(gpus) => Err(err(format!(
            "cuda:{ordinal}: this machine has {} GPU(s)",
            gpus.len()
        ))),
        Err(why) => Err(err(format!("cuda:{ordinal}: {why}"))),
    }
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
        mut graph: DenseGraph,
        ordinal: usize,
        table_devices: &[usize],
    ) -> DataflowResult<CudaDense> {
        check_ordinal(ordinal)?;
        for d in table_devices {
            check_ordinal(*d)?;
        }
        if table_devices.len() > 1 {
            graph.split_tables(table_devices.len())?;
        }
        let ctx = CudaContext::new(ordinal).map_err(cuda)?;
        let stream = ctx.default_stream();
        let blas = CudaBlas::new(stream.clone()).map_err(cuda)?;
        let ptx = cudarc::nvrtc::compile_ptx(KERNELS).map_err(cuda)?;
        let module = ctx.load_module(ptx.clone()).map_err(cuda)?;
        let mut functions = HashMap::new();
        for name in [
            "gather_f32",
            "binary_f32",
            "unary_f32",
            "reduce_inner_f32",
            "copy_block_f32",
        ] {
            functions.insert(name, module.load_function(name).map_err(cuda)?);
        }
        let mut weights = HashMap::new();
        for (name, t) in &graph.weights {
            weights.insert(name.clone(), upload(&stream, t)?);
        }
        // Each part goes to its GPU; the host copy is dropped (these tables can be large).
        let mut tables = HashMap::new();
        for (name, split) in std::mem::take(&mut graph.split) {
            let row_shape = split
                .parts
                .first()
                .map(|p| p.shape[1..].to_vec())
                .unwrap_or_default();
            let mut parts = Vec::with_capacity(split.parts.len());
            for (k, part) in split.parts.iter().enumerate() {
                let device = CudaContext::new(table_devices[k]).map_err(cuda)?;
                let part_stream = device.default_stream();
                let module = device.load_module(ptx.clone()).map_err(cuda)?;
                parts.push(TablePart {
                    gather: module.load_function("gather_f32").map_err(cuda)?,
                    values: part_stream.clone_htod(part.as_f32()?).map_err(cuda)?,
                    stream: part_stream,
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
        Ok(CudaDense {
            graph,
            stream,
            blas,
            functions,
            weights,
            tables,
        })
    }

    /// The graph's output names, in the order [`CudaDense::run`] returns them.
    pub fn output_names(&self) -> &[String] {
        &self.graph.outputs
    }

    /// A Gather from a table split over GPUs: each part's GPU gathers its rows, which come
    /// back through the host into one tensor on the main GPU. (Peer-to-peer copies would skip
    /// the host; the rows are few next to the tables.)
    fn gather_split(&self, table: &DeviceTable, indices: &Tensor) -> DataflowResult<DTensor> {
        let routes = table.rows.route(indices.as_i64()?)?;
        let width = table.width;
        let mut host = vec![0f32; indices.len() * width];
        for (part, route) in table.parts.iter().zip(&routes) {
            if route.local.is_empty() || width == 0 {
                continue;
            }
            let idx = part.stream.clone_htod(&route.local).map_err(cuda)?;
            let total = route.local.len() * width;
            let out = part.stream.alloc_zeros::<f32>(total).map_err(cuda)?;
            let (w, t) = (width as i32, total as i32);
            {
                let mut b = part.stream.launch_builder(&part.gather);
                b.arg(&part.values).arg(&idx).arg(&out).arg(&w).arg(&t);
                // SAFETY: the kernel checks its thread index against `total`, `out` holds
                // `total` values and every local index is within the part (routed above).
                unsafe { b.launch(LaunchConfig::for_num_elems(total as u32)) }.map_err(cuda)?;
            }
            let rows = part.stream.clone_dtoh(&out).map_err(cuda)?;
            scatter_rows(&mut host, width, &route.positions, &rows);
        }
        let mut shape = indices.shape.clone();
        shape.extend_from_slice(&table.row_shape);
        upload(&self.stream, &Tensor::f32(shape, host))
    }

    /// Runs the graph on the GPU: inputs from host memory, outputs back to it.
    pub fn run(&self, inputs: &[(&str, Tensor)]) -> DataflowResult<Vec<Tensor>> {
        // Small integer tensors (axes) are also kept on the host, where the ops read them.
        let mut host: HashMap<String, Tensor> = self
            .graph
            .weights
            .iter()
            .filter(|(_, t)| matches!(t.data, Data::I64(_)))
            .map(|(n, t)| (n.clone(), t.clone()))
            .collect();
        let mut values: HashMap<String, DTensor> = HashMap::new();
        for (name, t) in inputs {
            values.insert(name.to_string(), upload(&self.stream, t)?);
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
                values.insert(out_name.clone(), upload(&self.stream, &t)?);
                host.insert(out_name, t);
                continue;
            }
            let get = |i: usize| -> DataflowResult<&DTensor> {
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
                        Err(_) => download(&self.stream, get(1)?)?,
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
                download(&self.stream, t)
            })
            .collect()
    }

    fn function(&self, name: &str) -> DataflowResult<&CudaFunction> {
        self.functions
            .get(name)
            .ok_or_else(|| err(format!("kernel {name} missing")))
    }

    fn run_node<'a>(
        &self,
        node: &crate::dense::proto::NodeProto,
        get: &dyn Fn(usize) -> DataflowResult<&'a DTensor>,
        host_get: &dyn Fn(usize) -> DataflowResult<&'a Tensor>,
    ) -> DataflowResult<DTensor> {
        let op = node.op_type.as_str();
        let reshape = |x: &DTensor, shape: Vec<usize>| DTensor {
            shape,
            data: x.data.clone(),
        };
        Ok(match op {
            "Identity" => get(0)?.clone(),
            "Gather" => {
                let (data, indices) = (get(0)?, get(1)?);
                if attr_i(node, "axis", 0) != 0 {
                    return Err(err("Gather: only axis 0 is supported"));
                }
                let rows = *data
                    .shape
                    .first()
                    .ok_or_else(|| err("Gather of a scalar"))?;
                // Indices are checked and negative ones wrapped (as ONNX says) on the host: the
                // kernel must never read outside the table. They are graph inputs, so already
                // there, except when the graph computes them.
                let host_idx = match host_get(1) {
                    Ok(t) => t.clone(),
                    Err(_) => download(&self.stream, indices)?,
                };
                let wrapped = RowShards::split(rows, 1).route(host_idx.as_i64()?)?;
                let local = wrapped
                    .into_iter()
                    .next()
                    .map(|r| r.local)
                    .unwrap_or_default();
                let width: usize = data.shape[1..].iter().product();
                let total = indices.len() * width;
                let out = self.stream.alloc_zeros::<f32>(total.max(1)).map_err(cuda)?;
                let src = data.f32()?;
                let (w, t) = (width as i32, total as i32);
                if total > 0 {
                    let idx = self.stream.clone_htod(&local).map_err(cuda)?;
                    let mut b = self.stream.launch_builder(self.function("gather_f32")?);
                    b.arg(src.as_ref()).arg(&idx).arg(&out).arg(&w).arg(&t);
                    // SAFETY: every kernel checks its thread index against the element count it is
                    // given, and the buffers passed hold at least that many elements.
                    unsafe { b.launch(LaunchConfig::for_num_elems((total).max(1) as u32)) }
                        .map_err(cuda)?;
                }
                let mut shape = indices.shape.clone();
                shape.extend_from_slice(&data.shape[1..]);
                DTensor {
                    shape,
                    data: DData::F32(Arc::new(out)),
                }
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
                let out = self.stream.alloc_zeros::<f32>(n.max(1)).map_err(cuda)?;
                let (code, count) = (i32::from(op == "Sigmoid"), n as i32);
                let src = x.f32()?;
                {
                    let mut b = self.stream.launch_builder(self.function("unary_f32")?);
                    b.arg(src.as_ref()).arg(&out).arg(&code).arg(&count);
                    // SAFETY: every kernel checks its thread index against the element count it is
                    // given, and the buffers passed hold at least that many elements.
                    unsafe { b.launch(LaunchConfig::for_num_elems((n).max(1) as u32)) }
                        .map_err(cuda)?;
                }
                DTensor {
                    shape: x.shape.clone(),
                    data: DData::F32(Arc::new(out)),
                }
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
                let out = self.stream.alloc_zeros::<f32>(outer.max(1)).map_err(cuda)?;
                let (o, i) = (outer as i32, inner as i32);
                let src = x.f32()?;
                {
                    let mut b = self
                        .stream
                        .launch_builder(self.function("reduce_inner_f32")?);
                    b.arg(src.as_ref()).arg(&out).arg(&o).arg(&i);
                    // SAFETY: every kernel checks its thread index against the element count it is
                    // given, and the buffers passed hold at least that many elements.
                    unsafe { b.launch(LaunchConfig::for_num_elems((outer).max(1) as u32)) }
                        .map_err(cuda)?;
                }
                let mut shape = x.shape[..first].to_vec();
                if attr_i(node, "keepdims", 1) != 0 {
                    shape.extend(std::iter::repeat_n(1, rank - first));
                }
                DTensor {
                    shape,
                    data: DData::F32(Arc::new(out)),
                }
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
                let parts: Vec<&DTensor> = (0..node.input.len())
                    .map(get)
                    .collect::<DataflowResult<_>>()?;
                let part_shapes: Vec<&[usize]> = parts.iter().map(|p| p.shape.as_slice()).collect();
                let (axis, outer, shape) = shapes::concat(&part_shapes, attr_i(node, "axis", 0))?;
                let dst_chunk: usize = shape[axis..].iter().product();
                let out = self
                    .stream
                    .alloc_zeros::<f32>((outer * dst_chunk).max(1))
                    .map_err(cuda)?;
                let mut offset = 0usize;
                for p in &parts {
                    let chunk: usize = p.shape[axis..].iter().product();
                    let src = p.f32()?;
                    let (o, c, d, off) =
                        (outer as i32, chunk as i32, dst_chunk as i32, offset as i32);
                    {
                        let mut b = self.stream.launch_builder(self.function("copy_block_f32")?);
                        b.arg(src.as_ref())
                            .arg(&out)
                            .arg(&o)
                            .arg(&c)
                            .arg(&d)
                            .arg(&off);
                        // SAFETY: every kernel checks its thread index against the element count it is
                        // given, and the buffers passed hold at least that many elements.
                        unsafe {
                            b.launch(LaunchConfig::for_num_elems((outer * chunk).max(1) as u32))
                        }
                        .map_err(cuda)?;
                    }
                    offset += chunk;
                }
                DTensor {
                    shape,
                    data: DData::F32(Arc::new(out)),
                }
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
                let mut out = self
                    .stream
                    .alloc_zeros::<f32>((m * n).max(1))
                    .map_err(cuda)?;
                let cfg = row_major_gemm(m, k, n, ta, tb, alpha);
                // SAFETY: the dimensions and leading dimensions above describe the buffers.
                unsafe {
                    self.blas
                        .gemm(cfg, b.f32()?.as_ref(), a.f32()?.as_ref(), &mut out)
                }
                .map_err(cuda)?;
                let product = DTensor {
                    shape: vec![m, n],
                    data: DData::F32(Arc::new(out)),
                };
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
    fn binary(&self, a: &DTensor, b: &DTensor, code: i32) -> DataflowResult<DTensor> {
        let rank = a.shape.len().max(b.shape.len());
        if rank > 4 {
            return Err(err("elementwise ops on the GPU: at most 4 dimensions"));
        }
        let (shape, sa, sb) = shapes::broadcast(&a.shape, &b.shape, 4)?;
        let as_i32 = |s: Vec<usize>| -> Vec<i32> { s.into_iter().map(|v| v as i32).collect() };
        let (ta, tb) = (as_i32(sa), as_i32(sb));
        let total: usize = shape.iter().product();
        let out = self.stream.alloc_zeros::<f32>(total.max(1)).map_err(cuda)?;
        let (x, y) = (a.f32()?, b.f32()?);
        let (t, d1, d2, d3) = (
            total as i32,
            shape[1] as i32,
            shape[2] as i32,
            shape[3] as i32,
        );
        {
            let mut l = self.stream.launch_builder(self.function("binary_f32")?);
            l.arg(x.as_ref())
                .arg(y.as_ref())
                .arg(&out)
                .arg(&code)
                .arg(&t);
            l.arg(&d1).arg(&d2).arg(&d3);
            for s in &ta {
                l.arg(s);
            }
            for s in &tb {
                l.arg(s);
            }
            // SAFETY: every kernel checks its thread index against the element count it is
            // given, and the buffers passed hold at least that many elements.
            unsafe { l.launch(LaunchConfig::for_num_elems((total).max(1) as u32)) }
                .map_err(cuda)?;
        }
        Ok(DTensor {
            shape: shape[4 - rank..].to_vec(),
            data: DData::F32(Arc::new(out)),
        })
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

fn upload(stream: &Arc<CudaStream>, t: &Tensor) -> DataflowResult<DTensor> {
    let data = match &t.data {
        Data::F32(v) => DData::F32(Arc::new(stream.clone_htod(v.as_slice()).map_err(cuda)?)),
        Data::I64(v) => DData::I64(Arc::new(stream.clone_htod(v.as_slice()).map_err(cuda)?)),
    };
    Ok(DTensor {
        shape: t.shape.clone(),
        data,
    })
}

fn download(stream: &Arc<CudaStream>, t: &DTensor) -> DataflowResult<Tensor> {
    Ok(match &t.data {
        DData::F32(s) => {
            let mut v = stream.clone_dtoh(s.as_ref()).map_err(cuda)?;
            v.truncate(t.len());
            Tensor::f32(t.shape.clone(), v)
        }
        DData::I64(s) => {
            let mut v = stream.clone_dtoh(s.as_ref()).map_err(cuda)?;
            v.truncate(t.len());
            Tensor::i64(t.shape.clone(), v)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// cublasSgemm's definition, column-major: C = alpha·op(A)·op(B) + beta·C.
    fn sgemm_reference(cfg: &GemmConfig<f32>, a: &[f32], b: &[f32], c: &mut [f32]) {
        let transposed = |t: cublasOperation_t| t == cublasOperation_t::CUBLAS_OP_T;
        let (m, n, k) = (cfg.m as usize, cfg.n as usize, cfg.k as usize);
        let (lda, ldb, ldc) = (cfg.lda as usize, cfg.ldb as usize, cfg.ldc as usize);
        let op_a = |i: usize, p: usize| {
            if transposed(cfg.transa) {
                a[p + i * lda]
            } else {
                a[i + p * lda]
            }
        };
        let op_b = |p: usize, j: usize| {
            if transposed(cfg.transb) {
                b[j + p * ldb]
            } else {
                b[p + j * ldb]
            }
        };
        for j in 0..n {
            for i in 0..m {
                let acc: f32 = (0..k).map(|p| op_a(i, p) * op_b(p, j)).sum();
                c[i + j * ldc] = cfg.alpha * acc + cfg.beta * c[i + j * ldc];
            }
        }
    }

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
            for name in [
                "gather_f32",
                "binary_f32",
                "unary_f32",
                "reduce_inner_f32",
                "copy_block_f32",
            ] {
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
    // launched with the grids and arguments the executor computes, compared with the CPU
    // executor. `EmulatedDense` below is `CudaDense::run` line for line with the device calls
    // of the emulated device (cuBLAS's part done by `sgemm_reference`): keep the two in step.

    use crate::dense::proto::{AttributeProto, NodeProto};
    use crate::dense::SplitTable;
    use crate::kernel_emulation::{Buf, Device, Emulator};

    const KERNEL_NAMES: [&str; 5] = [
        "gather_f32",
        "binary_f32",
        "unary_f32",
        "reduce_inner_f32",
        "copy_block_f32",
    ];

    fn emulated(e: String) -> riffle_dataflow::DataflowError {
        err(format!("emulated CUDA: {e}"))
    }

    #[derive(Clone)]
    enum EData {
        F32(Buf),
        I64(Buf),
    }

    /// `DTensor` on the emulated device.
    #[derive(Clone)]
    struct ETensor {
        shape: Vec<usize>,
        data: EData,
    }

    impl ETensor {
        fn len(&self) -> usize {
            self.shape.iter().product()
        }

        fn f32(&self) -> DataflowResult<Buf> {
            match &self.data {
                EData::F32(b) => Ok(*b),
                EData::I64(_) => Err(err("expected a float tensor on the GPU, found int64")),
            }
        }
    }

    fn e_upload(dev: &mut Device, t: &Tensor) -> ETensor {
        let data = match &t.data {
            Data::F32(v) => EData::F32(dev.htod(v)),
            Data::I64(v) => EData::I64(dev.htod(v)),
        };
        ETensor {
            shape: t.shape.clone(),
            data,
        }
    }

    /// `download`: runs what is queued first, as the stream would.
    fn e_download(dev: &mut Device, t: &ETensor) -> DataflowResult<Tensor> {
        dev.synchronize().map_err(emulated)?;
        Ok(match &t.data {
            EData::F32(b) => {
                let mut v = dev.dtoh::<f32>(*b);
                v.truncate(t.len());
                Tensor::f32(t.shape.clone(), v)
            }
            EData::I64(b) => {
                let mut v = dev.dtoh::<i64>(*b);
                v.truncate(t.len());
                Tensor::i64(t.shape.clone(), v)
            }
        })
    }

    /// `DeviceTable`, every part on the one emulated device.
    struct ETable {
        rows: RowShards,
        width: usize,
        row_shape: Vec<usize>,
        parts: Vec<Buf>,
    }

    struct EmulatedDense<'e> {
        graph: DenseGraph,
        dev: Device<'e>,
        weights: HashMap<String, ETensor>,
        tables: HashMap<String, ETable>,
    }

    impl<'e> EmulatedDense<'e> {
        /// `CudaDense::with_tables_on` with `table_devices` table parts.
        fn new(emulator: &'e Emulator, mut graph: DenseGraph, table_devices: usize) -> Self {
            if table_devices > 1 {
                graph.split_tables(table_devices).unwrap();
            }
            let mut dev = Device::new(emulator);
            let mut weights = HashMap::new();
            for (name, t) in &graph.weights {
                weights.insert(name.clone(), e_upload(&mut dev, t));
            }
            let mut tables = HashMap::new();
            for (name, split) in std::mem::take(&mut graph.split) {
                let SplitTable { rows, parts } = split;
                let row_shape = parts
                    .first()
                    .map(|p| p.shape[1..].to_vec())
                    .unwrap_or_default();
                let parts = parts
                    .iter()
                    .map(|part| dev.htod(part.as_f32().unwrap()))
                    .collect();
                tables.insert(
                    name,
                    ETable {
                        rows,
                        width: row_shape.iter().product(),
                        row_shape,
                        parts,
                    },
                );
            }
            EmulatedDense {
                graph,
                dev,
                weights,
                tables,
            }
        }

        /// `CudaDense::run`.
        fn run(&mut self, inputs: &[(&str, Tensor)]) -> DataflowResult<Vec<Tensor>> {
            let EmulatedDense {
                graph,
                dev,
                weights,
                tables,
            } = self;
            let mut host: HashMap<String, Tensor> = graph
                .weights
                .iter()
                .filter(|(_, t)| matches!(t.data, Data::I64(_)))
                .map(|(n, t)| (n.clone(), t.clone()))
                .collect();
            let mut values: HashMap<String, ETensor> = HashMap::new();
            for (name, t) in inputs {
                values.insert(name.to_string(), e_upload(dev, t));
                host.insert(name.to_string(), t.clone());
            }
            for node in &graph.nodes {
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
                    values.insert(out_name.clone(), e_upload(dev, &t));
                    host.insert(out_name, t);
                    continue;
                }
                let get = |i: usize| -> DataflowResult<&ETensor> {
                    let name = node
                        .input
                        .get(i)
                        .ok_or_else(|| err(format!("{}: missing input {i}", node.op_type)))?;
                    values
                        .get(name)
                        .or_else(|| weights.get(name))
                        .ok_or_else(|| err(format!("{}: no value `{name}`", node.op_type)))
                };
                let host_get = |i: usize| -> DataflowResult<&Tensor> {
                    let name = node
                        .input
                        .get(i)
                        .ok_or_else(|| err(format!("{}: missing input {i}", node.op_type)))?;
                    host.get(name).ok_or_else(|| {
                        err(format!("{}: `{name}` must be a constant", node.op_type))
                    })
                };
                let split = node
                    .input
                    .first()
                    .and_then(|n| tables.get(n))
                    .filter(|_| node.op_type == "Gather");
                let out = match split {
                    Some(table) => {
                        let indices = match host_get(1) {
                            Ok(t) => t.clone(),
                            Err(_) => e_download(dev, get(1)?)?,
                        };
                        e_gather_split(dev, table, &indices)?
                    }
                    None => e_run_node(dev, node, &get, &host_get)?,
                };
                values.insert(out_name, out);
            }
            graph
                .outputs
                .iter()
                .map(|o| {
                    let t = values
                        .get(o)
                        .ok_or_else(|| err(format!("output `{o}` was not computed")))?;
                    e_download(dev, t)
                })
                .collect()
        }
    }

    /// `CudaDense::gather_split`.
    fn e_gather_split(
        dev: &mut Device,
        table: &ETable,
        indices: &Tensor,
    ) -> DataflowResult<ETensor> {
        let routes = table.rows.route(indices.as_i64()?)?;
        let width = table.width;
        let mut host = vec![0f32; indices.len() * width];
        for (part, route) in table.parts.iter().zip(&routes) {
            if route.local.is_empty() {
                continue;
            }
            let idx = dev.htod(&route.local);
            let total = route.local.len() * width;
            let out = dev.alloc_filled(total, 0f32);
            let (w, t) = (width as i32, total as i32);
            {
                let mut b = dev.launch_builder("gather_f32");
                b.arg(part).arg(idx).arg(out).arg(&w).arg(&t);
                b.launch(LaunchConfig::for_num_elems(total as u32));
            }
            dev.synchronize().map_err(emulated)?;
            let rows = dev.dtoh::<f32>(out);
            scatter_rows(&mut host, width, &route.positions, &rows);
        }
        let mut shape = indices.shape.clone();
        shape.extend_from_slice(&table.row_shape);
        Ok(e_upload(dev, &Tensor::f32(shape, host)))
    }

    /// `CudaDense::run_node`.
    fn e_run_node<'a>(
        dev: &mut Device,
        node: &NodeProto,
        get: &dyn Fn(usize) -> DataflowResult<&'a ETensor>,
        host_get: &dyn Fn(usize) -> DataflowResult<&'a Tensor>,
    ) -> DataflowResult<ETensor> {
        let op = node.op_type.as_str();
        let reshape = |x: &ETensor, shape: Vec<usize>| ETensor {
            shape,
            data: x.data.clone(),
        };
        Ok(match op {
            "Identity" => get(0)?.clone(),
            "Gather" => {
                let (data, indices) = (get(0)?, get(1)?);
                let idx_host = host_get(1).ok();
                let rows = *data
                    .shape
                    .first()
                    .ok_or_else(|| err("Gather of a scalar"))?;
                if let Some(h) = idx_host {
                    if h.as_i64()?.iter().any(|i| *i < 0 || *i as usize >= rows) {
                        return Err(err(format!(
                            "Gather: an index is out of range (rows: {rows})"
                        )));
                    }
                }
                let EData::I64(idx) = &indices.data else {
                    return Err(err("Gather: int64 indices expected"));
                };
                let width: usize = data.shape[1..].iter().product();
                let total = indices.len() * width;
                let out = dev.alloc_filled(total.max(1), 0f32);
                let src = data.f32()?;
                let (w, t) = (width as i32, total as i32);
                {
                    let mut b = dev.launch_builder("gather_f32");
                    b.arg(src).arg(idx).arg(out).arg(&w).arg(&t);
                    b.launch(LaunchConfig::for_num_elems((total).max(1) as u32));
                }
                let mut shape = indices.shape.clone();
                shape.extend_from_slice(&data.shape[1..]);
                ETensor {
                    shape,
                    data: EData::F32(out),
                }
            }
            "Add" | "Sub" | "Mul" | "Div" => {
                let code = ["Add", "Sub", "Mul", "Div"]
                    .iter()
                    .position(|o| *o == op)
                    .unwrap_or(0) as i32;
                e_binary(dev, get(0)?, get(1)?, code)?
            }
            "Relu" | "Sigmoid" => {
                let x = get(0)?;
                let n = x.len();
                let out = dev.alloc_filled(n.max(1), 0f32);
                let (code, count) = (i32::from(op == "Sigmoid"), n as i32);
                let src = x.f32()?;
                {
                    let mut b = dev.launch_builder("unary_f32");
                    b.arg(src).arg(out).arg(&code).arg(&count);
                    b.launch(LaunchConfig::for_num_elems((n).max(1) as u32));
                }
                ETensor {
                    shape: x.shape.clone(),
                    data: EData::F32(out),
                }
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
                let out = dev.alloc_filled(outer.max(1), 0f32);
                let (o, i) = (outer as i32, inner as i32);
                let src = x.f32()?;
                {
                    let mut b = dev.launch_builder("reduce_inner_f32");
                    b.arg(src).arg(out).arg(&o).arg(&i);
                    b.launch(LaunchConfig::for_num_elems((outer).max(1) as u32));
                }
                let mut shape = x.shape[..first].to_vec();
                if attr_i(node, "keepdims", 1) != 0 {
                    shape.extend(std::iter::repeat_n(1, rank - first));
                }
                ETensor {
                    shape,
                    data: EData::F32(out),
                }
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
                let parts: Vec<&ETensor> = (0..node.input.len())
                    .map(get)
                    .collect::<DataflowResult<_>>()?;
                let part_shapes: Vec<&[usize]> = parts.iter().map(|p| p.shape.as_slice()).collect();
                let (axis, outer, shape) = shapes::concat(&part_shapes, attr_i(node, "axis", 0))?;
                let dst_chunk: usize = shape[axis..].iter().product();
                let out = dev.alloc_filled((outer * dst_chunk).max(1), 0f32);
                let mut offset = 0usize;
                for p in &parts {
                    let chunk: usize = p.shape[axis..].iter().product();
                    let src = p.f32()?;
                    let (o, c, d, off) =
                        (outer as i32, chunk as i32, dst_chunk as i32, offset as i32);
                    {
                        let mut b = dev.launch_builder("copy_block_f32");
                        b.arg(src).arg(out).arg(&o).arg(&c).arg(&d).arg(&off);
                        b.launch(LaunchConfig::for_num_elems((outer * chunk).max(1) as u32));
                    }
                    offset += chunk;
                }
                ETensor {
                    shape,
                    data: EData::F32(out),
                }
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
                let mut out = vec![0f32; (m * n).max(1)];
                let cfg = row_major_gemm(m, k, n, ta, tb, alpha);
                // cuBLAS by its definition, on the host.
                let (a_host, b_host) = (e_download(dev, a)?, e_download(dev, b)?);
                sgemm_reference(&cfg, b_host.as_f32()?, a_host.as_f32()?, &mut out);
                let product = ETensor {
                    shape: vec![m, n],
                    data: EData::F32(dev.htod(&out)),
                };
                if gemm && node.input.len() > 2 && !node.input[2].is_empty() {
                    e_binary(dev, &product, get(2)?, 0)?
                } else {
                    product
                }
            }
            other => return Err(err(format!("op `{other}` is not supported on the GPU"))),
        })
    }

    /// `CudaDense::binary`.
    fn e_binary(dev: &mut Device, a: &ETensor, b: &ETensor, code: i32) -> DataflowResult<ETensor> {
        let rank = a.shape.len().max(b.shape.len());
        if rank > 4 {
            return Err(err("elementwise ops on the GPU: at most 4 dimensions"));
        }
        let (shape, sa, sb) = shapes::broadcast(&a.shape, &b.shape, 4)?;
        let as_i32 = |s: Vec<usize>| -> Vec<i32> { s.into_iter().map(|v| v as i32).collect() };
        let (ta, tb) = (as_i32(sa), as_i32(sb));
        let total: usize = shape.iter().product();
        let out = dev.alloc_filled(total.max(1), 0f32);
        let (x, y) = (a.f32()?, b.f32()?);
        let (t, d1, d2, d3) = (
            total as i32,
            shape[1] as i32,
            shape[2] as i32,
            shape[3] as i32,
        );
        {
            let mut l = dev.launch_builder("binary_f32");
            l.arg(x).arg(y).arg(out).arg(&code).arg(&t);
            l.arg(&d1).arg(&d2).arg(&d3);
            for s in &ta {
                l.arg(s);
            }
            for s in &tb {
                l.arg(s);
            }
            l.launch(LaunchConfig::for_num_elems((total).max(1) as u32));
        }
        Ok(ETensor {
            shape: shape[4 - rank..].to_vec(),
            data: EData::F32(out),
        })
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
            let got = EmulatedDense::new(emulator, self.graph(), 1)
                .run(&inputs)
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
                        ((state >> 33) % rows) as i64
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
            let got = EmulatedDense::new(&emulator, graph(), parts)
                .run(&inputs)
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
