//! The stage one worker runs: its own instance of the user's module, called under the GIL
//! with each batch as a `pyarrow.RecordBatch` (zero copy, through the Arrow C data interface).

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use arrow_array::RecordBatch;
use arrow_pyarrow::{FromPyArrow, ToPyArrow};
use arrow_schema::SchemaRef;
use pyo3::prelude::*;
use riffle_dataflow::{DataflowError, DataflowResult, Stage, StageOutput};

use crate::interpreter;

pub(crate) const NAME: &str = "python";

/// Why a function could not be loaded, and the configuration key to blame.
pub(crate) struct LoadError {
    pub key: &'static str,
    pub message: String,
}

impl From<LoadError> for DataflowError {
    fn from(e: LoadError) -> Self {
        DataflowError::Config(e.message).at(e.key)
    }
}

/// Imports `path` as a module of its own (a worker's module-level state is its own) and
/// returns its `function`.
pub(crate) fn load(path: &Path, function: &str) -> Result<Py<PyAny>, LoadError> {
    static LOADED: AtomicUsize = AtomicUsize::new(0);
    let at_path = |py: Python<'_>, e: PyErr| LoadError {
        key: "path",
        message: format!(
            "python: cannot load {}: {}",
            path.display(),
            interpreter::reason(py, &e)
        ),
    };
    interpreter::ensure().map_err(|e| Python::attach(|py| at_path(py, e)))?;
    Python::attach(|py| {
        let module = (|| -> PyResult<Bound<'_, PyAny>> {
            if let Some(dir) = path.parent() {
                interpreter::add_path(py, dir)?;
            }
            let stem = path.file_stem().map_or_else(
                || "udf".to_string(),
                |s| {
                    s.to_string_lossy()
                        .replace(|c: char| !c.is_alphanumeric(), "_")
                },
            );
            let name = format!(
                "riffle_udf_{stem}_{}",
                LOADED.fetch_add(1, Ordering::Relaxed)
            );
            let util = py.import("importlib.util")?;
            let spec =
                util.call_method1("spec_from_file_location", (name, path.to_string_lossy()))?;
            let module = util.call_method1("module_from_spec", (&spec,))?;
            spec.getattr("loader")?
                .call_method1("exec_module", (&module,))?;
            Ok(module)
        })()
        .map_err(|e| at_path(py, e))?;
        let f = module.getattr(function).map_err(|_| LoadError {
            key: "function",
            message: format!("python: {} defines no `{function}`", path.display()),
        })?;
        if !f.is_callable() {
            return Err(LoadError {
                key: "function",
                message: format!("python: `{function}` in {} is not callable", path.display()),
            });
        }
        Ok(f.unbind())
    })
}

/// Calls `function` with `batch`; `None` back is a batch of no rows.
fn call(function: &Py<PyAny>, batch: &RecordBatch) -> Result<Option<RecordBatch>, String> {
    Python::attach(|py| {
        let arg = batch
            .to_pyarrow(py)
            .map_err(|e| interpreter::reason(py, &e))?;
        let out = function
            .bind(py)
            .call1((arg,))
            .map_err(|e| interpreter::reason(py, &e))?;
        if out.is_none() {
            return Ok(None);
        }
        RecordBatch::from_pyarrow_bound(&out)
            .map(Some)
            .map_err(|_| {
                let kind = out
                    .get_type()
                    .name()
                    .map_or_else(|_| "?".to_string(), |n| n.to_string());
                format!("returned a {kind}, expected a pyarrow.RecordBatch (or None for no rows)")
            })
    })
}

/// The schema a function makes of `input`: what it returns for a batch of no rows.
pub(crate) fn infer(function: &Py<PyAny>, input: &SchemaRef) -> Result<SchemaRef, String> {
    match call(function, &RecordBatch::new_empty(input.clone()))? {
        Some(out) => Ok(out.schema()),
        None => Err("returned None for a batch of no rows: declare its `schema:`".into()),
    }
}

/// `out` under `schema`: the same names and types, in order (nullability and metadata from
/// `schema`).
fn conform(out: RecordBatch, schema: &SchemaRef) -> Result<RecordBatch, String> {
    let same = out.num_columns() == schema.fields().len()
        && out
            .schema()
            .fields()
            .iter()
            .zip(schema.fields())
            .all(|(a, b)| a.name() == b.name() && a.data_type() == b.data_type());
    if !same {
        let list = |s: &SchemaRef| {
            s.fields()
                .iter()
                .map(|f| format!("{}: {}", f.name(), f.data_type()))
                .collect::<Vec<_>>()
                .join(", ")
        };
        return Err(format!(
            "returned columns [{}], expected [{}]",
            list(&out.schema()),
            list(schema)
        ));
    }
    RecordBatch::try_new(schema.clone(), out.columns().to_vec()).map_err(|e| e.to_string())
}

/// A Python function applied to each batch (or each merged batch, with `batch:`).
pub struct PythonStage {
    function: Py<PyAny>,
    declared: Option<SchemaRef>,
    /// The last input schema and what the function makes of it.
    inferred: Option<(SchemaRef, SchemaRef)>,
}

impl PythonStage {
    pub(crate) fn new(function: Py<PyAny>, declared: Option<SchemaRef>) -> Self {
        PythonStage {
            function,
            declared,
            inferred: None,
        }
    }

    fn schema_for(&mut self, input: &SchemaRef) -> DataflowResult<SchemaRef> {
        if let Some(s) = &self.declared {
            return Ok(s.clone());
        }
        if let Some((i, o)) = &self.inferred {
            if i == input {
                return Ok(o.clone());
            }
        }
        let out = infer(&self.function, input).map_err(|e| DataflowError::stage(NAME, e))?;
        self.inferred = Some((input.clone(), out.clone()));
        Ok(out)
    }
}

impl Stage for PythonStage {
    fn name(&self) -> &str {
        NAME
    }

    fn output_schema(&self, input: &SchemaRef) -> DataflowResult<SchemaRef> {
        if let Some(s) = &self.declared {
            return Ok(s.clone());
        }
        match &self.inferred {
            Some((i, o)) if i == input => Ok(o.clone()),
            _ => infer(&self.function, input).map_err(|e| DataflowError::stage(NAME, e)),
        }
    }

    fn process_batch(&mut self, batch: &RecordBatch) -> DataflowResult<StageOutput> {
        let schema = self.schema_for(batch.schema_ref())?;
        // An exception fails this batch only: its rows become dead letters with the reason.
        let out = call(&self.function, batch).map_err(|e| DataflowError::stage(NAME, e))?;
        let out = match out {
            Some(out) => conform(out, &schema).map_err(|e| DataflowError::stage(NAME, e))?,
            None => RecordBatch::new_empty(schema),
        };
        Ok(StageOutput::all(out))
    }

    fn preserves_rows(&self) -> bool {
        false
    }
}
