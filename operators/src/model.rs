//! Running an ONNX model on tensor columns.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::types::{
    ArrowPrimitiveType, Float32Type, Float64Type, Int32Type, Int64Type, Int8Type, UInt8Type,
};
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use ort::session::{Session, SessionInputValue};
use ort::value::{PrimitiveTensorElementType, TensorRef};
use riffle_dataflow::tensor::{
    element_type, row_shape, tensor_column, tensor_field, tensor_values,
};
use riffle_dataflow::{DataflowError, DataflowResult, Stage, StageOutput};
use serde::Deserialize;

use crate::onnx::{self, TensorSpec};

/// `model:` — an ONNX model whose inputs and outputs are Arrow columns.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// The `.onnx` file (relative to the pipeline file).
    pub path: PathBuf,
    /// ONNX input name → column holding it.
    pub inputs: BTreeMap<String, String>,
    /// ONNX output name → column to create. Outputs not listed are discarded.
    pub outputs: BTreeMap<String, OutputSpec>,
    /// Dynamic batching across incoming batches.
    #[serde(default)]
    pub batch: BatchConfig,
    /// Threads ONNX Runtime uses inside one run (default: `runtime.intra_op_threads`).
    #[serde(default)]
    pub intra_op_threads: Option<usize>,
    /// Where the model runs.
    #[serde(default)]
    pub device: Device,
    /// Keep the input tensor columns in the output (default: drop them, they are large).
    #[serde(default)]
    pub keep_inputs: bool,
}

/// Where one model output goes: a column name, or a column plus the per-row shape for outputs
/// whose shape the model leaves dynamic (like Triton's `dims`).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum OutputSpec {
    Column(String),
    Shaped { column: String, shape: Vec<usize> },
}

impl OutputSpec {
    pub fn column(&self) -> &str {
        match self {
            OutputSpec::Column(c) | OutputSpec::Shaped { column: c, .. } => c,
        }
    }
}

/// `batch:` — when a model batch is run.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct BatchConfig {
    /// Run as soon as this many rows are waiting.
    #[serde(default = "default_max_size")]
    pub max_size: usize,
    /// Run when the oldest waiting row has waited this long, even if the batch is not full.
    #[serde(default = "default_max_delay_ms")]
    pub max_delay_ms: u64,
    /// Real-time budget: records older than this (since the source read them) when their
    /// batch is about to run are counted as late.
    #[serde(default)]
    pub late_after_ms: Option<u64>,
    /// Drop late records instead of running them (a live display wants the newest frame).
    #[serde(default)]
    pub drop_late: bool,
}

fn default_max_size() -> usize {
    8
}
fn default_max_delay_ms() -> u64 {
    5
}

impl Default for BatchConfig {
    fn default() -> Self {
        BatchConfig {
            max_size: default_max_size(),
            max_delay_ms: default_max_delay_ms(),
            late_after_ms: None,
            drop_late: false,
        }
    }
}

/// `device:` — `cpu`, `auto` (CPU where no GPU is usable) or `cuda:N`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Device {
    #[default]
    Cpu,
    Auto,
    Cuda(usize),
}

impl<'de> Deserialize<'de> for Device {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        match text.as_str() {
            "cpu" => Ok(Device::Cpu),
            "auto" => Ok(Device::Auto),
            other => other
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Device::Cuda)
                .ok_or_else(|| {
                    serde::de::Error::custom(format!(
                        "expected `cpu`, `auto` or `cuda:N`, found `{other}`"
                    ))
                }),
        }
    }
}

/// The model stage: one ONNX Runtime session per worker.
pub struct Model {
    config: ModelConfig,
    session: Session,
    inputs: Vec<TensorSpec>,
    outputs: Vec<TensorSpec>,
}

impl Model {
    /// Loads the model. `default_threads` applies when the config sets no `intra_op_threads`.
    pub fn new(config: ModelConfig, default_threads: usize) -> DataflowResult<Self> {
        check_device(&config)?;
        if config.batch.max_size == 0 {
            return Err(DataflowError::Config(
                "batch.max_size must be at least 1".into(),
            ));
        }
        let env = onnx::environment()?;
        let threads = config.intra_op_threads.unwrap_or(default_threads).max(1);
        let session = open_session(&env, &config.path, threads)?;
        let inputs = onnx::tensor_specs(session.inputs(), &config.path)?;
        let outputs = onnx::tensor_specs(session.outputs(), &config.path)?;
        Ok(Model {
            config,
            session,
            inputs,
            outputs,
        })
    }

    /// The model's inputs as ONNX Runtime reports them.
    pub fn input_specs(&self) -> &[TensorSpec] {
        &self.inputs
    }

    /// The model's outputs as ONNX Runtime reports them.
    pub fn output_specs(&self) -> &[TensorSpec] {
        &self.outputs
    }

    pub fn batch(&self) -> BatchConfig {
        self.config.batch
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
}

/// GPU placement: `cuda:N` must name a usable GPU; `auto` says once where the model runs.
fn check_device(config: &ModelConfig) -> DataflowResult<()> {
    let found = crate::gpu::discover();
    match (&config.device, &found) {
        (Device::Cpu, _) => Ok(()),
        (Device::Cuda(n), Err(why)) => Err(DataflowError::Config(format!(
            "device `cuda:{n}`: no CUDA device is usable here ({why}); use `cpu`, or `auto` to take a GPU when there is one"
        ))),
        (Device::Cuda(n), Ok(gpus)) if *n >= gpus.len() => Err(DataflowError::Config(format!(
            "device `cuda:{n}`: this machine has {} GPU(s), cuda:0..cuda:{}",
            gpus.len(),
            gpus.len().saturating_sub(1)
        ))),
        (Device::Cuda(n), Ok(_)) => Err(DataflowError::Config(format!(
            "device `cuda:{n}`: running ONNX models on GPU is not in this build yet; use `cpu` or `auto`"
        ))),
        (Device::Auto, found) => {
            // Once per process, not once per worker.
            static AUTO_LOGGED: std::sync::Once = std::sync::Once::new();
            AUTO_LOGGED.call_once(|| match found {
                Err(why) => tracing::info!(
                    "model {}: device `auto` runs on CPU: no CUDA device ({why})",
                    config.path.display()
                ),
                Ok(gpus) => tracing::info!(
                    "model {}: device `auto` runs on CPU: {} GPU(s) found, but GPU execution is not in this build yet",
                    config.path.display(),
                    gpus.len()
                ),
            });
            Ok(())
        }
    }
}

fn open_session(
    env: &ort::environment::Environment,
    path: &Path,
    threads: usize,
) -> DataflowResult<Session> {
    let fail =
        |e: &dyn std::fmt::Display| DataflowError::Config(format!("model {}: {e}", path.display()));
    let mut builder = Session::builder(env)
        .map_err(|e| fail(&e))?
        .with_intra_threads(threads)
        .map_err(|e| fail(&e))?
        // Workers already keep every core busy; spinning threads would steal from them.
        .with_intra_op_spinning(false)
        .map_err(|e| fail(&e))?;
    builder.commit_from_file(path).map_err(|e| fail(&e))
}

impl Stage for Model {
    fn name(&self) -> &str {
        "model"
    }

    fn preserves_rows(&self) -> bool {
        true
    }

    fn output_schema(&self, input: &SchemaRef) -> DataflowResult<SchemaRef> {
        let path = &self.config.path;
        for spec in &self.inputs {
            if !self.config.inputs.contains_key(&spec.name) {
                return Err(DataflowError::Config(format!(
                    "model {} needs input `{}` ({}); map it to a column under `inputs`",
                    path.display(),
                    spec.name,
                    spec.describe()
                )));
            }
        }
        for (name, column) in &self.config.inputs {
            let spec = Self::spec(&self.inputs, name, "input", path)?;
            let field = input.field_with_name(column).map_err(|_| {
                DataflowError::schema(
                    column,
                    format!(
                        "a tensor column for model input `{name}` {}",
                        spec.describe()
                    ),
                    "no such column",
                )
            })?;
            check_input(field, spec)?;
        }
        let mut fields: Vec<Arc<Field>> = input
            .fields()
            .iter()
            .filter(|f| {
                self.config.keep_inputs || !self.config.inputs.values().any(|c| c == f.name())
            })
            .cloned()
            .collect();
        for (name, out) in &self.config.outputs {
            let spec = Self::spec(&self.outputs, name, "output", path)?;
            let shape = output_row_shape(spec, out).map_err(|found| {
                DataflowError::Config(format!(
                    "model {} output `{name}` is {}: {found}; declare its per-row shape, e.g. \
                     `{name}: {{ column: {}, shape: [...] }}`",
                    path.display(),
                    spec.describe(),
                    out.column()
                ))
            })?;
            fields.push(Arc::new(tensor_field(
                out.column(),
                spec.element.clone(),
                &shape,
            )));
        }
        Ok(Arc::new(Schema::new(fields)))
    }

    fn process_batch(&mut self, batch: &RecordBatch) -> DataflowResult<StageOutput> {
        let rows = batch.num_rows();
        let schema = self.output_schema(&batch.schema())?;
        let mut values: Vec<(String, SessionInputValue<'_>)> =
            Vec::with_capacity(self.config.inputs.len());
        for (name, column) in &self.config.inputs {
            let array = batch.column_by_name(column).ok_or_else(|| {
                DataflowError::schema(column, "a tensor column", "no such column")
            })?;
            let field = batch.schema_ref().field_with_name(column)?.clone();
            let mut shape = vec![rows as i64];
            shape.extend(row_shape(&field)?.iter().map(|d| *d as i64));
            values.push((
                name.clone(),
                tensor_input(array.as_ref(), &element_type(&field), shape)?,
            ));
        }
        let outputs = self
            .session
            .run(values)
            .map_err(|e| DataflowError::stage("model", e))?;
        let mut columns: Vec<ArrayRef> = schema
            .fields()
            .iter()
            .filter_map(|f| batch.column_by_name(f.name()).cloned())
            .collect();
        let kept = columns.len();
        for (field, (name, _)) in schema.fields()[kept..].iter().zip(&self.config.outputs) {
            let value = outputs.get(name).ok_or_else(|| {
                DataflowError::stage("model", format!("output `{name}` missing from the run"))
            })?;
            columns.push(output_column(value, field, rows)?);
        }
        Ok(StageOutput::all(RecordBatch::try_new(schema, columns)?))
    }
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

fn tensor_input<'a>(
    array: &'a dyn Array,
    element: &DataType,
    shape: Vec<i64>,
) -> DataflowResult<SessionInputValue<'a>> {
    fn view<'a, T>(array: &'a dyn Array, shape: Vec<i64>) -> DataflowResult<SessionInputValue<'a>>
    where
        T: ArrowPrimitiveType,
        T::Native: PrimitiveTensorElementType + Clone + std::fmt::Debug + 'static,
    {
        // Zero-copy: ONNX Runtime reads the Arrow buffer in place.
        let values = tensor_values::<T>(array)?;
        let tensor = TensorRef::from_array_view((shape, values))
            .map_err(|e| DataflowError::stage("model", e))?;
        Ok(tensor.into())
    }
    match element {
        DataType::Float32 => view::<Float32Type>(array, shape),
        DataType::Float64 => view::<Float64Type>(array, shape),
        DataType::UInt8 => view::<UInt8Type>(array, shape),
        DataType::Int8 => view::<Int8Type>(array, shape),
        DataType::Int32 => view::<Int32Type>(array, shape),
        DataType::Int64 => view::<Int64Type>(array, shape),
        other => Err(DataflowError::schema(
            "model input",
            "a numeric tensor column",
            other.to_string(),
        )),
    }
}

fn output_column(
    value: &ort::value::DynValue,
    field: &Field,
    rows: usize,
) -> DataflowResult<ArrayRef> {
    fn extract<T>(
        value: &ort::value::DynValue,
        field: &Field,
        rows: usize,
    ) -> DataflowResult<ArrayRef>
    where
        T: ArrowPrimitiveType,
        T::Native: PrimitiveTensorElementType + Clone,
    {
        let (shape, data) = value
            .try_extract_tensor::<T::Native>()
            .map_err(|e| DataflowError::stage("model", e))?;
        if shape.first().copied() != Some(rows as i64) {
            return Err(DataflowError::stage(
                "model",
                format!(
                    "output `{}` has shape {shape:?}, expected {rows} rows",
                    field.name()
                ),
            ));
        }
        let per_row: usize = shape.iter().skip(1).map(|d| *d as usize).product();
        let expected = match field.data_type() {
            DataType::FixedSizeList(_, size) => *size as usize,
            _ => 1,
        };
        if per_row != expected {
            return Err(DataflowError::stage(
                "model",
                format!(
                    "output `{}` has shape {shape:?}, expected {expected} values per row",
                    field.name()
                ),
            ));
        }
        tensor_column::<T>(field, data.to_vec())
    }
    match element_type(field) {
        DataType::Float32 => extract::<Float32Type>(value, field, rows),
        DataType::Float64 => extract::<Float64Type>(value, field, rows),
        DataType::UInt8 => extract::<UInt8Type>(value, field, rows),
        DataType::Int8 => extract::<Int8Type>(value, field, rows),
        DataType::Int32 => extract::<Int32Type>(value, field, rows),
        DataType::Int64 => extract::<Int64Type>(value, field, rows),
        other => Err(DataflowError::schema(
            field.name(),
            "a numeric output",
            other.to_string(),
        )),
    }
}
