//! From a job's steps to the operators one worker runs.

use std::collections::BTreeMap;
use std::sync::Arc;

use timely::dataflow::channels::pact::Pipeline as Local;
use timely::dataflow::operators::feedback::Handle;
use timely::dataflow::operators::vec::Map;
use timely::dataflow::operators::{ConnectLoop, Feedback, Operator};

use super::step::{Instrumented, JobStep, Route, Step, StepKind};
use super::SlowWorker;
use crate::credit::Credit;
use crate::observe::registry::Metrics;
use crate::operators::{
    ApplyStage, Balance, BatchStream, DynamicBatch, ExchangeByKey, Place, Rebalance, ServiceCell,
    Spread, StateUpdates,
};
use crate::state::SavedState;
use crate::{Compression, DataflowError, DataflowResult, Epoch};

/// One step as this worker runs it.
pub(crate) enum WorkerStep {
    Run(Step),
    Exchange(Route, Compression),
    /// A stage placed on other workers: batches never reach it here, so nothing is built.
    Elsewhere,
}

/// Checkpointed operator state by step name: the records and their counts.
pub type Restored = BTreeMap<String, SavedState>;

/// A stateful step's state updates: its name, its records' kind and the updates.
pub(crate) type StepState<'scope> = (String, &'static str, StateUpdates<'scope>);

/// The steps worker `worker` (of `peers`) runs: its own stage instances, except for stages
/// placed on other workers.
pub(crate) fn worker_steps(
    steps: &[JobStep],
    worker: usize,
    peers: usize,
    slow: Option<&SlowWorker>,
) -> DataflowResult<Vec<(String, WorkerStep)>> {
    let mut out = Vec::new();
    let mut here = true;
    for step in steps {
        let built = match &step.kind {
            StepKind::Exchange(route, compression) => {
                let placed = match route {
                    Route::Workers(list) | Route::Balance(list, _) => list.as_slice(),
                    Route::Key(_) | Route::All | Route::Spread(_) => &[],
                };
                if let Some(missing) = placed.iter().find(|w| **w >= peers) {
                    return Err(DataflowError::Config(format!(
                        "{}.workers: worker {missing} does not exist (the cluster has {peers} \
                         worker(s), 0..{})",
                        step.at,
                        peers.saturating_sub(1)
                    )));
                }
                here = match route {
                    Route::Workers(list) => list.contains(&worker),
                    _ => true,
                };
                WorkerStep::Exchange(route.clone(), *compression)
            }
            StepKind::Stage(_) if !here => WorkerStep::Elsewhere,
            StepKind::Stage(build) => match build.build(worker, peers)? {
                Step::Batched(stage, policy) => match slow {
                    Some(slow) if slow.worker == worker => Step::Batched(
                        Box::new(Instrumented {
                            inner: stage,
                            delay: slow.delay,
                            service: None,
                        }),
                        policy,
                    ),
                    _ => Step::Batched(stage, policy),
                },
                other => other,
            }
            .into(),
        };
        out.push((step.name.clone(), built));
    }
    Ok(out)
}

impl From<Step> for WorkerStep {
    fn from(step: Step) -> Self {
        WorkerStep::Run(step)
    }
}

/// The first batched stage (a model) fed straight from this worker's own source, with its
/// batch size: its index in `steps`. None when an exchange or a keyed stage (which routes rows
/// to other workers) comes first: rows from other workers then reach it, which this worker's
/// read loop cannot account for.
pub(crate) fn first_model(steps: &[(String, WorkerStep)]) -> Option<(usize, usize)> {
    for (i, (_, step)) in steps.iter().enumerate() {
        match step {
            WorkerStep::Run(Step::Apply(_)) => {}
            WorkerStep::Run(Step::Batched(_, policy)) => return Some((i, policy.max_size)),
            WorkerStep::Run(Step::Stateful(_)) | WorkerStep::Exchange(..) => return None,
            WorkerStep::Elsewhere => return None,
        }
    }
    None
}

/// A balanced exchange ahead of the first batched stage (a model), with only per-batch stages
/// between them and before it: its index in `steps` and the model's batch size. The source
/// reads while that model has room on some worker ([`Credit::set_queued`]).
pub(crate) fn balanced_model(steps: &[(String, WorkerStep)]) -> Option<(usize, usize)> {
    let mut exchange = None;
    for (i, (_, step)) in steps.iter().enumerate() {
        match step {
            WorkerStep::Run(Step::Apply(_)) => {}
            WorkerStep::Exchange(Route::Balance(..), _) if exchange.is_none() => {
                exchange = Some(i);
            }
            WorkerStep::Run(Step::Batched(_, policy)) => {
                return exchange.map(|e| (e, policy.max_size));
            }
            _ => return None,
        }
    }
    None
}

/// The open end of a balanced exchange's feedback loop of load reports.
type LoadLoop<'scope> = Handle<'scope, Epoch, Vec<(usize, f64, u64)>>;

/// Appends the steps to `stream`. Stateful steps start from `restored` (before
/// `first_epoch`) and report the updates of their state, by step name, to checkpoint. The
/// [`first_model`] is fed through `credit`, when given, or the [`balanced_model`]'s exchange
/// keeps it.
pub(crate) fn build_chain<'scope>(
    mut stream: BatchStream<'scope>,
    steps: Vec<(String, WorkerStep)>,
    metrics: &Arc<Metrics>,
    restored: &Restored,
    first_epoch: Epoch,
    credit: Option<Credit>,
) -> DataflowResult<(BatchStream<'scope>, Vec<StepState<'scope>>)> {
    let fed = first_model(&steps).map(|(i, _)| i);
    let gated = balanced_model(&steps).map(|(i, _)| i);
    let mut credit = credit;
    let mut states = Vec::new();
    // A balanced exchange learns each worker's delay from the end of the stages after it.
    let mut feedback: Option<(LoadLoop<'scope>, ServiceCell)> = None;
    for (i, (name, mut step)) in steps.into_iter().enumerate() {
        let gate = credit.clone().filter(|_| gated == Some(i));
        if matches!(step, WorkerStep::Exchange(..)) {
            if let Some((handle, service)) = feedback.take() {
                stream.clone().report_delays(service).connect_loop(handle);
            }
        }
        // Stages after a balanced exchange time their work for its load reports. Stateful
        // steps are not timed: they route rows to each key's owner themselves, so a balanced
        // exchange's choice of worker cannot move their work (and `slow_worker` stands for a
        // slower model host: it delays batched steps only).
        if let Some((_, service)) = &feedback {
            step = match step {
                WorkerStep::Run(Step::Apply(stage)) => {
                    WorkerStep::Run(Step::Apply(Instrumented::timed(stage, service)))
                }
                WorkerStep::Run(Step::Batched(stage, policy)) => {
                    WorkerStep::Run(Step::Batched(Instrumented::timed(stage, service), policy))
                }
                other => other,
            };
        }
        stream = match step {
            WorkerStep::Run(Step::Apply(stage)) => stream.apply_stage(stage, metrics.stage(&name)?),
            WorkerStep::Run(Step::Batched(stage, policy)) => {
                let stage_metrics = metrics.stage(&name)?;
                match credit.take().filter(|_| fed == Some(i)) {
                    Some(c) => stream.dynamic_batch_fed(stage, policy, stage_metrics, c),
                    None => stream.dynamic_batch(stage, policy, stage_metrics),
                }
            }
            WorkerStep::Run(Step::Stateful(stage)) => {
                let none = SavedState::default();
                let state = restored.get(&name).unwrap_or(&none);
                let kind = stage.state_kind();
                let (out, updates) =
                    stage.attach(stream, metrics.stage(&name)?, state, first_epoch);
                states.push((name, kind, updates));
                out
            }
            WorkerStep::Exchange(route, compression) => {
                // Encoded only if a batch crosses to another process; decoded on arrival.
                let stream = if compression == Compression::None {
                    stream
                } else {
                    stream.map_in_place(move |b| b.compression = compression)
                };
                let moved = match route {
                    Route::Key(key) => stream.exchange_by_key(&key),
                    Route::All => stream.rebalance(),
                    Route::Spread(together) => stream.spread(together.as_deref()),
                    Route::Workers(list) => stream.place(&list),
                    Route::Balance(list, ordered_by) => {
                        let (handle, reports) = stream.scope().feedback(1);
                        let service = ServiceCell::default();
                        feedback = Some((handle, service.clone()));
                        stream.balance(&list, ordered_by, reports, service, gate)
                    }
                };
                if compression == Compression::None {
                    moved
                } else {
                    moved.map_in_place(|b| b.compression = Compression::None)
                }
            }
            // Every worker must build the same operators (timely numbers channels in build
            // order), so a stage placed elsewhere is an idle pass-through here.
            WorkerStep::Elsewhere => stream.unary(Local, "Elsewhere", |_, _| {
                |input, output| {
                    input.for_each(|cap, data| output.session(&cap).give_container(data));
                }
            }),
        };
    }
    if let Some((handle, service)) = feedback {
        stream.clone().report_delays(service).connect_loop(handle);
    }
    Ok((stream, states))
}
