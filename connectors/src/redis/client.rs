//! One connection to the server, opened with its credentials checked, and the atomic write of
//! a set of keys: one `MULTI`/`EXEC`, sent as one pipeline.

use ::redis::{ConnectionLike, ErrorKind, RedisError, Value};
use riffle_dataflow::{DataflowError, DataflowResult};

use super::config::RedisSinkConfig;
use super::render::{push_len, push_u64};
use super::writes::{Write, Writes};

/// A connection and the configuration it was opened with (for messages and reconnecting).
pub(super) struct Connection {
    con: ::redis::Connection,
    config: RedisSinkConfig,
    /// The last commit's commands, encoded: the room is reused by the next.
    packed: Vec<u8>,
}

/// A buffer grown past this by a large commit is let go rather than kept for the next.
const KEEP_PACKED: usize = 64 << 20;

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
            packed: Vec::new(),
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
        writes: &Writes,
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
        let commands = pack(&mut self.packed, writes, ttl_s, position);
        // What `redis::Pipeline` sends for an atomic pipeline (`MULTI`, the commands, `EXEC`),
        // encoded here into one buffer kept between commits instead of a `Cmd` per key:
        // skip the `+OK` of `MULTI` and a `+QUEUED` per command, then read `EXEC`'s answer.
        let sent = self.con.req_packed_commands(&self.packed, commands + 1, 1);
        if self.packed.capacity() > KEEP_PACKED {
            self.packed = Vec::new();
        }
        let what = || format!("writing {} key(s)", writes.len());
        let reply = sent
            .and_then(|mut replies| match replies.pop() {
                Some(reply) => reply.extract_error(),
                None => Err(RedisError::from((
                    ErrorKind::UnexpectedReturnType,
                    "no answer to EXEC",
                ))),
            })
            .map_err(|e| self.error(&what(), &e))?;
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

/// Encodes `MULTI`, a `SET` (with `EX`) or `DEL` per key, the position's `SET` and `EXEC`
/// into `out` in Redis's protocol (RESP: `*<args>\r\n` then `$<len>\r\n<bytes>\r\n` per
/// argument), as `redis::Pipeline` would; returns the number of commands between `MULTI` and
/// `EXEC`.
fn pack(
    out: &mut Vec<u8>,
    writes: &Writes,
    ttl_s: Option<u64>,
    position: Option<&PositionUpdate<'_>>,
) -> usize {
    let mut ttl = Vec::new();
    if let Some(t) = ttl_s {
        push_u64(&mut ttl, t);
    }
    out.clear();
    // Keys, values and about 40 bytes of framing per command.
    out.reserve(writes.bytes() + writes.len() * (48 + ttl.len()) + 64);
    command(out, &[b"MULTI"]);
    for (key, write) in writes.iter() {
        match (write, ttl_s) {
            (Write::Set(value), Some(_)) => command(out, &[b"SET", key, value, b"EX", &ttl]),
            (Write::Set(value), None) => command(out, &[b"SET", key, value]),
            (Write::Delete, _) => command(out, &[b"DEL", key]),
        }
    }
    let mut commands = writes.len();
    if let Some(p) = position {
        command(out, &[b"SET", p.key.as_bytes(), p.new.as_bytes()]);
        commands += 1;
    }
    command(out, &[b"EXEC"]);
    commands
}

fn command(out: &mut Vec<u8>, args: &[&[u8]]) {
    out.push(b'*');
    push_len(out, args.len());
    out.extend_from_slice(b"\r\n");
    for arg in args {
        out.push(b'$');
        push_len(out, arg.len());
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
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
    fn a_commit_is_encoded_as_redis_pipeline_encodes_it() {
        let mut rendered = super::super::render::Rendered::default();
        rendered.push_row(Some(b"k:1"), Some(br#"{"a":"x\r\ny"}"#));
        rendered.push_row(Some(b"k:2"), None);
        rendered.push_row(Some(b"k:3"), Some(b""));
        let mut writes = Writes::default();
        writes.add(&mut rendered);
        let position = PositionUpdate {
            key: "riffle:p",
            expected: None,
            new: "1733 42",
        };
        for ttl in [None, Some(315_360_000)] {
            let mut pipe = ::redis::pipe();
            pipe.atomic();
            for (key, value) in [
                ("k:1", &br#"{"a":"x\r\ny"}"#[..]),
                ("k:2", b""),
                ("k:3", b""),
            ] {
                match (key, ttl) {
                    ("k:2", _) => pipe.cmd("DEL").arg(key),
                    (_, Some(t)) => pipe.cmd("SET").arg(key).arg(value).arg("EX").arg(t),
                    (_, None) => pipe.cmd("SET").arg(key).arg(value),
                };
            }
            pipe.cmd("SET").arg("riffle:p").arg("1733 42");
            let mut out = vec![b'x'; 3];
            let commands = pack(&mut out, &writes, ttl, Some(&position));
            assert_eq!(commands, 4);
            assert_eq!(
                String::from_utf8_lossy(&out),
                String::from_utf8_lossy(&pipe.get_packed_pipeline())
            );
        }
        let mut out = Vec::new();
        assert_eq!(pack(&mut out, &Writes::default(), None, None), 0);
        assert_eq!(out, b"*1\r\n$5\r\nMULTI\r\n*1\r\n$4\r\nEXEC\r\n");
    }

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
