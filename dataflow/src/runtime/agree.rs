//! Every process of a cluster resumes from the same checkpoint.
//!
//! Each process finds its start on its own, beside loading its models ([`super::pending`]).
//! Found by the fault campaign (`scripts/campaign.sh`, seed 7): an old process 0, paused past
//! the peer timeout, woke after the others had restarted and read the checkpoints, committed
//! the epochs it still held and wrote their checkpoint, then died; its successor resumed from
//! that newer checkpoint while the others resumed from the older one, and their partitions'
//! records of the epochs in between were written twice. Process 0's start is the cluster's:
//! its sink's recovery fenced every older writer before it looked. So worker 0 tells every
//! worker its first epoch before any dataflow runs, and a process that found another start
//! fails the run: its restart reads the checkpoints again, now settled.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::vec::Broadcast;
use timely::dataflow::operators::Operator;
use timely::dataflow::InputHandle;

use crate::DataflowError;

/// Waits for worker 0's first epoch, stepping the worker and calling `tick` meanwhile (the
/// heartbeats, which fail when a peer is gone). Every worker must call it at the same point,
/// as dataflows are matched across the cluster by the order they are built in.
pub(crate) fn agree_on_start(
    worker: &mut timely::worker::Worker,
    first_epoch: u64,
    mut tick: impl FnMut() -> Result<(), DataflowError>,
) -> Result<(), DataflowError> {
    let heard: Rc<Cell<Option<u64>>> = Rc::default();
    let sink = heard.clone();
    let mut input: InputHandle<u64, CapacityContainerBuilder<Vec<u64>>> = InputHandle::new();
    worker.dataflow::<u64, _, _>(|scope| {
        input
            .to_stream(scope)
            .broadcast()
            .sink(Pipeline, "AgreeOnStart", move |(input, _)| {
                input.for_each(|_, data| {
                    if let Some(epoch) = data.drain(..).next() {
                        sink.set(Some(epoch));
                    }
                });
            });
    });
    if worker.index() == 0 {
        input.send(first_epoch);
    }
    drop(input);
    let leader = loop {
        if let Some(epoch) = heard.get() {
            break epoch;
        }
        worker.step_or_park(Some(Duration::from_millis(1)));
        tick()?;
    };
    if leader == first_epoch {
        return Ok(());
    }
    Err(DataflowError::Cluster(format!(
        "this process found its start at epoch {first_epoch}, process 0 at epoch {leader}: the \
         checkpoints changed while the cluster formed (an older run was still committing); \
         stopping so that the restart reads them again"
    )))
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// Runs `agree_on_start` on two workers with these first epochs; each worker's outcome.
    fn agree(firsts: [u64; 2]) -> Vec<Result<(), String>> {
        let outcomes = Arc::new(Mutex::new(vec![Ok(()), Ok(())]));
        let out = outcomes.clone();
        timely::execute(timely::Config::process(2), move |worker| {
            let index = worker.index();
            let result =
                agree_on_start(worker, firsts[index], || Ok(())).map_err(|e| e.to_string());
            out.lock().unwrap()[index] = result;
        })
        .unwrap()
        .join();
        let outcomes = outcomes.lock().unwrap().clone();
        outcomes
    }

    #[test]
    fn workers_that_found_worker_0s_start_go_on() {
        assert_eq!(agree([0, 0]), vec![Ok(()), Ok(())]);
        assert_eq!(agree([295, 295]), vec![Ok(()), Ok(())]);
    }

    #[test]
    fn a_worker_that_found_another_start_stops_the_run_naming_both() {
        // The campaign's case: process 0 resumed after epoch 295, another after 289.
        let outcomes = agree([296, 290]);
        assert_eq!(outcomes[0], Ok(()));
        let error = outcomes[1].clone().unwrap_err();
        assert!(
            error.contains("epoch 290") && error.contains("process 0 at epoch 296"),
            "{error}"
        );
    }

    #[test]
    fn a_failing_tick_ends_the_wait() {
        // Worker 1's first tick fails (as when a peer's heartbeats stop) before it can have
        // heard worker 0: the wait ends with the tick's error.
        let failed = Arc::new(Mutex::new(None));
        let out = failed.clone();
        timely::execute(timely::Config::process(2), move |worker| {
            if worker.index() == 1 {
                let result = agree_on_start(worker, 7, || {
                    Err(DataflowError::Cluster("worker 0 has been silent".into()))
                });
                *out.lock().unwrap() = Some(result.map_err(|e| e.to_string()));
            } else {
                let _ = agree_on_start(worker, 7, || Ok(()));
            }
        })
        .unwrap()
        .join();
        let result = failed.lock().unwrap().clone();
        assert!(
            matches!(&result, Some(Err(e)) if e.contains("silent")),
            "{result:?}"
        );
    }
}
