//! Exactly-once output: one PostgreSQL transaction per checkpoint.
//!
//! With checkpoints the sink only buffers rows, per epoch ([`Shared`]). When a checkpoint is
//! due the runtime seals the buffer at the newest epoch the sink has written, writes the
//! checkpoint, then commits: one transaction writes every buffered row of the sealed epochs
//! and this sink's row of the positions table (`riffle_sink_positions`: sink id, generation,
//! epoch), then COMMITs. Rows and position land together or not at all, so after a crash
//! `recover` reads the position row and the run resumes from exactly that checkpoint: nothing
//! is lost, nothing repeated. Memory holds the rows of one checkpoint interval.
//!
//! Every commit first locks the position row, and checks that it still names this run
//! (`owner`, claimed by `recover`): a restarted run waits there for a transaction a killed one
//! left in flight, and a stale run that wakes up after a restart is refused instead of writing
//! twice.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use arrow_array::RecordBatch;
use postgres::error::SqlState;
use postgres::GenericClient;
use riffle_dataflow::sink::{Committer, Recovery};
use riffle_dataflow::{DataflowResult, Epoch};

use super::config::PostgresSinkConfig;
use super::describe_error;
use super::sql::TableName;
use super::writer::{Rows, Writer};

/// How long `recover` waits for the position row while another transaction holds it.
const LOCK_TIMEOUT: &str = "60s";

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The positions table and this sink's row in it.
#[derive(Clone, Debug)]
pub(super) struct Position {
    pub table: TableName,
    pub sink_id: String,
}

impl Position {
    pub fn of(config: &PostgresSinkConfig) -> DataflowResult<Position> {
        Ok(Position {
            table: config.positions_name()?,
            sink_id: config.sink_id(),
        })
    }

    fn create_sql(&self) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS {} (sink_id text PRIMARY KEY, generation bigint, \
             epoch bigint, owner bigint, updated_at timestamptz NOT NULL DEFAULT now())",
            self.table.quoted()
        )
    }

    /// The last commit, waiting for any transaction in flight on the row; `claim`: also makes
    /// the row name `owner` (the leader), so older runs' commits are refused from now on.
    fn read(
        &self,
        client: &mut impl GenericClient,
        claim: Option<i64>,
    ) -> Result<Option<(u64, Epoch)>, postgres::Error> {
        let mut tx = client.transaction()?;
        tx.batch_execute(&format!("SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"))?;
        let t = self.table.quoted();
        if claim.is_some() {
            tx.execute(
                &format!("INSERT INTO {t} (sink_id) VALUES ($1) ON CONFLICT (sink_id) DO NOTHING"),
                &[&self.sink_id],
            )?;
        }
        let row = tx.query_opt(
            &format!("SELECT generation, epoch FROM {t} WHERE sink_id = $1 FOR UPDATE"),
            &[&self.sink_id],
        )?;
        if let Some(owner) = claim {
            tx.execute(
                &format!("UPDATE {t} SET owner = $2 WHERE sink_id = $1"),
                &[&self.sink_id, &owner],
            )?;
        }
        tx.commit()?;
        Ok(row.and_then(|r| {
            let generation: Option<i64> = r.get(0);
            let epoch: Option<i64> = r.get(1);
            Some((
                u64::try_from(generation?).ok()?,
                u64::try_from(epoch?).ok()?,
            ))
        }))
    }
}

/// What the sink and the committer share: the connection and the rows of each epoch not yet
/// committed.
pub(super) struct Shared {
    writer: Writer,
    position: Position,
    /// This run's claim on the position row.
    owner: i64,
    epochs: BTreeMap<Epoch, Rows>,
    /// The epoch the sink is writing.
    epoch: Epoch,
    sealed: Option<Epoch>,
}

impl Shared {
    pub fn begin_epoch(&mut self, epoch: Epoch) {
        self.epoch = epoch;
    }

    pub fn buffer(&mut self, batch: &RecordBatch) -> DataflowResult<()> {
        let plan = self.writer.plan(&batch.schema())?;
        self.epochs
            .entry(self.epoch)
            .or_default()
            .push((plan, batch.clone()));
        Ok(())
    }

    /// One transaction: the rows of every epoch up to the seal (or `through`) and the
    /// position row.
    fn commit(&mut self, generation: u64, through: Epoch) -> DataflowResult<()> {
        let limit = self.sealed.map_or(through, |cut| cut.max(through));
        let later = match limit.checked_add(1) {
            Some(next) => self.epochs.split_off(&next),
            None => BTreeMap::new(),
        };
        let rows: Rows = std::mem::replace(&mut self.epochs, later)
            .into_values()
            .flatten()
            .collect();
        self.sealed = None;
        let position = self.position.clone();
        let owner = self.owner;
        let (g, e) = match (i64::try_from(generation), i64::try_from(through)) {
            (Ok(g), Ok(e)) => (g, e),
            _ => {
                return Err(self.writer.sink_error(format!(
                    "generation {generation} or epoch {through} does not fit a bigint"
                )))
            }
        };
        self.writer.transaction(|tx| {
            let t = position.table.quoted();
            let row = tx
                .inner
                .query_opt(
                    &format!("SELECT owner FROM {t} WHERE sink_id = $1 FOR UPDATE"),
                    &[&position.sink_id],
                )
                .map_err(|e| {
                    tx.config
                        .sink_error(format!("locking the position row: {}", describe_error(&e)))
                })?;
            let current: Option<i64> = row.and_then(|r| r.get(0));
            if current != Some(owner) {
                return Err(tx.config.sink_error(format!(
                    "another run of this pipeline took over `{}` in {} (is a second run writing \
                     to this table?): this run stops without committing",
                    position.sink_id, position.table
                )));
            }
            tx.write(&rows)?;
            tx.inner
                .execute(
                    &format!(
                        "UPDATE {t} SET generation = $2, epoch = $3, updated_at = now() \
                         WHERE sink_id = $1"
                    ),
                    &[&position.sink_id, &g, &e],
                )
                .map_err(|e| {
                    tx.config
                        .sink_error(format!("recording the position: {}", describe_error(&e)))
                })?;
            Ok(())
        })
    }
}

/// The leader's recovery: creates the positions table, waits for any transaction in flight on
/// the sink's row, claims it for this run, and opens the connection rows are written on.
pub(super) fn recover_leader(
    config: &PostgresSinkConfig,
    schema: Option<&arrow_schema::SchemaRef>,
) -> DataflowResult<(Recovery, Arc<Mutex<Shared>>)> {
    let position = Position::of(config)?;
    let mut writer = Writer::open(config, schema)?;
    let owner = owner_token();
    let last = writer
        .with_client(|client| {
            client.batch_execute(&position.create_sql())?;
            position.read(client, Some(owner))
        })
        .map_err(|e| position_error(config, &position, &e))?;
    log_last(&position, last);
    let shared = Shared {
        writer,
        position,
        owner,
        epochs: BTreeMap::new(),
        epoch: 0,
        sealed: None,
    };
    Ok((Recovery::Committed(last), Arc::new(Mutex::new(shared))))
}

/// Another process's recovery: reads the last commit (after any transaction in flight).
pub(super) fn recover_follower(config: &PostgresSinkConfig) -> DataflowResult<Recovery> {
    let position = Position::of(config)?;
    let mut client = super::connect(config)?;
    let last = match position.read(&mut client, None) {
        Ok(last) => last,
        // The leader has not created it yet: nothing was ever committed.
        Err(e) if e.code() == Some(&SqlState::UNDEFINED_TABLE) => None,
        Err(e) => return Err(position_error(config, &position, &e)),
    };
    log_last(&position, last);
    Ok(Recovery::Committed(last))
}

fn log_last(position: &Position, last: Option<(u64, Epoch)>) {
    tracing::info!(
        sink = %position.sink_id,
        "postgres sink: last committed checkpoint: {}",
        last.map_or("none".to_string(), |(g, e)| format!("epoch {e} of run {g}"))
    );
}

fn position_error(
    config: &PostgresSinkConfig,
    position: &Position,
    e: &postgres::Error,
) -> riffle_dataflow::DataflowError {
    let hint = if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) {
        format!(
            " (the row stayed locked for {LOCK_TIMEOUT}: is another run of this pipeline \
             committing?)"
        )
    } else {
        String::new()
    };
    config.config_error(format!(
        "reading `{}` in {}: {}{hint}",
        position.sink_id,
        position.table,
        describe_error(e)
    ))
}

/// A claim no other run makes: the time in nanoseconds, with the process id.
fn owner_token() -> i64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64);
    nanos ^ (i64::from(std::process::id()) << 44)
}

/// The committer side: seals, and commits the buffered rows with the position.
pub(super) struct PositionCommitter {
    pub shared: Arc<Mutex<Shared>>,
}

impl Committer for PositionCommitter {
    fn commit(&mut self, generation: u64, through: Epoch) -> DataflowResult<()> {
        lock(&self.shared).commit(generation, through)
    }

    /// A restarted run claimed the position row in `recover`: older runs' commits fail.
    fn fence(&mut self, _generation: u64) -> DataflowResult<()> {
        Ok(())
    }

    fn transactional(&self) -> bool {
        true
    }

    fn seal(&mut self, through: Epoch) -> bool {
        lock(&self.shared).sealed = Some(through);
        true
    }

    fn sealed(&self) -> Option<Epoch> {
        lock(&self.shared).sealed
    }

    /// The rows stay buffered for the next commit.
    fn release(&mut self) -> DataflowResult<()> {
        lock(&self.shared).sealed = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_tokens_differ_between_claims() {
        let a = owner_token();
        std::thread::sleep(std::time::Duration::from_millis(1));
        assert_ne!(a, owner_token());
    }

    #[test]
    fn the_positions_table_has_one_row_per_sink() {
        let p = Position {
            table: TableName::parse("s.riffle_sink_positions").unwrap(),
            sink_id: "clicks/events".into(),
        };
        let sql = p.create_sql();
        assert!(
            sql.starts_with("CREATE TABLE IF NOT EXISTS \"s\".\"riffle_sink_positions\""),
            "{sql}"
        );
        assert!(sql.contains("sink_id text PRIMARY KEY"), "{sql}");
    }
}
