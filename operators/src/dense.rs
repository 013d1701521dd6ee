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

use crate::onnx::TensorSpec;

/// The part of ONNX's protobuf schema this executor reads (field numbers from onnx.proto).
pub(crate) mod proto {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ModelProto {
        #[prost(message, optional, tag = "7")]
        pub graph: Option<GraphProto>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct GraphProto {
        #[prost(message, repeated, tag = "1")]
        pub node: Vec<NodeProto>,
        #[prost(message, repeated, tag = "5")]
        pub initializer: Vec<TensorProto>,
        #[prost(message, repeated, tag = "11")]
        pub input: Vec<ValueInfoProto>,
        #[prost(message, repeated, tag = "12")]
        pub output: Vec<ValueInfoProto>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct NodeProto {
        #[prost(string, repeated, tag = "1")]
        pub input: Vec<String>,
        #[prost(string, repeated, tag = "2")]
        pub output: Vec<String>,
        #[prost(string, tag = "4")]
        pub op_type: String,
        #[prost(message, repeated, tag = "5")]
        pub attribute: Vec<AttributeProto>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct AttributeProto {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(float, tag = "2")]
        pub f: f32,
        #[prost(int64, tag = "3")]
        pub i: i64,
        #[prost(message, optional, tag = "5")]
        pub t: Option<TensorProto>,
        #[prost(int64, repeated, tag = "8")]
        pub ints: Vec<i64>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TensorProto {
        #[prost(int64, repeated, tag = "1")]
        pub dims: Vec<i64>,
        #[prost(int32, tag = "2")]
        pub data_type: i32,
        #[prost(float, repeated, tag = "4")]
        pub float_data: Vec<f32>,
        #[prost(int64, repeated, tag = "7")]
        pub int64_data: Vec<i64>,
        #[prost(string, tag = "8")]
        pub name: String,
        #[prost(bytes = "vec", tag = "9")]
        pub raw_data: Vec<u8>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ValueInfoProto {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(message, optional, tag = "2")]
        pub r#type: Option<TypeProto>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TypeProto {
        #[prost(message, optional, tag = "1")]
        pub tensor_type: Option<TypeTensor>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TypeTensor {
        #[prost(int32, tag = "1")]
        pub elem_type: i32,
        #[prost(message, optional, tag = "2")]
        pub shape: Option<TensorShapeProto>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TensorShapeProto {
        #[prost(message, repeated, tag = "1")]
        pub dim: Vec<Dimension>,
    }

    /// `dim_value` and `dim_param` are a oneof in onnx.proto; optional fields read the same bytes.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Dimension {
        #[prost(int64, optional, tag = "1")]
        pub dim_value: Option<i64>,
        #[prost(string, optional, tag = "2")]
        pub dim_param: Option<String>,
    }
}

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
                    t.raw_data
                        .chunks_exact(4)
                        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                        .collect()
                } else {
                    t.float_data.clone()
                };
                Tensor::f32(shape, values)
            }
            7 => {
                let values = if !t.raw_data.is_empty() {
                    t.raw_data
                        .chunks_exact(8)
                        .map(|b| {
                            i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
                        })
                        .collect()
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
/// executor ([`crate::dense_cuda`]) on a GPU, which is checked against it.
///
/// # Examples
/// ```
/// use std::path::Path;
/// use riffle_operators::dense::{DenseGraph, Tensor};
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

    pub fn range(&self, part: usize) -> std::ops::Range<usize> {
        self.starts[part]..self.starts[part + 1]
    }

    /// Splits a gather's indices (ONNX semantics: negative counts from the end) by part.
    pub fn route(&self, indices: &[i64]) -> DataflowResult<Vec<ShardRoute>> {
        let rows = self.rows();
        let mut routes = vec![ShardRoute::default(); self.parts()];
        for (position, &i) in indices.iter().enumerate() {
            let row = gather_row(i, rows)?;
            let part = self.starts.partition_point(|s| *s <= row) - 1;
            routes[part].positions.push(position);
            routes[part].local.push((row - self.starts[part]) as i64);
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

/// Writes each part's gathered rows (`width` values each) to their positions in `out`.
pub fn scatter_rows(out: &mut [f32], width: usize, positions: &[usize], rows: &[f32]) {
    for (p, row) in positions.iter().zip(rows.chunks_exact(width.max(1))) {
        out[p * width..(p + 1) * width].copy_from_slice(row);
    }
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
            let rows = RowShards::split(table.shape[0], parts);
            let width: usize = table.shape[1..].iter().product();
            let values = table.as_f32()?;
            let parts = (0..rows.parts())
                .map(|k| {
                    let r = rows.range(k);
                    let mut shape = table.shape.clone();
                    shape[0] = r.len();
                    Tensor::f32(shape, values[r.start * width..r.end * width].to_vec())
                })
                .collect();
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
        self.outputs
            .iter()
            .map(|o| {
                values
                    .remove(o.as_str())
                    .ok_or_else(|| err(format!("output `{o}` was not computed")))
            })
            .collect()
    }
}

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
    let raw: Vec<i64> = if node.input.len() > 1 && !node.input[1].is_empty() {
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

fn run_node<'a>(
    node: &proto::NodeProto,
    get: &dyn Fn(usize) -> DataflowResult<&'a Tensor>,
) -> DataflowResult<Tensor> {
    let op = node.op_type.as_str();
    Ok(match op {
        "Constant" => {
            let t = attr(node, "value")
                .and_then(|a| a.t.as_ref())
                .ok_or_else(|| err("Constant without a tensor `value`"))?;
            Tensor::from_proto(t)?
        }
        "Identity" => get(0)?.clone(),
        "Gather" => {
            let (data, indices) = (get(0)?, get(1)?);
            let idx = gather_rows_of(node, &data.shape, indices.as_i64()?)?;
            let width: usize = data.shape[1..].iter().product();
            let mut shape = indices.shape.clone();
            shape.extend_from_slice(&data.shape[1..]);
            match &data.data {
                Data::F32(v) => Tensor::f32(
                    shape,
                    idx.iter()
                        .flat_map(|&i| v[i * width..(i + 1) * width].iter().copied())
                        .collect(),
                ),
                Data::I64(v) => Tensor::i64(
                    shape,
                    idx.iter()
                        .flat_map(|&i| v[i * width..(i + 1) * width].iter().copied())
                        .collect(),
                ),
            }
        }
        "Add" | "Sub" | "Mul" | "Div" => {
            let f: fn(f32, f32) -> f32 = match op {
                "Add" => |a, b| a + b,
                "Sub" => |a, b| a - b,
                "Mul" => |a, b| a * b,
                _ => |a, b| a / b,
            };
            broadcast(get(0)?, get(1)?, f)?
        }
        "Relu" => map(get(0)?, |x| x.max(0.0))?,
        "Sigmoid" => map(get(0)?, |x| 1.0 / (1.0 + (-x).exp()))?,
        "ReduceSum" => {
            let x = get(0)?;
            let rank = x.shape.len();
            let mut reduce = axes(node, get, rank)?;
            if reduce.is_empty() {
                reduce = (0..rank).collect();
            }
            let keep = attr_i(node, "keepdims", 1) != 0;
            reduce_sum(x, &reduce, keep)?
        }
        "Squeeze" => {
            let x = get(0)?;
            let drop = axes(node, get, x.shape.len())?;
            Tensor {
                shape: shapes::squeeze(&x.shape, &drop),
                data: x.data.clone(),
            }
        }
        "Unsqueeze" => {
            let x = get(0)?;
            let add = axes(node, get, x.shape.len() + 1)?;
            Tensor {
                shape: shapes::unsqueeze(&x.shape, add),
                data: x.data.clone(),
            }
        }
        "Flatten" => {
            let x = get(0)?;
            Tensor {
                shape: shapes::flatten(&x.shape, attr_i(node, "axis", 1)),
                data: x.data.clone(),
            }
        }
        "Concat" => {
            let parts: Vec<&Tensor> = (0..node.input.len())
                .map(get)
                .collect::<DataflowResult<_>>()?;
            let part_shapes: Vec<&[usize]> = parts.iter().map(|p| p.shape.as_slice()).collect();
            let (axis, outer, shape) = shapes::concat(&part_shapes, attr_i(node, "axis", 0))?;
            let mut out = Vec::with_capacity(shape.iter().product());
            for o in 0..outer {
                for p in &parts {
                    let chunk: usize = p.shape[axis..].iter().product();
                    out.extend_from_slice(&p.as_f32()?[o * chunk..(o + 1) * chunk]);
                }
            }
            Tensor::f32(shape, out)
        }
        "Gemm" | "MatMul" => {
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
            let (av, bv) = (a.as_f32()?, b.as_f32()?);
            let at = |i: usize, p: usize| if ta { av[p * m + i] } else { av[i * k + p] };
            let bt = |p: usize, j: usize| if tb { bv[j * k + p] } else { bv[p * n + j] };
            let mut out = vec![0f32; m * n];
            for i in 0..m {
                for j in 0..n {
                    let mut acc = 0f32;
                    for p in 0..k {
                        acc += at(i, p) * bt(p, j);
                    }
                    out[i * n + j] = alpha * acc;
                }
            }
            let product = Tensor::f32(vec![m, n], out);
            if op == "Gemm" && node.input.len() > 2 && !node.input[2].is_empty() {
                let c = map(get(2)?, |x| beta * x)?;
                broadcast(&product, &c, |a, b| a + b)?
            } else {
                product
            }
        }
        other => return Err(err(format!("op `{other}` is not supported"))),
    })
}

/// A Gather from a table split by rows: each part serves its rows, scattered back in order.
fn gather_split(table: &SplitTable, indices: &Tensor) -> DataflowResult<Tensor> {
    let first = table
        .parts
        .first()
        .ok_or_else(|| err("Gather: a split table without parts"))?;
    let width: usize = first.shape[1..].iter().product();
    let routes = table.rows.route(indices.as_i64()?)?;
    let mut out = vec![0f32; indices.len() * width];
    for (part, route) in table.parts.iter().zip(&routes) {
        let values = part.as_f32()?;
        let rows: Vec<f32> = route
            .local
            .iter()
            .flat_map(|&i| {
                values[i as usize * width..(i as usize + 1) * width]
                    .iter()
                    .copied()
            })
            .collect();
        scatter_rows(&mut out, width, &route.positions, &rows);
    }
    let mut shape = indices.shape.clone();
    shape.extend_from_slice(&first.shape[1..]);
    Ok(Tensor::f32(shape, out))
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

/// Output shapes, shared by the CPU and GPU executors so both read a graph the same way.
pub(crate) mod shapes {
    use super::err;
    use riffle_dataflow::DataflowResult;

    /// `(m, k, n)` of `op(A)·op(B)` for 2-D operands (`op`: transposed or not).
    pub fn gemm(
        op: &str,
        a: &[usize],
        b: &[usize],
        ta: bool,
        tb: bool,
    ) -> DataflowResult<(usize, usize, usize)> {
        if a.len() != 2 || b.len() != 2 {
            return Err(err(format!("{op}: only 2-D operands are supported")));
        }
        let (m, k) = if ta { (a[1], a[0]) } else { (a[0], a[1]) };
        let (k2, n) = if tb { (b[1], b[0]) } else { (b[0], b[1]) };
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
        let outer: usize = shape[..axis].iter().product();
        let total: usize = shape.iter().product();
        vec![outer, total / outer.max(1)]
    }

    /// Concat of `parts` at `axis`: the axis made non-negative, the rows before it, and the
    /// output shape.
    pub fn concat(parts: &[&[usize]], axis: i64) -> DataflowResult<(usize, usize, Vec<usize>)> {
        let first = parts.first().ok_or_else(|| err("Concat of nothing"))?;
        let rank = first.len();
        let axis = if axis < 0 { axis + rank as i64 } else { axis } as usize;
        if axis >= rank {
            return Err(err("Concat: axis out of range"));
        }
        let outer: usize = first[..axis].iter().product();
        let mut shape = first.to_vec();
        shape[axis] = parts.iter().map(|p| p[axis]).sum();
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
            for i in (0..s.len()).rev() {
                st[i] = if s[i] == 1 { 0 } else { acc };
                acc *= s[i];
            }
            st
        };
        Ok((shape, strides(&sa), strides(&sb)))
    }
}

fn map(x: &Tensor, f: impl Fn(f32) -> f32) -> DataflowResult<Tensor> {
    Ok(Tensor::f32(
        x.shape.clone(),
        x.as_f32()?.iter().map(|v| f(*v)).collect(),
    ))
}

/// Elementwise `f` with numpy broadcasting.
fn broadcast(a: &Tensor, b: &Tensor, f: fn(f32, f32) -> f32) -> DataflowResult<Tensor> {
    let rank = a.shape.len().max(b.shape.len());
    let (shape, ta, tb) = shapes::broadcast(&a.shape, &b.shape, rank)?;
    let (av, bv) = (a.as_f32()?, b.as_f32()?);
    let total: usize = shape.iter().product();
    let mut out = Vec::with_capacity(total);
    let mut index = vec![0usize; rank];
    for _ in 0..total {
        let ia: usize = index.iter().zip(&ta).map(|(i, s)| i * s).sum();
        let ib: usize = index.iter().zip(&tb).map(|(i, s)| i * s).sum();
        out.push(f(av[ia], bv[ib]));
        for d in (0..rank).rev() {
            index[d] += 1;
            if index[d] < shape[d] {
                break;
            }
            index[d] = 0;
        }
    }
    Ok(Tensor::f32(shape, out))
}

fn reduce_sum(x: &Tensor, axes: &[usize], keep: bool) -> DataflowResult<Tensor> {
    let v = x.as_f32()?;
    let rank = x.shape.len();
    let kept: Vec<usize> = (0..rank)
        .map(|d| if axes.contains(&d) { 1 } else { x.shape[d] })
        .collect();
    let total: usize = kept.iter().product();
    let mut out = vec![0f32; total];
    let mut index = vec![0usize; rank];
    for value in v {
        let mut o = 0;
        for d in 0..rank {
            o = o * kept[d] + if axes.contains(&d) { 0 } else { index[d] };
        }
        out[o] += value;
        for d in (0..rank).rev() {
            index[d] += 1;
            if index[d] < x.shape[d] {
                break;
            }
            index[d] = 0;
        }
    }
    let shape = if keep {
        kept
    } else {
        (0..rank)
            .filter(|d| !axes.contains(d))
            .map(|d| x.shape[d])
            .collect()
    };
    Ok(Tensor::f32(shape, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasting_and_reduction() {
        let a = Tensor::f32(vec![2, 3], vec![1., 2., 3., 4., 5., 6.]);
        let b = Tensor::f32(vec![3], vec![10., 20., 30.]);
        let s = broadcast(&a, &b, |x, y| x + y).unwrap();
        assert_eq!(s.as_f32().unwrap(), &[11., 22., 33., 14., 25., 36.]);
        let r = reduce_sum(&a, &[1], false).unwrap();
        assert_eq!(
            (r.shape.clone(), r.as_f32().unwrap().to_vec()),
            (vec![2], vec![6., 15.])
        );
        let r = reduce_sum(&a, &[0], true).unwrap();
        assert_eq!(
            (r.shape.clone(), r.as_f32().unwrap().to_vec()),
            (vec![1, 3], vec![5., 7., 9.])
        );
        assert!(broadcast(&a, &Tensor::f32(vec![2], vec![1., 2.]), |x, y| x + y).is_err());
    }

    #[test]
    fn row_ranges_cover_the_table_and_route_every_index_to_its_part() {
        let shards = RowShards::split(10, 3);
        assert_eq!(
            (0..3).map(|k| shards.range(k)).collect::<Vec<_>>(),
            vec![0..3, 3..6, 6..10]
        );
        let routes = shards.route(&[9, 0, 3, -1, 5, 2]).unwrap();
        assert_eq!(routes[0].positions, vec![1, 5]);
        assert_eq!(routes[0].local, vec![0, 2]);
        assert_eq!(routes[1].positions, vec![2, 4]);
        assert_eq!(routes[1].local, vec![0, 2]);
        assert_eq!(routes[2].positions, vec![0, 3]);
        assert_eq!(routes[2].local, vec![3, 3]);
        assert!(shards.route(&[10]).is_err());
        assert!(shards.route(&[-11]).is_err());
        // More parts than rows: one row each.
        assert_eq!(RowShards::split(2, 4).parts(), 2);
    }

    #[test]
    fn a_split_gather_equals_the_whole_one() {
        let table = Tensor::f32(vec![7, 2], (0..14).map(|v| v as f32).collect());
        let idx = Tensor::i64(vec![2, 3], vec![6, 0, 3, 3, -2, 1]);
        let rows = RowShards::split(7, 3);
        let parts = (0..3)
            .map(|k| {
                let r = rows.range(k);
                Tensor::f32(
                    vec![r.len(), 2],
                    table.as_f32().unwrap()[r.start * 2..r.end * 2].to_vec(),
                )
            })
            .collect();
        let split = gather_split(&SplitTable { rows, parts }, &idx).unwrap();
        assert_eq!(split.shape, vec![2, 3, 2]);
        assert_eq!(
            split.as_f32().unwrap(),
            &[12., 13., 0., 1., 6., 7., 6., 7., 10., 11., 2., 3.]
        );
    }
}
