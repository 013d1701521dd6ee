//! A small executor for dense ONNX graphs — embedding lookups, matrix products, elementwise
//! ops — the operator set of click-through-rate models such as `ml100k_ncf_ctr.onnx`.
//!
//! It exists for GPU hosts without ONNX Runtime's CUDA provider (a 284 MB library that is often
//! absent): the graph is read from the ONNX file here, and its ops map one to one onto cuBLAS
//! (Gemm, MatMul) and small elementwise kernels. This CPU implementation is the reference those
//! kernels are checked against; it is itself checked against ONNX Runtime (`tests/dense.rs`).
//! Supported: Constant, Gather (axis 0), Add, Sub, Mul, Div, ReduceSum, Squeeze, Unsqueeze,
//! Concat, Gemm, MatMul (2-D), Relu, Sigmoid, Flatten, Identity.

use std::collections::HashMap;
use std::path::Path;

use prost::Message;
use riffle_dataflow::{DataflowError, DataflowResult};

use crate::inference::onnx::TensorSpec;

mod buffers;
mod cpu;
pub mod gpu;
pub(crate) mod proto;
pub(crate) mod shapes;
#[cfg(test)]
mod tests;

pub(crate) use cpu::{attr, attr_f, attr_i, axes};
use cpu::{gather_split, run_node};
pub use gpu::CudaDense;

/// A tensor: its shape and row-major values.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: Data,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    F32(Vec<f32>),
    I64(Vec<i64>),
}

impl Tensor {
    pub fn f32(shape: Vec<usize>, values: Vec<f32>) -> Self {
        Tensor {
            shape,
            data: Data::F32(values),
        }
    }

    pub fn i64(shape: Vec<usize>, values: Vec<i64>) -> Self {
        Tensor {
            shape,
            data: Data::I64(values),
        }
    }

    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn as_f32(&self) -> DataflowResult<&[f32]> {
        match &self.data {
            Data::F32(v) => Ok(v),
            Data::I64(_) => Err(err("expected a float tensor, found int64")),
        }
    }

    pub fn as_i64(&self) -> DataflowResult<&[i64]> {
        match &self.data {
            Data::I64(v) => Ok(v),
            Data::F32(_) => Err(err("expected an int64 tensor, found float")),
        }
    }

    pub(crate) fn from_proto(t: &proto::TensorProto) -> DataflowResult<Tensor> {
        let shape: Vec<usize> = t.dims.iter().map(|d| (*d).max(0) as usize).collect();
        let n: usize = shape.iter().product();
        let tensor = match t.data_type {
            1 => {
                let values = if !t.raw_data.is_empty() {
                    let (words, _) = t.raw_data.as_chunks::<4>();
                    words.iter().map(|b| f32::from_le_bytes(*b)).collect()
                } else {
                    t.float_data.clone()
                };
                Tensor::f32(shape, values)
            }
            7 => {
                let values = if !t.raw_data.is_empty() {
                    let (words, _) = t.raw_data.as_chunks::<8>();
                    words.iter().map(|b| i64::from_le_bytes(*b)).collect()
                } else {
                    t.int64_data.clone()
                };
                Tensor::i64(shape, values)
            }
            other => {
                return Err(err(format!(
                    "tensor `{}`: element type {other} is not supported (float32 and int64 are)",
                    t.name
                )))
            }
        };
        if tensor.len() != n
            || match &tensor.data {
                Data::F32(v) => v.len() != n,
                Data::I64(v) => v.len() != n,
            }
        {
            return Err(err(format!(
                "tensor `{}`: data does not match its shape",
                t.name
            )));
        }
        Ok(tensor)
    }
}

pub(crate) fn err(message: impl Into<String>) -> DataflowError {
    DataflowError::stage("dense", message.into())
}

/// A dense graph read from an ONNX file.
///
/// Runs CTR-style models without ONNX Runtime: [`DenseGraph::run_cpu`] here, and the CUDA
/// executor ([`crate::inference::dense::gpu`]) on a GPU, which is checked against it.
///
/// # Examples
/// ```
/// use std::path::Path;
/// use riffle_operators::inference::dense::{DenseGraph, Tensor};
///
/// let graph = DenseGraph::load(Path::new("../models/ml100k_ncf_ctr.onnx")).unwrap();
/// assert_eq!(graph.inputs, ["user_id", "item_id"]);
/// assert_eq!(graph.outputs, ["p_click"]);
/// // Three (user, item) pairs, one click probability each.
/// let outputs = graph
///     .run_cpu(&[
///         ("user_id", Tensor::i64(vec![3], vec![1, 1, 42])),
///         ("item_id", Tensor::i64(vec![3], vec![50, 1000, 181])),
///     ])
///     .unwrap();
/// assert_eq!(outputs[0].shape, [3]);
/// let p_click = outputs[0].as_f32().unwrap();
/// assert!(p_click.iter().all(|p| *p > 0.0 && *p < 1.0), "{p_click:?}");
/// ```
pub struct DenseGraph {
    pub(crate) nodes: Vec<proto::NodeProto>,
    pub(crate) weights: HashMap<String, Tensor>,
    /// Embedding tables split by row range (see [`DenseGraph::split_tables`]).
    pub(crate) split: HashMap<String, SplitTable>,
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    pub(crate) input_specs: Vec<TensorSpec>,
    pub(crate) output_specs: Vec<TensorSpec>,
}

/// An embedding table cut into row ranges, one part per device.
#[derive(Clone, Debug)]
pub struct SplitTable {
    pub rows: RowShards,
    pub parts: Vec<Tensor>,
}

/// Contiguous row ranges of a table: part `k` holds rows `starts[k]..starts[k + 1]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowShards {
    starts: Vec<usize>,
}

/// The rows of one gather that one part serves: where they go in the output and their index
/// within the part.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShardRoute {
    pub positions: Vec<usize>,
    pub local: Vec<i64>,
}

impl RowShards {
    /// `rows` in `parts` near-equal ranges (fewer when there are fewer rows than parts).
    pub fn split(rows: usize, parts: usize) -> RowShards {
        let parts = parts.clamp(1, rows.max(1));
        RowShards {
            starts: (0..=parts).map(|k| k * rows / parts).collect(),
        }
    }

    pub fn parts(&self) -> usize {
        self.starts.len() - 1
    }

    pub fn rows(&self) -> usize {
        self.starts.last().copied().unwrap_or(0)
    }

    /// The rows of part `part` (none for a part beyond the last).
    pub fn range(&self, part: usize) -> std::ops::Range<usize> {
        match self.starts.get(part..part + 2) {
            Some(&[start, end]) => start..end,
            _ => 0..0,
        }
    }

    /// Splits a gather's indices (ONNX semantics: negative counts from the end) by part.
    pub fn route(&self, indices: &[i64]) -> DataflowResult<Vec<ShardRoute>> {
        let rows = self.rows();
        let mut routes = vec![ShardRoute::default(); self.parts()];
        for (position, &i) in indices.iter().enumerate() {
            let row = gather_row(i, rows)?;
            // The last part starting at or before `row` (`starts` begins at 0 and ends past it).
            let part = self.starts.partition_point(|s| *s <= row).saturating_sub(1);
            let (Some(route), Some(&start)) = (routes.get_mut(part), self.starts.get(part)) else {
                return Err(err(format!("Gather: row {row} is in no part of the table")));
            };
            route.positions.push(position);
            route.local.push((row - start) as i64);
        }
        Ok(routes)
    }
}

/// The row index `i` of a Gather names in a table of `rows` rows (negative counts from the end,
/// as ONNX says), or an error when there is no such row.
fn gather_row(i: i64, rows: usize) -> DataflowResult<usize> {
    let row = if i < 0 { i + rows as i64 } else { i };
    usize::try_from(row)
        .ok()
        .filter(|r| *r < rows)
        .ok_or_else(|| err(format!("Gather: index {i} out of range (rows: {rows})")))
}

/// The table rows a Gather node reads: its indices checked against the table's shape and
/// wrapped. The CPU and GPU executors both read rows through this, so neither reads outside.
pub(crate) fn gather_rows_of(
    node: &proto::NodeProto,
    table_shape: &[usize],
    indices: &[i64],
) -> DataflowResult<Vec<usize>> {
    if attr_i(node, "axis", 0) != 0 {
        return Err(err("Gather: only axis 0 is supported"));
    }
    let rows = *table_shape
        .first()
        .ok_or_else(|| err("Gather of a scalar"))?;
    indices.iter().map(|&i| gather_row(i, rows)).collect()
}

/// Writes each part's gathered rows (`width` values each) to their positions in `out`; an error
/// when a position is beyond `out`.
pub fn scatter_rows(
    out: &mut [f32],
    width: usize,
    positions: &[usize],
    rows: &[f32],
) -> DataflowResult<()> {
    let len = out.len();
    for (p, row) in positions.iter().zip(rows.chunks_exact(width.max(1))) {
        out.get_mut(p * width..(p + 1) * width)
            .ok_or_else(|| {
                err(format!(
                    "Gather: position {p} is beyond the output's {len} values"
                ))
            })?
            .copy_from_slice(row);
    }
    Ok(())
}

impl DenseGraph {
    /// Reads `path`; an op outside the supported set is an error naming it.
    pub fn load(path: &Path) -> DataflowResult<DenseGraph> {
        let bytes = std::fs::read(path)
            .map_err(|e| DataflowError::io(format!("reading {}", path.display()), e))?;
        let model = proto::ModelProto::decode(bytes.as_slice())
            .map_err(|e| err(format!("{}: not an ONNX model: {e}", path.display())))?;
        let graph = model
            .graph
            .ok_or_else(|| err(format!("{}: the model has no graph", path.display())))?;
        const SUPPORTED: &[&str] = &[
            "Constant",
            "Gather",
            "Add",
            "Sub",
            "Mul",
            "Div",
            "ReduceSum",
            "Squeeze",
            "Unsqueeze",
            "Concat",
            "Gemm",
            "MatMul",
            "Relu",
            "Sigmoid",
            "Flatten",
            "Identity",
        ];
        if let Some(n) = graph
            .node
            .iter()
            .find(|n| !SUPPORTED.contains(&n.op_type.as_str()))
        {
            return Err(err(format!(
                "{}: op `{}` is not supported by the dense executor (it runs: {})",
                path.display(),
                n.op_type,
                SUPPORTED.join(", ")
            )));
        }
        let weights = graph
            .initializer
            .iter()
            .map(|t| Ok((t.name.clone(), Tensor::from_proto(t)?)))
            .collect::<DataflowResult<HashMap<_, _>>>()?;
        let graph_inputs: Vec<&proto::ValueInfoProto> = graph
            .input
            .iter()
            .filter(|i| !weights.contains_key(&i.name))
            .collect();
        let input_specs = graph_inputs
            .iter()
            .map(|v| value_spec(v, path))
            .collect::<DataflowResult<Vec<_>>>()?;
        let output_specs = graph
            .output
            .iter()
            .map(|v| value_spec(v, path))
            .collect::<DataflowResult<Vec<_>>>()?;
        Ok(DenseGraph {
            nodes: graph.node,
            weights,
            split: HashMap::new(),
            inputs: graph_inputs.iter().map(|i| i.name.clone()).collect(),
            outputs: graph.output.iter().map(|o| o.name.clone()).collect(),
            input_specs,
            output_specs,
        })
    }

    /// Inputs with element types and shapes, as the ONNX file declares them.
    pub fn input_specs(&self) -> &[TensorSpec] {
        &self.input_specs
    }

    pub fn output_specs(&self) -> &[TensorSpec] {
        &self.output_specs
    }

    /// The float tables that Gather nodes read rows from (the embedding tables).
    pub fn embedding_tables(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .nodes
            .iter()
            .filter(|n| n.op_type == "Gather" && attr_i(n, "axis", 0) == 0)
            .filter_map(|n| n.input.first())
            .filter(|name| {
                self.weights
                    .get(*name)
                    .is_some_and(|t| t.shape.len() >= 2 && matches!(t.data, Data::F32(_)))
            })
            .cloned()
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// Cuts every embedding table into `parts` row ranges (one per device when the tables are
    /// spread over several GPUs). Gathers then route each index to the part holding its row.
    pub fn split_tables(&mut self, parts: usize) -> DataflowResult<()> {
        for name in self.embedding_tables() {
            let Some(table) = self.weights.remove(&name) else {
                continue;
            };
            // `embedding_tables` only names tables of at least 2 dimensions.
            let Some((&table_rows, row_shape)) = table.shape.split_first() else {
                return Err(err(format!("table `{name}` is a scalar")));
            };
            let rows = RowShards::split(table_rows, parts);
            let width: usize = row_shape.iter().product();
            let values = table.as_f32()?;
            let parts = (0..rows.parts())
                .map(|k| {
                    let r = rows.range(k);
                    let shape = std::iter::once(r.len())
                        .chain(row_shape.iter().copied())
                        .collect();
                    let part = values.get(r.start * width..r.end * width).ok_or_else(|| {
                        err(format!("table `{name}`: its data does not match its shape"))
                    })?;
                    Ok(Tensor::f32(shape, part.to_vec()))
                })
                .collect::<DataflowResult<_>>()?;
            self.split.insert(name, SplitTable { rows, parts });
        }
        Ok(())
    }

    /// Runs the graph on CPU; returns the graph's outputs in order.
    pub fn run_cpu(&self, inputs: &[(&str, Tensor)]) -> DataflowResult<Vec<Tensor>> {
        let mut values: HashMap<&str, Tensor> = HashMap::new();
        for (name, t) in inputs {
            values.insert(name, t.clone());
        }
        for node in &self.nodes {
            let get = |i: usize| -> DataflowResult<&Tensor> {
                let name = node
                    .input
                    .get(i)
                    .ok_or_else(|| err(format!("{}: missing input {i}", node.op_type)))?;
                values
                    .get(name.as_str())
                    .or_else(|| self.weights.get(name))
                    .ok_or_else(|| err(format!("{}: no value `{name}`", node.op_type)))
            };
            let split = node
                .input
                .first()
                .and_then(|n| self.split.get(n))
                .filter(|_| node.op_type == "Gather");
            let out = match split {
                Some(table) => gather_split(table, get(1)?)?,
                None => run_node(node, &get)?,
            };
            let name = node
                .output
                .first()
                .ok_or_else(|| err(format!("{} has no output", node.op_type)))?;
            values.insert(name.as_str(), out);
        }
        let outputs = self
            .outputs
            .iter()
            .map(|o| {
                values
                    .remove(o.as_str())
                    .ok_or_else(|| err(format!("output `{o}` was not computed")))
            })
            .collect();
        for t in values.into_values() {
            if let Data::F32(v) = t.data {
                buffers::give(v);
            }
        }
        outputs
    }
}

/// An input or output of the graph as a [`TensorSpec`] (float32 and int64 only).
fn value_spec(v: &proto::ValueInfoProto, path: &Path) -> DataflowResult<TensorSpec> {
    let tensor = v.r#type.as_ref().and_then(|t| t.tensor_type.as_ref());
    let element = match tensor.map(|t| t.elem_type) {
        Some(1) => arrow_schema::DataType::Float32,
        Some(7) => arrow_schema::DataType::Int64,
        other => {
            return Err(err(format!(
                "{}: `{}` has element type {other:?}; the dense executor takes float32 and int64",
                path.display(),
                v.name
            )))
        }
    };
    let shape = tensor
        .and_then(|t| t.shape.as_ref())
        .map(|s| s.dim.iter().map(|d| d.dim_value.unwrap_or(-1)).collect())
        .unwrap_or_default();
    Ok(TensorSpec {
        name: v.name.clone(),
        element,
        shape,
    })
}
