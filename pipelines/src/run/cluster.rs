//! Where a run's workers are: [`ClusterSpec`], what `riffle run`'s `--workers`, `--processes`,
//! `--process`, `--hostfile` and `--base-port` say, and the [`ClusterConfig`] it makes for a
//! pipeline on this host.

use std::path::PathBuf;

use riffle_dataflow::cluster::ClusterConfig;

use super::RunError;
use crate::Pipeline;

/// The environment variable that hands a supervisor's cluster token to its processes.
pub const CLUSTER_TOKEN: &str = "RIFFLE_CLUSTER_TOKEN";

/// `--workers N` or `--workers auto`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workers {
    /// This host's cores ÷ processes here ÷ ONNX Runtime threads per worker (and at least one
    /// worker per GPU of this process's share): [`crate::plan::auto_workers`].
    Auto,
    Count(usize),
}

impl std::str::FromStr for Workers {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Workers::Auto),
            n => n
                .parse()
                .map(Workers::Count)
                .map_err(|_| format!("expected a number or `auto`, found `{n}`")),
        }
    }
}

impl std::fmt::Display for Workers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Workers::Auto => f.write_str("auto"),
            Workers::Count(n) => write!(f, "{n}"),
        }
    }
}

/// The workers and processes of a run, as `riffle run` takes them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterSpec {
    /// Worker threads per process; `None`: the pipeline's `runtime.workers`.
    pub workers: Option<Workers>,
    /// Processes in the cluster. Without `process` or `hostfile`, a run of more than one
    /// starts them all on this host and supervises them.
    pub processes: usize,
    /// Index of this process in the cluster (0-based).
    pub process: Option<usize>,
    /// File listing `host:port` of every process, one per line.
    pub hostfile: Option<PathBuf>,
    /// First port of a local cluster (process i listens on base-port + i).
    pub base_port: u16,
}

impl Default for ClusterSpec {
    /// One process, the pipeline's workers, ports from 2101.
    fn default() -> Self {
        ClusterSpec {
            workers: None,
            processes: 1,
            process: None,
            hostfile: None,
            base_port: 2101,
        }
    }
}

impl ClusterSpec {
    /// Whether this process starts and supervises a cluster of processes on this host
    /// (`--processes N` without `--process` or `--hostfile`).
    pub fn launches_locally(&self) -> bool {
        self.processes > 1 && self.process.is_none() && self.hostfile.is_none()
    }

    /// This process's place in the cluster for `pipeline` (with a supervisor's token, when
    /// [`CLUSTER_TOKEN`] is set).
    pub fn config(&self, pipeline: &Pipeline) -> Result<ClusterConfig, RunError> {
        let threads = match self.workers {
            Some(Workers::Count(n)) => n,
            Some(Workers::Auto) => {
                let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
                // With a hostfile each host runs one process; locally they share the cores.
                let here = if self.hostfile.is_some() {
                    1
                } else {
                    self.processes
                };
                // CUDA is only loaded for a pipeline that may use it.
                let gpus = if crate::plan::uses_gpus(pipeline) {
                    riffle_gpu::discover().map_or(0, |g| g.len())
                } else {
                    0
                };
                crate::plan::auto_workers(cores, here, pipeline.runtime.intra_op_threads, gpus)
            }
            None => pipeline.runtime.workers,
        };
        if threads == 0 {
            return Err(RunError::NoWorkers);
        }
        let process = self.process.unwrap_or(0);
        let cluster = match &self.hostfile {
            Some(hostfile) => ClusterConfig::from_hostfile(threads, process, hostfile)?,
            None if self.processes > 1 => {
                ClusterConfig::local_processes(threads, self.processes, process, self.base_port)?
            }
            None => ClusterConfig::single_process(threads),
        };
        Ok(match std::env::var(CLUSTER_TOKEN) {
            Ok(value) => {
                let token = value.parse().map_err(|cause| RunError::Token {
                    var: CLUSTER_TOKEN,
                    value: value.clone(),
                    cause,
                })?;
                cluster.with_token(token)
            }
            Err(_) => cluster,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_parse_and_print_as_the_command_line_writes_them() {
        assert_eq!("auto".parse::<Workers>(), Ok(Workers::Auto));
        assert_eq!("3".parse::<Workers>(), Ok(Workers::Count(3)));
        assert!("x".parse::<Workers>().unwrap_err().contains("`x`"));
        assert_eq!(Workers::Auto.to_string(), "auto");
        assert_eq!(Workers::Count(4).to_string(), "4");
    }

    #[test]
    fn only_several_processes_without_a_place_launch_locally() {
        let spec = |processes, process, hostfile: Option<&str>| ClusterSpec {
            processes,
            process,
            hostfile: hostfile.map(PathBuf::from),
            ..ClusterSpec::default()
        };
        assert!(!spec(1, None, None).launches_locally());
        assert!(spec(2, None, None).launches_locally());
        assert!(!spec(2, Some(0), None).launches_locally());
        assert!(!spec(2, None, Some("hosts")).launches_locally());
    }
}
