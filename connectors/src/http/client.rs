//! One request, sent until it is answered: retries with doubling backoff for what may pass
//! (connection errors, timeouts, 408, 429, 5xx), a refusal returned for any other 4xx.

use std::time::Duration;

use riffle_dataflow::DataflowResult;
use ureq::tls::{RootCerts, TlsConfig};

use super::config::{HttpMethod, HttpSinkConfig};

/// How a request ended, short of failing the run.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    Delivered,
    /// A 4xx that retrying will not change: its rows are dead letters.
    Refused {
        status: u16,
        body: String,
    },
}

/// The number of attempts and retries, for the sink's counts.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    pub requests: u64,
    pub retries: u64,
    pub refusals: u64,
}

pub(crate) struct Client {
    agent: ureq::Agent,
    config: HttpSinkConfig,
}

impl Client {
    pub(crate) fn new(config: &HttpSinkConfig) -> DataflowResult<Client> {
        let mut agent = ureq::Agent::config_builder()
            // Statuses are read, not raised: 4xx and 5xx are told apart.
            .http_status_as_error(false)
            .timeout_global(Some(config.timeout()))
            .user_agent(concat!("riffle/", env!("CARGO_PKG_VERSION")));
        if let Some(path) = &config.ca_file {
            let roots =
                crate::web::read_ca_file(path).map_err(|m| config.key_error("ca_file", m))?;
            agent = agent.tls_config(
                TlsConfig::builder()
                    .root_certs(RootCerts::new_with_certs(&roots))
                    .build(),
            );
        }
        Ok(Client {
            agent: agent.build().new_agent(),
            config: config.clone(),
        })
    }

    /// Sends `body` under `key` until it is delivered or refused; spent attempts fail the run
    /// with the URL, the last status or cause and the number of attempts.
    pub(crate) fn send(&self, body: &[u8], key: &str, tally: &mut Tally) -> DataflowResult<Answer> {
        let c = &self.config;
        let mut wait = Duration::from_millis(c.backoff_ms);
        let cap = Duration::from_millis(c.max_backoff_ms);
        let mut last = String::new();
        for attempt in 1..=c.max_attempts.max(1) {
            if attempt > 1 {
                tally.retries += 1;
            }
            tally.requests += 1;
            let mut retry_after = None;
            match self.attempt(body, key) {
                Ok((status, _, _)) if (200..300).contains(&status) => return Ok(Answer::Delivered),
                Ok((status, after, text)) if retryable_status(status) => {
                    last = status_text(status, &text);
                    retry_after = after;
                }
                Ok((status, _, text)) if (400..500).contains(&status) => {
                    tally.refusals += 1;
                    return Ok(Answer::Refused { status, body: text });
                }
                Ok((status, _, text)) => {
                    return Err(c.sink_error(format!(
                        "unexpected {} (expected 2xx)",
                        status_text(status, &text)
                    )))
                }
                Err(e) if crate::web::retryable(&e) => last = e.to_string(),
                Err(e) => return Err(c.sink_error(e)),
            }
            if attempt < c.max_attempts {
                // A server's own wait counts, within the cap: longer would stall the run.
                let pause = retry_after.unwrap_or(wait).min(cap);
                std::thread::sleep(pause);
                wait = (wait * 2).min(cap);
            }
        }
        Err(c.sink_error(format!(
            "gave up after {} attempt(s) (max_attempts): {last}",
            c.max_attempts
        )))
    }

    /// One attempt: the status, any `Retry-After` in seconds, and the answer's text.
    fn attempt(
        &self,
        body: &[u8],
        key: &str,
    ) -> Result<(u16, Option<Duration>, String), ureq::Error> {
        let c = &self.config;
        let mut request = match c.method {
            HttpMethod::POST => self.agent.post(&c.url),
            HttpMethod::PUT => self.agent.put(&c.url),
        }
        .header("content-type", c.format.content_type())
        .header("idempotency-key", key);
        for (name, value) in &c.headers {
            request = request.header(name.as_str(), value.as_str());
        }
        let mut response = request.send(body)?;
        let status = response.status().as_u16();
        let after = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        // The text is only quoted: an unreadable one is no reason to fail.
        let text = response.body_mut().read_to_string().unwrap_or_default();
        Ok((status, after, text))
    }
}

fn retryable_status(status: u16) -> bool {
    matches!(status, 408 | 429 | 500..=599)
}

/// `HTTP <status>`, with the start of the answer's text when it has one.
fn status_text(status: u16, text: &str) -> String {
    match text.trim() {
        "" => format!("HTTP {status}"),
        text => format!("HTTP {status}: {}", quote(text)),
    }
}

/// The first 200 characters of an answer, for reasons and errors.
pub(crate) fn quote(text: &str) -> String {
    let mut quoted: String = text.chars().take(200).collect();
    if quoted.len() < text.len() {
        quoted.push('…');
    }
    quoted
}
