//! `model`: an ONNX model run over Arrow columns, batch by batch.
//!
//! - the config ([`ModelConfig`], [`BatchConfig`], [`Executor`], [`DeviceSpec`]);
//! - the engine choice ([`choose_engine`], [`planned_engine`]: ONNX Runtime or the dense
//!   executor, on CPU or a GPU) in `engine`;
//! - the model's [`Signature`], read from the ONNX file alone, and the stage's schema rule
//!   [`output_schema`] over it, which validation calls without loading any engine;
//! - the engines' batch I/O: `ort` (ONNX Runtime sessions, pinned memory on a GPU) and
//!   `dense_io` (the dense executor, [`crate::inference::dense`]);
//! - the [`Model`] stage.

use std::collections::BTreeMap;
use std::path::PathBuf;

use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, SchemaRef};
use ort::memory::{Allocator, MemoryInfo};
use ort::session::{Session, SessionInputValue};
use riffle_dataflow::tensor::{element_type, row_shape};
use riffle_dataflow::{DataflowError, DataflowResult, Stage, StageOutput};
pub use riffle_gpu::DeviceSpec;
use serde::Deserialize;

use crate::inference::dense::{CudaDense, DenseGraph};
use crate::inference::onnx::{self, TensorSpec};

mod dense_io;
mod engine;
mod kind;
mod ort_io;
pub mod repository;
mod shared;
mod signature;
#[cfg(test)]
mod tests;
mod variants;
mod versions;

pub use engine::{choose_engine, planned_engine, Engine};
pub use kind::MIN_POLL_MS;
pub use shared::SharedModel;
pub use signature::{output_schema, Signature};
pub use variants::{ShadowSpec, VariantSpec, CONTROL, VARIANT_COLUMN};
pub use versions::{LOOKAHEAD, VERSION_COLUMN};

use dense_io::{dense_inputs, push_dense_outputs};
use engine::{decide, Decision};
use ort_io::{open_session, ort_output, output_column, pinned_backend, pinned_input, tensor_input};

/// `model:` — an ONNX model whose inputs and outputs are Arrow columns.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// The `.onnx` file, or a model repository: a directory of `<version>/model.onnx`
    /// (relative to the pipeline file). From a repository the highest version serves, new
    /// versions are switched to while running, and rows get a `model_version` column.
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
    pub device: DeviceSpec,
    /// What runs it (`auto`, `ort`, `dense`).
    #[serde(default)]
    pub executor: Executor,
    /// GPUs over which the embedding tables are split by row range (`[cuda:0, cuda:1]`):
    /// tables too large for one GPU. Dense executor on a GPU only.
    #[serde(default)]
    pub embedding_devices: Vec<DeviceSpec>,
    /// Keep the input tensor columns in the output (default: drop them, they are large).
    #[serde(default)]
    pub keep_inputs: bool,
    /// `worker`: one model instance per worker; `process`: one per process (per GPU), fed
    /// by all the process's workers, whose batches it merges.
    #[serde(default)]
    pub share: Share,
    /// How often a model repository is looked at for new versions.
    #[serde(default = "default_poll_ms")]
    pub poll_ms: u64,
    /// Other models serving a share of keys each (A/B tests); the rest stay on `path`.
    #[serde(default)]
    pub variants: Vec<VariantSpec>,
    /// The column whose value keeps a key on one variant (and in or out of the shadow's sample).
    #[serde(default)]
    pub variant_key: Option<String>,
    /// A model run on a sample off the main path, its results appended to a file.
    #[serde(default)]
    pub shadow: Option<ShadowSpec>,
}

fn default_poll_ms() -> u64 {
    1000
}

/// `share:` — how many instances of a model a process holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Share {
    /// One per worker: no locking, one copy of the weights and arena per worker.
    #[default]
    Worker,
    /// One per process and engine (per GPU), run by its own thread, batching across workers.
    Process,
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
#[serde(default, deny_unknown_fields)]
pub struct BatchConfig {
    /// Run as soon as this many rows are waiting.
    pub max_size: usize,
    /// Run when the oldest waiting row has waited this long, even if the batch is not full.
    pub max_delay_ms: u64,
    /// Real-time budget: records older than this (since the source read them) when their
    /// batch is about to run are counted as late.
    pub late_after_ms: Option<u64>,
    /// Drop late records instead of running them (a live display wants the newest frame).
    pub drop_late: bool,
}

impl Default for BatchConfig {
    fn default() -> Self {
        BatchConfig {
            max_size: 8,
            max_delay_ms: 5,
            late_after_ms: None,
            drop_late: false,
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
/// use riffle_operators::inference::model::{Engine, Model};
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
    /// The model's inputs and outputs, as the engine that loaded it reports them.
    signature: Signature,
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
        config.check_settings()?;
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
                let mut session = open_session(&env, &config.path, threads, engine)?;
                let inputs =
                    onnx::tensor_specs(session.inputs(), &config.path).map_err(|e| e.at("path"))?;
                if engine == Engine::OrtCpu {
                    ort_io::warm(&mut session, &inputs, &config.path);
                }
                let outputs = onnx::tensor_specs(session.outputs(), &config.path)
                    .map_err(|e| e.at("path"))?;
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
            signature: Signature { inputs, outputs },
        })
    }

    /// The engine this stage runs on.
    pub fn engine(&self) -> Engine {
        self.engine
    }

    /// The model's inputs as its engine reports them.
    pub fn input_specs(&self) -> &[TensorSpec] {
        &self.signature.inputs
    }

    /// The model's outputs as its engine reports them.
    pub fn output_specs(&self) -> &[TensorSpec] {
        &self.signature.outputs
    }

    /// The model's signature as the engine that loaded it reports it.
    pub fn signature(&self) -> &Signature {
        &self.signature
    }

    pub fn batch(&self) -> BatchConfig {
        self.config.batch
    }
}

impl Stage for Model {
    fn name(&self) -> &str {
        "model"
    }

    fn preserves_rows(&self) -> bool {
        true
    }

    fn output_schema(&self, input: &SchemaRef) -> DataflowResult<SchemaRef> {
        output_schema(&self.config, &self.signature, input)
    }

    fn process_batch(&mut self, batch: &RecordBatch) -> DataflowResult<StageOutput> {
        match self.fixed_batch() {
            Some(n) if batch.num_rows() != n && batch.num_rows() > 0 => {
                self.run_in_fixed_batches(batch, n)
            }
            _ => self.run_batch(batch),
        }
    }
}

impl Model {
    /// The batch size the model was exported with, when its inputs fix one (e.g. `[1, 3, H, W]`).
    pub fn fixed_batch(&self) -> Option<usize> {
        let first = self.signature.inputs.first()?.shape.first()?;
        usize::try_from(*first).ok().filter(|n| *n > 0)
    }

    /// Runs `batch` in chunks of the model's fixed batch `n`, the last one padded with copies
    /// of its last row whose outputs are dropped.
    fn run_in_fixed_batches(
        &mut self,
        batch: &RecordBatch,
        n: usize,
    ) -> DataflowResult<StageOutput> {
        let rows = batch.num_rows();
        let mut parts = Vec::with_capacity(rows.div_ceil(n));
        for start in (0..rows).step_by(n) {
            let len = n.min(rows - start);
            let chunk = batch.slice(start, len);
            let chunk = if len < n {
                let last = (len - 1) as u32;
                let indices: arrow_array::UInt32Array =
                    (0..n as u32).map(|i| i.min(last)).collect();
                arrow_select::take::take_record_batch(&chunk, &indices)?
            } else {
                chunk
            };
            parts.push(self.run_batch(&chunk)?.records.slice(0, len));
        }
        let schema = self.output_schema(&batch.schema())?;
        Ok(StageOutput::all(arrow_select::concat::concat_batches(
            &schema, &parts,
        )?))
    }

    fn run_batch(&mut self, batch: &RecordBatch) -> DataflowResult<StageOutput> {
        let rows = batch.num_rows();
        let schema = self.output_schema(&batch.schema())?;
        let mut columns: Vec<ArrayRef> = schema
            .fields()
            .iter()
            .filter_map(|f| batch.column_by_name(f.name()).cloned())
            .collect();
        // The fields after the input's own (`columns` holds some of `schema`'s fields, so never
        // more than it has).
        let out_fields = schema.fields().get(columns.len()..).unwrap_or_default();
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
