use thiserror::Error;

/// Errors raised by the engine and by the operators and connectors built on it.
#[derive(Debug, Error)]
pub enum DataflowError {
    #[error("arrow: {0}")]
    Arrow(#[from] arrow_schema::ArrowError),
    // The cause is in the message and not also a `source`: chains printed whole (anyhow's
    // `{:#}`) would say it twice.
    #[error("{context}: {cause}")]
    Io {
        context: String,
        cause: std::io::Error,
    },
    /// A column a stage needs is missing or has the wrong type.
    #[error("column `{column}`: expected {expected}, found {found}")]
    Schema {
        column: String,
        expected: String,
        found: String,
    },
    /// The stage's own configuration is unusable (caught at validation where possible).
    #[error("{0}")]
    Config(String),
    /// A failure while running a model or other operator logic on a whole batch.
    #[error("{stage}: {message}")]
    Stage { stage: String, message: String },
    /// The batch is too large for the stage to process at once (its output would not fit an
    /// Arrow array); the runtime splits the batch in halves and runs each, so no row fails for
    /// its neighbours' size.
    #[error("{stage}: {message}")]
    BatchTooLarge { stage: String, message: String },
    #[error("cluster: {0}")]
    Cluster(String),
    /// An error at a key of a stage's (or source's, sink's) configuration, as a dotted path
    /// relative to that block (`batch.max_size`, `inputs."image_tensor:0"`): validation names
    /// the file, line and field from it, never from the message text.
    #[error("{source}")]
    At {
        key: String,
        #[source]
        source: Box<DataflowError>,
    },
}

impl DataflowError {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        DataflowError::Io {
            context: context.into(),
            cause: source,
        }
    }

    pub fn schema(
        column: impl Into<String>,
        expected: impl Into<String>,
        found: impl Into<String>,
    ) -> Self {
        DataflowError::Schema {
            column: column.into(),
            expected: expected.into(),
            found: found.into(),
        }
    }

    /// This error, located at `key` of the configuration block (an outer key is prepended to
    /// an inner one: `batch` + `max_size` → `batch.max_size`).
    pub fn at(self, key: impl Into<String>) -> Self {
        let key = key.into();
        match self {
            DataflowError::At { key: inner, source } => DataflowError::At {
                key: format!("{key}.{inner}"),
                source,
            },
            other => DataflowError::At {
                key,
                source: Box::new(other),
            },
        }
    }

    /// The configuration key this error is located at, if any, and the error itself.
    pub fn located(&self) -> (Option<&str>, &DataflowError) {
        match self {
            DataflowError::At { key, source } => (Some(key), source.located().1),
            other => (None, other),
        }
    }

    pub fn batch_too_large(stage: impl Into<String>, message: impl std::fmt::Display) -> Self {
        DataflowError::BatchTooLarge {
            stage: stage.into(),
            message: message.to_string(),
        }
    }

    pub fn stage(stage: impl Into<String>, message: impl std::fmt::Display) -> Self {
        DataflowError::Stage {
            stage: stage.into(),
            message: message.to_string(),
        }
    }
}

pub type DataflowResult<T> = Result<T, DataflowError>;
