//! PostgreSQL: Riffle's `postgres` sink (insert mode, key `id`) against the `postgres` crate's
//! binary COPY into a table of the same types and key, one COPY (its own transaction) per
//! epoch's rows, as the sink commits one transaction per flush.

use std::io::Read;
use std::time::{Duration, Instant, UNIX_EPOCH};

use anyhow::{Context, Result};
use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, Int64Type, TimestampMicrosecondType};
use arrow_array::RecordBatch;
use postgres::binary_copy::BinaryCopyInWriter;
use postgres::types::{Json, ToSql, Type};
use postgres::{Client, NoTls};
use serde_json::json;

use crate::data::{Digest, Hasher};
use crate::{riffle_run, Side, Target};

/// What the sink creates for the batches' schema (`docs/sinks/postgres.md`, Types).
const COLUMNS: &str = "\"id\" bigint NOT NULL, \"user_id\" bigint, \"item_id\" bigint, \
                       \"ts\" timestamptz, \"score\" real, \"recs\" jsonb, PRIMARY KEY (\"id\")";

pub const LABEL: &str = "postgres, insert mode (key `id`)";

pub struct Postgres {
    url: String,
    plain: PlainWrite,
}

/// How the plain client writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PlainWrite {
    /// Binary COPY, one per epoch's rows: what one would write for bulk loads.
    Copy,
    /// The sink's own statement form, by hand (to tell the statement's cost from the sink's):
    /// `INSERT … SELECT FROM UNNEST($1::int8[], …) ON CONFLICT (id) DO NOTHING` per batch,
    /// one transaction per epoch.
    Unnest,
}

impl Postgres {
    pub fn new(url: String, plain: PlainWrite) -> Postgres {
        Postgres { url, plain }
    }

    fn table(side: Side) -> String {
        format!("bench_sinks_{}", side.name())
    }

    fn client(&self) -> Result<Client> {
        let mut client =
            Client::connect(&self.url, NoTls).context("connecting to RIFFLE_PG_URL")?;
        client.batch_execute("SET TimeZone = 'UTC'")?;
        Ok(client)
    }
}

impl Target for Postgres {
    fn label(&self) -> String {
        match self.plain {
            PlainWrite::Copy => LABEL.into(),
            PlainWrite::Unnest => {
                "postgres, insert mode (key `id`); plain: INSERT … UNNEST, not COPY".into()
            }
        }
    }

    fn clean(&mut self) -> Result<()> {
        let mut client = self.client()?;
        for side in [Side::Riffle, Side::Plain] {
            let t = Postgres::table(side);
            client.batch_execute(&format!(
                "DROP TABLE IF EXISTS \"{t}\"; DROP TABLE IF EXISTS \"{t}_dead_letters\""
            ))?;
        }
        Ok(())
    }

    fn run(&mut self, side: Side, batches: &[RecordBatch], every: usize) -> Result<Duration> {
        let table = Postgres::table(side);
        match side {
            Side::Riffle => riffle_run(
                json!({"postgres": {"url": self.url, "table": table, "key": ["id"], "mode": "insert"}}),
                batches,
                every,
            ),
            Side::Plain => {
                let start = Instant::now();
                let mut client = Client::connect(&self.url, NoTls)?;
                client.batch_execute(&format!("CREATE TABLE \"{table}\" ({COLUMNS})"))?;
                if self.plain == PlainWrite::Unnest {
                    insert_unnest(&mut client, &table, batches, every)?;
                    return Ok(start.elapsed());
                }
                let types = [
                    Type::INT8,
                    Type::INT8,
                    Type::INT8,
                    Type::TIMESTAMPTZ,
                    Type::FLOAT4,
                    Type::JSONB,
                ];
                let copy = format!(
                    "COPY \"{table}\" (id, user_id, item_id, ts, score, recs) FROM STDIN BINARY"
                );
                for epoch in batches.chunks(every) {
                    let mut writer = BinaryCopyInWriter::new(client.copy_in(&copy)?, &types);
                    for batch in epoch {
                        copy_batch(&mut writer, batch)?;
                    }
                    writer.finish()?;
                }
                Ok(start.elapsed())
            }
        }
    }

    /// The table's columns and key, then `COPY (SELECT … ORDER BY id) TO STDOUT` (text).
    fn read_back(&mut self, side: Side) -> Result<Digest> {
        let table = Postgres::table(side);
        let mut client = self.client()?;
        let mut hasher = Hasher::new();
        let columns = client.query(
            "SELECT column_name, data_type, is_nullable FROM information_schema.columns \
             WHERE table_name = $1 ORDER BY ordinal_position",
            &[&table],
        )?;
        for c in columns {
            let (name, ty, null): (String, String, String) = (c.get(0), c.get(1), c.get(2));
            hasher.update(format!("{name}:{ty}:{null}\n").as_bytes());
        }
        let key = client.query(
            "SELECT a.attname FROM pg_index i JOIN pg_attribute a \
             ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) \
             WHERE i.indrelid = $1::text::regclass AND i.indisprimary ORDER BY a.attname",
            &[&format!("\"{table}\"")],
        )?;
        for k in key {
            let name: String = k.get(0);
            hasher.update(format!("key:{name}\n").as_bytes());
        }
        let mut dump = Vec::new();
        client
            .copy_out(&format!(
                "COPY (SELECT id, user_id, item_id, ts, score, recs FROM \"{table}\" \
                 ORDER BY id) TO STDOUT"
            ))?
            .read_to_end(&mut dump)?;
        for line in dump.split_inclusive(|&b| b == b'\n') {
            hasher.update(line);
            hasher.row();
        }
        Ok(hasher.finish())
    }
}

/// One batch's rows into the COPY, each column read once per batch.
fn copy_batch(writer: &mut BinaryCopyInWriter<'_>, batch: &RecordBatch) -> Result<()> {
    let col = |i: usize| batch.column(i);
    let ids = col(0).as_primitive::<Int64Type>().values();
    let users = col(1).as_primitive::<Int64Type>().values();
    let items = col(2).as_primitive::<Int64Type>().values();
    let ts = col(3).as_primitive::<TimestampMicrosecondType>().values();
    let scores = col(4).as_primitive::<Float32Type>().values();
    let recs = col(5).as_list::<i32>();
    let rec_items = recs.values().as_primitive::<Int64Type>().values();
    let offsets = recs.value_offsets();
    for row in 0..batch.num_rows() {
        let at = UNIX_EPOCH + Duration::from_micros(ts[row] as u64);
        let list = Json(&rec_items[offsets[row] as usize..offsets[row + 1] as usize]);
        let values: [&(dyn ToSql + Sync); 6] = [
            &ids[row],
            &users[row],
            &items[row],
            &at,
            &scores[row],
            &list,
        ];
        writer.write(&values)?;
    }
    Ok(())
}

/// [`PlainWrite::Unnest`]: one statement per batch, one array per column.
fn insert_unnest(
    client: &mut Client,
    table: &str,
    batches: &[RecordBatch],
    every: usize,
) -> Result<()> {
    let sql = format!(
        "INSERT INTO \"{table}\" (id, user_id, item_id, ts, score, recs) \
         SELECT * FROM UNNEST($1::int8[], $2::int8[], $3::int8[], $4::timestamptz[], \
         $5::float4[], $6::jsonb[]) ON CONFLICT (id) DO NOTHING"
    );
    let statement = client.prepare(&sql)?;
    for epoch in batches.chunks(every) {
        let mut tx = client.transaction()?;
        for batch in epoch {
            let col = |i: usize| batch.column(i);
            let ts: Vec<_> = col(3)
                .as_primitive::<TimestampMicrosecondType>()
                .values()
                .iter()
                .map(|&us| UNIX_EPOCH + Duration::from_micros(us as u64))
                .collect();
            let recs = col(5).as_list::<i32>();
            let items = recs.values().as_primitive::<Int64Type>().values();
            let lists: Vec<_> = recs
                .value_offsets()
                .windows(2)
                .map(|w| Json(&items[w[0] as usize..w[1] as usize]))
                .collect();
            let ints = |i: usize| col(i).as_primitive::<Int64Type>().values().to_vec();
            let scores = col(4).as_primitive::<Float32Type>().values().to_vec();
            tx.execute(
                &statement,
                &[&ints(0), &ints(1), &ints(2), &ts, &scores, &lists],
            )?;
        }
        tx.commit()?;
    }
    Ok(())
}
