//! What every stage kind says about itself, so that validation, planning and running need no
//! list of kinds: the pipeline planner only calls this trait.

use std::fmt;
use std::path::PathBuf;

use arrow_schema::SchemaRef;
use riffle_dataflow::operators::BatchPolicy;
use riffle_dataflow::runtime::Step;
use riffle_dataflow::DataflowResult;

/// A stage kind, implemented by its configuration type (the block under its YAML key).
///
/// # Examples
/// A custom kind, `scale: { column, factor }`, multiplying a Float32 column:
/// ```
/// use std::sync::Arc;
/// use arrow_array::cast::AsArray;
/// use arrow_array::types::Float32Type;
/// use arrow_array::{ArrayRef, Float32Array, RecordBatch};
/// use arrow_schema::{DataType, Field, Schema, SchemaRef};
/// use riffle_dataflow::runtime::Step;
/// use riffle_dataflow::{DataflowError, DataflowResult, Stage, StageOutput};
/// use riffle_operators::{StageContext, StageKind};
///
/// #[derive(Clone, Debug, serde::Deserialize)]
/// #[serde(deny_unknown_fields)]
/// struct ScaleConfig {
///     column: String,
///     factor: f32,
/// }
///
/// /// The stage one worker runs.
/// struct Scale(ScaleConfig);
///
/// impl Stage for Scale {
///     fn name(&self) -> &str {
///         "scale"
///     }
///
///     fn output_schema(&self, input: &SchemaRef) -> DataflowResult<SchemaRef> {
///         let found = match input.field_with_name(&self.0.column) {
///             Ok(f) if f.data_type() == &DataType::Float32 => return Ok(input.clone()),
///             Ok(f) => f.data_type().to_string(),
///             Err(_) => "no such column".to_string(),
///         };
///         // Located at the key naming the column: validation points at its line.
///         Err(DataflowError::schema(&self.0.column, "Float32", found).at("column"))
///     }
///
///     fn process_batch(&mut self, batch: &RecordBatch) -> DataflowResult<StageOutput> {
///         let schema = self.output_schema(batch.schema_ref())?;
///         let i = schema.index_of(&self.0.column)?;
///         let mut columns = batch.columns().to_vec();
///         let factor = self.0.factor;
///         let values = columns[i].as_primitive::<Float32Type>();
///         columns[i] = Arc::new(values.unary::<_, Float32Type>(|v| v * factor));
///         Ok(StageOutput::all(RecordBatch::try_new(schema, columns)?))
///     }
///
///     fn preserves_rows(&self) -> bool {
///         true
///     }
/// }
///
/// impl StageKind for ScaleConfig {
///     fn kind(&self) -> &'static str {
///         "scale"
///     }
///
///     fn output_schema(&self, input: &SchemaRef) -> DataflowResult<SchemaRef> {
///         // Nothing to load: the stage itself answers.
///         Scale(self.clone()).output_schema(input)
///     }
///
///     fn build(&self, _ctx: &StageContext<'_>) -> DataflowResult<Step> {
///         Ok(Step::Apply(Box::new(Scale(self.clone()))))
///     }
/// }
///
/// let config: ScaleConfig = serde_json::from_str(r#"{"column": "score", "factor": 2}"#).unwrap();
///
/// // Validation: the output schema from the configuration alone, no engine built.
/// let input = Arc::new(Schema::new(vec![Field::new("score", DataType::Float32, false)]));
/// assert_eq!(config.output_schema(&input).unwrap(), input);
/// let text = Arc::new(Schema::new(vec![Field::new("score", DataType::Utf8, false)]));
/// let e = config.output_schema(&text).unwrap_err();
/// assert_eq!(e.located().0, Some("column"));
/// assert_eq!(e.to_string(), "column `score`: expected Float32, found Utf8");
///
/// // Running: each worker builds its own instance and applies it batch by batch.
/// let ctx = StageContext { worker: 0, peers: 1, intra_op_threads: 1, gpus: &[] };
/// let Ok(Step::Apply(mut stage)) = config.build(&ctx) else {
///     panic!("`scale` is applied batch by batch");
/// };
/// let scores = Arc::new(Float32Array::from(vec![0.25, 1.5])) as ArrayRef;
/// let batch = RecordBatch::try_new(input, vec![scores]).unwrap();
/// let out = stage.process_batch(&batch).unwrap();
/// assert_eq!(out.records.column(0).as_primitive::<Float32Type>().values(), &[0.5, 3.0]);
/// assert!(out.rejected.is_empty());
/// ```
pub trait StageKind: fmt::Debug + Send + Sync {
    /// The YAML key (`decode`, `model`, …).
    fn kind(&self) -> &'static str;

    /// Files the configuration names, for the planner to resolve against the pipeline file's
    /// folder and check before anything runs.
    fn files_mut(&mut self) -> Vec<ConfigFile<'_>> {
        Vec::new()
    }

    /// The schema this stage makes of `input`, from its configuration and files alone: no
    /// model session is opened and no GPU touched. Errors about a configuration key carry it
    /// ([`riffle_dataflow::DataflowError::at`]).
    fn output_schema(&self, input: &SchemaRef) -> DataflowResult<SchemaRef>;

    /// Checks what the stage needs of this machine for worker `ctx.worker` (a GPU it names, an
    /// engine that can run its model) without building it.
    fn check(&self, _ctx: &StageContext<'_>) -> DataflowResult<()> {
        Ok(())
    }

    /// The stage as one worker runs it (models load here: once per worker).
    fn build(&self, ctx: &StageContext<'_>) -> DataflowResult<Step>;

    /// How it merges batches, when it does (models).
    fn batching(&self) -> Option<BatchPolicy> {
        None
    }

    /// Where and how it runs, for `riffle plan` (worker 0 of the plan's context).
    fn describe(&self, _ctx: &StageContext<'_>) -> String {
        "on the worker holding the batch".into()
    }

    /// Whether it may run on a GPU (`--workers auto` then covers the GPUs).
    fn may_use_gpu(&self) -> bool {
        false
    }

    /// Whether it picks its GPU through `runtime.gpus` (`device: auto`).
    fn follows_gpu_map(&self) -> bool {
        false
    }

    /// Whether it keeps state and shards its input itself ([`Step::Stateful`]): it runs on
    /// every worker and cannot be placed on some of them.
    fn stateful(&self) -> bool {
        false
    }

    /// The stage as it runs outside the dataflow (a benchmark's straight loop); by default
    /// [`StageKind::build`].
    fn build_alone(&self, ctx: &StageContext<'_>) -> DataflowResult<Step> {
        self.build(ctx)
    }

    /// Sets the engine threads one instance of it uses, where it has an engine (a benchmark
    /// gives one instance every core).
    fn set_intra_op_threads(&mut self, _threads: usize) {}

    /// `(column, width, height)` when all it does is scale the picture in `column` to
    /// `width`×`height` as a decoder's scaler would (CPU, bilinear, antialiased, the full-size
    /// picture not kept): a source that decodes may then do it while converting its frames.
    fn scale_only(&self) -> Option<(&str, u32, u32)> {
        None
    }

    /// The folder of live streams (`<camera>/live/index.m3u8`) it writes, for the live view.
    fn live_stream_dir(&self) -> Option<PathBuf> {
        None
    }
}

/// A file a stage's configuration names.
pub struct ConfigFile<'a> {
    /// Its key in the stage's block (`path`, `labels`).
    pub key: &'static str,
    pub path: &'a mut PathBuf,
    /// What it should be, for the error when it is missing (`an .onnx file`).
    pub expected: &'static str,
    pub kind: FileKind,
}

/// What a [`ConfigFile`] names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    /// A file that must exist.
    File,
    /// A file or a directory (a model repository) that must exist.
    FileOrDirectory,
    /// A file the stage writes (resolved, not required to exist).
    Output,
}

/// Where a stage is built: which worker of how many, and the process-wide settings that
/// stages read (ONNX Runtime threads, the worker → GPU map).
#[derive(Clone, Copy, Debug)]
pub struct StageContext<'a> {
    pub worker: usize,
    pub peers: usize,
    /// ONNX Runtime threads per model run, unless the stage says otherwise.
    pub intra_op_threads: usize,
    /// Worker → GPU map for `device: auto` (empty: worker i → GPU i mod the GPUs found).
    pub gpus: &'a [usize],
}

/// A stage that is applied batch by batch where the data is: the step for most kinds.
pub fn apply(stage: impl riffle_dataflow::Stage + 'static) -> Step {
    Step::Apply(Box::new(stage))
}
