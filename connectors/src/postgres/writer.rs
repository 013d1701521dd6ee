//! The connection that writes rows: the table's plans, prepared statements, and transactions
//! that write rows in statements of `batch_rows`.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::{Array as _, RecordBatch, UInt32Array};
use arrow_cast::display::{ArrayFormatter, FormatOptions};
use arrow_schema::SchemaRef;
use postgres::{Client, Statement};
use riffle_dataflow::{DataflowError, DataflowResult};

use super::config::{PostgresSinkConfig, WriteMode};
use super::encode::encode;
use super::sql::TableName;
use super::table::{self, Plan, Table};
use super::{connect, describe_error};

/// Rows waiting to be written, with the plan of their schema.
pub(super) type Rows = Vec<(Arc<Plan>, RecordBatch)>;

/// A connection to the database and what it knows of the target table.
pub(super) struct Writer {
    config: PostgresSinkConfig,
    client: Client,
    name: TableName,
    table: Option<Table>,
    plans: Vec<Arc<Plan>>,
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
        let plan = table::plan(&table, schema, &self.config.key.0, self.config.mode);
        self.table = Some(table);
        let plan = Arc::new(plan.map_err(|e| self.config.config_error(e))?);
        self.plans.push(Arc::clone(&plan));
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
            statements,
            ..
        } = self;
        let inner = client.transaction().map_err(|e| {
            config.sink_error(format!("beginning a transaction: {}", describe_error(&e)))
        })?;
        let mut tx = Tx {
            config,
            inner,
            statements,
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
    statements: &'a mut HashMap<String, Statement>,
}

impl Tx<'_> {
    /// Writes `rows` in statements of at most `batch_rows` rows.
    pub fn write(&mut self, rows: &Rows) -> DataflowResult<u64> {
        let mut written = 0;
        for (plan, batch) in rows {
            let mut offset = 0;
            while offset < batch.num_rows() {
                let len = self.config.batch_rows.min(batch.num_rows() - offset);
                written += self.write_chunk(plan, &batch.slice(offset, len))?;
                offset += len;
            }
        }
        Ok(written)
    }

    fn write_chunk(&mut self, plan: &Plan, chunk: &RecordBatch) -> DataflowResult<u64> {
        let folded;
        let chunk = if plan.mode == WriteMode::Upsert {
            folded = last_of_each_key(chunk, &plan.key).map_err(|e| self.config.sink_error(e))?;
            folded.as_ref().unwrap_or(chunk)
        } else {
            chunk
        };
        let mut params = Vec::with_capacity(plan.types.len());
        for ((column, sql), field) in chunk
            .columns()
            .iter()
            .zip(&plan.types)
            .zip(chunk.schema().fields())
        {
            params.push(encode(column, *sql).map_err(|e| {
                self.config
                    .sink_error(format!("column `{}`: {e}", field.name()))
            })?);
        }
        let refs: Vec<_> = params.iter().map(|p| p.as_sql()).collect();
        let statement = match self.statements.get(&plan.sql) {
            Some(s) => s.clone(),
            None => {
                let s = self.inner.prepare(&plan.sql).map_err(|e| {
                    self.config
                        .sink_error(format!("preparing the INSERT: {}", describe_error(&e)))
                })?;
                self.statements.insert(plan.sql.clone(), s.clone());
                s
            }
        };
        self.inner.execute(&statement, &refs).map_err(|e| {
            self.config.sink_error(format!(
                "writing {} row(s): {}",
                chunk.num_rows(),
                describe_error(&e)
            ))
        })
    }
}

/// `chunk` without the rows whose key comes again later in it (`None`: no key repeats): one
/// upsert statement may not touch a row twice, and the later row is the one to keep.
fn last_of_each_key(chunk: &RecordBatch, key: &[usize]) -> Result<Option<RecordBatch>, String> {
    let options = FormatOptions::default();
    let mut formatters = Vec::with_capacity(key.len());
    for &k in key {
        let column = chunk
            .columns()
            .get(k)
            .ok_or_else(|| format!("key column {k} is missing from a batch"))?;
        formatters.push((
            column,
            ArrayFormatter::try_new(column.as_ref(), &options).map_err(|e| e.to_string())?,
        ));
    }
    let mut last: HashMap<String, u32> = HashMap::with_capacity(chunk.num_rows());
    for row in 0..chunk.num_rows() {
        let mut id = String::new();
        for (column, f) in &formatters {
            // Length-prefixed, so that ("a|b", "c") and ("a", "b|c") differ.
            if column.is_null(row) {
                id.push_str("-;");
            } else {
                let v = f.value(row).to_string();
                id.push_str(&format!("{}:{v};", v.len()));
            }
        }
        last.insert(id, row as u32);
    }
    if last.len() == chunk.num_rows() {
        return Ok(None);
    }
    let mut keep: Vec<u32> = last.into_values().collect();
    keep.sort_unstable();
    arrow_select::take::take_record_batch(chunk, &UInt32Array::from(keep))
        .map(Some)
        .map_err(|e| e.to_string())
}
