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

use cudarc::driver::LaunchConfig;
use riffle_dataflow::DataflowResult;
use riffle_gpu::{check_gpu, Arg, CudaDevice, Elem, GpuDevice, Kernels, Stream};

use crate::gpu_error;
use crate::inference::dense::proto::NodeProto;
use crate::inference::dense::{attr, err, scatter_rows, Data, DenseGraph, RowShards, Tensor};

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
            let inputs = Inputs {
                node,
                values: &values,
                weights: &self.weights,
                host_values: &host,
            };
            let split = node
                .input
                .first()
                .and_then(|n| self.tables.get(n))
                .filter(|_| node.op_type == "Gather");
            let out = match split {
                Some(table) => self.gather_split(table, &inputs.host_copy(1, &self.device)?)?,
                None => self.run_node(&inputs)?,
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
}

/// One node and where its inputs are read: on the device, the values computed so far and else
/// the weights; on the host, the graph's inputs and its constants.
struct Inputs<'a, D: GpuDevice> {
    node: &'a NodeProto,
    values: &'a HashMap<String, DTensor<D>>,
    weights: &'a HashMap<String, DTensor<D>>,
    host_values: &'a HashMap<String, Tensor>,
}

impl<'a, D: GpuDevice> Inputs<'a, D> {
    fn name(&self, i: usize) -> DataflowResult<&'a String> {
        self.node
            .input
            .get(i)
            .ok_or_else(|| err(format!("{}: missing input {i}", self.node.op_type)))
    }

    /// Input `i` on the device.
    fn get(&self, i: usize) -> DataflowResult<&'a DTensor<D>> {
        let name = self.name(i)?;
        self.values
            .get(name)
            .or_else(|| self.weights.get(name))
            .ok_or_else(|| err(format!("{}: no value `{name}`", self.node.op_type)))
    }

    /// Input `i` in host memory, where only the graph's inputs and constants are.
    fn host(&self, i: usize) -> DataflowResult<&'a Tensor> {
        let name = self.name(i)?;
        self.host_values.get(name).ok_or_else(|| {
            err(format!(
                "{}: `{name}` must be a constant",
                self.node.op_type
            ))
        })
    }

    /// Input `i` in host memory: its host copy when it has one, else downloaded.
    fn host_copy(&self, i: usize, device: &D) -> DataflowResult<Tensor> {
        match self.host(i) {
            Ok(t) => Ok(t.clone()),
            Err(_) => download(device, self.get(i)?),
        }
    }
}

mod ops;
mod tensor;
#[cfg(test)]
mod tests;
