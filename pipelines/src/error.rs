use std::fmt;
use std::path::PathBuf;

use thiserror::Error;

/// A problem with a pipeline: where it is (file, line, field) and what was expected.
#[derive(Debug, Error)]
pub struct PipelineError {
    pub file: PathBuf,
    /// 1-based line in the pipeline file, when the problem has one.
    pub line: Option<u64>,
    /// Dotted path of the field, e.g. `stages[2].model.path`.
    pub field: String,
    pub message: String,
}

impl fmt::Display for PipelineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if !self.field.is_empty() {
            write!(f, ": {}", self.field)?;
        }
        write!(f, ": {}", self.message)
    }
}
