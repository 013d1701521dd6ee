//! `sink: { redis: {...} }`: the configuration, what the kind says about itself, and the URL
//! with its password hidden for every message.

use std::fmt;
use std::time::Duration;

use arrow_schema::Schema;
use riffle_dataflow::range::Range;
use riffle_dataflow::sink::SinkFactory;
use riffle_dataflow::{DataflowError, DataflowResult};
use serde::Deserialize;
use serde_inline_default::serde_inline_default;

use super::template::{KeyTemplate, ValueSpec};
use crate::kind::{Limits, SinkContext, SinkKind, SinkRole};
pub use crate::web::redacted;

/// `sink: { redis: {...} }`: each result row sets one key.
#[serde_inline_default]
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisSinkConfig {
    /// `redis://[[user]:password@]host[:port][/db]`. Never shown whole: messages print it with
    /// the password hidden.
    pub url: String,
    /// The key template: text with `{column}` placeholders (`recs:{user_id}`); `{{` and `}}`
    /// for literal braces.
    pub key: String,
    /// What a key is set to: `json` (the whole row as a JSON object) or a column's name (its
    /// text; lists and structs as JSON).
    #[serde(default)]
    pub value: ValueSpec,
    /// Seconds a written key lives (`SET … EX`); unset: keys never expire.
    #[serde(default)]
    pub ttl_s: Option<u64>,
    /// The key recording the last committed checkpoint (`generation epoch`) in runs with
    /// checkpoints. Default: `riffle:sink:<pipeline>:<key template>`.
    #[serde(default)]
    pub position_key: Option<String>,
    /// Connect, read and write timeout of every request.
    #[serde_inline_default(5_000)]
    pub timeout_ms: u64,
}

impl fmt::Debug for RedisSinkConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisSinkConfig")
            .field("url", &redacted(&self.url))
            .field("key", &self.key)
            .field("value", &self.value)
            .field("ttl_s", &self.ttl_s)
            .field("position_key", &self.position_key)
            .field("timeout_ms", &self.timeout_ms)
            .finish()
    }
}

impl RedisSinkConfig {
    /// The URL with its password hidden, for messages.
    pub fn label(&self) -> String {
        redacted(&self.url)
    }

    pub(crate) fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms.max(1))
    }

    /// The position key: as configured, else one per pipeline and key template (set by
    /// [`SinkKind::prepare`]); `riffle:sink:<key template>` for a configuration built in code.
    pub(crate) fn position_key(&self) -> String {
        self.position_key
            .clone()
            .unwrap_or_else(|| format!("riffle:sink:{}", self.key))
    }

    /// An error in this sink's configuration or set-up.
    pub(crate) fn config_error(&self, message: impl fmt::Display) -> DataflowError {
        DataflowError::Config(format!("redis sink ({}): {message}", self.label()))
    }

    /// An error while writing.
    pub(crate) fn sink_error(&self, message: impl fmt::Display) -> DataflowError {
        DataflowError::stage("sink", format!("redis {}: {message}", self.label()))
    }

    /// Checks what can be checked without a server: the URL's scheme and form, the template,
    /// the ranges.
    pub(crate) fn check(&self) -> DataflowResult<KeyTemplate> {
        for range in Self::RANGES {
            let value = match range.key {
                "ttl_s" => self.ttl_s,
                "timeout_ms" => Some(self.timeout_ms),
                _ => None,
            };
            if let Some(v) = value {
                range.check_int(v).map_err(|e| self.config_error(e))?;
            }
        }
        let scheme = self.url.split_once("://").map(|(s, _)| s);
        match scheme {
            Some("redis" | "valkey" | "redis+unix" | "unix") => {}
            Some("rediss" | "valkeys") => {
                return Err(self.config_error(
                    "`url`: TLS (`rediss://`) needs the redis crate's `tls-rustls` feature, \
                     which this build does not have: expected `redis://`",
                ))
            }
            _ => {
                return Err(
                    self.config_error("`url`: expected `redis://[:password@]host[:port][/db]`")
                )
            }
        }
        // Parsing builds no connection; its messages never quote the URL.
        ::redis::Client::open(self.url.as_str())
            .map_err(|e| self.config_error(format!("`url`: {e}")))?;
        if self.position_key.as_deref() == Some("") {
            return Err(self.config_error("`position_key` is empty"));
        }
        KeyTemplate::parse(&self.key).map_err(|e| self.config_error(format!("`key`: {e}")))
    }
}

impl SinkKind for RedisSinkConfig {
    fn kind(&self) -> &'static str {
        "redis"
    }

    /// One position key per pipeline and key template, the same on every restart.
    fn prepare(&mut self, ctx: &SinkContext<'_>) {
        if ctx.role == SinkRole::Results && self.position_key.is_none() {
            self.position_key = Some(format!("riffle:sink:{}:{}", ctx.pipeline, self.key));
        }
    }

    fn check_input(&self, schema: &Schema) -> Result<(), String> {
        let template = KeyTemplate::parse(&self.key).map_err(|e| format!("`key`: {e}"))?;
        template
            .check(schema)
            .map_err(|e| format!("`key` `{}`: {e}", self.key))?;
        self.value
            .check(schema)
            .map_err(|e| format!("`value`: {e}"))
    }

    fn build(&self) -> DataflowResult<Box<dyn SinkFactory>> {
        Ok(Box::new(super::RedisSinkFactory::new(self)?))
    }
}

impl Limits for RedisSinkConfig {
    const RANGES: &'static [Range] = &[
        // Redis takes up to i64 seconds; ten years is past any cache's use.
        Range::int("ttl_s", 1, 315_360_000),
        Range::int("timeout_ms", 1, 600_000),
    ];
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn config(value: serde_json::Value) -> RedisSinkConfig {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn passwords_stay_out_of_labels_debug_and_errors() {
        assert_eq!(
            redacted("redis://:s3cret@127.0.0.1:6379/2"),
            "redis://:***@127.0.0.1:6379/2"
        );
        assert_eq!(
            redacted("redis://app:s3cret@cache:6379"),
            "redis://app:***@cache:6379"
        );
        assert_eq!(redacted("redis://s3cret@cache/0"), "redis://***@cache/0");
        assert_eq!(redacted("redis://cache:6379/0"), "redis://cache:6379/0");
        assert_eq!(
            redacted("redis+unix:///run/redis.sock?pass=s3cret"),
            "redis+unix:///run/redis.sock?…"
        );
        assert!(!redacted("s3cret").contains("s3cret"));
        let c = config(json!({"url": "redis://:s3cret@h:1/x", "key": "k:{a}"}));
        assert!(!format!("{c:?}").contains("s3cret"));
        let e = c.check().unwrap_err().to_string();
        assert!(
            e.contains("database number") && !e.contains("s3cret"),
            "{e}"
        );
        let e = config(json!({"url": "rediss://:s3cret@h:1/0", "key": "k"}))
            .check()
            .unwrap_err()
            .to_string();
        assert!(e.contains("tls-rustls") && !e.contains("s3cret"), "{e}");
    }

    #[test]
    fn defaults_and_the_position_key_per_pipeline() {
        let mut c = config(json!({"url": "redis://h/0", "key": "recs:{user_id}"}));
        assert_eq!(c.value, ValueSpec::Json);
        assert_eq!((c.ttl_s, c.timeout_ms), (None, 5_000));
        c.check().unwrap();
        let mut live = c.clone();
        live.prepare(&SinkContext {
            pipeline: "p",
            role: SinkRole::Live,
        });
        assert_eq!(live.position_key, None);
        c.prepare(&SinkContext {
            pipeline: "clicks",
            role: SinkRole::Results,
        });
        assert_eq!(c.position_key(), "riffle:sink:clicks:recs:{user_id}");
        let named = config(json!({"url": "redis://h", "key": "k", "value": "score"}));
        assert_eq!(named.value, ValueSpec::Column("score".into()));
        assert!(serde_json::from_value::<RedisSinkConfig>(
            json!({"url": "redis://h", "key": "k", "ttl": 3})
        )
        .is_err());
    }

    #[test]
    fn check_input_names_the_key_and_the_missing_column() {
        use arrow_schema::{DataType, Field};
        let schema = Schema::new(vec![
            Field::new("user_id", DataType::Int64, false),
            Field::new("recs", DataType::Utf8, true),
        ]);
        let c = config(json!({"url": "redis://h", "key": "recs:{user}"}));
        let e = c.check_input(&schema).unwrap_err();
        assert!(
            e.starts_with("`key` `recs:{user}`: names column `user`") && e.contains("user_id"),
            "{e}"
        );
        let c = config(json!({"url": "redis://h", "key": "recs:{user_id}", "value": "score"}));
        let e = c.check_input(&schema).unwrap_err();
        assert!(e.starts_with("`value`: names column `score`"), "{e}");
        let c = config(json!({"url": "redis://h", "key": "recs:{user_id", "value": "recs"}));
        assert!(c.check_input(&schema).unwrap_err().starts_with("`key`: "));
        let c = config(json!({"url": "redis://h", "key": "recs:{user_id}", "value": "recs"}));
        assert_eq!(c.check_input(&schema), Ok(()));
    }

    #[test]
    fn numbers_out_of_range_are_refused_by_the_build_too() {
        let c = config(json!({"url": "redis://h", "key": "k", "ttl_s": 0}));
        let e = c.check().unwrap_err().to_string();
        assert!(e.contains("ttl_s") && e.contains("from 1"), "{e}");
        let c = config(json!({"url": "http://h", "key": "k"}));
        assert!(c.check().unwrap_err().to_string().contains("`url`"));
    }
}
