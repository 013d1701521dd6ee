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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn serves_stage_metrics_in_prometheus_text_format() {
        let metrics = Metrics::new().unwrap();
        metrics
            .stage("model")
            .unwrap()
            .record_batch(8, 8, 0, std::time::Duration::from_millis(3));
        let addr = format!("127.0.0.1:{}", 30000 + std::process::id() % 20000);
        let _server = serve_metrics(&addr, metrics).unwrap();
        let mut stream = std::net::TcpStream::connect(&addr).unwrap();
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut body = String::new();
        stream.read_to_string(&mut body).unwrap();
        assert!(body.starts_with("HTTP/1.1 200"), "{body}");
        assert!(
            body.contains("riffle_stage_records_in_total{stage=\"model\"} 8"),
            "{body}"
        );
        assert!(body.contains("riffle_stage_batch_rows_bucket"), "{body}");
    }
}
