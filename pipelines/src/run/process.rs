//! One process's run: its workers run the pipeline to the end of its input (or a stop
//! request), and the dead-letter verdict is taken on its summary.

use std::sync::Arc;
use std::time::Instant;

use riffle_dataflow::cluster::ClusterConfig;
use riffle_dataflow::observe::registry::Metrics;
use riffle_dataflow::observe::RunContext;

use super::error::chain;
use super::exit::TooManyDeadLetters;
use super::outcome::RunOutcome;
use super::signals::{stop_requested, StopSignals};
use super::RunError;
use crate::{Pipeline, RunLock};

/// A prepared process of a run: the pipeline validated, its place in the cluster known, its
/// locks taken (by process 0 of a cluster not started by a supervisor), its run context
/// (metrics registry, readiness, live tap) made: what a caller needs to serve metrics, show a
/// live view or progress before [`Self::execute`].
pub struct ProcessRun {
    pub(super) pipeline: Arc<Pipeline>,
    pub(super) cluster: ClusterConfig,
    pub(super) context: RunContext,
    pub(super) lock: Option<RunLock>,
    pub(super) signals: Option<StopSignals>,
}

impl std::fmt::Debug for ProcessRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessRun")
            .field("pipeline", &self.pipeline.file)
            .field("cluster", &self.cluster)
            .field("lock", &self.lock)
            .finish_non_exhaustive()
    }
}

impl ProcessRun {
    /// The pipeline, with the run's `output` and `checkpoint_dir`.
    pub fn pipeline(&self) -> &Arc<Pipeline> {
        &self.pipeline
    }

    /// This process's place in the cluster.
    pub fn cluster(&self) -> &ClusterConfig {
        &self.cluster
    }

    /// The registry the run fills (to serve at `/metrics`, or to show progress from).
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.context.metrics
    }

    /// What the run reports to, handed to the runtime by [`Self::execute`]: a live view puts
    /// its tap here first (`riffle_ui::serve`).
    pub fn context_mut(&mut self) -> &mut RunContext {
        &mut self.context
    }

    /// Runs this process's workers to the end of the input, or until a stop is requested.
    pub fn execute(self) -> Result<RunOutcome, RunError> {
        let started = Instant::now();
        let report = super::execute(self.pipeline.clone(), &self.cluster, self.context)
            // A run-time error may quote the configuration (brokers, paths): never a secret
            // `${VAR}`.
            .map_err(|e| RunError::Failed {
                file: self.pipeline.file.clone(),
                message: self.pipeline.redactions.redact(&chain(&e)),
            })?;
        let elapsed = started.elapsed();
        let dead_letters =
            TooManyDeadLetters::check(&report.summary, self.pipeline.runtime.max_dead_letter_ratio);
        Ok(RunOutcome {
            pipeline: self.pipeline.name(),
            stopped: stop_requested(self.signals.as_ref()),
            cluster: Some(self.cluster),
            report: Some(report),
            elapsed,
            restarts: 0,
            dead_letters,
            signals: self.signals,
            _lock: self.lock,
        })
    }
}
