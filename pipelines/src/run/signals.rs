//! How a run stops on a signal: SIGTERM and SIGINT. The first asks the run to stop at the end of
//! its open epochs (they complete, are written and checkpointed, and the run ends as at the end
//! of its input); a second one ends the process at once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex};

use super::RunError;

/// The SIGTERM/SIGINT handler of a run ([`super::RunOptions::stop_on_signals`]).
pub struct StopSignals {
    received: Arc<AtomicBool>,
    rx: Mutex<Receiver<()>>,
}

impl std::fmt::Debug for StopSignals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StopSignals")
            .field("received", &self.received())
            .finish()
    }
}

impl StopSignals {
    /// Installs the handler: from now on the first SIGTERM or SIGINT calls
    /// [`riffle_dataflow::runtime::request_stop`], a second one exits the process.
    pub fn install() -> Result<Self, RunError> {
        let mut signals = signal_hook::iterator::Signals::new([
            signal_hook::consts::SIGTERM,
            signal_hook::consts::SIGINT,
        ])
        .map_err(RunError::io("installing the SIGTERM/SIGINT handler"))?;
        let received = Arc::new(AtomicBool::new(false));
        let (tx, rx): (Sender<()>, Receiver<()>) = std::sync::mpsc::channel();
        let flag = received.clone();
        std::thread::Builder::new()
            .name("riffle-signals".into())
            .spawn(move || {
                for signal in signals.forever() {
                    if flag.swap(true, Ordering::SeqCst) {
                        eprintln!("riffle: second signal ({signal}): stopping now");
                        std::process::exit(128 + signal);
                    }
                    // The target keeps log lines as they were when the binary handled signals.
                    tracing::info!(target: "riffle::serve", "signal {signal}: finishing the open epochs, then stopping");
                    riffle_dataflow::runtime::request_stop();
                    let _ = tx.send(());
                }
            })
            .map_err(RunError::io("starting the signal thread"))?;
        Ok(StopSignals {
            received,
            rx: Mutex::new(rx),
        })
    }

    /// A stop signal came.
    pub fn received(&self) -> bool {
        self.received.load(Ordering::SeqCst)
    }

    /// Blocks until a stop signal comes (at once if one came already).
    pub fn wait(&self) {
        if !self.received() {
            if let Ok(rx) = self.rx.lock() {
                let _ = rx.recv();
            }
        }
    }
}

/// Whether this process was asked to stop: by a signal `signals` caught, or by a call to
/// [`riffle_dataflow::runtime::request_stop`] (an embedding program's own stop).
pub(crate) fn stop_requested(signals: Option<&StopSignals>) -> bool {
    signals.is_some_and(StopSignals::received) || riffle_dataflow::runtime::stop_requested()
}
