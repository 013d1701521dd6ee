//! Loading ONNX Runtime and reading a model's signature.
//!
//! The shared library is loaded at run time (`ort`'s `load-dynamic`), from `RIFFLE_ORT_LIB` or
//! the cache path that `scripts/setup.sh` fills, so one binary works on any machine that has the
//! library, and a missing library is a clear error instead of a link failure.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use arrow_schema::DataType;
use ort::environment::Environment;
use ort::value::TensorElementType;
use riffle_dataflow::{DataflowError, DataflowResult};

/// Version of the ONNX Runtime library the `ort` bindings are built for (`api-31`).
pub const ORT_VERSION: &str = "1.31.1";
/// Environment variable overriding the library's location.
pub const ORT_LIB_ENV: &str = "RIFFLE_ORT_LIB";

/// Where Riffle looks for `libonnxruntime` when `RIFFLE_ORT_LIB` is unset: the path
/// `scripts/setup.sh` writes to.
pub fn default_library_path() -> PathBuf {
    let cache = std::env::var_os("RIFFLE_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|c| PathBuf::from(c).join("riffle")))
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/riffle")))
        .unwrap_or_else(|| PathBuf::from(".cache/riffle"));
    cache
        .join(format!("onnxruntime-{ORT_VERSION}"))
        .join(format!("libonnxruntime.so.{ORT_VERSION}"))
}

/// The library path in effect: `RIFFLE_ORT_LIB` if set, else [`default_library_path`].
pub fn library_path() -> PathBuf {
    std::env::var_os(ORT_LIB_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(default_library_path)
}

static ENVIRONMENT: OnceLock<Environment> = OnceLock::new();
static INIT: Mutex<()> = Mutex::new(());

/// The process's ONNX Runtime environment, loading the library on first use.
pub fn environment() -> DataflowResult<Environment> {
    if let Some(env) = ENVIRONMENT.get() {
        return Ok(env.clone());
    }
    // ort allows one environment per process: serialise the first initialisation.
    let _guard = INIT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(env) = ENVIRONMENT.get() {
        return Ok(env.clone());
    }
    let path = library_path();
    let env = load(&path)?;
    Ok(ENVIRONMENT.get_or_init(|| env).clone())
}

fn load(path: &Path) -> DataflowResult<Environment> {
    if !path.is_file() {
        return Err(missing_library(path, "no such file"));
    }
    let builder = ort::init_from(path).map_err(|e| missing_library(path, e))?;
    builder
        .with_name("riffle")
        .build()
        .map_err(|e| DataflowError::Config(format!("ONNX Runtime at {}: {e}", path.display())))
}

fn missing_library(path: &Path, why: impl std::fmt::Display) -> DataflowError {
    DataflowError::Config(format!(
        "ONNX Runtime {ORT_VERSION} library not usable at {} ({why}). Run `scripts/setup.sh` to fetch it, \
         or set {ORT_LIB_ENV} to the path of libonnxruntime.so.{ORT_VERSION}",
        path.display()
    ))
}

/// The Arrow element type holding values of an ONNX tensor element type, if supported.
pub fn arrow_type(element: TensorElementType) -> Option<DataType> {
    Some(match element {
        TensorElementType::Float16 => DataType::Float16,
        TensorElementType::Float32 => DataType::Float32,
        TensorElementType::Float64 => DataType::Float64,
        TensorElementType::Uint8 => DataType::UInt8,
        TensorElementType::Int8 => DataType::Int8,
        TensorElementType::Uint16 => DataType::UInt16,
        TensorElementType::Int16 => DataType::Int16,
        TensorElementType::Uint32 => DataType::UInt32,
        TensorElementType::Int32 => DataType::Int32,
        TensorElementType::Uint64 => DataType::UInt64,
        TensorElementType::Int64 => DataType::Int64,
        TensorElementType::Bool => DataType::Boolean,
        _ => return None,
    })
}

/// Whether ONNX Runtime's CUDA provider library sits next to the ONNX Runtime library in use
/// (as in the onnxruntime-gpu wheel); ONNX Runtime loads it from there.
pub fn cuda_provider_installed() -> bool {
    library_path()
        .with_file_name("libonnxruntime_providers_cuda.so")
        .is_file()
}

/// One input or output of a model: name, element type and shape (`-1` for dynamic dims).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    pub element: DataType,
    pub shape: Vec<i64>,
}

impl TensorSpec {
    pub fn describe(&self) -> String {
        let dims: Vec<String> = self
            .shape
            .iter()
            .map(|d| {
                if *d < 0 {
                    "?".to_string()
                } else {
                    d.to_string()
                }
            })
            .collect();
        format!("{}[{}]", self.element, dims.join(","))
    }
}

pub(crate) fn tensor_specs(
    outlets: &[ort::value::Outlet],
    model: &Path,
) -> DataflowResult<Vec<TensorSpec>> {
    outlets
        .iter()
        .map(|o| {
            let dtype = o.dtype();
            let element = dtype.tensor_type().and_then(arrow_type).ok_or_else(|| {
                DataflowError::Config(format!(
                    "model {}: `{}` has unsupported type {dtype:?}",
                    model.display(),
                    o.name()
                ))
            })?;
            let shape = dtype.tensor_shape().map(|s| s.to_vec()).unwrap_or_default();
            Ok(TensorSpec {
                name: o.name().to_string(),
                element,
                shape,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_library_path_is_a_clear_error_not_a_panic() {
        let err = load(Path::new("/nonexistent/libonnxruntime.so")).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("scripts/setup.sh"), "{text}");
        assert!(text.contains("/nonexistent/libonnxruntime.so"), "{text}");
    }
}
