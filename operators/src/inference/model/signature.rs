//! A model's signature read from its ONNX file, and the model stage's schema rule over it.
//!
//! [`Signature::read`] needs neither ONNX Runtime nor a GPU: validation gets the same
//! [`TensorSpec`]s the engines report (ONNX Runtime's session, the dense executor's graph)
//! from the protobuf alone. [`output_schema`] is the one rule for the stage's output schema:
//! [`super::Model`]'s `Stage::output_schema` calls it with the signature its engine loaded.

use std::path::Path;
use std::sync::Arc;

use arrow_schema::{DataType, Field, Schema, SchemaRef};
use prost::Message;
use riffle_dataflow::tensor::{element_type, row_shape, tensor_field};
use riffle_dataflow::{DataflowError, DataflowResult};

use super::{ModelConfig, OutputSpec};
use crate::inference::dense::proto::{SignatureModelProto, ValueInfoProto};
use crate::inference::onnx::TensorSpec;

/// A model's inputs (graph inputs that are not initializers) and outputs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Signature {
    pub inputs: Vec<TensorSpec>,
    pub outputs: Vec<TensorSpec>,
}

impl Signature {
    /// Reads the signature of the ONNX model at `path` from its protobuf: element types as
    /// Arrow types, `dim_value`s as sizes and `dim_param`s (or missing dims) as `-1`, as ONNX
    /// Runtime reports them. Loads no library. Errors are located at `path`.
    pub fn read(path: &Path) -> DataflowResult<Signature> {
        let fail = |why: String| {
            DataflowError::Config(format!("model {}: {why}", path.display())).at("path")
        };
        let bytes = std::fs::read(path).map_err(|e| fail(e.to_string()))?;
        let model = SignatureModelProto::decode(bytes.as_slice())
            .map_err(|e| fail(format!("not an ONNX model: {e}")))?;
        let graph = model
            .graph
            .ok_or_else(|| fail("not an ONNX model: no graph".to_string()))?;
        let initializers: std::collections::HashSet<&str> =
            graph.initializer.iter().map(|t| t.name.as_str()).collect();
        let specs = |values: &[ValueInfoProto], skip: &dyn Fn(&str) -> bool| {
            values
                .iter()
                .filter(|v| !skip(&v.name))
                .map(|v| value_spec(v).map_err(fail))
                .collect::<DataflowResult<Vec<TensorSpec>>>()
        };
        Ok(Signature {
            inputs: specs(&graph.input, &|name| initializers.contains(name))?,
            outputs: specs(&graph.output, &|_| false)?,
        })
    }

    /// The input called `name`.
    pub fn input(&self, name: &str) -> Option<&TensorSpec> {
        self.inputs.iter().find(|s| s.name == name)
    }

    /// The output called `name`.
    pub fn output(&self, name: &str) -> Option<&TensorSpec> {
        self.outputs.iter().find(|s| s.name == name)
    }
}

/// The Arrow element type of ONNX's `TensorProto.DataType` `elem_type`, for the types Riffle
/// moves between Arrow and a model (those of `crate::inference::onnx::arrow_type`).
pub(super) fn arrow_element(elem_type: i32) -> Option<DataType> {
    Some(match elem_type {
        1 => DataType::Float32,
        2 => DataType::UInt8,
        3 => DataType::Int8,
        4 => DataType::UInt16,
        5 => DataType::Int16,
        6 => DataType::Int32,
        7 => DataType::Int64,
        9 => DataType::Boolean,
        10 => DataType::Float16,
        11 => DataType::Float64,
        12 => DataType::UInt32,
        13 => DataType::UInt64,
        _ => return None,
    })
}

fn value_spec(v: &ValueInfoProto) -> Result<TensorSpec, String> {
    let tensor = v.r#type.as_ref().and_then(|t| t.tensor_type.as_ref());
    let element = tensor
        .and_then(|t| arrow_element(t.elem_type))
        .ok_or_else(|| {
            format!(
                "`{}` has unsupported type (ONNX element type {:?})",
                v.name,
                tensor.map(|t| t.elem_type)
            )
        })?;
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

/// `map.name` as a config key path.
fn entry(map: &str, name: &str) -> String {
    format!("{map}.{}", crate::key_segment(name))
}

fn spec<'a>(
    specs: &'a [TensorSpec],
    name: &str,
    kind: &str,
    model: &Path,
) -> DataflowResult<&'a TensorSpec> {
    specs.iter().find(|s| s.name == name).ok_or_else(|| {
        let known: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
        DataflowError::Config(format!(
            "model {} has no {kind} `{name}`; its {kind}s are: {}",
            model.display(),
            known.join(", ")
        ))
    })
}

/// The schema a model stage configured by `config`, running a model of `signature`, gives
/// for `input`: the mapped input columns checked against the model's inputs (and dropped
/// unless `keep_inputs`), one tensor column per configured output. Errors about a config
/// entry are located at it (`inputs."image_tensor:0"`, `outputs.scores`, `inputs`).
pub fn output_schema(
    config: &ModelConfig,
    signature: &Signature,
    input: &SchemaRef,
) -> DataflowResult<SchemaRef> {
    let path = &config.path;
    for spec in &signature.inputs {
        if !config.inputs.contains_key(&spec.name) {
            return Err(DataflowError::Config(format!(
                "model {} needs input `{}` ({}); map it to a column under `inputs`",
                path.display(),
                spec.name,
                spec.describe()
            ))
            .at("inputs"));
        }
    }
    for (name, column) in &config.inputs {
        let at = |e: DataflowError| e.at(entry("inputs", name));
        let spec = spec(&signature.inputs, name, "input", path).map_err(at)?;
        let field = input.field_with_name(column).map_err(|_| {
            at(DataflowError::schema(
                column,
                format!(
                    "a tensor column for model input `{name}` {}",
                    spec.describe()
                ),
                "no such column",
            ))
        })?;
        check_input(field, spec).map_err(at)?;
    }
    let mut fields: Vec<Arc<Field>> = input
        .fields()
        .iter()
        .filter(|f| config.keep_inputs || !config.inputs.values().any(|c| c == f.name()))
        .cloned()
        .collect();
    for (name, out) in &config.outputs {
        let at = |e: DataflowError| e.at(entry("outputs", name));
        let spec = spec(&signature.outputs, name, "output", path).map_err(at)?;
        let shape = output_row_shape(spec, out).map_err(|found| {
            at(DataflowError::Config(format!(
                "model {} output `{name}` is {}: {found}; declare its per-row shape, e.g. \
                 `{name}: {{ column: {}, shape: [...] }}`",
                path.display(),
                spec.describe(),
                out.column()
            )))
        })?;
        fields.push(Arc::new(tensor_field(
            out.column(),
            spec.element.clone(),
            &shape,
        )));
    }
    Ok(Arc::new(Schema::new(fields)))
}

/// Per-row shape of an output column: the model's dims after the batch one, or the declared
/// shape, which must agree with every fixed model dimension.
fn output_row_shape(spec: &TensorSpec, out: &OutputSpec) -> Result<Vec<usize>, String> {
    let model_row = spec.shape.get(1..).unwrap_or(&[]);
    match out {
        OutputSpec::Column(_) => model_row
            .iter()
            .map(|d| usize::try_from(*d))
            .collect::<Result<Vec<usize>, _>>()
            .map_err(|_| "its dimensions after the batch one are dynamic".to_string()),
        OutputSpec::Shaped { shape, .. } => {
            let fits = model_row.len() == shape.len()
                && model_row
                    .iter()
                    .zip(shape)
                    .all(|(m, s)| *m < 0 || *m as usize == *s);
            if fits {
                Ok(shape.clone())
            } else {
                Err(format!("the declared shape {shape:?} does not fit it"))
            }
        }
    }
}

fn check_input(field: &Field, spec: &TensorSpec) -> DataflowResult<()> {
    let found_element = element_type(field);
    let shape = row_shape(field)?;
    let expected = || format!("{} for model input `{}`", spec.describe(), spec.name);
    let found = || {
        format!(
            "{found_element}[?,{}]",
            riffle_dataflow::tensor::format_shape(&shape)
        )
    };
    if found_element != spec.element {
        return Err(DataflowError::schema(field.name(), expected(), found()));
    }
    let model_row = spec.shape.get(1..).unwrap_or(&[]);
    let fits = model_row.len() == shape.len()
        && model_row
            .iter()
            .zip(&shape)
            .all(|(m, c)| *m < 0 || *m as usize == *c);
    if !fits {
        return Err(DataflowError::schema(field.name(), expected(), found()));
    }
    Ok(())
}
