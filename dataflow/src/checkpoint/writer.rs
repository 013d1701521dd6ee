//! An object store's checkpoint writes, and its lease's renewals, on a thread of their own.
//!
//! Worker 0 runs the checkpointer and also writes the results: a store that answers slowly,
//! or not at all until its timeout, must not hold the results (nor the worker's heartbeats)
//! back. The checkpointer hands a checkpoint over and learns the outcome at a later poll.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::lease::{Lease, Renewal};
use super::{Checkpoint, CheckpointStore};
use crate::error::{DataflowError, DataflowResult};
use crate::Epoch;

/// What became of a checkpoint handed to the writer, or of the lease.
#[derive(Debug)]
pub enum Done {
    /// Written, at this URL.
    Written(Epoch, String),
    /// Not written (the store failed); the checkpointer tries again later.
    Failed(Epoch, DataflowError),
    /// Another run took the lease over: this one must stop.
    LeaseLost(DataflowError),
}

/// The writer thread's handle: at most one checkpoint is in its hands at a time.
#[derive(Debug)]
pub struct Writer {
    jobs: Option<Sender<Checkpoint>>,
    done: Receiver<Done>,
    thread: Option<JoinHandle<()>>,
    url: String,
}

/// The longest wait between two renewal attempts while the store fails.
const RENEW_RETRY: Duration = Duration::from_secs(1);

impl Writer {
    /// Starts the thread writing to `store`, renewing `lease` (released when the writer is
    /// dropped, unless lost).
    pub fn spawn(store: CheckpointStore, lease: Option<Lease>) -> DataflowResult<Writer> {
        let (jobs, inbox) = mpsc::channel();
        let (outbox, done) = mpsc::channel();
        let url = store.describe();
        let thread = std::thread::Builder::new()
            .name("riffle-checkpoints".into())
            .spawn(move || write_loop(&store, lease, &inbox, &outbox))
            .map_err(|e| DataflowError::io("starting the checkpoint writer thread", e))?;
        Ok(Writer {
            jobs: Some(jobs),
            done,
            thread: Some(thread),
            url,
        })
    }

    /// Where it writes.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Hands `checkpoint` over to be written.
    pub fn submit(&self, checkpoint: Checkpoint) -> DataflowResult<()> {
        let gone = || {
            DataflowError::Config(format!(
                "the checkpoint writer for {} has stopped",
                self.url
            ))
        };
        self.jobs
            .as_ref()
            .ok_or_else(gone)?
            .send(checkpoint)
            .map_err(|_| gone())
    }

    /// The next outcome, if one is in (never waits).
    pub fn try_done(&self) -> Option<Done> {
        self.done.try_recv().ok()
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        // The thread ends (releasing the lease) once its inbox is closed.
        drop(self.jobs.take());
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::error!("the checkpoint writer for {} panicked", self.url);
            }
        }
    }
}

fn write_loop(
    store: &CheckpointStore,
    mut lease: Option<Lease>,
    inbox: &Receiver<Checkpoint>,
    outbox: &Sender<Done>,
) {
    let mut next_renewal = lease.as_ref().map(|l| l.confirmed() + l.period());
    loop {
        let wait = next_renewal.map_or(Duration::from_secs(3600), |at| {
            at.saturating_duration_since(Instant::now())
        });
        match inbox.recv_timeout(wait) {
            Ok(checkpoint) => {
                let epoch = checkpoint.epoch;
                // Fencing: a checkpoint goes out only with the lease confirmed within the last
                // period, so a run that lost its lease stops before it writes again.
                if let Some(l) = lease.as_mut() {
                    if l.confirmed().elapsed() >= l.period() {
                        match l.renew() {
                            Ok(()) => next_renewal = Some(l.confirmed() + l.period()),
                            Err(Renewal::Lost(e)) => {
                                let _ = outbox.send(Done::LeaseLost(e));
                                return;
                            }
                            Err(Renewal::Failed(e)) => {
                                if outbox.send(Done::Failed(epoch, e)).is_err() {
                                    break;
                                }
                                continue;
                            }
                        }
                    }
                }
                let outcome = match store.write(&checkpoint) {
                    Ok(at) => Done::Written(epoch, at),
                    Err(e) => Done::Failed(epoch, e),
                };
                if outbox.send(outcome).is_err() {
                    break;
                }
            }
            Err(RecvTimeoutError::Timeout) => {
                let Some(l) = lease.as_mut() else { continue };
                match l.renew() {
                    Ok(()) => next_renewal = Some(l.confirmed() + l.period()),
                    Err(Renewal::Lost(e)) => {
                        let _ = outbox.send(Done::LeaseLost(e));
                        return;
                    }
                    Err(Renewal::Failed(e)) => {
                        tracing::warn!(
                            "{e}; retrying (another run may take the lease over once it is \
                             {:.0} s old)",
                            l.period().as_secs_f64() * 3.0
                        );
                        next_renewal = Some(Instant::now() + RENEW_RETRY.min(l.period()));
                    }
                }
            }
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    if let Some(lease) = lease {
        lease.release();
    }
}
