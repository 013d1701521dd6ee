//! Peer liveness: timely waits forever for a peer that died or whose host dropped off the
//! network (its progress never arrives), so every worker broadcasts a heartbeat through a small
//! dataflow of its own and fails the run when a peer has been silent too long. The supervisor
//! (or systemd, Kubernetes) then restarts the process, and the cluster resumes from its last
//! checkpoint once every host is back.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use crate::DataflowError;
use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::vec::Broadcast;
use timely::dataflow::operators::Operator;
use timely::dataflow::InputHandle;

/// How often a worker says it is alive.
const BEAT: Duration = Duration::from_millis(200);

pub struct Liveness {
    input: InputHandle<u64, CapacityContainerBuilder<Vec<usize>>>,
    index: usize,
    last_beat: Option<Instant>,
    /// When each worker was last heard from (none yet: counted from `started`).
    heard: Rc<RefCell<Vec<Option<Instant>>>>,
    started: Instant,
    timeout: Duration,
}

impl Liveness {
    /// Builds the heartbeat dataflow on `worker`. A peer silent for `timeout` is gone; before
    /// its first heartbeat (it may still be loading models) it gets `timeout` plus a minute.
    pub fn build(worker: &mut timely::worker::Worker, timeout: Duration) -> Liveness {
        let peers = worker.peers();
        let heard: Rc<RefCell<Vec<Option<Instant>>>> = Rc::new(RefCell::new(vec![None; peers]));
        let sink = heard.clone();
        let mut input = InputHandle::new();
        worker.dataflow::<u64, _, _>(|scope| {
            input
                .to_stream(scope)
                .broadcast()
                .sink(Pipeline, "Liveness", move |(input, _)| {
                    input.for_each(|_, data| {
                        let now = Instant::now();
                        let mut heard = sink.borrow_mut();
                        for peer in data.drain(..) {
                            if let Some(at) = heard.get_mut(peer) {
                                *at = Some(now);
                            }
                        }
                    });
                });
        });
        Liveness {
            input,
            index: worker.index(),
            last_beat: None,
            heard,
            started: Instant::now(),
            timeout,
        }
    }

    /// Sends a heartbeat when one is due, and fails if a peer has been silent too long.
    pub fn tick(&mut self) -> Result<(), DataflowError> {
        if self.last_beat.is_none_or(|t| t.elapsed() >= BEAT) {
            self.input.send(self.index);
            self.input.flush();
            self.last_beat = Some(Instant::now());
        }
        let grace = self.timeout + Duration::from_secs(60);
        for (peer, at) in self.heard.borrow().iter().enumerate() {
            let silent = match at {
                Some(at) => at.elapsed() > self.timeout,
                None => self.started.elapsed() > grace,
            };
            if silent && peer != self.index {
                return Err(DataflowError::Cluster(format!(
                    "worker {peer} has been silent for over {:.1} s: its process or host is gone \
                     (runtime.peer_timeout_ms); stopping so the cluster can restart from its \
                     last checkpoint",
                    self.timeout.as_secs_f64()
                )));
            }
        }
        Ok(())
    }

    /// Stops the heartbeats (the run is over).
    pub fn close(&mut self) {
        drop(std::mem::replace(&mut self.input, InputHandle::new()));
    }
}
