//! PostgreSQL sink: results as rows of a table (`sink: { postgres: { url, table, … } }`),
//! through the synchronous `postgres` client.
//!
//! - `config`: the keys, the password kept out of every message ([`redact_url`]).
//! - `tls` and `connector`: `sslmode` and `tls:` settled into a mode and what it trusts, and
//!   the rustls handshake that checks it.
//! - `types`, `encode` and `json`: Arrow types → SQL types, and batches → PostgreSQL's binary
//!   COPY format, written straight from the arrays (lists and structs as jsonb).
//! - `sql`: quoting, `CREATE TABLE`, `COPY … FROM STDIN BINARY`, and the staging table with
//!   its `INSERT … SELECT … ON CONFLICT` for a key (and for values PostgreSQL casts).
//! - `table`: the catalog's view of the table, the check that the results fit it, the plan.
//! - `writer`: the connection that writes; `sink`: what the runtime writes batches to;
//!   `commit`: exactly-once output, one transaction per checkpoint with the sink's row of
//!   `riffle_sink_positions`.
//!
//! Building the factory connects: a wrong address or password fails the run before it starts
//! (naming authentication), and so does an existing table the results do not fit.

mod commit;
mod config;
mod connector;
mod encode;
mod json;
mod sink;
mod sql;
mod table;
mod tls;
mod types;
mod writer;

use std::sync::{Arc, Mutex};

use arrow_schema::SchemaRef;
use postgres::config::SslMode as ClientSslMode;
use postgres::error::SqlState;
use postgres::{Client, NoTls};
use riffle_dataflow::sink::{Committer, Recovery, Sink, SinkFactory};
use riffle_dataflow::DataflowResult;

use commit::{lock, PositionCommitter, Shared};
pub use config::{redact_url, KeyColumns, PostgresSinkConfig, WriteMode, DEFAULT_POSITIONS_TABLE};
pub use sink::PostgresSink;
pub use tls::{SslMode, TlsConfig};
use writer::Writer;

/// A configured PostgreSQL sink.
pub struct PostgresSinkFactory {
    config: PostgresSinkConfig,
    /// The results' schema, when validation saw it: the table is checked (and created) for it
    /// before the first row.
    schema: Option<SchemaRef>,
    /// A run with checkpoints: set by `recover`, shared by the sink and the committer (the
    /// leader's; `None` in other processes, which never open the sink).
    shared: Mutex<Option<Arc<Mutex<Shared>>>>,
    recovered: Mutex<bool>,
}

impl std::fmt::Debug for PostgresSinkFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresSinkFactory")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl PostgresSinkFactory {
    /// Checks the configuration, connects (so a wrong address or password fails here), and
    /// checks an existing table against the results.
    pub fn new(config: &PostgresSinkConfig) -> DataflowResult<Self> {
        config.check()?;
        let schema = config.input.get();
        let mut client = connect(config)?;
        let name = config.table_name()?;
        let found = table::describe(&mut client, &name).map_err(|e| {
            config.config_error(format!("reading table `{name}`: {}", describe_error(&e)))
        })?;
        match (found, &schema) {
            (Some(t), Some(s)) => {
                table::plan(&t, s, &config.key.0, config.mode, "riffle_stage")
                    .map_err(|e| config.config_error(e))?;
            }
            (None, _) if !config.create_table => {
                return Err(config
                    .config_error(format!(
                        "table `{name}` does not exist (and `create_table` is false)"
                    ))
                    .at("table"))
            }
            _ => {}
        }
        Ok(PostgresSinkFactory {
            config: config.clone(),
            schema,
            shared: Mutex::new(None),
            recovered: Mutex::new(false),
        })
    }

    fn open_with(&self, rows: u64) -> DataflowResult<Box<dyn Sink>> {
        if let Some(shared) = lock(&self.shared).clone() {
            return Ok(Box::new(PostgresSink::buffered(shared, rows)));
        }
        if *lock(&self.recovered) {
            return Err(self
                .config
                .config_error("the sink opened in a process that did not recover it"));
        }
        // Results get their table now; dead letters only once there is one.
        let eager = self.schema.as_ref().filter(|_| self.config.results);
        let writer = Writer::open(&self.config, eager)?;
        Ok(Box::new(PostgresSink::direct(writer, rows)))
    }
}

impl SinkFactory for PostgresSinkFactory {
    fn open(&self) -> DataflowResult<Box<dyn Sink>> {
        self.open_with(0)
    }

    fn open_at(&self, position: u64) -> DataflowResult<Box<dyn Sink>> {
        self.open_with(position)
    }

    fn committer(&self) -> DataflowResult<Option<Box<dyn Committer>>> {
        Ok(lock(&self.shared)
            .clone()
            .map(|shared| Box::new(PositionCommitter { shared }) as Box<dyn Committer>))
    }

    fn recover(&self, leader: bool) -> DataflowResult<Recovery> {
        *lock(&self.recovered) = true;
        if !leader {
            return commit::recover_follower(&self.config);
        }
        let (recovery, shared) = commit::recover_leader(&self.config, self.schema.as_ref())?;
        *lock(&self.shared) = Some(shared);
        Ok(recovery)
    }
}

/// A connection with the configured timeout and TLS, in UTC (timestamps into `timestamp`
/// columns), without notices (`CREATE TABLE IF NOT EXISTS` would log one at every start).
pub(crate) fn connect(config: &PostgresSinkConfig) -> DataflowResult<Client> {
    let settled = config.settle_tls()?;
    let mut pg: postgres::Config = settled.url.parse().map_err(|e: postgres::Error| {
        config
            .config_error(format!(
                "`url` is not a PostgreSQL connection string: {}",
                describe_error(&e)
            ))
            .at("url")
    })?;
    if pg.get_connect_timeout().is_none() {
        pg.connect_timeout(config.connect_timeout());
    }
    if pg.get_application_name().is_none() {
        pg.application_name("riffle");
    }
    // The client knows three modes; the checks of verify-ca and verify-full are the
    // connector's.
    pg.ssl_mode(match settled.mode {
        SslMode::Disable => ClientSslMode::Disable,
        SslMode::Prefer => ClientSslMode::Prefer,
        SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => ClientSslMode::Require,
    });
    let connected = match settled.connector {
        Some(tls) => pg.connect(tls),
        None => pg.connect(NoTls),
    };
    let mut client =
        connected.map_err(|e| config.config_error(connect_failure(&e, settled.mode)))?;
    client
        .batch_execute("SET TimeZone = 'UTC'; SET client_min_messages = warning")
        .map_err(|e| config.config_error(describe_error(&e)))?;
    Ok(client)
}

/// Why connecting failed, saying so plainly when it is the credentials or a server without
/// TLS.
fn connect_failure(e: &postgres::Error, mode: SslMode) -> String {
    let credentials = matches!(
        e.code(),
        Some(c) if *c == SqlState::INVALID_PASSWORD
            || *c == SqlState::INVALID_AUTHORIZATION_SPECIFICATION
    );
    let text = describe_error(e);
    if credentials && text.contains("no encryption") {
        format!(
            "the server refuses this user without TLS: {text} (ask for it with \
             `sslmode=verify-full` in `url`, or `tls:`)"
        )
    } else if credentials {
        format!("authentication failed: {text} (check the user and password in `url`)")
    } else if text.contains("server does not support TLS") {
        format!(
            "the server does not accept TLS connections, and sslmode {} needs one: turn `ssl` \
             on in the server's configuration, or ask for `sslmode=prefer` ({text})",
            mode.name()
        )
    } else {
        format!("cannot connect: {text}")
    }
}

/// The whole error: the server's message with its SQLSTATE, or the client's error and causes
/// (the `postgres` crate's own message is only its kind: "db error").
pub(crate) fn describe_error(e: &postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        let mut text = format!(
            "{}: {} (SQLSTATE {})",
            db.severity(),
            db.message(),
            db.code().code()
        );
        if let Some(detail) = db.detail() {
            text.push_str(&format!("; {detail}"));
        }
        if let Some(hint) = db.hint() {
            text.push_str(&format!("; hint: {hint}"));
        }
        return text;
    }
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpListener;

    use super::*;

    /// A server that answers the client's TLS request with `N` (no TLS), and returns what
    /// the client sent next (a plain startup message, or nothing).
    fn plain_only_server() -> (u16, std::thread::JoinHandle<Vec<u8>>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let (mut socket, _) = listener.accept().unwrap();
            let mut request = [0u8; 8];
            socket.read_exact(&mut request).unwrap();
            // SSLRequest: length 8, code 80877103.
            assert_eq!(request, [0, 0, 0, 8, 4, 210, 22, 47], "a TLS request first");
            socket.write_all(b"N").unwrap();
            let mut next = [0u8; 8];
            let n = socket.read(&mut next).unwrap_or(0);
            next[..n].to_vec()
        });
        (port, server)
    }

    fn config(url: String) -> PostgresSinkConfig {
        serde_json::from_value(serde_json::json!({"url": url, "table": "t"})).unwrap()
    }

    #[test]
    fn require_fails_clearly_against_a_server_without_tls_and_prefer_goes_plain() {
        let (port, server) = plain_only_server();
        let e = connect(&config(format!(
            "postgres://u:secret@127.0.0.1:{port}/d?sslmode=require"
        )))
        .err()
        .unwrap()
        .to_string();
        assert!(
            e.contains("does not accept TLS") && e.contains("sslmode require"),
            "{e}"
        );
        assert!(!e.contains("secret"), "{e}");
        assert!(server.join().unwrap().is_empty(), "nothing sent in plain");

        let (port, server) = plain_only_server();
        let e = connect(&config(format!(
            "host=127.0.0.1 port={port} user=u dbname=d sslmode=prefer connect_timeout=5"
        )));
        assert!(e.is_err(), "the fake server never answers the startup");
        let next = server.join().unwrap();
        assert_eq!(
            next.get(4..8),
            Some(&[0u8, 3, 0, 0][..]),
            "prefer sent a plain startup message (protocol 3.0): {next:?}"
        );
    }
}
