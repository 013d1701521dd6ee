//! `--processes N` on one host: start N copies of this binary as one timely cluster.

use std::process::{Child, Command};

use anyhow::{bail, Context, Result};

use crate::cli::RunArgs;

pub fn launch_local_cluster(args: &RunArgs) -> Result<()> {
    let exe = std::env::current_exe().context("locating the riffle binary")?;
    let mut children: Vec<(usize, Child)> = Vec::new();
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
        // One endpoint per host: the first process serves metrics.
        if let (Some(addr), 0) = (&args.metrics_addr, process) {
            cmd.arg("--metrics-addr").arg(addr);
        }
        if args.quiet || process > 0 {
            cmd.arg("--quiet");
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("starting process {process}"))?;
        children.push((process, child));
    }
    // A process that fails leaves the others waiting for it forever: stop them all.
    loop {
        let mut failed = None;
        let mut all_done = true;
        for (process, child) in children.iter_mut() {
            match child
                .try_wait()
                .with_context(|| format!("watching process {process}"))?
            {
                Some(status) if status.success() => {}
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
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
