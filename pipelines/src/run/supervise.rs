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
    /// [`RunOptions::max_restarts`] times in a row. A cluster that ended with too many dead letters is
    /// not restarted: bad input, not a crash, would end the same way again.
    pub fn execute(self) -> Result<RunOutcome, RunError> {
        let started = Instant::now();
        let signals = self.signals.as_ref();
        let mut restarts = Restarts::new(self.options.max_restarts);
        let verdict = loop {
            let began = Instant::now();
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
                Err(why) => match restarts.after_failure(began.elapsed()) {
                    Some(backoff) => {
                        eprintln!(
                            "riffle: {why}; restarting the cluster in {} ms (restart {} in a row of at most {})",
                            backoff.as_millis(),
                            restarts.in_a_row,
                            restarts.max,
                        );
                        std::thread::sleep(backoff);
                    }
                    None => {
                        return Err(RunError::GaveUp {
                            restarts: restarts.in_a_row,
                            last: Box::new(why),
                        })
                    }
                },
            }
        };
        let stopped = stop_requested(signals);
        Ok(RunOutcome {
            pipeline: self.pipeline.name(),
            cluster: None,
            report: None,
            elapsed: started.elapsed(),
            restarts: restarts.total,
            stopped,
            dead_letters: verdict,
            signals: self.signals,
            _lock: Some(self.lock),
        })
    }
}

/// When to restart a failed cluster: capped exponential backoff over the failures in a row. A
/// run that stayed up for [`Restarts::HEALTHY`] before failing starts the count and the backoff
/// afresh, so a long-lived cluster that crashes now and then (a host lost once a week) is never
/// given up on, while one that fails at every start still is.
#[derive(Debug)]
struct Restarts {
    max: usize,
    in_a_row: usize,
    total: usize,
    backoff: Duration,
}

impl Restarts {
    const FIRST: Duration = Duration::from_millis(100);
    const CAP: Duration = Duration::from_secs(10);
    const HEALTHY: Duration = Duration::from_secs(60);

    fn new(max: usize) -> Self {
        Restarts {
            max,
            in_a_row: 0,
            total: 0,
            backoff: Self::FIRST,
        }
    }

    /// The wait before the next start after a run that failed after `ran`, or `None` once the
    /// failures in a row are more than `max`.
    fn after_failure(&mut self, ran: Duration) -> Option<Duration> {
        if ran >= Self::HEALTHY {
            self.in_a_row = 0;
            self.backoff = Self::FIRST;
        }
        if self.in_a_row >= self.max {
            return None;
        }
        self.in_a_row += 1;
        self.total += 1;
        let wait = self.backoff;
        self.backoff = (self.backoff * 2).min(Self::CAP);
        Some(wait)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QUICK: Duration = Duration::from_millis(5);

    #[test]
    fn failures_in_a_row_back_off_up_to_the_cap_and_then_give_up() {
        let mut r = Restarts::new(9);
        let waits: Vec<_> = (0..9).map(|_| r.after_failure(QUICK).unwrap()).collect();
        assert_eq!(waits[0], Duration::from_millis(100));
        assert_eq!(waits[3], Duration::from_millis(800));
        assert_eq!(waits[8], Restarts::CAP);
        assert_eq!(
            r.after_failure(QUICK),
            None,
            "the tenth failure in a row gives up"
        );
    }

    #[test]
    fn a_run_that_stayed_up_starts_the_count_and_the_backoff_afresh() {
        let mut r = Restarts::new(3);
        for _ in 0..3 {
            r.after_failure(QUICK).unwrap();
        }
        // Three failures in a row, then a run that stayed up an hour: not given up on.
        let wait = r.after_failure(Duration::from_secs(3600));
        assert_eq!(wait, Some(Restarts::FIRST));
        assert_eq!((r.in_a_row, r.total), (1, 4));
        // A supervisor that kept a cluster for weeks restarts it after every crash.
        for _ in 0..100 {
            assert!(r.after_failure(Restarts::HEALTHY).is_some());
        }
        assert_eq!(r.total, 104);
    }

    #[test]
    fn no_restarts_allowed_gives_up_at_once() {
        assert_eq!(
            Restarts::new(0).after_failure(Duration::from_secs(3600)),
            None
        );
    }
}
