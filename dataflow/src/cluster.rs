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
    /// Shared by the processes of one cluster, checked when they connect: a process of another
    /// cluster that reaches a reused port is turned away instead of joining (default: a hash
    /// of the addresses; the supervisor gives each start of its cluster a fresh one).
    pub token: u64,
}

impl ClusterConfig {
    /// `threads` workers in this process only.
    pub fn single_process(threads: usize) -> Self {
        ClusterConfig {
            threads: threads.max(1),
            process: 0,
            addresses: Vec::new(),
            token: 0,
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
        let token = addresses_token(&addresses);
        Ok(ClusterConfig {
            threads: threads.max(1),
            process,
            addresses,
            token,
        })
    }

    /// The same cluster with `token` (see [`ClusterConfig::token`]).
    pub fn with_token(mut self, token: u64) -> Self {
        self.token = token;
        self
    }

    pub fn processes(&self) -> usize {
        self.addresses.len().max(1)
    }

    pub fn total_workers(&self) -> usize {
        self.threads * self.processes()
    }

    /// The timely configuration for this process.
    /// The communication layer for [`timely::execute::execute_from`]. Processes of a cluster are
    /// connected here rather than by timely, whose connect and accept loops sleep a whole second
    /// after a refused or not-yet-arrived connection: that second would be paid on every start
    /// and every restart after a failure. Here connecting retries every 20 ms and accepting
    /// blocks, so a cluster forms as soon as its last process is up.
    pub fn build(
        &self,
    ) -> Result<
        (
            Vec<timely_communication::AllocatorBuilder>,
            Box<dyn std::any::Any + Send>,
        ),
        String,
    > {
        if self.addresses.len() <= 1 {
            return self.to_timely().communication.try_build();
        }
        use timely_communication::allocator::zero_copy::initialize::initialize_networking_from_sockets;
        use timely_communication::allocator::ProcessBuilder;
        let sockets = connect(&self.addresses, self.process, self.token)
            .map_err(|e| format!("connecting the cluster: {e}"))?;
        let hooks = timely_communication::Hooks::default();
        let local = ProcessBuilder::new_typed_vector(
            self.threads,
            hooks.refill.clone(),
            hooks.spill.clone(),
        );
        let (builders, guard) =
            initialize_networking_from_sockets(local, sockets, self.process, self.threads, hooks)
                .map_err(|e| format!("starting the cluster's network threads: {e}"))?;
        Ok((
            builders
                .into_iter()
                .map(timely_communication::AllocatorBuilder::Tcp)
                .collect(),
            Box::new(guard),
        ))
    }

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

/// FNV-1a of the addresses: the token of processes started by hand from one hostfile.
fn addresses_token(addresses: &[String]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in addresses.join("\n").bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

/// What a connecting process sends: magic, cluster token, its index.
const HELLO: &[u8; 4] = b"RFL1";
/// Longest a connection may take to introduce itself.
const HELLO_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// One socket per other process, indexed by process: this process connects to those before it
/// (announcing the cluster's token and its index, answered by the token) and accepts those
/// after it. A connection with another token (a process of another cluster on a reused port)
/// is closed and waited past.
#[allow(
    clippy::indexing_slicing,
    reason = "`me` and every `peer` are process indices below the number of addresses, checked by the cluster config"
)]
fn connect(
    addresses: &[String],
    me: usize,
    token: u64,
) -> std::io::Result<Vec<Option<std::net::TcpStream>>> {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::time::{Duration, Instant};

    let listener = TcpListener::bind(addresses[me].as_str())?;
    let later = addresses.len() - me - 1;
    let accepting = std::thread::spawn(move || -> std::io::Result<Vec<(usize, TcpStream)>> {
        let mut accepted = Vec::with_capacity(later);
        while accepted.len() < later {
            let (mut stream, from) = listener.accept()?;
            stream.set_nodelay(true)?;
            stream.set_read_timeout(Some(HELLO_TIMEOUT))?;
            let mut hello = [0u8; 20];
            let ours = stream.read_exact(&mut hello).is_ok()
                && &hello[..4] == HELLO
                && hello[4..12] == token.to_le_bytes();
            // The answer lets a stranger know it is one, and our peer that we are its cluster.
            let _ = stream.write_all(&token.to_le_bytes());
            if !ours {
                tracing::warn!(
                    "turned away a connection from {from}: not a process of this cluster"
                );
                continue;
            }
            stream.set_read_timeout(None)?;
            let mut index = [0u8; 8];
            index.copy_from_slice(&hello[12..20]);
            accepted.push((u64::from_le_bytes(index) as usize, stream));
        }
        Ok(accepted)
    });
    let mut sockets: Vec<Option<TcpStream>> = (0..addresses.len()).map(|_| None).collect();
    for (peer, address) in addresses.iter().enumerate().take(me) {
        let started = Instant::now();
        let mut reported = Instant::now();
        let stream = loop {
            let attempt = TcpStream::connect(address.as_str()).and_then(|mut s| {
                s.set_nodelay(true)?;
                s.set_read_timeout(Some(HELLO_TIMEOUT))?;
                let mut hello = Vec::with_capacity(20);
                hello.extend_from_slice(HELLO);
                hello.extend_from_slice(&token.to_le_bytes());
                hello.extend_from_slice(&(me as u64).to_le_bytes());
                s.write_all(&hello)?;
                let mut answer = [0u8; 8];
                s.read_exact(&mut answer)?;
                if answer != token.to_le_bytes() {
                    return Err(std::io::Error::other(
                        "a process of another cluster answered",
                    ));
                }
                s.set_read_timeout(None)?;
                Ok(s)
            });
            match attempt {
                Ok(s) => break s,
                Err(e) => {
                    if reported.elapsed() > Duration::from_secs(5) {
                        tracing::info!(
                            "waiting for process {peer} at {address} ({:.0} s): {e}",
                            started.elapsed().as_secs_f64()
                        );
                        reported = Instant::now();
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        };
        sockets[peer] = Some(stream);
    }
    let accepted = accepting
        .join()
        .map_err(|_| std::io::Error::other("the accepting thread panicked"))??;
    for (peer, stream) in accepted {
        match sockets.get_mut(peer) {
            Some(slot @ None) if peer > me => *slot = Some(stream),
            _ => {
                return Err(std::io::Error::other(format!(
                    "process index {peer} announced twice or out of range"
                )))
            }
        }
    }
    Ok(sockets)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_process_of_another_cluster_is_turned_away() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap();
        let addresses: Vec<String> = vec![
            format!("127.0.0.1:{port}"),
            format!("127.0.0.1:{}", port + 1),
        ];
        let first = {
            let addresses = addresses.clone();
            std::thread::spawn(move || super::connect(&addresses, 0, 7))
        };
        // A stranger (token 8) keeps knocking at process 0; it never gets in.
        {
            let addresses = addresses.clone();
            std::thread::spawn(move || super::connect(&addresses, 1, 8));
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
        let ours = {
            let mut addresses = addresses.clone();
            // Process 1 of our cluster listens elsewhere: the stranger holds port + 1.
            let spare = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .unwrap();
            addresses[1] = format!("127.0.0.1:{spare}");
            let (done, result) = std::sync::mpsc::channel();
            std::thread::spawn(move || done.send(super::connect(&addresses, 1, 7)));
            result
        };
        // Had process 0 let the stranger in, our process 1 would wait forever.
        let second = ours
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("process 1 of our cluster got in")
            .expect("process 1 formed its cluster");
        let first = first.join().unwrap().expect("process 0 formed its cluster");
        assert!(first[1].is_some() && second[0].is_some());
    }

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
