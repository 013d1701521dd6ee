//! `--processes N` on one host: the supervisor. It starts N copies of this binary as one timely
//! cluster, watches them, and when any exits abnormally stops the others and starts the cluster
//! again (resuming from the newest checkpoint when the pipeline has them), with capped
//! exponential backoff.
//!
//! The processes never outlive it: each asks the kernel for SIGKILL when the supervisor dies
//! (`PR_SET_PDEATHSIG`), and each holds the supervisor's run locks (inherited descriptors), so
//! a second run of the same pipeline cannot start until the last of them has exited.

use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::cli::{LogFormat, RunArgs};

/// Set in the environment of a supervisor's processes: the run locks are already held.
pub const LOCKS_HELD: &str = "RIFFLE_LOCKS_HELD";

pub fn launch_local_cluster(
    args: &RunArgs,
    log_format: LogFormat,
    lock: &riffle_pipelines::RunLock,
) -> Result<()> {
    // SIGTERM or Ctrl-C reach the supervisor only (its processes have a process group of their
    // own): it passes one SIGTERM on to each, and they finish their open epochs and exit.
    let signals = crate::serve::StopSignals::install()?;
    let mut backoff = Duration::from_millis(100);
    let mut restarts = 0;
    loop {
        match run_cluster_once(args, log_format, lock, &signals) {
            Ok(()) => return Ok(()),
            Err(why) if signals.received() => return Err(why.context("while stopping")),
            // Bad input, not a crash: running again would end the same way.
            Err(why) if why.downcast_ref::<crate::TooManyDeadLetters>().is_some() => {
                return Err(why)
            }
            Err(why) if restarts < args.max_restarts => {
                restarts += 1;
                eprintln!(
                    "riffle: {why:#}; restarting the cluster in {} ms (restart {restarts} of at most {})",
                    backoff.as_millis(),
                    args.max_restarts
                );
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_secs(10));
            }
            Err(why) => return Err(why.context(format!("gave up after {restarts} restart(s)"))),
        }
    }
}

/// The environment variable that hands the supervisor's cluster token to its processes.
pub const CLUSTER_TOKEN: &str = "RIFFLE_CLUSTER_TOKEN";

/// Runs the cluster until every process exits, or one fails (the others are then stopped).
fn run_cluster_once(
    args: &RunArgs,
    log_format: LogFormat,
    lock: &riffle_pipelines::RunLock,
    signals: &crate::serve::StopSignals,
) -> Result<()> {
    let exe = std::env::current_exe().context("locating the riffle binary")?;
    let mut children: Vec<(usize, Child)> = Vec::new();
    // A fresh token per start: a process left over from an earlier start, or of another
    // cluster on the same ports, cannot join this one.
    let token = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
        ^ ((std::process::id() as u64) << 32);
    for process in 0..args.cluster.processes {
        let mut cmd = Command::new(&exe);
        cmd.arg("run")
            .arg(&args.file)
            .arg("--processes")
            .arg(args.cluster.processes.to_string())
            .arg("--process")
            .arg(process.to_string())
            .arg("--base-port")
            .arg(args.cluster.base_port.to_string());
        if let Some(w) = args.cluster.workers {
            cmd.arg("--workers").arg(w.to_string());
        }
        if let Some(o) = &args.output {
            cmd.arg("--output").arg(o);
        }
        if let Some(dir) = &args.checkpoint_dir {
            cmd.arg("--checkpoint-dir").arg(dir);
        }
        // Each process serves its own metrics (at the port + its index); process 0 serves the
        // view and the others report to it.
        if let Some(addr) = &args.metrics_addr {
            cmd.arg("--metrics-addr").arg(addr);
        }
        if let Some(addr) = &args.ui {
            cmd.arg("--ui").arg(addr);
        }
        if args.quiet || process > 0 {
            cmd.arg("--quiet");
        }
        if log_format == LogFormat::Json {
            cmd.arg("--log-format").arg("json");
        }
        cmd.process_group(0);
        cmd.env(CLUSTER_TOKEN, token.to_string());
        cmd.env(LOCKS_HELD, "1");
        tie_to_supervisor(&mut cmd, lock.raw_fds());
        let child = cmd
            .spawn()
            .with_context(|| format!("starting process {process}"))?;
        children.push((process, child));
        // Process i connects to the processes before it; a head start for those avoids
        // timely's one-second retry after a refused connection.
        std::thread::sleep(Duration::from_millis(50));
    }
    // A process that fails leaves the others waiting for it forever: stop them all.
    let mut forwarded = false;
    let mut dead_letters: Option<usize> = None;
    loop {
        if signals.received() && !forwarded {
            forwarded = true;
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
        let mut failed = None;
        let mut all_done = true;
        for (process, child) in children.iter_mut() {
            match child
                .try_wait()
                .with_context(|| format!("watching process {process}"))?
            {
                Some(status) if status.success() => {}
                Some(status) if status.code() == Some(crate::TooManyDeadLetters::EXIT_CODE) => {
                    dead_letters.get_or_insert(*process);
                }
                Some(status) => failed = Some(format!("process {process} exited with {status}")),
                None => all_done = false,
            }
        }
        if let Some(why) = failed {
            for (_, child) in children.iter_mut() {
                let _ = child.kill();
                let _ = child.wait();
            }
            bail!("{why}; stopped the other processes");
        }
        if all_done {
            return match dead_letters {
                Some(process) => Err(crate::TooManyDeadLetters(format!(
                    "process {process} ended with too many of its records in dead letters (its error above says which)"
                ))
                .into()),
                None => Ok(()),
            };
        }
        std::thread::sleep(Duration::from_millis(20));
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
