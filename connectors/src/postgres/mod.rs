//! PostgreSQL sink: results as rows of a table (`sink: { postgres: { url, table, … } }`),
//! through the synchronous `postgres` client.
//!
//! - `config`: the keys, the password kept out of every message ([`redact_url`]).
//! - `types` and `encode`: Arrow types → SQL types, and columns → array parameters.
//! - `sql`: quoting, `CREATE TABLE`, and the INSERT that takes one array per column
//!   (`INSERT … SELECT … FROM UNNEST($1::int8[], …)`, `ON CONFLICT` for a key).
//! - `table`: the catalog's view of the table, the check that the results fit it, the plan.
//! - `writer`: the connection that writes; `sink`: what the runtime writes batches to;
//!   `commit`: exactly-once output, one transaction per checkpoint with the sink's row of
//!   `riffle_sink_positions`.
//!
//! Building the factory connects: a wrong address or password fails the run before it starts
//! (naming authentication), and so does an existing table the results do not fit.

mod commit;
mod config;
mod encode;
mod sink;
mod sql;
mod table;
mod types;
mod writer;

use std::sync::{Arc, Mutex};

use arrow_schema::SchemaRef;
use postgres::error::SqlState;
use postgres::{Client, NoTls};
use riffle_dataflow::sink::{Committer, Recovery, Sink, SinkFactory};
use riffle_dataflow::DataflowResult;

use commit::{lock, PositionCommitter, Shared};
pub use config::{
    redact_url, KeyColumns, PostgresSinkConfig, TlsConfig, WriteMode, DEFAULT_POSITIONS_TABLE,
};
pub use sink::PostgresSink;
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
                table::plan(&t, s, &config.key.0, config.mode)
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

/// A connection with the configured timeout, in UTC (timestamps into `timestamp` columns),
/// without notices (`CREATE TABLE IF NOT EXISTS` would log one at every start).
pub(crate) fn connect(config: &PostgresSinkConfig) -> DataflowResult<Client> {
    let mut pg: postgres::Config = config.url.parse().map_err(|e: postgres::Error| {
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
    let mut client = pg
        .connect(NoTls)
        .map_err(|e| config.config_error(connect_failure(&e)))?;
    client
        .batch_execute("SET TimeZone = 'UTC'; SET client_min_messages = warning")
        .map_err(|e| config.config_error(describe_error(&e)))?;
    Ok(client)
}

/// Why connecting failed, saying so plainly when it is the credentials.
fn connect_failure(e: &postgres::Error) -> String {
    let credentials = matches!(
        e.code(),
        Some(c) if *c == SqlState::INVALID_PASSWORD
            || *c == SqlState::INVALID_AUTHORIZATION_SPECIFICATION
    );
    if credentials {
        format!(
            "authentication failed: {} (check the user and password in `url`)",
            describe_error(e)
        )
    } else {
        format!("cannot connect: {}", describe_error(e))
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
