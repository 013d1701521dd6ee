//! What every stage kind says about itself, so that validation, planning and running need no
//! list of kinds: the pipeline planner only calls this trait.

use std::fmt;
use std::path::PathBuf;

use arrow_schema::SchemaRef;
use riffle_dataflow::operators::BatchPolicy;
use riffle_dataflow::runtime::Step;
use riffle_dataflow::DataflowResult;

/// A stage kind, implemented by its configuration type (the block under its YAML key).
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

    /// Whether it keeps state and shards its input itself ([`Step::Stateful`]): it runs on
    /// every worker and cannot be placed on some of them.
    fn stateful(&self) -> bool {
        false
    }
}

/// A file a stage's configuration names.
pub struct ConfigFile<'a> {
    /// Its key in the stage's block (`path`, `labels`).
    pub key: &'static str,
    pub path: &'a mut PathBuf,
    /// What it should be, for the error when it is missing (`an .onnx file`).
    pub expected: &'static str,
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
