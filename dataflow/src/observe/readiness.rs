//! Whether this process is ready (`/readyz`): every worker has built its dataflow (models
//! loaded) and has its share of the source.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Workers of this process that are ready.
#[derive(Debug, Default)]
pub struct Readiness {
    workers: AtomicUsize,
}

impl Readiness {
    /// A worker of this process has built its dataflow (models loaded) and has its share of
    /// the source.
    pub fn worker_ready(&self) {
        self.workers.fetch_add(1, Ordering::SeqCst);
    }

    /// Workers of this process that are ready (see [`Readiness::worker_ready`]).
    pub fn ready_workers(&self) -> usize {
        self.workers.load(Ordering::SeqCst)
    }
}
