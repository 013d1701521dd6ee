//! Local multi-process launch: one start of a cluster of processes on this host, watched until
//! every process exits or one fails (the others are then stopped).
//!
//! The processes never outlive their supervisor: each asks the kernel for SIGKILL when it dies
//! (`PR_SET_PDEATHSIG`), and each holds the supervisor's run locks (inherited descriptors), so
//! a second run of the same pipeline cannot start until the last of them has exited.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::time::Duration;

use super::cluster::CLUSTER_TOKEN;
use super::exit::DEAD_LETTERS;
use super::signals::{stop_requested, StopSignals};
use super::{RunError, RunOptions};
use crate::RunLock;

/// Set in the environment of a supervisor's processes: the run locks are already held.
pub const LOCKS_HELD: &str = "RIFFLE_LOCKS_HELD";

/// Set in the environment of a supervisor's processes when the pipeline was given as text
/// ([`RunOptions::text`]): the text, which their `FILE` argument names.
pub const PIPELINE_TEXT: &str = "RIFFLE_PIPELINE_TEXT";

/// How a start of the cluster ended without failing.
pub(super) enum Ended {
    /// Every process exited 0.
    Done,
    /// Every process exited, this one (the first seen) with too many dead letters.
    DeadLetters(usize),
}

/// The arguments of process `process`: `run FILE --processes N --process I --base-port P`, the
/// options every process shares, then the caller's own ([`RunOptions::process_args`]).
pub(super) fn process_args(options: &RunOptions, process: usize) -> Vec<OsString> {
    let cluster = &options.cluster;
    let mut args: Vec<OsString> = vec![
        "run".into(),
        options.file.clone().into(),
        "--processes".into(),
        cluster.processes.to_string().into(),
        "--process".into(),
        process.to_string().into(),
        "--base-port".into(),
        cluster.base_port.to_string().into(),
    ];
    if let Some(w) = cluster.workers {
        args.extend(["--workers".into(), w.to_string().into()]);
    }
    if let Some(o) = &options.output {
        args.extend(["--output".into(), o.clone().into()]);
    }
    if let Some(dir) = &options.checkpoint_dir {
        args.extend(["--checkpoint-dir".into(), dir.clone().into()]);
    }
    if let Some(url) = &options.checkpoint_url {
        args.extend(["--checkpoint-url".into(), url.into()]);
    }
    if let Some(extra) = &options.process_args {
        args.extend(extra(process));
    }
    args
}

/// Runs the cluster until every process exits, or one fails (the others are then stopped).
pub(super) fn run_cluster_once(
    options: &RunOptions,
    lock: &RunLock,
    signals: Option<&StopSignals>,
) -> Result<Ended, RunError> {
    let program = match &options.program {
        Some(program) => program.clone(),
        None => std::env::current_exe().map_err(RunError::io("locating the riffle binary"))?,
    };
    let mut children: Vec<(usize, Child)> = Vec::new();
    // A fresh token per start: a process left over from an earlier start, or of another
    // cluster on the same ports, cannot join this one.
    let token = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
        ^ ((std::process::id() as u64) << 32);
    for process in 0..options.cluster.processes {
        let mut cmd = Command::new(&program);
        cmd.args(&options.program_args);
        cmd.args(process_args(options, process));
        if let Some(text) = &options.text {
            cmd.env(PIPELINE_TEXT, text);
        }
        cmd.process_group(0);
        cmd.env(CLUSTER_TOKEN, token.to_string());
        cmd.env(LOCKS_HELD, "1");
        tie_to_supervisor(&mut cmd, lock.raw_fds());
        let child = cmd
            .spawn()
            .map_err(RunError::io(format!("starting process {process}")))?;
        children.push((process, child));
        // Process i connects to the processes before it; a head start for those avoids
        // timely's one-second retry after a refused connection.
        std::thread::sleep(Duration::from_millis(50));
    }
    // A process that fails leaves the others waiting for it forever: stop them all.
    let mut forwarded = false;
    let mut dead_letters: Option<usize> = None;
    loop {
        if stop_requested(signals) && !forwarded {
            forwarded = true;
            terminate(&mut children);
        }
        let mut failed = None;
        let mut all_done = true;
        for (process, child) in children.iter_mut() {
            let status = child
                .try_wait()
                .map_err(RunError::io(format!("watching process {process}")))?;
            match status {
                Some(status) if status.success() => {}
                Some(status) if status.code() == Some(DEAD_LETTERS) => {
                    dead_letters.get_or_insert(*process);
                }
                Some(status) => {
                    failed = Some(RunError::ProcessFailed {
                        process: *process,
                        status,
                    })
                }
                None => all_done = false,
            }
        }
        if let Some(why) = failed {
            for (_, child) in children.iter_mut() {
                let _ = child.kill();
                let _ = child.wait();
            }
            return Err(why);
        }
        if all_done {
            return Ok(match dead_letters {
                Some(process) => Ended::DeadLetters(process),
                None => Ended::Done,
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Passes one SIGTERM to each running process: they finish their open epochs and exit.
fn terminate(children: &mut [(usize, Child)]) {
    for (_, child) in children.iter_mut() {
        // Only a child not yet reaped: its pid cannot belong to another process.
        if !matches!(child.try_wait(), Ok(None)) {
            continue;
        }
        if let Ok(pid) = libc::pid_t::try_from(child.id()) {
            // SAFETY: kill(2) on the pid of our own child, which is not reaped.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
    }
}

/// Makes the child die with the supervisor and keep the run locks' descriptors open.
fn tie_to_supervisor(cmd: &mut Command, lock_fds: Vec<std::os::fd::RawFd>) {
    let supervisor = std::process::id() as libc::pid_t;
    // SAFETY: runs between fork and exec, calling only async-signal-safe functions (prctl,
    // getppid, fcntl) on values computed before the fork.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The supervisor died before the signal was armed: nobody would kill this child.
            if libc::getppid() != supervisor {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            // Locks are kept by the open file they belong to: a child holding the descriptor
            // keeps the lock after the supervisor is gone, until the child exits too.
            for fd in &lock_fds {
                if libc::fcntl(*fd, libc::F_SETFD, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::{ClusterSpec, Workers};

    #[test]
    fn each_process_gets_the_run_command_of_its_place_then_the_callers_arguments() {
        let options = super::super::RunOptions::new("p.yaml")
            .cluster(ClusterSpec {
                workers: Some(Workers::Auto),
                processes: 2,
                base_port: 3000,
                ..ClusterSpec::default()
            })
            .output("out.jsonl")
            .checkpoint_dir("ckpt")
            .process_args(|i| {
                if i > 0 {
                    vec!["--quiet".into()]
                } else {
                    vec![]
                }
            });
        let text = |i| {
            process_args(&options, i)
                .iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join(" ")
        };
        assert_eq!(
            text(0),
            "run p.yaml --processes 2 --process 0 --base-port 3000 --workers auto \
             --output out.jsonl --checkpoint-dir ckpt"
        );
        assert!(
            text(1).ends_with("--checkpoint-dir ckpt --quiet"),
            "{}",
            text(1)
        );
    }
}
