//! Running a validated pipeline: the runtime's run loop over the job the planner makes of it.

use std::sync::Arc;

use riffle_dataflow::cluster::ClusterConfig;
use riffle_dataflow::metrics::Metrics;
use riffle_dataflow::DataflowError;

pub use riffle_dataflow::runtime::RunReport;

use crate::validate::Pipeline;

/// How to run: where the workers are, and the metrics to fill.
#[derive(Clone)]
pub struct RunOptions {
    pub cluster: ClusterConfig,
    pub metrics: Arc<Metrics>,
}

/// Runs the pipeline to the end of its sources (see [`riffle_dataflow::runtime::run`]).
pub fn run(pipeline: Arc<Pipeline>, options: RunOptions) -> Result<RunReport, DataflowError> {
    let job = crate::plan::job(&pipeline)?;
    riffle_dataflow::runtime::run(Arc::new(job), &options.cluster, options.metrics)
}
