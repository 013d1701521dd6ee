//! The Prometheus endpoint (`--metrics-addr`).

use std::sync::Arc;
use std::thread::JoinHandle;

use anyhow::{anyhow, Result};
use riffle_dataflow::metrics::Metrics;

/// Serves `GET /metrics` on `addr` from a background thread for the life of the process.
pub fn serve_metrics(addr: &str, metrics: Arc<Metrics>) -> Result<JoinHandle<()>> {
    let server =
        tiny_http::Server::http(addr).map_err(|e| anyhow!("metrics endpoint on {addr}: {e}"))?;
    tracing::info!("serving Prometheus metrics on http://{addr}/metrics");
    Ok(std::thread::spawn(move || {
        for request in server.incoming_requests() {
            let response = match (request.url(), metrics.render_prometheus()) {
                ("/metrics", Ok(body)) => {
                    tiny_http::Response::from_string(body).with_header(content_type())
                }
                ("/metrics", Err(e)) => {
                    tiny_http::Response::from_string(e.to_string()).with_status_code(500)
                }
                _ => tiny_http::Response::from_string("see /metrics").with_status_code(404),
            };
            let _ = request.respond(response);
        }
    }))
}

fn content_type() -> tiny_http::Header {
    "Content-Type: text/plain; version=0.0.4"
        .parse()
        .expect("a constant, well-formed header")
}
