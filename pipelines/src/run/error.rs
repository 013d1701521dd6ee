//! Why a run failed: [`RunError`].

use std::path::PathBuf;

use riffle_dataflow::DataflowError;
use thiserror::Error;

use crate::{LockError, PipelineError};

/// Why a run (or a supervisor's cluster) failed; `riffle run` prints it and exits 1.
///
/// Each message holds its causes (no variant has a `source` besides the transparent ones, whose
/// inner errors say their own), so `{}` and anyhow's `{:#}` print the same line.
#[derive(Debug, Error)]
pub enum RunError {
    /// The pipeline file (or `--checkpoint-dir`) is not valid.
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
    /// Another run holds the checkpoint directory or an output file.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// The cluster's description (hostfile, ports) or the metrics registry.
    #[error(transparent)]
    Dataflow(#[from] DataflowError),
    /// `--workers 0`.
    #[error("--workers must be at least 1")]
    NoWorkers,
    /// The cluster token a supervisor hands its processes is not a number.
    #[error("{var}={value}: {cause}")]
    Token {
        var: &'static str,
        value: String,
        cause: std::num::ParseIntError,
    },
    /// An operating-system call of the lifecycle: the signal handler, starting or watching a
    /// process of a local cluster.
    #[error("{context}: {cause}")]
    Io {
        context: String,
        cause: std::io::Error,
    },
    /// The run itself failed (a worker's error, a lost peer); `message` is its whole chain of
    /// causes with secret `${VAR}` values redacted.
    #[error("running {}: {message}", file.display())]
    Failed { file: PathBuf, message: String },
    /// A process of a local cluster exited abnormally; the others were stopped.
    #[error("process {process} exited with {status}; stopped the other processes")]
    ProcessFailed {
        process: usize,
        status: std::process::ExitStatus,
    },
    /// A local cluster failed while it was stopping on request (not restarted).
    #[error("while stopping: {0}")]
    WhileStopping(Box<RunError>),
    /// A local cluster failed more often than `max_restarts` allows.
    #[error("gave up after {restarts} restart(s) in a row: {last}")]
    GaveUp {
        restarts: usize,
        last: Box<RunError>,
    },
}

impl RunError {
    /// What `riffle run` exits with on this error.
    pub fn exit_code(&self) -> i32 {
        super::exit::FAILED
    }

    pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> RunError {
        let context = context.into();
        move |cause| RunError::Io { context, cause }
    }
}

/// `error` and its causes as anyhow's `{:#}` prints them: `outer: inner: innermost`.
pub(crate) fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        text.push_str(": ");
        text.push_str(&e.to_string());
        cause = e.source();
    }
    text
}
