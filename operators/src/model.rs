//! Running an ONNX model on tensor columns.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::types::{
    ArrowPrimitiveType, Float32Type, Float64Type, Int32Type, Int64Type, Int8Type, UInt8Type,
};
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use ort::memory::{AllocationDevice, Allocator, AllocatorType, MemoryInfo, MemoryType};
use ort::session::{Session, SessionInputValue};
use ort::value::{PrimitiveTensorElementType, TensorRef};
use riffle_dataflow::tensor::{
    element_type, row_shape, tensor_column, tensor_field, tensor_values,
};
use riffle_dataflow::{DataflowError, DataflowResult, Stage, StageOutput};
use serde::Deserialize;

use crate::dense::{Data as DenseData, DenseGraph, Tensor as DenseTensor};
use crate::dense_cuda::CudaDense;
use crate::onnx::{self, TensorSpec};

mod kind;

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
    /// What runs it (`auto`, `ort`, `dense`).
    #[serde(default)]
    pub executor: Executor,
    /// GPUs over which the embedding tables are split by row range (`[cuda:0, cuda:1]`):
    /// tables too large for one GPU. Dense executor on a GPU only.
    #[serde(default)]
    pub embedding_devices: Vec<Device>,
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

/// `executor:` — the engine that runs the model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Executor {
    /// ONNX Runtime; on a GPU, its CUDA provider when installed, else the dense executor.
    #[default]
    Auto,
    /// ONNX Runtime (on a GPU: its CUDA execution provider, which must be installed).
    Ort,
    /// Riffle's executor for dense graphs (embeddings, matrix products, elementwise ops):
    /// cuBLAS and NVRTC kernels on a GPU, a plain reference implementation on CPU.
    Dense,
}

/// What runs a model stage on one worker, decided from the config and the machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    OrtCpu,
    OrtCuda(usize),
    DenseCpu,
    DenseCuda(usize),
}

/// Chooses the engine. `gpu` is the GPU this worker's stage was given (none on CPU or for
/// `auto` without a usable GPU), `cuda_provider` whether ONNX Runtime's CUDA provider library
/// is installed, `dense` whether the dense executor runs this graph (or why not). Errors name
/// the config key first (`device` or `executor`).
pub fn choose_engine(
    executor: Executor,
    device: &Device,
    gpu: Option<usize>,
    cuda_provider: bool,
    dense: &Result<(), String>,
) -> Result<Engine, String> {
    let Some(n) = gpu else {
        return match (executor, dense) {
            (Executor::Dense, Err(why)) => Err(format!("executor `dense`: {why}")),
            (Executor::Dense, Ok(())) => Ok(Engine::DenseCpu),
            _ => Ok(Engine::OrtCpu),
        };
    };
    let no_provider = "ONNX Runtime's CUDA provider (libonnxruntime_providers_cuda.so) is not \
                       installed next to the ONNX Runtime library (install onnxruntime-gpu and \
                       point RIFFLE_ORT_LIB at its libonnxruntime.so)";
    match executor {
        Executor::Ort if cuda_provider => Ok(Engine::OrtCuda(n)),
        Executor::Ort => Err(format!(
            "executor `ort` on cuda:{n}: {no_provider}; or use `executor: dense` for dense models"
        )),
        Executor::Dense => match dense {
            Ok(()) => Ok(Engine::DenseCuda(n)),
            Err(why) => Err(format!("executor `dense`: {why}")),
        },
        Executor::Auto if cuda_provider => Ok(Engine::OrtCuda(n)),
        Executor::Auto => match (dense, device) {
            (Ok(()), _) => Ok(Engine::DenseCuda(n)),
            (Err(_), Device::Auto) => Ok(Engine::OrtCpu),
            (Err(why), _) => Err(format!(
                "device `cuda:{n}`: {no_provider}, and the dense executor cannot run this model \
                 ({why}); use `cpu` or `auto`"
            )),
        },
    }
}

/// The model stage: one engine (an ONNX Runtime session, or the dense executor) per worker.
///
/// Runs a batch's rows through the model in one call: the `inputs` columns feed the model's
/// inputs and each listed output becomes a new column, row for row.
///
/// # Examples
/// The CTR model on the dense executor, which runs on the CPU without ONNX Runtime
/// (`executor: ort` or `auto` would need the library `scripts/setup.sh` fetches):
/// ```
/// use std::sync::Arc;
/// use arrow_array::cast::AsArray;
/// use arrow_array::types::Float32Type;
/// use arrow_array::{ArrayRef, Int64Array, RecordBatch};
/// use riffle_dataflow::Stage;
/// use riffle_operators::model::{Engine, Model};
///
/// let config = serde_json::json!({
///     "path": "../models/ml100k_ncf_ctr.onnx",
///     "inputs": { "user_id": "user", "item_id": "item" },
///     "outputs": { "p_click": "p_click" },
///     "executor": "dense",
/// });
/// let mut stage = Model::new(serde_json::from_value(config).unwrap(), 1).unwrap();
/// assert_eq!(stage.engine(), Engine::DenseCpu);
/// let batch = RecordBatch::try_from_iter(vec![
///     ("user", Arc::new(Int64Array::from(vec![1, 1, 42])) as ArrayRef),
///     ("item", Arc::new(Int64Array::from(vec![50, 1000, 181])) as _),
/// ])
/// .unwrap();
/// let out = stage.process_batch(&batch).unwrap().records;
///
/// // One click probability per row; the input columns are dropped (`keep_inputs: false`).
/// let p_click = out.column_by_name("p_click").unwrap().as_primitive::<Float32Type>();
/// assert_eq!(p_click.len(), 3);
/// assert!(p_click.values().iter().all(|p| *p > 0.0 && *p < 1.0), "{p_click:?}");
/// assert!(out.column_by_name("user").is_none());
/// ```
pub struct Model {
    config: ModelConfig,
    engine: Engine,
    backend: Backend,
    inputs: Vec<TensorSpec>,
    outputs: Vec<TensorSpec>,
}

enum Backend {
    Ort(Session),
    /// Inputs are copied once into page-locked host memory, which the GPU reads by DMA, and
    /// outputs land in page-locked memory the stage reads directly.
    OrtCuda {
        session: Session,
        pinned: Allocator,
        output_memory: MemoryInfo<'static>,
    },
    Dense(DenseGraph),
    DenseCuda(Box<CudaDense>),
}

impl Model {
    /// Loads the model for worker 0 (see [`Model::for_worker`]).
    pub fn new(config: ModelConfig, default_threads: usize) -> DataflowResult<Self> {
        Self::for_worker(config, default_threads, 0, &[])
    }

    /// Loads the model on the engine and device this worker uses: `device: auto` gives worker
    /// `i` GPU `gpu_map[i mod len]`, or GPU `i mod gpus` without a map. `default_threads`
    /// applies when the config sets no `intra_op_threads`.
    pub fn for_worker(
        config: ModelConfig,
        default_threads: usize,
        worker: usize,
        gpu_map: &[usize],
    ) -> DataflowResult<Self> {
        if config.batch.max_size == 0 {
            return Err(DataflowError::Config(
                "batch.max_size must be at least 1".into(),
            ));
        }
        let Decision {
            engine,
            graph,
            table_devices,
        } = decide(&config, worker, gpu_map)?;
        let threads = config.intra_op_threads.unwrap_or(default_threads).max(1);
        let (backend, inputs, outputs) = match (engine, graph) {
            (Engine::DenseCpu | Engine::DenseCuda(_), Some(graph)) => {
                let (inputs, outputs) =
                    (graph.input_specs().to_vec(), graph.output_specs().to_vec());
                let backend = match engine {
                    Engine::DenseCuda(n) => Backend::DenseCuda(Box::new(
                        CudaDense::with_tables_on(graph, n, &table_devices)?,
                    )),
                    _ => Backend::Dense(graph),
                };
                (backend, inputs, outputs)
            }
            _ => {
                let env = onnx::environment()?;
                let session = open_session(&env, &config.path, threads, engine)?;
                let inputs = onnx::tensor_specs(session.inputs(), &config.path)?;
                let outputs = onnx::tensor_specs(session.outputs(), &config.path)?;
                let backend = match engine {
                    Engine::OrtCuda(n) => pinned_backend(session, n, &config.path)?,
                    _ => Backend::Ort(session),
                };
                (backend, inputs, outputs)
            }
        };
        Ok(Model {
            config,
            engine,
            backend,
            inputs,
            outputs,
        })
    }

    /// The engine this stage runs on.
    pub fn engine(&self) -> Engine {
        self.engine
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

/// The engine a model stage gets on a worker, with what was read to decide.
struct Decision {
    engine: Engine,
    /// The graph, when the dense executor runs it.
    graph: Option<DenseGraph>,
    table_devices: Vec<usize>,
}

fn decide(config: &ModelConfig, worker: usize, gpu_map: &[usize]) -> DataflowResult<Decision> {
    let gpu =
        crate::gpu::resolve(&config.device, worker, gpu_map).map_err(DataflowError::Config)?;
    let table_devices = config
        .embedding_devices
        .iter()
        .map(|d| match d {
            Device::Cuda(n) => crate::gpu::resolve(d, worker, gpu_map)
                .map_err(|e| DataflowError::Config(format!("embedding_devices: {e}")))
                .map(|_| *n),
            other => Err(DataflowError::Config(format!(
                "embedding_devices: expected `cuda:N` entries, found {other:?}"
            ))),
        })
        .collect::<DataflowResult<Vec<usize>>>()?;
    // Reading the graph is cheap; only needed when the dense executor may run it.
    let wants_dense =
        config.executor == Executor::Dense || (config.executor == Executor::Auto && gpu.is_some());
    let (graph, dense) = match wants_dense.then(|| DenseGraph::load(&config.path)) {
        Some(Ok(graph)) => (Some(graph), Ok(())),
        Some(Err(e)) => (None, Err(e.to_string())),
        None => (None, Err("not considered".to_string())),
    };
    let engine = choose_engine(
        config.executor,
        &config.device,
        gpu,
        crate::onnx::cuda_provider_installed(),
        &dense,
    )
    .map_err(DataflowError::Config)?;
    log_engine(config, engine, gpu, &dense);
    if !table_devices.is_empty() && !matches!(engine, Engine::DenseCuda(_)) {
        return Err(DataflowError::Config(format!(
            "embedding_devices: tables are split over GPUs by the dense executor on a GPU; \
             this stage runs as {engine}"
        )));
    }
    Ok(Decision {
        engine,
        graph: graph.filter(|_| matches!(engine, Engine::DenseCpu | Engine::DenseCuda(_))),
        table_devices,
    })
}

/// The engine `config` would run on for `worker` here, without loading the model into it
/// (`riffle plan`).
pub fn planned_engine(
    config: &ModelConfig,
    worker: usize,
    gpu_map: &[usize],
) -> DataflowResult<Engine> {
    decide(config, worker, gpu_map).map(|d| d.engine)
}

impl std::fmt::Display for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Engine::OrtCpu => write!(f, "ONNX Runtime on CPU"),
            Engine::OrtCuda(n) => write!(f, "ONNX Runtime's CUDA provider on cuda:{n}"),
            Engine::DenseCpu => write!(f, "the dense executor on CPU"),
            Engine::DenseCuda(n) => write!(f, "the dense executor (cuBLAS + NVRTC) on cuda:{n}"),
        }
    }
}

/// One line per process saying where a model runs when that was a choice (`auto` without a
/// GPU is said by [`crate::gpu::resolve`]).
fn log_engine(
    config: &ModelConfig,
    engine: Engine,
    gpu: Option<usize>,
    dense: &Result<(), String>,
) {
    static LOGGED: std::sync::Once = std::sync::Once::new();
    if gpu.is_none() && config.executor == Executor::Auto {
        return;
    }
    LOGGED.call_once(|| {
        let path = config.path.display();
        match (engine, gpu) {
            (Engine::OrtCpu, Some(n)) => tracing::info!(
                "model {path}: device `auto` runs on CPU, not cuda:{n}: ONNX Runtime's CUDA \
                 provider is not installed and the dense executor cannot run it ({})",
                dense.as_ref().err().map_or("", String::as_str)
            ),
            (engine, _) => tracing::info!("model {path}: runs on {engine}"),
        }
    });
}

fn open_session(
    env: &ort::environment::Environment,
    path: &Path,
    threads: usize,
    engine: Engine,
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
    if let Engine::OrtCuda(n) = engine {
        let cuda = ort::ep::CUDA::default()
            .with_device_id(n as i32)
            .build()
            .error_on_failure();
        builder = builder
            .with_execution_providers([cuda])
            .map_err(|e| fail(&e))?;
    }
    builder.commit_from_file(path).map_err(|e| fail(&e))
}

fn pinned_backend(session: Session, gpu: usize, path: &Path) -> DataflowResult<Backend> {
    let fail = |e: ort::Error| {
        DataflowError::Config(format!("model {} on cuda:{gpu}: {e}", path.display()))
    };
    let pinned_memory = |kind| {
        MemoryInfo::new(
            AllocationDevice::CUDA_PINNED,
            gpu as i32,
            AllocatorType::Device,
            kind,
        )
    };
    let pinned = Allocator::new(&session, pinned_memory(MemoryType::CPUInput).map_err(fail)?)
        .map_err(fail)?;
    let output_memory = pinned_memory(MemoryType::CPUOutput).map_err(fail)?;
    Ok(Backend::OrtCuda {
        session,
        pinned,
        output_memory,
    })
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
        let mut columns: Vec<ArrayRef> = schema
            .fields()
            .iter()
            .filter_map(|f| batch.column_by_name(f.name()).cloned())
            .collect();
        let out_fields = &schema.fields()[columns.len()..];
        let out_names = self.config.outputs.keys();
        let fail = |e: ort::Error| DataflowError::stage("model", e);
        match &mut self.backend {
            Backend::Ort(session) => {
                let mut values: Vec<(String, SessionInputValue<'_>)> = Vec::new();
                for (name, column) in &self.config.inputs {
                    let (array, element, shape) = input_column(batch, column)?;
                    values.push((name.clone(), tensor_input(array, &element, shape)?));
                }
                let outputs = session.run(values).map_err(fail)?;
                for (field, name) in out_fields.iter().zip(out_names) {
                    columns.push(output_column(ort_output(&outputs, name)?, field, rows)?);
                }
            }
            Backend::OrtCuda {
                session,
                pinned,
                output_memory,
            } => {
                let mut binding = session.create_binding().map_err(fail)?;
                for (name, column) in &self.config.inputs {
                    let (array, element, shape) = input_column(batch, column)?;
                    let value = pinned_input(pinned, array, &element, shape)?;
                    binding.bind_input(name.as_str(), &value).map_err(fail)?;
                }
                for name in self.config.outputs.keys() {
                    binding
                        .bind_output_to_device(name.as_str(), output_memory)
                        .map_err(fail)?;
                }
                let outputs = session.run_binding(&binding).map_err(fail)?;
                for (field, name) in out_fields.iter().zip(out_names) {
                    columns.push(output_column(ort_output(&outputs, name)?, field, rows)?);
                }
            }
            Backend::Dense(graph) => {
                let outputs = graph.run_cpu(&dense_inputs(batch, &self.config.inputs)?)?;
                let names = &graph.outputs;
                push_dense_outputs(&mut columns, names, outputs, out_fields, out_names, rows)?;
            }
            Backend::DenseCuda(gpu) => {
                let outputs = gpu.run(&dense_inputs(batch, &self.config.inputs)?)?;
                let names = gpu.output_names();
                push_dense_outputs(&mut columns, names, outputs, out_fields, out_names, rows)?;
            }
        }
        Ok(StageOutput::all(RecordBatch::try_new(schema, columns)?))
    }
}

/// A model input column: the array, its element type and the batch's tensor shape.
fn input_column<'a>(
    batch: &'a RecordBatch,
    column: &str,
) -> DataflowResult<(&'a dyn Array, DataType, Vec<i64>)> {
    let array = batch
        .column_by_name(column)
        .ok_or_else(|| DataflowError::schema(column, "a tensor column", "no such column"))?;
    let field = batch.schema_ref().field_with_name(column)?.clone();
    let mut shape = vec![batch.num_rows() as i64];
    shape.extend(row_shape(&field)?.iter().map(|d| *d as i64));
    Ok((array.as_ref(), element_type(&field), shape))
}

fn ort_output<'a>(
    outputs: &'a ort::session::SessionOutputs<'_>,
    name: &str,
) -> DataflowResult<&'a ort::value::DynValue> {
    outputs.get(name).ok_or_else(|| {
        DataflowError::stage("model", format!("output `{name}` missing from the run"))
    })
}

/// The input copied into page-locked memory from `allocator`.
fn pinned_input(
    allocator: &Allocator,
    array: &dyn Array,
    element: &DataType,
    shape: Vec<i64>,
) -> DataflowResult<ort::value::DynValue> {
    fn copy<T>(
        allocator: &Allocator,
        array: &dyn Array,
        shape: Vec<i64>,
    ) -> DataflowResult<ort::value::DynValue>
    where
        T: ArrowPrimitiveType,
        T::Native: PrimitiveTensorElementType + Copy + std::fmt::Debug + 'static,
    {
        let fail = |e: ort::Error| DataflowError::stage("model", e);
        let values = tensor_values::<T>(array)?;
        let mut tensor = ort::value::Tensor::<T::Native>::new(allocator, shape).map_err(fail)?;
        let (_, dst) = tensor.try_extract_tensor_mut().map_err(fail)?;
        if dst.len() != values.len() {
            return Err(DataflowError::stage(
                "model",
                format!(
                    "pinned input holds {} values, the column {}",
                    dst.len(),
                    values.len()
                ),
            ));
        }
        dst.copy_from_slice(values);
        Ok(tensor.into_dyn())
    }
    match element {
        DataType::Float32 => copy::<Float32Type>(allocator, array, shape),
        DataType::Float64 => copy::<Float64Type>(allocator, array, shape),
        DataType::UInt8 => copy::<UInt8Type>(allocator, array, shape),
        DataType::Int8 => copy::<Int8Type>(allocator, array, shape),
        DataType::Int32 => copy::<Int32Type>(allocator, array, shape),
        DataType::Int64 => copy::<Int64Type>(allocator, array, shape),
        other => Err(DataflowError::schema(
            "model input",
            "a numeric tensor column",
            other.to_string(),
        )),
    }
}

/// The dense executor's inputs (float32 and int64 tensors) from the mapped columns.
fn dense_inputs<'a>(
    batch: &RecordBatch,
    mapping: &'a BTreeMap<String, String>,
) -> DataflowResult<Vec<(&'a str, DenseTensor)>> {
    mapping
        .iter()
        .map(|(name, column)| {
            let (array, element, shape) = input_column(batch, column)?;
            let shape: Vec<usize> = shape.iter().map(|d| *d as usize).collect();
            let tensor = match element {
                DataType::Float32 => {
                    DenseTensor::f32(shape, tensor_values::<Float32Type>(array)?.to_vec())
                }
                DataType::Int64 => {
                    DenseTensor::i64(shape, tensor_values::<Int64Type>(array)?.to_vec())
                }
                other => {
                    return Err(DataflowError::schema(
                        column,
                        "a float32 or int64 tensor column (dense executor)",
                        other.to_string(),
                    ))
                }
            };
            Ok((name.as_str(), tensor))
        })
        .collect()
}

/// Appends the configured outputs of a dense run (`names`: the graph's outputs, in order).
fn push_dense_outputs<'a>(
    columns: &mut Vec<ArrayRef>,
    names: &[String],
    mut outputs: Vec<DenseTensor>,
    fields: &[Arc<Field>],
    wanted: impl Iterator<Item = &'a String>,
    rows: usize,
) -> DataflowResult<()> {
    for (field, name) in fields.iter().zip(wanted) {
        let at = names.iter().position(|n| n == name).ok_or_else(|| {
            DataflowError::stage("model", format!("output `{name}` missing from the run"))
        })?;
        let tensor = std::mem::replace(&mut outputs[at], DenseTensor::f32(vec![0], Vec::new()));
        if tensor.shape.first() != Some(&rows) {
            return Err(DataflowError::stage(
                "model",
                format!(
                    "output `{name}` has shape {:?}, expected {rows} rows",
                    tensor.shape
                ),
            ));
        }
        check_per_row(field, tensor.shape.iter().skip(1).product(), &tensor.shape)?;
        columns.push(match tensor.data {
            DenseData::F32(v) => tensor_column::<Float32Type>(field, v)?,
            DenseData::I64(v) => tensor_column::<Int64Type>(field, v)?,
        });
    }
    Ok(())
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

/// An output's values per row must fill its column's rows.
fn check_per_row(field: &Field, per_row: usize, shape: &dyn std::fmt::Debug) -> DataflowResult<()> {
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
    Ok(())
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
        let per_row = shape.iter().skip(1).map(|d| *d as usize).product();
        check_per_row(field, per_row, &shape)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_engine_follows_executor_device_and_what_is_installed() {
        let dense_ok: Result<(), String> = Ok(());
        let not_dense: Result<(), String> = Err("op `Conv` is not supported".into());
        use Engine::*;
        use Executor as X;
        let choose = |x, d: Device, gpu, provider, dense: &Result<(), String>| {
            choose_engine(x, &d, gpu, provider, dense)
        };
        // No GPU for this stage.
        assert_eq!(
            choose(X::Auto, Device::Cpu, None, true, &dense_ok),
            Ok(OrtCpu)
        );
        assert_eq!(
            choose(X::Ort, Device::Auto, None, false, &not_dense),
            Ok(OrtCpu)
        );
        assert_eq!(
            choose(X::Dense, Device::Cpu, None, false, &dense_ok),
            Ok(DenseCpu)
        );
        let e = choose(X::Dense, Device::Cpu, None, false, &not_dense).unwrap_err();
        assert!(e.starts_with("executor `dense`: op `Conv`"), "{e}");
        // A GPU: ORT's CUDA provider first, then the dense executor.
        assert_eq!(
            choose(X::Auto, Device::Cuda(1), Some(1), true, &not_dense),
            Ok(OrtCuda(1))
        );
        assert_eq!(
            choose(X::Auto, Device::Cuda(1), Some(1), false, &dense_ok),
            Ok(DenseCuda(1))
        );
        assert_eq!(
            choose(X::Dense, Device::Auto, Some(0), true, &dense_ok),
            Ok(DenseCuda(0))
        );
        assert_eq!(
            choose(X::Ort, Device::Auto, Some(2), true, &dense_ok),
            Ok(OrtCuda(2))
        );
        let e = choose(X::Ort, Device::Cuda(0), Some(0), false, &dense_ok).unwrap_err();
        assert!(
            e.starts_with("executor `ort` on cuda:0: ONNX Runtime's CUDA provider"),
            "{e}"
        );
        // Neither: `auto` falls back to CPU, `cuda:N` is an error naming both reasons.
        assert_eq!(
            choose(X::Auto, Device::Auto, Some(0), false, &not_dense),
            Ok(OrtCpu)
        );
        let e = choose(X::Auto, Device::Cuda(0), Some(0), false, &not_dense).unwrap_err();
        assert!(
            e.starts_with("device `cuda:0`: ") && e.contains("`Conv`"),
            "{e}"
        );
    }
}
