//! One line, not a backtrace per thread, when a cluster's connection is lost.

use std::sync::atomic::{AtomicBool, Ordering};

/// Installs a panic hook for timely's network threads, which panic when a peer's socket closes
/// (a peer process died or its host dropped off): one line says so, not a backtrace per thread.
/// The run turns the failure into an error that supervisors restart on. A worker's own panic,
/// before any connection was lost, is a bug and keeps its backtrace.
///
/// Process-wide: `riffle` calls it first thing; a program embedding Riffle may too.
pub fn quiet_network_panics() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let thread = std::thread::current();
        let name = thread.name().unwrap_or("");
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("panic");
        // The network thread that saw the socket close says it; worker threads and the joins
        // of the other network threads follow it down and say nothing new.
        static LOST: AtomicBool = AtomicBool::new(false);
        let network = name.starts_with("timely:send") || name.starts_with("timely:recv");
        let joining =
            message.starts_with("Send thread panic") || message.starts_with("Recv thread panic");
        let following = name.starts_with("timely:work") && LOST.load(Ordering::SeqCst);
        if network && !LOST.swap(true, Ordering::SeqCst) {
            // The target `riffle` (the binary's) keeps log lines as they were.
            tracing::error!(target: "riffle", "cluster connection lost ({name}): {message}");
            return;
        }
        if network || joining || following {
            return;
        }
        default(info);
    }));
}
