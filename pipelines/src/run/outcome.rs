//! What a run ended with: [`RunOutcome`].

use std::time::Duration;

use riffle_dataflow::cluster::ClusterConfig;
use riffle_dataflow::runtime::RunReport;

use super::exit::{TooManyDeadLetters, OK};
use super::signals::{stop_requested, StopSignals};
use crate::RunLock;

/// How a run ended without failing: its report and the verdict the exit code is picked from.
#[derive(Debug)]
pub struct RunOutcome {
    /// The pipeline's name (`name:` or the file's stem).
    pub pipeline: String,
    /// This process's place in the cluster; `None` for a supervisor, whose processes report
    /// their own.
    pub cluster: Option<ClusterConfig>,
    /// This process's figures (its summary table); `None` for a supervisor.
    pub report: Option<RunReport>,
    /// From the start of the run (a supervisor's: of its first cluster) to its end.
    pub elapsed: Duration,
    /// How many times a supervisor restarted its cluster.
    pub restarts: usize,
    /// The run ended because it was asked to stop (a signal, or
    /// [`riffle_dataflow::runtime::request_stop`]); with checkpoints, the last one covers every
    /// result written.
    pub stopped: bool,
    /// Set when more of the records went to dead letters than `runtime.max_dead_letter_ratio`
    /// allows: the run is a failure ([`Self::exit_code`] is
    /// [`TooManyDeadLetters::EXIT_CODE`]) that a supervisor does not restart.
    pub dead_letters: Option<TooManyDeadLetters>,
    pub(super) signals: Option<StopSignals>,
    /// The run's locks, released when the outcome is dropped (a finished run's live view keeps
    /// them while it stays up).
    pub(super) _lock: Option<RunLock>,
}

impl RunOutcome {
    /// What `riffle run` exits with: 0, or [`TooManyDeadLetters::EXIT_CODE`].
    pub fn exit_code(&self) -> i32 {
        match self.dead_letters {
            Some(_) => TooManyDeadLetters::EXIT_CODE,
            None => OK,
        }
    }

    /// Whether this process was asked to stop, now: at the run's end ([`Self::stopped`]) or
    /// since.
    pub fn stop_requested(&self) -> bool {
        self.stopped || stop_requested(self.signals.as_ref())
    }

    /// Blocks until a stop signal comes (at once if one came already, or when the run did not
    /// handle signals): what keeps a finished run's live view up until Ctrl-C.
    pub fn wait_for_stop(&self) {
        if let Some(signals) = &self.signals {
            signals.wait();
        }
    }
}
