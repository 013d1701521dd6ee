//! A run's HTTP endpoints: metrics and health, the live view.

use anyhow::{anyhow, Context, Result};
use riffle_dataflow::cluster::ClusterConfig;
use riffle_dataflow::observe::RunContext;
use riffle_ui::{PeerReporter, ViewConfig, ViewServer};

use crate::cli::RunArgs;

/// The servers and reporters of one process of a run.
pub struct Endpoints {
    view: Option<ViewServer>,
    metrics: Option<ViewServer>,
    peer: Option<PeerReporter>,
}

impl Endpoints {
    /// `--ui` on process 0: the view; on other processes: a reporter to process 0's view.
    /// `--metrics-addr`: this process's metrics and health (port + process index in a local
    /// cluster, so every process of a host serves its own). The view (or the reporter) puts its
    /// live tap in `context`, which the run is then handed.
    pub fn start(
        args: &RunArgs,
        pipeline: &riffle_pipelines::Pipeline,
        cluster: &ClusterConfig,
        context: &mut RunContext,
    ) -> Result<Self> {
        let config = ViewConfig {
            pipeline: pipeline.name().to_string(),
            plan: riffle_pipelines::plan::describe(pipeline, cluster.threads, cluster.processes()),
            process: cluster.process,
            processes: cluster.processes(),
            workers: cluster.threads,
            page: false,
            video_dir: pipeline.live_stream_dir(),
        };
        if let (Some(control), None, true) =
            (pipeline.source.control(), &args.ui, cluster.processes() > 1)
        {
            if let Some(file) = control.watched_file() {
                return Err(anyhow!(
                    "{}: the source's watched camera file ({}) across {} processes needs --ui: \
                     process 0's view holds the camera set and the other processes follow it",
                    args.file.display(),
                    file.display(),
                    cluster.processes()
                ));
            }
        }
        // The source's inputs, served on process 0 and followed by the others; a source kept
        // open by the view waits for cameras added after its own end.
        if args.ui.is_some() || (args.metrics_addr.is_some() && cluster.processes() == 1) {
            if let Some(control) = pipeline.source.control() {
                if args.ui.is_some() {
                    control.keep_open();
                }
                context.control = Some(control);
            }
        }
        let mut endpoints = Endpoints {
            view: None,
            metrics: None,
            peer: None,
        };
        if let Some(addr) = &args.metrics_addr {
            let addr = if args.cluster.hostfile.is_none() {
                offset_port(addr, cluster.process)?
            } else {
                addr.clone()
            };
            let server = riffle_ui::serve(&addr, context, config.clone())?;
            tracing::info!(
                "serving Prometheus metrics on http://{}/metrics (and /healthz, /readyz)",
                server.addr()
            );
            endpoints.metrics = Some(server);
        }
        match (&args.ui, cluster.process) {
            (Some(addr), 0) => {
                let view = riffle_ui::serve(
                    addr,
                    context,
                    ViewConfig {
                        page: true,
                        ..config
                    },
                )?;
                eprintln!("riffle: live view on http://{}/", view.addr());
                endpoints.view = Some(view);
            }
            (Some(addr), process) => {
                let at = view_of_process_zero(addr, cluster, args.cluster.hostfile.is_some())?;
                endpoints.peer = Some(PeerReporter::start(&at, context, process, cluster.threads)?);
            }
            (None, _) => {}
        }
        Ok(endpoints)
    }

    /// The run is over: the view shows the final state. Returns the view's address when
    /// this process serves one, which stays up until the process exits.
    pub fn finish(self) -> Option<std::net::SocketAddr> {
        if let Some(peer) = self.peer {
            peer.finish();
        }
        let addr = self.view.as_ref().map(ViewServer::addr);
        if let Some(view) = self.view {
            view.finish();
        }
        addr
    }
}

/// `host:port` with the port moved up by `offset`.
pub fn offset_port(addr: &str, offset: usize) -> Result<String> {
    let (host, port) = addr
        .rsplit_once(':')
        .ok_or_else(|| anyhow!("`{addr}`: expected HOST:PORT"))?;
    let port: usize = port
        .parse()
        .with_context(|| format!("`{addr}`: the port is not a number"))?;
    let moved = u16::try_from(port + offset)
        .map_err(|_| anyhow!("`{addr}`: port {port} + {offset} is past 65535"))?;
    Ok(format!("{host}:{moved}"))
}

/// Where another process reaches process 0's view at `ui`: process 0's host among the
/// cluster's addresses (the hostfile's first line) when it runs elsewhere, else this host, on
/// `ui`'s port.
fn view_of_process_zero(ui: &str, cluster: &ClusterConfig, hostfile: bool) -> Result<String> {
    let (host, port) = ui
        .rsplit_once(':')
        .ok_or_else(|| anyhow!("--ui `{ui}`: expected HOST:PORT"))?;
    let first = cluster.addresses.first().filter(|_| hostfile);
    let host = match first {
        Some(address) => address
            .rsplit_once(':')
            .map_or(address.as_str(), |(h, _)| h),
        None if matches!(host, "0.0.0.0" | "[::]" | "") => "127.0.0.1",
        None => host,
    };
    Ok(format!("{host}:{port}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_and_view_addresses() {
        assert_eq!(offset_port("127.0.0.1:9898", 2).unwrap(), "127.0.0.1:9900");
        assert!(offset_port("127.0.0.1:65535", 1).is_err());
        assert!(offset_port("nowhere", 0).is_err());
        let local = ClusterConfig::local_processes(1, 2, 1, 2101).unwrap();
        assert_eq!(
            view_of_process_zero("0.0.0.0:8080", &local, false).unwrap(),
            "127.0.0.1:8080"
        );
        let dir = tempfile::tempdir().unwrap();
        let hosts = dir.path().join("hosts");
        std::fs::write(&hosts, "# cluster\n\n10.0.0.5:2101\n10.0.0.6:2101\n").unwrap();
        let spread = ClusterConfig::from_hostfile(1, 1, &hosts).unwrap();
        assert_eq!(
            view_of_process_zero("0.0.0.0:8080", &spread, true).unwrap(),
            "10.0.0.5:8080"
        );
    }
}
