//! The crate's error: riffle-operators maps it into its `DataflowError` (`Unusable` is a
//! configuration error, `Cuda` a stage's failure), keeping this crate off the engine's.

/// Why a GPU could not be used or its work failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GpuError {
    /// The GPU asked for cannot be used here (no driver, no such device, no NVRTC): the
    /// configuration asks for what the machine lacks. The message names the device.
    #[error("{0}")]
    Unusable(String),
    /// A CUDA call failed, or the host code asked for something impossible, in `stage`'s work.
    #[error("{stage}: {message}")]
    Cuda { stage: String, message: String },
}

impl GpuError {
    pub(crate) fn cuda(stage: &str, message: impl std::fmt::Display) -> GpuError {
        GpuError::Cuda {
            stage: stage.to_string(),
            message: message.to_string(),
        }
    }
}

/// Results of this crate.
pub type GpuResult<T> = Result<T, GpuError>;
