//! Python stages: `python: { path: udf.py, function: f }` calls `f` with each batch as a
//! `pyarrow.RecordBatch` and takes one back, which may have other rows and columns.
//!
//! From the `riffle` binary the interpreter is embedded (started on the first Python stage,
//! with the active virtual environment's packages); from the `riffle` Python package the stage
//! runs in the interpreter that imported it. Either way the GIL is held only during a call,
//! each worker imports its own copy of the module, and a raised exception sends that batch's
//! rows to the dead letters with the traceback's last line (`ValueError: …`) as the reason.
//!
//! # Examples
//! Needs pyarrow where the interpreter finds it (`VIRTUAL_ENV`), so it is compiled, not run,
//! by `cargo test`; tests/python_stage.rs runs these steps through the CLI.
//! ```no_run
//! use std::sync::Arc;
//! use arrow_array::{Int64Array, RecordBatch};
//! use arrow_schema::{DataType, Field, Schema};
//! use riffle_dataflow::runtime::Step;
//! use riffle_operators::{StageContext, StageKind};
//! use riffle_udf::PythonConfig;
//!
//! let dir = tempfile::tempdir().unwrap();
//! let udf = dir.path().join("udf.py");
//! std::fs::write(&udf, "import pyarrow.compute as pc\n\
//!     def big(batch):\n    return batch.filter(pc.greater(batch['n'], 1))\n").unwrap();
//! let config: PythonConfig = serde_json::from_value(serde_json::json!({
//!     "path": udf, "function": "big"
//! })).unwrap();
//!
//! let input = Arc::new(Schema::new(vec![Field::new("n", DataType::Int64, false)]));
//! // Validation calls `big` once with no rows to learn its output schema.
//! let output = config.output_schema(&input).unwrap();
//! assert_eq!(output.field(0).name(), "n");
//!
//! let ctx = StageContext { worker: 0, peers: 1, intra_op_threads: 1, gpus: &[] };
//! let Ok(Step::Apply(mut stage)) = config.build(&ctx) else { panic!("applied per batch") };
//! let batch = RecordBatch::try_new(input, vec![Arc::new(Int64Array::from(vec![1, 2, 3]))]).unwrap();
//! assert_eq!(stage.process_batch(&batch).unwrap().records.num_rows(), 2);
//! ```

mod interpreter;
mod schema;
mod stage;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arrow_schema::SchemaRef;
use riffle_dataflow::operators::BatchPolicy;
use riffle_dataflow::runtime::Step;
use riffle_dataflow::{DataflowError, DataflowResult};
use riffle_operators::inference::model::BatchConfig;
use riffle_operators::kind::{ConfigFile, FileKind};
use riffle_operators::{StageContext, StageKind};
use serde::Deserialize;

pub use schema::DeclaredSchema;
pub use stage::PythonStage;

/// `python:` — a function of a Python file applied to every batch.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PythonConfig {
    /// The Python file (relative to the pipeline file).
    pub path: PathBuf,
    /// The function in it: `f(batch: pyarrow.RecordBatch) -> pyarrow.RecordBatch | None`.
    pub function: String,
    /// Merge incoming batches (of one epoch) into calls of up to `max_size` rows, as a model
    /// does: fewer, larger calls. Without it, each batch is one call.
    #[serde(default)]
    pub batch: Option<BatchConfig>,
    /// The columns it returns (`{ name: Type }`, Arrow's type names: `Int64`, `Utf8`,
    /// `List(Float32)`); without it, learnt by calling it with no rows at validation.
    #[serde(default)]
    pub schema: Option<DeclaredSchema>,
}

impl PythonConfig {
    fn declared(&self) -> DataflowResult<Option<SchemaRef>> {
        self.schema
            .as_ref()
            .map(|s| s.to_schema().map(Arc::new))
            .transpose()
    }
}

impl StageKind for PythonConfig {
    fn kind(&self) -> &'static str {
        stage::NAME
    }

    fn files_mut(&mut self) -> Vec<ConfigFile<'_>> {
        vec![ConfigFile {
            key: "path",
            path: &mut self.path,
            expected: "a Python file (.py)",
            kind: FileKind::File,
        }]
    }

    fn output_schema(&self, input: &SchemaRef) -> DataflowResult<SchemaRef> {
        if let Some(s) = self.declared()? {
            return Ok(s);
        }
        let function = stage::load(&self.path, &self.function)?;
        stage::infer(&function, input).map_err(|e| {
            DataflowError::Config(format!(
                "python: calling `{}` with no rows to learn its output ({e}); declare `schema:` \
                 to skip the call",
                self.function
            ))
            .at("function")
        })
    }

    fn build(&self, _ctx: &StageContext<'_>) -> DataflowResult<Step> {
        let function = stage::load(&self.path, &self.function)?;
        let stage = Box::new(PythonStage::new(function, self.declared()?));
        Ok(match self.batching() {
            Some(policy) => Step::Batched(stage, policy),
            None => Step::Apply(stage),
        })
    }

    fn batching(&self) -> Option<BatchPolicy> {
        self.batch.map(|b| BatchPolicy {
            max_size: b.max_size,
            max_delay: Duration::from_millis(b.max_delay_ms),
            late_after: b.late_after_ms.map(Duration::from_millis),
            drop_late: b.drop_late,
        })
    }

    fn describe(&self, _ctx: &StageContext<'_>) -> String {
        format!(
            "{}:{} in Python (GIL held per call), on the worker holding the batch",
            self.path.display(),
            self.function
        )
    }
}
