//! The connection that writes rows: the table's plans (and their staging tables), prepared
//! statements, and transactions that write rows with binary COPY.

use std::collections::HashMap;
use std::io::Write as _;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use postgres::error::SqlState;
use postgres::{Client, Statement};
use riffle_dataflow::{DataflowError, DataflowResult};

use super::config::PostgresSinkConfig;
use super::encode::{Columns, HEADER, TRAILER};
use super::sql::TableName;
use super::table::{self, Plan, Table};
use super::{connect, describe_error};

/// Bytes of COPY data encoded before they are sent: the server parses one message while
/// the next is encoded.
const MESSAGE_BYTES: usize = 256 * 1024;

/// Rows waiting to be written, with the plan of their schema.
pub(super) type Rows = Vec<(Arc<Plan>, RecordBatch)>;

/// A connection to the database and what it knows of the target table.
pub(super) struct Writer {
    config: PostgresSinkConfig,
    client: Client,
    name: TableName,
    table: Option<Table>,
    plans: Vec<Arc<Plan>>,
    /// Per plan (same index): how COPY straight into the table fared, when it has a key.
    attempts: Vec<Attempts>,
    statements: HashMap<String, Statement>,
}

impl Writer {
    /// Connects, and creates (when missing and allowed) and checks the table for `schema`
    /// now when given, else at the first batch.
    pub fn open(config: &PostgresSinkConfig, schema: Option<&SchemaRef>) -> DataflowResult<Self> {
        let client = connect(config)?;
        let mut writer = Writer {
            config: config.clone(),
            client,
            name: config.table_name()?,
            table: None,
            plans: Vec::new(),
            attempts: Vec::new(),
            statements: HashMap::new(),
        };
        writer.table = table::describe(&mut writer.client, &writer.name)
            .map_err(|e| writer.failed("reading the table's columns", &e))?;
        if let Some(schema) = schema {
            writer.plan(schema)?;
        }
        Ok(writer)
    }

    /// The plan for batches of `schema`, made once per schema: the table is created first when
    /// missing (and `create_table`), and must fit.
    pub fn plan(&mut self, schema: &SchemaRef) -> DataflowResult<Arc<Plan>> {
        if let Some(p) = self
            .plans
            .iter()
            .find(|p| Arc::ptr_eq(&p.schema, schema) || *p.schema == **schema)
        {
            return Ok(Arc::clone(p));
        }
        let table = match self.table.take() {
            Some(t) => t,
            None => self.create(schema)?,
        };
        // Unique in the session: one staging table per schema of batches.
        let stage = format!("riffle_stage_{}", self.plans.len() + 1);
        let plan = table::plan(&table, schema, &self.config.key.0, self.config.mode, &stage);
        self.table = Some(table);
        let plan = Arc::new(plan.map_err(|e| self.config.config_error(e))?);
        if let Some(staged) = &plan.staged {
            // Outside any transaction, so that it lasts as long as the connection.
            self.client
                .batch_execute(&staged.create)
                .map_err(|e| self.failed("creating the staging table", &e))?;
        }
        self.plans.push(Arc::clone(&plan));
        self.attempts.push(Attempts::default());
        Ok(plan)
    }

    fn create(&mut self, schema: &SchemaRef) -> DataflowResult<Table> {
        if !self.config.create_table {
            return Err(self.config.config_error(format!(
                "table `{}` does not exist (and `create_table` is false)",
                self.name
            )));
        }
        table::create(&mut self.client, &self.name, schema, &self.config.key.0)
            .map_err(|e| self.failed("creating the table", &e))?
            .map_err(|e| self.config.config_error(e))?;
        tracing::info!(table = %self.name, "postgres sink: created the table");
        table::describe(&mut self.client, &self.name)
            .map_err(|e| self.failed("reading the created table", &e))?
            .ok_or_else(|| {
                self.config.config_error(format!(
                    "table `{}` is missing after creating it",
                    self.name
                ))
            })
    }

    /// Runs `work` in one transaction, committed when it succeeds (rolled back otherwise).
    pub fn transaction(
        &mut self,
        work: impl FnOnce(&mut Tx<'_>) -> DataflowResult<()>,
    ) -> DataflowResult<()> {
        let Writer {
            config,
            client,
            plans,
            attempts,
            statements,
            ..
        } = self;
        let inner = client.transaction().map_err(|e| {
            config.sink_error(format!("beginning a transaction: {}", describe_error(&e)))
        })?;
        let mut tx = Tx {
            config,
            inner,
            plans,
            attempts,
            statements,
            staged: Vec::new(),
        };
        work(&mut tx)?;
        tx.inner
            .commit()
            .map_err(|e| config.sink_error(format!("committing: {}", describe_error(&e))))
    }

    /// Runs catalog or bookkeeping statements on the connection.
    pub fn with_client<T>(
        &mut self,
        work: impl FnOnce(&mut Client) -> Result<T, postgres::Error>,
    ) -> Result<T, postgres::Error> {
        work(&mut self.client)
    }

    pub fn sink_error(&self, message: impl std::fmt::Display) -> DataflowError {
        self.config.sink_error(message)
    }

    fn failed(&self, what: &str, e: &postgres::Error) -> DataflowError {
        self.config
            .config_error(format!("{what}: {}", describe_error(e)))
    }
}

/// An open transaction of a [`Writer`].
pub(super) struct Tx<'a> {
    pub config: &'a PostgresSinkConfig,
    pub inner: postgres::Transaction<'a>,
    plans: &'a [Arc<Plan>],
    attempts: &'a mut [Attempts],
    statements: &'a mut HashMap<String, Statement>,
    /// The plans whose staging table holds rows of this transaction.
    staged: Vec<usize>,
}

impl Tx<'_> {
    /// Writes `rows`, in order: each run of batches of one schema with one COPY (and, when
    /// staged, one INSERT).
    pub fn write(&mut self, rows: &Rows) -> DataflowResult<u64> {
        let mut written = 0;
        let mut rest = rows.as_slice();
        while let Some((plan, _)) = rest.first() {
            let run = rest
                .iter()
                .take_while(|(p, _)| Arc::ptr_eq(p, plan))
                .count();
            let (now, later) = rest.split_at(run);
            written += self.write_run(plan, now)?;
            rest = later;
        }
        Ok(written)
    }

    fn write_run(
        &mut self,
        plan: &Arc<Plan>,
        run: &[(Arc<Plan>, RecordBatch)],
    ) -> DataflowResult<u64> {
        let count: usize = run.iter().map(|(_, b)| b.num_rows()).sum();
        let failed = |config: &PostgresSinkConfig, e: Failure| match e {
            Failure::Encode(e) => config.sink_error(e),
            Failure::Server(e) => {
                config.sink_error(format!("writing {count} row(s): {}", describe_error(&e)))
            }
            Failure::Sending(e) => config.sink_error(format!("writing {count} row(s): {e}")),
        };
        let Some((index, attempts)) = self
            .plans
            .iter()
            .position(|p| Arc::ptr_eq(p, plan))
            .and_then(|i| Some((i, self.attempts.get_mut(i)?)))
        else {
            return Err(self
                .config
                .sink_error("rows of a plan this connection did not make"));
        };
        let batch_rows = self.config.batch_rows;
        if let Some(copy) = &plan.copy {
            let Some(_) = &plan.staged else {
                return copy_rows(&mut self.inner, copy, plan, run, batch_rows)
                    .map_err(|e| failed(self.config, e));
            };
            if attempts.ready() {
                // A key already present fails the COPY: undone, the rows are staged instead.
                let mut savepoint = self
                    .inner
                    .savepoint("riffle_copy")
                    .map_err(|e| failed(self.config, Failure::Server(e)))?;
                match copy_rows(&mut savepoint, copy, plan, run, batch_rows) {
                    Ok(n) => {
                        savepoint
                            .commit()
                            .map_err(|e| failed(self.config, Failure::Server(e)))?;
                        attempts.hit();
                        return Ok(n);
                    }
                    Err(Failure::Server(e)) if e.code() == Some(&SqlState::UNIQUE_VIOLATION) => {
                        savepoint
                            .rollback()
                            .map_err(|e| failed(self.config, Failure::Server(e)))?;
                        attempts.miss();
                    }
                    Err(e) => return Err(failed(self.config, e)),
                }
            }
        }
        let staged = plan.staged.as_ref().ok_or_else(|| {
            self.config
                .sink_error("a plan with neither COPY nor staging")
        })?;
        if self.staged.contains(&index) {
            self.inner
                .batch_execute(&staged.empty)
                .map_err(|e| failed(self.config, Failure::Server(e)))?;
        }
        copy_rows(&mut self.inner, &staged.copy, plan, run, batch_rows)
            .map_err(|e| failed(self.config, e))?;
        self.staged.push(index);
        let statement = match self.statements.get(&staged.insert) {
            Some(s) => s.clone(),
            None => {
                let s = self.inner.prepare(&staged.insert).map_err(|e| {
                    self.config
                        .sink_error(format!("preparing the INSERT: {}", describe_error(&e)))
                })?;
                self.statements.insert(staged.insert.clone(), s.clone());
                s
            }
        };
        self.inner
            .execute(&statement, &[])
            .map_err(|e| failed(self.config, Failure::Server(e)))
    }
}

/// Why writing rows failed.
enum Failure {
    /// A value the binary form cannot hold; the message names the column.
    Encode(String),
    /// The server's error (a key already present, a constraint, a value out of range…).
    Server(postgres::Error),
    /// The connection failed while sending.
    Sending(std::io::Error),
}

/// The rows of `run` in one binary `COPY … FROM STDIN` (`sql`), sent in messages of at most
/// `batch_rows` rows (and about [`MESSAGE_BYTES`]); the number of rows copied.
fn copy_rows(
    tx: &mut postgres::Transaction<'_>,
    sql: &str,
    plan: &Plan,
    run: &[(Arc<Plan>, RecordBatch)],
    batch_rows: usize,
) -> Result<u64, Failure> {
    let mut writer = tx.copy_in(sql).map_err(Failure::Server)?;
    let mut message = Vec::with_capacity(MESSAGE_BYTES + MESSAGE_BYTES / 4);
    message.extend_from_slice(HEADER);
    let mut rows_in_message = 0;
    for (_, batch) in run {
        let columns = Columns::new(batch, &plan.wires, &plan.types).map_err(Failure::Encode)?;
        let mut rows = columns.rows().map_err(Failure::Encode)?;
        for row in 0..batch.num_rows() {
            rows.write(row, &mut message).map_err(Failure::Encode)?;
            rows_in_message += 1;
            if message.len() >= MESSAGE_BYTES || rows_in_message >= batch_rows {
                writer.write_all(&message).map_err(sending)?;
                message.clear();
                rows_in_message = 0;
            }
        }
    }
    message.extend_from_slice(TRAILER);
    writer.write_all(&message).map_err(sending)?;
    // The server's own error (not a failed write) when COPY ended with one.
    writer.finish().map_err(Failure::Server)
}

/// A failed write: the client's error within, when it is one (so that a key already present
/// is recognised however it surfaces).
fn sending(e: std::io::Error) -> Failure {
    if !e
        .get_ref()
        .is_some_and(|inner| inner.is::<postgres::Error>())
    {
        return Failure::Sending(e);
    }
    match e
        .into_inner()
        .map(|inner| inner.downcast::<postgres::Error>())
    {
        Some(Ok(client)) => Failure::Server(*client),
        _ => Failure::Sending(std::io::Error::other("sending COPY data failed")),
    }
}

/// When to try COPY straight into a keyed table again after a key already present made it
/// fail: after 1, 3, 7 … 63 writes through the staging table, so that a stream that keeps
/// repeating keys rarely pays for a COPY that fails.
#[derive(Debug, Default)]
struct Attempts {
    misses: u32,
    skip: u32,
}

impl Attempts {
    fn ready(&mut self) -> bool {
        if self.skip == 0 {
            return true;
        }
        self.skip -= 1;
        false
    }

    fn hit(&mut self) {
        self.misses = 0;
    }

    fn miss(&mut self) {
        self.misses = (self.misses + 1).min(6);
        self.skip = (1 << self.misses) - 1;
    }
}

#[cfg(test)]
mod tests;
