//! The run's [`Start`] made on its own thread while the workers build their stages: recovery
//! (a transactional sink's `init_transactions` and commit log, an object store's lease and
//! newest checkpoint) and model loading both take hundreds of milliseconds, and neither needs
//! the other. A worker waits for the start only once its stages are built, before it builds
//! its dataflow, which needs the restored state and the first epoch.

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use super::checkpointing::{self, Start};
use super::Job;
use crate::{DataflowError, DataflowResult};

enum State {
    Pending(JoinHandle<DataflowResult<Start>>),
    Ready(Arc<Start>),
    /// The start failed, and the worker that found out returned its error.
    Failed,
}

pub(crate) struct PendingStart(Mutex<State>);

impl PendingStart {
    /// Starts making the start of `job` in this process (`leader`: process 0, which opens the
    /// sink).
    pub(crate) fn spawn(job: Arc<Job>, leader: bool) -> DataflowResult<Self> {
        let handle = std::thread::Builder::new()
            .name("riffle-start".into())
            .spawn(move || checkpointing::start(&job, leader))
            .map_err(|e| DataflowError::Cluster(format!("cannot start a thread: {e}")))?;
        Ok(Self(Mutex::new(State::Pending(handle))))
    }

    /// Whether the start is made (or failed): [`PendingStart::get`] then returns at once.
    pub(crate) fn settled(&self) -> bool {
        self.0.lock().map_or(
            true,
            |s| !matches!(&*s, State::Pending(h) if !h.is_finished()),
        )
    }

    /// Waits for the start. `Ok(None)`: it failed, and another worker of this process has
    /// its error (one error for the run, not one per worker).
    pub(crate) fn get(&self) -> DataflowResult<Option<Arc<Start>>> {
        let mut state = self
            .0
            .lock()
            .map_err(|_| DataflowError::Cluster("a worker panicked while starting".into()))?;
        // Failed until proven otherwise: a worker that panics here leaves the others a failure.
        match std::mem::replace(&mut *state, State::Failed) {
            State::Pending(handle) => match handle.join() {
                Ok(Ok(start)) => {
                    let start = Arc::new(start);
                    *state = State::Ready(start.clone());
                    Ok(Some(start))
                }
                Ok(Err(e)) => Err(e),
                Err(_) => Err(DataflowError::Cluster(
                    "the run's start-up (checkpoint recovery) panicked".into(),
                )),
            },
            State::Ready(start) => {
                *state = State::Ready(start.clone());
                Ok(Some(start))
            }
            State::Failed => Ok(None),
        }
    }
}
