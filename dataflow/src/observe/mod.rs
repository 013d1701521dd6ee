//! Observation of a run: what it measures and shows while it computes, kept apart from the
//! computing. A [`RunContext`] is made before the run, handed to [`crate::runtime::run`], and
//! the runtime reports into it:
//!
//! - [`registry`]: the process's Prometheus registry ([`Metrics`]): per-stage counters and
//!   latency histograms, and the collectors sources and sinks register themselves
//!   ([`Metrics::register`], called from their factories' `attach_metrics`);
//! - [`readiness`]: the workers that have built their dataflow (`/readyz`);
//! - [`dead_letters`]: dead letters counted by stage and reason;
//! - [`summary`]: the end-of-run figures and the table `riffle run` prints;
//! - [`live`]: the live tap, a bounded side channel of sampled frames and latest results that
//!   a viewer puts in [`RunContext::live`].

pub mod dead_letters;
pub mod live;
pub mod readiness;
pub mod registry;
pub mod summary;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use self::dead_letters::DeadLetterReasons;
use self::live::LiveObserver;
use self::readiness::Readiness;
use self::registry::Metrics;
use self::summary::Summary;
use crate::DataflowResult;

/// Where a run reports: handed to [`crate::runtime::run`] (and from there to every worker and
/// the sink operator), shared with whoever serves or shows it (`/metrics`, `/readyz`, a live
/// view). Cloning shares the same parts.
///
/// # Examples
/// ```
/// use std::any::Any;
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use std::sync::Arc;
/// use arrow_array::RecordBatch;
/// use riffle_dataflow::observe::live::LiveObserver;
/// use riffle_dataflow::observe::RunContext;
///
/// // A watcher counting results; `runtime::run(job, &cluster, context.clone())` would offer
/// // it each batch read and each result and dead letter at the sink.
/// #[derive(Default)]
/// struct Count(AtomicUsize);
/// impl LiveObserver for Count {
///     fn source_batch(&self, _: &RecordBatch) {}
///     fn results(&self, batch: &RecordBatch) {
///         self.0.fetch_add(batch.num_rows(), Ordering::Relaxed);
///     }
///     fn dead_letters(&self, _: &RecordBatch) {}
///     fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync> {
///         self
///     }
/// }
/// let context = RunContext::new()?.with_live(Arc::new(Count::default()));
/// let count = context.live.clone().and_then(|l| l.into_any().downcast::<Count>().ok());
/// assert_eq!(count.map(|c| c.0.load(Ordering::Relaxed)), Some(0));
/// assert_eq!(context.readiness.ready_workers(), 0);
/// # Ok::<(), riffle_dataflow::DataflowError>(())
/// ```
#[derive(Clone)]
pub struct RunContext {
    /// Counters and histograms per stage, and sources' and sinks' own metrics.
    pub metrics: Arc<Metrics>,
    /// Workers of this process ready to read.
    pub readiness: Arc<Readiness>,
    /// Dead letters by stage and reason.
    pub dead_letters: Arc<DeadLetterReasons>,
    /// A watcher, offered each batch read and each result and dead letter at the sink;
    /// `None`: nothing is offered.
    pub live: Option<Arc<dyn LiveObserver>>,
    /// The source's inputs, changed while it runs (`/api/cameras`); `None` when its inputs are
    /// fixed or nobody serves the control.
    pub control: Option<Arc<dyn crate::control::InputControl>>,
}

impl RunContext {
    /// A context with a registry of its own and no live tap.
    pub fn new() -> DataflowResult<Self> {
        Ok(Metrics::new()?.into())
    }

    /// The same context, offering what passes to `watcher`.
    pub fn with_live(mut self, watcher: Arc<dyn LiveObserver>) -> Self {
        self.live = Some(watcher);
        self
    }

    /// The end-of-run figures: the registry's, with the dead-letter reasons.
    pub fn summary(&self, elapsed: Duration) -> Summary {
        let mut summary = self.metrics.summary(elapsed);
        summary.dead_letter_reasons = self.dead_letters.commonest();
        summary
    }
}

/// A context reporting to `metrics`, with no live tap.
impl From<Arc<Metrics>> for RunContext {
    fn from(metrics: Arc<Metrics>) -> Self {
        RunContext {
            metrics,
            readiness: Arc::default(),
            dead_letters: Arc::default(),
            live: None,
            control: None,
        }
    }
}

// A poisoned lock only means another worker panicked mid-update; the counts are still usable.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
