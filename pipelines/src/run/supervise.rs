//! The supervisor of a local cluster (`--processes N` on one host): it starts the cluster
//! ([`super::launch`]), and when any process exits abnormally stops the others and starts the
//! cluster again (resuming from the newest checkpoint when the pipeline has them), with capped
//! exponential backoff. SIGTERM or Ctrl-C reach the supervisor only (its processes have a
//! process group of their own): it passes one SIGTERM on to each, and they finish their open
//! epochs and exit.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::exit::TooManyDeadLetters;
use super::launch::{run_cluster_once, Ended};
use super::outcome::RunOutcome;
use super::signals::{stop_requested, StopSignals};
use super::{RunError, RunOptions};
use crate::{Pipeline, RunLock};

/// A prepared local cluster: its locks are taken, its processes not yet started.
pub struct Supervisor {
    pub(super) options: RunOptions,
    pub(super) pipeline: Arc<Pipeline>,
    pub(super) lock: RunLock,
    pub(super) signals: Option<StopSignals>,
}

impl std::fmt::Debug for Supervisor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Supervisor")
            .field("options", &self.options)
            .field("lock", &self.lock)
            .finish_non_exhaustive()
    }
}

impl Supervisor {
    /// The pipeline the cluster runs (validated here, before any process starts).
    pub fn pipeline(&self) -> &Arc<Pipeline> {
        &self.pipeline
    }

    /// How many processes the cluster has.
    pub fn processes(&self) -> usize {
        self.options.cluster.processes
    }

    /// Runs the cluster to its end, restarting it after a crash up to
    /// [`RunOptions::max_restarts`] times. A cluster that ended with too many dead letters is
    /// not restarted: bad input, not a crash, would end the same way again.
    pub fn execute(self) -> Result<RunOutcome, RunError> {
        let started = Instant::now();
        let signals = self.signals.as_ref();
        let max_restarts = self.options.max_restarts;
        let mut backoff = Duration::from_millis(100);
        let mut restarts = 0;
        let verdict = loop {
            match run_cluster_once(&self.options, &self.lock, signals) {
                Ok(Ended::Done) => break None,
                Ok(Ended::DeadLetters(process)) => {
                    let verdict = TooManyDeadLetters::in_process(process);
                    break Some(if stop_requested(signals) {
                        verdict.while_stopping()
                    } else {
                        verdict
                    });
                }
                Err(why) if stop_requested(signals) => {
                    return Err(RunError::WhileStopping(Box::new(why)))
                }
                Err(why) if restarts < max_restarts => {
                    restarts += 1;
                    eprintln!(
                        "riffle: {why}; restarting the cluster in {} ms (restart {restarts} of at most {max_restarts})",
                        backoff.as_millis(),
                    );
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_secs(10));
                }
                Err(why) => {
                    return Err(RunError::GaveUp {
                        restarts,
                        last: Box::new(why),
                    })
                }
            }
        };
        let stopped = stop_requested(signals);
        Ok(RunOutcome {
            pipeline: self.pipeline.name(),
            cluster: None,
            report: None,
            elapsed: started.elapsed(),
            restarts,
            stopped,
            dead_letters: verdict,
            signals: self.signals,
            _lock: Some(self.lock),
        })
    }
}
