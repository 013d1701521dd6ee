//! One connection to the server, opened with its credentials checked, and the atomic write of
//! a set of keys: one `MULTI`/`EXEC`, sent as one pipeline.

use std::collections::HashMap;

use ::redis::{ConnectionLike, ErrorKind, RedisError, Value};
use riffle_dataflow::{DataflowError, DataflowResult};

use super::config::RedisSinkConfig;
use super::render::Write;

/// A connection and the configuration it was opened with (for messages and reconnecting).
pub(super) struct Connection {
    con: ::redis::Connection,
    config: RedisSinkConfig,
}

/// The position key's update in a commit: set to `new` if it still holds `expected`.
pub(super) struct PositionUpdate<'a> {
    pub key: &'a str,
    pub expected: Option<&'a str>,
    pub new: &'a str,
}

impl Connection {
    /// Connects and sends a `PING`, so that a wrong or missing password fails here, within the
    /// timeout, with an error that says so.
    pub fn open(config: &RedisSinkConfig) -> DataflowResult<Connection> {
        let fail = |e: RedisError| config.config_error(describe(config, "connecting", &e));
        let client = ::redis::Client::open(config.url.as_str()).map_err(fail)?;
        let timeout = config.timeout();
        let con = client.get_connection_with_timeout(timeout).map_err(fail)?;
        con.set_read_timeout(Some(timeout)).map_err(fail)?;
        con.set_write_timeout(Some(timeout)).map_err(fail)?;
        let mut connection = Connection {
            con,
            config: config.clone(),
        };
        // A server that wants a password the URL does not give opens the connection and
        // refuses the first command instead.
        ::redis::cmd("PING")
            .query::<String>(&mut connection.con)
            .map_err(fail)?;
        Ok(connection)
    }

    /// Reconnects when the server closed the connection since the last request.
    fn ready(&mut self) -> DataflowResult<()> {
        if !self.con.is_open() {
            *self = Connection::open(&self.config)?;
        }
        Ok(())
    }

    fn error(&self, what: &str, e: &RedisError) -> DataflowError {
        self.config.sink_error(describe(&self.config, what, e))
    }

    /// The text at `key`, if any.
    pub fn get(&mut self, key: &str) -> DataflowResult<Option<String>> {
        self.ready()?;
        ::redis::cmd("GET")
            .arg(key)
            .query(&mut self.con)
            .map_err(|e| self.error(&format!("reading `{key}`"), &e))
    }

    /// Applies `writes` (and the position update) in one transaction: all or nothing. With a
    /// position, the transaction first `WATCH`es the position key and checks it still holds
    /// what this run last committed: a second writer (a run of the same pipeline that should
    /// not exist) makes the commit fail instead of interleaving its output with this one's.
    pub fn apply(
        &mut self,
        writes: &HashMap<String, Write>,
        ttl_s: Option<u64>,
        position: Option<&PositionUpdate<'_>>,
    ) -> DataflowResult<()> {
        if writes.is_empty() && position.is_none() {
            return Ok(());
        }
        self.ready()?;
        if let Some(p) = position {
            ::redis::cmd("WATCH")
                .arg(p.key)
                .exec(&mut self.con)
                .map_err(|e| self.error("watching the position key", &e))?;
            let found = self.get(p.key)?;
            if found.as_deref() != p.expected {
                let _ = ::redis::cmd("UNWATCH").exec(&mut self.con);
                return Err(self.fenced(p, found.as_deref()));
            }
        }
        let mut pipe = ::redis::pipe();
        pipe.atomic();
        for (key, write) in writes {
            match (write, ttl_s) {
                (Write::Set(value), Some(ttl)) => {
                    pipe.cmd("SET").arg(key).arg(value).arg("EX").arg(ttl)
                }
                (Write::Set(value), None) => pipe.cmd("SET").arg(key).arg(value),
                (Write::Delete, _) => pipe.cmd("DEL").arg(key),
            }
            .ignore();
        }
        if let Some(p) = position {
            pipe.cmd("SET").arg(p.key).arg(p.new).ignore();
        }
        let reply: Value = pipe
            .query(&mut self.con)
            .map_err(|e| self.error(&format!("writing {} key(s)", writes.len()), &e))?;
        match (reply, position) {
            // EXEC answers nil when a watched key changed after WATCH.
            (Value::Nil, Some(p)) => Err(self.fenced(p, None)),
            _ => Ok(()),
        }
    }

    fn fenced(&self, p: &PositionUpdate<'_>, found: Option<&str>) -> DataflowError {
        let found = match found {
            Some(f) => format!("holds `{f}`"),
            None if p.expected.is_some() => "is gone".to_string(),
            None => "changed during the commit".to_string(),
        };
        self.config.sink_error(format!(
            "the position key `{}` {found}, not `{}` as this run last left it: another run of \
             this pipeline is writing the same keys (each pipeline needs its own `key` template \
             or `position_key`)",
            p.key,
            p.expected.unwrap_or("(unset)")
        ))
    }
}

/// `what` failed, in words that name the cause (authentication, a refused connection, a
/// timeout); the URL's password never appears.
fn describe(config: &RedisSinkConfig, what: &str, e: &RedisError) -> String {
    // A refused `SELECT` (a database other than 0, no password) carries NOAUTH's text only.
    let auth = e.kind() == ErrorKind::AuthenticationFailed
        || matches!(e.code(), Some("NOAUTH" | "WRONGPASS"))
        || e.to_string().contains("Authentication required");
    let text = if auth {
        format!(
            "{what}: authentication failed: the server refused the URL's credentials, or needs \
             a password the URL does not give (`redis://:PASSWORD@host:port/db`): {e}"
        )
    } else if e.is_connection_refusal() {
        format!("{what}: connection refused (is the server running, on this port?): {e}")
    } else if e.kind() == ErrorKind::Parse {
        format!("{what}: the answer is not Redis's protocol (is this a Redis server?): {e}")
    } else if e.is_timeout() {
        format!("{what}: no answer within {} ms: {e}", config.timeout_ms)
    } else {
        format!("{what}: {e}")
    };
    scrub(&text, &config.url)
}

/// `text` with the URL's password, should any message quote it, replaced.
fn scrub(text: &str, url: &str) -> String {
    let password = url
        .split_once("://")
        .and_then(|(_, rest)| rest.split('/').next())
        .and_then(|authority| authority.rsplit_once('@'))
        .and_then(|(user, _)| user.split_once(':').map(|(_, p)| p).or(Some(user)))
        // Shorter ones would garble the message, and no message quotes a password anyway.
        .filter(|p| p.len() >= 3);
    match password {
        Some(p) => text.replace(p, "***"),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quoted_password_is_scrubbed() {
        let url = "redis://:hunter2@h:1/0";
        assert_eq!(scrub("bad hunter2 here", url), "bad *** here");
        assert_eq!(scrub("x", "redis://h:1/0"), "x");
        assert_eq!(scrub("a pwd b", "redis://pwd@h/0"), "a *** b");
        // Too short to scrub without garbling the rest.
        assert_eq!(scrub("a pw b", "redis://:pw@h/0"), "a pw b");
    }

    #[test]
    fn authentication_failures_say_so() {
        let config: RedisSinkConfig =
            serde_json::from_value(serde_json::json!({"url": "redis://:pw@h/0", "key": "k"}))
                .unwrap();
        let e = RedisError::from((
            ErrorKind::AuthenticationFailed,
            "Password authentication failed",
        ));
        let text = describe(&config, "connecting", &e);
        assert!(
            text.starts_with("connecting: authentication failed"),
            "{text}"
        );
        let select = RedisError::from((
            ErrorKind::Server(::redis::ServerErrorKind::ResponseError),
            "Redis server refused to switch database",
            "Authentication required.".to_string(),
        ));
        assert!(describe(&config, "connecting", &select).contains("authentication failed"));
        let other = RedisError::from((ErrorKind::Parse, "garbled"));
        assert!(!describe(&config, "x", &other).contains("authentication"));
    }
}
