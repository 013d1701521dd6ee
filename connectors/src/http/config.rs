//! `sink: { http: {...} }`: the configuration, its checks and what the kind says about itself.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use riffle_dataflow::range::Range;
use riffle_dataflow::sink::SinkFactory;
use riffle_dataflow::{DataflowError, DataflowResult};
use serde::Deserialize;
use serde_inline_default::serde_inline_default;

use crate::kind::{Limits, SinkContext, SinkKind};

/// The request method.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
pub enum HttpMethod {
    #[default]
    #[serde(alias = "post")]
    POST,
    #[serde(alias = "put")]
    PUT,
}

/// How a request's rows are laid out in its body.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum BodyFormat {
    /// One JSON array of row objects (`application/json`).
    #[default]
    JsonArray,
    /// One row object per line (`application/x-ndjson`).
    Ndjson,
}

impl BodyFormat {
    pub fn content_type(self) -> &'static str {
        match self {
            BodyFormat::JsonArray => "application/json",
            BodyFormat::Ndjson => "application/x-ndjson",
        }
    }
}

/// `sink: { http: {...} }`: result rows sent as JSON to a URL.
#[serde_inline_default]
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSinkConfig {
    /// `http://` or `https://`; shown in messages with any credentials and query hidden.
    pub url: String,
    #[serde(default)]
    pub method: HttpMethod,
    /// Extra request headers; their values (tokens) are never shown.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(default)]
    pub format: BodyFormat,
    #[serde_inline_default(500)]
    pub max_rows_per_request: u64,
    /// The whole of one attempt: connecting, sending and reading the answer.
    #[serde_inline_default(10_000)]
    pub timeout_ms: u64,
    /// Attempts per request, the first included.
    #[serde_inline_default(5)]
    pub max_attempts: u64,
    /// The wait after the first failed attempt, doubled after each further one.
    #[serde_inline_default(200)]
    pub backoff_ms: u64,
    /// The longest wait between attempts, a `Retry-After` included.
    #[serde_inline_default(5_000)]
    pub max_backoff_ms: u64,
    /// JSON lines file for the rows of refused requests (4xx other than 408 and 429).
    #[serde_inline_default(PathBuf::from("refused.jsonl"))]
    pub dead_letter_path: PathBuf,
    /// A PEM file with the CA certificate(s) to trust instead of the system's.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// The pipeline's name, the stable part of every Idempotency-Key (set by `prepare`).
    #[serde(skip)]
    pub pipeline: String,
}

impl fmt::Debug for HttpSinkConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let headers: BTreeMap<&str, &str> =
            self.headers.keys().map(|k| (k.as_str(), "***")).collect();
        f.debug_struct("HttpSinkConfig")
            .field("url", &self.label())
            .field("method", &self.method)
            .field("headers", &headers)
            .field("format", &self.format)
            .field("max_rows_per_request", &self.max_rows_per_request)
            .field("timeout_ms", &self.timeout_ms)
            .field("max_attempts", &self.max_attempts)
            .field("backoff_ms", &self.backoff_ms)
            .field("max_backoff_ms", &self.max_backoff_ms)
            .field("dead_letter_path", &self.dead_letter_path)
            .field("ca_file", &self.ca_file)
            .field("pipeline", &self.pipeline)
            .finish()
    }
}

/// Headers the sink sets itself: a configured one would be sent twice or contradict them.
const OWN_HEADERS: [&str; 3] = ["content-type", "idempotency-key", "content-length"];

impl HttpSinkConfig {
    /// The URL with any user information's password and query hidden, for messages.
    pub fn label(&self) -> String {
        crate::web::redacted(&self.url)
    }

    pub(crate) fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms.max(1))
    }

    /// An error at one of this sink's keys, which validation reports as `sink.http.<key>`.
    pub(crate) fn key_error(&self, key: &str, message: impl fmt::Display) -> DataflowError {
        DataflowError::Config(format!("http sink ({}): `{key}`: {message}", self.label())).at(key)
    }

    /// An error while sending.
    pub(crate) fn sink_error(&self, message: impl fmt::Display) -> DataflowError {
        DataflowError::stage("sink", format!("http {}: {message}", self.label()))
    }

    /// Checks what can be checked without the server: ranges, the URL's form, the headers.
    pub(crate) fn check(&self) -> DataflowResult<()> {
        for range in Self::RANGES {
            let key = range.key.rsplit('.').next().unwrap_or(range.key);
            let value = match key {
                "max_rows_per_request" => self.max_rows_per_request,
                "timeout_ms" => self.timeout_ms,
                "max_attempts" => self.max_attempts,
                "backoff_ms" => self.backoff_ms,
                "max_backoff_ms" => self.max_backoff_ms,
                _ => continue,
            };
            range.check_int(value)?;
        }
        self.check_keys()
            .map_err(|(key, message)| self.key_error(key, message))
    }

    /// The checks past the ranges (which validation makes first), as the key at fault and
    /// what was expected.
    fn check_keys(&self) -> Result<(), (&'static str, String)> {
        let uri: ureq::http::Uri = self.url.parse().map_err(|_| {
            (
                "url",
                "expected `http://host[:port]/path` or `https://…`".to_string(),
            )
        })?;
        match uri.scheme_str() {
            Some("http" | "https") if uri.host().is_some_and(|h| !h.is_empty()) => {}
            Some("http" | "https") => return Err(("url", "has no host".into())),
            _ => {
                return Err((
                    "url",
                    "expected an `http://` or `https://` URL (the scheme is neither)".into(),
                ))
            }
        }
        for name in self.headers.keys() {
            if ureq::http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                return Err(("headers", format!("`{name}` is not a header name")));
            }
            if OWN_HEADERS.contains(&name.to_ascii_lowercase().as_str()) {
                return Err((
                    "headers",
                    format!("`{name}` is set by the sink itself: leave it out"),
                ));
            }
        }
        for (name, value) in &self.headers {
            // The value itself is a secret: say only whose it is.
            if ureq::http::HeaderValue::from_str(value).is_err() {
                return Err((
                    "headers",
                    format!("the value of `{name}` holds a character a header cannot carry"),
                ));
            }
        }
        if self.dead_letter_path.as_os_str().is_empty() {
            return Err(("dead_letter_path", "is empty".into()));
        }
        Ok(())
    }
}

impl SinkKind for HttpSinkConfig {
    fn kind(&self) -> &'static str {
        "http"
    }

    fn prepare(&mut self, ctx: &SinkContext<'_>) {
        // Events' keys apart from results' (one receiver may take both).
        self.pipeline = match ctx.role {
            crate::kind::SinkRole::Events => format!("{}.events", ctx.pipeline),
            _ => ctx.pipeline.to_string(),
        };
    }

    fn paths_mut(&mut self) -> Vec<&mut PathBuf> {
        let mut paths = vec![&mut self.dead_letter_path];
        paths.extend(self.ca_file.as_mut());
        paths
    }

    /// The results go to a URL: `--output` has no file to replace.
    fn output_mut(&mut self) -> Option<&mut PathBuf> {
        None
    }

    fn outputs(&self) -> Vec<&Path> {
        vec![&self.dead_letter_path]
    }

    fn build(&self) -> DataflowResult<Box<dyn SinkFactory>> {
        Ok(Box::new(super::HttpSinkFactory::new(self)?))
    }
}

impl Limits for HttpSinkConfig {
    const RANGES: &'static [Range] = &[
        Range::int("http.max_rows_per_request", 1, 1_000_000),
        // The same ranges as these keys have elsewhere (the reference has one row per key).
        Range::int("timeout_ms", 1, 3_600_000),
        Range::int("http.max_attempts", 1, 1_000),
        Range::int("backoff_ms", 0, 3_600_000),
        Range::int("max_backoff_ms", 0, 3_600_000),
    ];
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn config(value: serde_json::Value) -> HttpSinkConfig {
        serde_json::from_value(value).unwrap()
    }

    fn key_of(e: DataflowError) -> String {
        match e {
            DataflowError::At { key, .. } => key,
            other => panic!("no key: {other}"),
        }
    }

    #[test]
    fn defaults_and_secrets_stay_hidden() {
        let c = config(json!({
            "url": "https://u:pw@h.example/hook?token=t0k",
            "headers": {"Authorization": "Bearer s3cret"}
        }));
        assert_eq!(c.method, HttpMethod::POST);
        assert_eq!(c.format, BodyFormat::JsonArray);
        assert_eq!((c.max_rows_per_request, c.max_attempts), (500, 5));
        assert_eq!(c.dead_letter_path, PathBuf::from("refused.jsonl"));
        c.check().unwrap();
        let shown = format!("{c:?}");
        assert!(
            !shown.contains("s3cret") && !shown.contains("pw") && !shown.contains("t0k"),
            "{shown}"
        );
        assert!(shown.contains("Authorization"), "{shown}");
    }

    #[test]
    fn errors_name_the_key() {
        let e = config(json!({"url": "ftp://h/x"})).check().unwrap_err();
        assert_eq!(key_of(e), "url");
        let e = config(json!({"url": "http://h", "max_rows_per_request": 0}))
            .check()
            .unwrap_err();
        assert_eq!(key_of(e), "max_rows_per_request");
        let e = config(json!({"url": "http://h", "max_attempts": 0}))
            .check()
            .unwrap_err();
        assert_eq!(key_of(e), "max_attempts");
        let e = config(json!({"url": "http://h", "headers": {"Content-Type": "x"}}))
            .check()
            .unwrap_err();
        assert_eq!(key_of(e), "headers");
        let e = config(json!({"url": "http://h", "headers": {"X-T": "a\nb"}}))
            .check()
            .unwrap_err();
        assert_eq!(key_of(e), "headers");
        let c = config(json!({"url": "http://h", "method": "PUT", "format": "ndjson"}));
        assert_eq!((c.method, c.format), (HttpMethod::PUT, BodyFormat::Ndjson));
        c.check().unwrap();
    }
}
