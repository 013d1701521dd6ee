//! One request to the registry: its headers and timeout, and retries with backoff.

use std::time::{Duration, Instant};

use ureq::tls::{RootCerts, TlsConfig};

use super::replies::registry_says;
use super::{Method, RegistryClient, Reply};
use crate::schema_registry::{RegistryConfig, RegistryError};

/// The registry's media type, sent as Content-Type and Accept.
pub(super) const MEDIA_TYPE: &str = "application/vnd.schemaregistry.v1+json";
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// The HTTP agent of a client; `ca_file`, when set, holds the only CA trusted.
pub(super) fn agent(config: &RegistryConfig) -> Result<ureq::Agent, RegistryError> {
    let mut agent = ureq::Agent::config_builder()
        // Statuses are read, not raised: 404s and the registry's messages matter.
        .http_status_as_error(false)
        .user_agent(concat!("riffle/", env!("CARGO_PKG_VERSION")));
    if let Some(path) = &config.ca_file {
        let roots = crate::web::read_ca_file(path)
            .map_err(|m| RegistryError::Config(format!("ca_file {m}")))?;
        agent = agent.tls_config(
            TlsConfig::builder()
                .root_certs(RootCerts::new_with_certs(&roots))
                .build(),
        );
    }
    Ok(agent.build().new_agent())
}

impl RegistryClient {
    /// Sends one request, retrying connection errors, timeouts and 5xx with backoff until the
    /// timeout has passed since the call started. Returns the first 2xx–4xx answer.
    pub(super) fn send(&self, method: Method<'_>, url: &str) -> Result<Reply, RegistryError> {
        let started = Instant::now();
        let deadline = started + self.inner.timeout;
        let mut backoff = FIRST_BACKOFF;
        let mut attempts = 0_u32;
        loop {
            attempts += 1;
            let remaining = deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1));
            let failure = match self.attempt(method, url, remaining) {
                Ok(reply) if reply.status < 500 => return Ok(reply),
                Ok(reply) => format!("HTTP {}{}", reply.status, registry_says(&reply)),
                Err(e) if crate::web::retryable(&e) => e.to_string(),
                Err(e) => {
                    return Err(RegistryError::Request {
                        url: url.to_string(),
                        what: format!("{} failed: {e}", method.name()),
                    })
                }
            };
            if Instant::now() + backoff >= deadline {
                return Err(RegistryError::Request {
                    url: url.to_string(),
                    what: format!(
                        "{} failed after {attempts} attempt(s) in {} ms (timeout_ms {}): {failure}",
                        method.name(),
                        started.elapsed().as_millis(),
                        self.inner.timeout.as_millis()
                    ),
                });
            }
            tracing::debug!(url, attempts, %failure, "schema registry request failed; retrying");
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    fn attempt(
        &self,
        method: Method<'_>,
        url: &str,
        timeout: Duration,
    ) -> Result<Reply, ureq::Error> {
        let agent = &self.inner.agent;
        let mut response = match method {
            Method::Get => self.prepare(agent.get(url), timeout).call()?,
            Method::Post(body) => self
                .prepare(agent.post(url), timeout)
                .content_type(MEDIA_TYPE)
                .send(body)?,
        };
        let status = response.status().as_u16();
        let body = response.body_mut().read_to_string()?;
        Ok(Reply { status, body })
    }

    fn prepare<B>(
        &self,
        request: ureq::RequestBuilder<B>,
        timeout: Duration,
    ) -> ureq::RequestBuilder<B> {
        let request = request
            .config()
            .timeout_global(Some(timeout))
            .build()
            .header("accept", MEDIA_TYPE);
        match &self.inner.authorization {
            Some(auth) => request.header("authorization", auth.as_str()),
            None => request,
        }
    }
}

/// `s` percent-encoded as one path segment (all but RFC 3986's unreserved characters).
pub(super) fn path_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for byte in s.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}
