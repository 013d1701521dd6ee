//! Where the workers run: threads of one process, or a cluster of processes.

use std::path::Path;

use crate::error::{DataflowError, DataflowResult};

/// Workers of a run: `threads` per process, in `addresses.len()` processes (one when empty).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterConfig {
    /// Worker threads in each process.
    pub threads: usize,
    /// Index of this process among `addresses`.
    pub process: usize,
    /// `host:port` of every process, in process order; empty for a single process.
    pub addresses: Vec<String>,
}

impl ClusterConfig {
    /// `threads` workers in this process only.
    pub fn single_process(threads: usize) -> Self {
        ClusterConfig {
            threads: threads.max(1),
            process: 0,
            addresses: Vec::new(),
        }
    }

    /// Process `process` of `processes` on this host, listening on consecutive ports.
    pub fn local_processes(
        threads: usize,
        processes: usize,
        process: usize,
        base_port: u16,
    ) -> DataflowResult<Self> {
        let addresses = (0..processes)
            .map(|p| format!("127.0.0.1:{}", base_port as usize + p))
            .collect();
        Self::cluster(threads, process, addresses)
    }

    /// Process `process` of the cluster listed in `hostfile` (one `host:port` per line; blank
    /// lines and `#` comments ignored).
    pub fn from_hostfile(threads: usize, process: usize, hostfile: &Path) -> DataflowResult<Self> {
        let text = std::fs::read_to_string(hostfile).map_err(|e| {
            DataflowError::io(format!("reading hostfile {}", hostfile.display()), e)
        })?;
        let addresses: Vec<String> = text
            .lines()
            .map(|l| l.split('#').next().unwrap_or("").trim())
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect();
        if addresses.is_empty() {
            return Err(DataflowError::Cluster(format!(
                "hostfile {} lists no host:port lines",
                hostfile.display()
            )));
        }
        Self::cluster(threads, process, addresses)
    }

    fn cluster(threads: usize, process: usize, addresses: Vec<String>) -> DataflowResult<Self> {
        if process >= addresses.len() {
            return Err(DataflowError::Cluster(format!(
                "process index {process} is outside the {} processes of the cluster",
                addresses.len()
            )));
        }
        Ok(ClusterConfig {
            threads: threads.max(1),
            process,
            addresses,
        })
    }

    pub fn processes(&self) -> usize {
        self.addresses.len().max(1)
    }

    pub fn total_workers(&self) -> usize {
        self.threads * self.processes()
    }

    /// The timely configuration for this process.
    pub fn to_timely(&self) -> timely::Config {
        let communication = if self.addresses.len() > 1 {
            timely::CommunicationConfig::Cluster {
                threads: self.threads,
                process: self.process,
                addresses: self.addresses.clone(),
                report: false,
                zerocopy: false,
            }
        } else if self.threads > 1 {
            timely::CommunicationConfig::Process(self.threads)
        } else {
            timely::CommunicationConfig::Thread
        };
        timely::Config {
            communication,
            worker: timely::WorkerConfig::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostfile_lists_processes() {
        let dir = std::env::temp_dir().join(format!("riffle-hostfile-{}", std::process::id()));
        std::fs::write(&dir, "# cluster\n127.0.0.1:2101\n\n127.0.0.1:2102\n").unwrap();
        let c = ClusterConfig::from_hostfile(2, 1, &dir).unwrap();
        assert_eq!(c.processes(), 2);
        assert_eq!(c.total_workers(), 4);
        assert!(ClusterConfig::from_hostfile(2, 2, &dir).is_err());
        std::fs::remove_file(dir).unwrap();
    }
}
