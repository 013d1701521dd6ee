//! Which engine runs a model stage on a worker: ONNX Runtime or the dense executor, on CPU or
//! a GPU, decided from the config and what the machine has.

use riffle_dataflow::{DataflowError, DataflowResult};
use riffle_gpu::DeviceSpec;

use super::{Executor, ModelConfig};
use crate::inference::dense::DenseGraph;

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
    device: &DeviceSpec,
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
            (Err(_), DeviceSpec::Auto) => Ok(Engine::OrtCpu),
            (Err(why), _) => Err(format!(
                "device `cuda:{n}`: {no_provider}, and the dense executor cannot run this model \
                 ({why}); use `cpu` or `auto`"
            )),
        },
    }
}

/// The engine a model stage gets on a worker, with what was read to decide.
pub(super) struct Decision {
    pub(super) engine: Engine,
    /// The graph, when the dense executor runs it.
    pub(super) graph: Option<DenseGraph>,
    pub(super) table_devices: Vec<usize>,
}

pub(super) fn decide(
    config: &ModelConfig,
    worker: usize,
    gpu_map: &[usize],
) -> DataflowResult<Decision> {
    let gpu = riffle_gpu::resolve(&config.device, worker, gpu_map)
        .map_err(|e| DataflowError::Config(e).at("device"))?;
    let table_devices = config
        .embedding_devices
        .iter()
        .map(|d| match d {
            DeviceSpec::Cuda(n) => riffle_gpu::resolve(d, worker, gpu_map)
                .map_err(|e| {
                    DataflowError::Config(format!("embedding_devices: {e}")).at("embedding_devices")
                })
                .map(|_| *n),
            other => Err(DataflowError::Config(format!(
                "embedding_devices: expected `cuda:N` entries, found {other:?}"
            ))
            .at("embedding_devices")),
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
        crate::inference::onnx::cuda_provider_installed(),
        &dense,
    )
    // `choose_engine` fails on `executor` except for `executor: auto` on `cuda:N`, where the
    // device asked for is what cannot be served.
    .map_err(|e| {
        let key = if config.executor == Executor::Auto {
            "device"
        } else {
            "executor"
        };
        DataflowError::Config(e).at(key)
    })?;
    log_engine(config, engine, gpu, &dense);
    if !table_devices.is_empty() && !matches!(engine, Engine::DenseCuda(_)) {
        return Err(DataflowError::Config(format!(
            "embedding_devices: tables are split over GPUs by the dense executor on a GPU; \
             this stage runs as {engine}"
        ))
        .at("embedding_devices"));
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
/// GPU is said by [`riffle_gpu::resolve`]).
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
