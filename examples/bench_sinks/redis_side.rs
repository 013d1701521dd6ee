//! Redis: Riffle's `redis` sink (`key: click:{id}`, `value: json`) against the `redis` crate
//! setting the same keys, one `SET` per row pipelined in one `MULTI`/`EXEC` per epoch's rows,
//! each value the row as JSON made from the Arrow batch (arrow-json, the same form) in the
//! timed section. Both write into a database of their own (`DB`), emptied between sides.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::RecordBatch;
use redis::{Client, Connection, Value};
use serde_json::json;

use crate::data::{json_lines, Digest, Hasher};
use crate::{riffle_run, Side, Target};

/// The database both sides write (FLUSHDB'd between them), not the tests' or demos' 0.
const DB: u32 = 14;
/// Keys per MGET when reading back.
const READ_CHUNK: usize = 10_000;

pub const LABEL: &str = "redis, value json (`SET click:{id}`)";

pub struct Redis {
    url: String,
    rows: usize,
}

impl Redis {
    /// `url` as `RIFFLE_REDIS_URL` gives it, its database replaced by [`DB`].
    pub fn new(url: &str, rows: usize) -> Redis {
        let (scheme, rest) = url.split_once("://").unwrap_or(("redis", url));
        let authority = rest.split(['/', '?']).next().unwrap_or(rest);
        Redis {
            url: format!("{scheme}://{authority}/{DB}"),
            rows,
        }
    }

    fn connection(&self) -> Result<Connection> {
        Ok(Client::open(self.url.as_str())?.get_connection()?)
    }
}

impl Target for Redis {
    fn label(&self) -> String {
        LABEL.into()
    }

    fn clean(&mut self) -> Result<()> {
        let mut con = self.connection()?;
        redis::cmd("FLUSHDB").exec(&mut con)?;
        Ok(())
    }

    fn run(&mut self, side: Side, batches: &[RecordBatch], every: usize) -> Result<Duration> {
        match side {
            Side::Riffle => riffle_run(
                json!({"redis": {"url": self.url, "key": "click:{id}", "value": "json"}}),
                batches,
                every,
            ),
            Side::Plain => {
                let start = Instant::now();
                let mut con = self.connection()?;
                for epoch in batches.chunks(every) {
                    let mut pipe = redis::pipe();
                    pipe.atomic();
                    for batch in epoch {
                        let ids = batch.column(0).as_primitive::<Int64Type>().values();
                        let lines = json_lines(batch)?;
                        for (id, line) in ids.iter().zip(lines.split(|&b| b == b'\n')) {
                            pipe.cmd("SET")
                                .arg(format!("click:{id}"))
                                .arg(line)
                                .ignore();
                        }
                    }
                    let _: Value = pipe.query(&mut con)?;
                }
                Ok(start.elapsed())
            }
        }
    }

    /// `DBSIZE`, then every key `click:0` … in order with `MGET`.
    fn read_back(&mut self, _side: Side) -> Result<Digest> {
        let mut con = self.connection()?;
        let size: usize = redis::cmd("DBSIZE").query(&mut con)?;
        let mut hasher = Hasher::new();
        hasher.update(format!("dbsize:{size}\n").as_bytes());
        let mut start = 0;
        while start < self.rows {
            let end = (start + READ_CHUNK).min(self.rows);
            let keys: Vec<String> = (start..end).map(|i| format!("click:{i}")).collect();
            let values: Vec<Option<Vec<u8>>> = redis::cmd("MGET").arg(&keys).query(&mut con)?;
            if values.len() != keys.len() {
                bail!("MGET of {} keys answered {}", keys.len(), values.len());
            }
            for (key, value) in keys.iter().zip(values) {
                hasher.update(key.as_bytes());
                match value {
                    Some(v) => {
                        hasher.update(b"=");
                        hasher.update(&v);
                        hasher.row();
                    }
                    None => hasher.update(b" missing"),
                }
                hasher.update(b"\n");
            }
            start = end;
        }
        Ok(hasher.finish())
    }
}
