//! The rows both sides write: deterministic clickstream-like batches, and what a digest of
//! rows read back is made of.

use std::sync::Arc;

use anyhow::{Context, Result};
use arrow_array::builder::{Int64Builder, ListBuilder};
use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{
    ArrayRef, Float32Array, Int64Array, RecordBatch, TimestampMicrosecondArray, UInt32Array,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};

/// Recommendations per row (the nested column).
pub const RECS: usize = 10;

/// 2024-01-01T00:00:00Z in microseconds.
const T0_US: i64 = 1_704_067_200_000_000;

pub fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("user_id", DataType::Int64, false),
        Field::new("item_id", DataType::Int64, false),
        Field::new(
            "ts",
            DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into())),
            false,
        ),
        Field::new("score", DataType::Float32, false),
        Field::new(
            "recs",
            DataType::List(Arc::new(Field::new("item", DataType::Int64, true))),
            true,
        ),
    ]))
}

/// SplitMix64: the same stream on every run and machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> i64 {
        (self.next() % n) as i64
    }
}

/// `rows` rows with ids 0.., in batches of `batch_rows`: users and items drawn from 100k and
/// 50k, a timestamp a few ms apart, a score in [0, 1) and 10 recommended items.
pub fn batches(rows: usize, batch_rows: usize) -> Result<Vec<RecordBatch>> {
    let schema = schema();
    let mut rng = Rng(0x5EED_CAFE);
    let mut out = Vec::with_capacity(rows.div_ceil(batch_rows));
    let mut ts = T0_US;
    let mut start = 0;
    while start < rows {
        let n = batch_rows.min(rows - start);
        let (mut users, mut items, mut times, mut scores) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        let mut recs = ListBuilder::with_capacity(Int64Builder::with_capacity(n * RECS), n)
            .with_field(Arc::new(Field::new("item", DataType::Int64, true)));
        for _ in 0..n {
            users.push(rng.below(100_000));
            items.push(rng.below(50_000));
            ts += 1 + rng.below(5_000);
            times.push(ts);
            scores.push((rng.next() >> 40) as f32 / (1u64 << 24) as f32);
            for _ in 0..RECS {
                recs.values().append_value(rng.below(50_000));
            }
            recs.append(true);
        }
        let ids: Vec<i64> = (start as i64..(start + n) as i64).collect();
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(ids)),
            Arc::new(Int64Array::from(users)),
            Arc::new(Int64Array::from(items)),
            Arc::new(TimestampMicrosecondArray::from(times).with_timezone("+00:00")),
            Arc::new(Float32Array::from(scores)),
            Arc::new(recs.finish()),
        ];
        out.push(RecordBatch::try_new(schema.clone(), columns)?);
        start += n;
    }
    Ok(out)
}

/// The rows as JSON lines, nulls written out: the form of the Redis sink's `value: json` (the
/// `jsonl` sink's line), made with arrow-json directly.
pub fn json_lines(batch: &RecordBatch) -> Result<Vec<u8>> {
    let mut writer = arrow_json::WriterBuilder::new()
        .with_explicit_nulls(true)
        .build::<_, arrow_json::writer::LineDelimited>(Vec::with_capacity(
        batch.get_array_memory_size(),
    ));
    writer.write(batch)?;
    writer.finish()?;
    Ok(writer.into_inner())
}

/// A digest of `batches` read back, independent of how they were split into files or row
/// groups: the column names and types, then every row as a JSON line, in `id` order.
pub fn digest_batches(batches: &[RecordBatch]) -> Result<Digest> {
    let Some(first) = batches.first() else {
        return Ok(Digest::of(b"(no rows)", 0));
    };
    let schema = first.schema();
    let all = arrow_select::concat::concat_batches(&schema, batches)?;
    let ids = all
        .column_by_name("id")
        .context("no `id` column read back")?
        .as_primitive_opt::<Int64Type>()
        .context("`id` read back is not Int64")?;
    let mut order: Vec<u32> = (0..all.num_rows() as u32).collect();
    order.sort_by_key(|&i| ids.value(i as usize));
    let sorted = arrow_select::take::take_record_batch(&all, &UInt32Array::from(order))?;
    let mut text = Vec::new();
    for f in schema.fields() {
        text.extend_from_slice(
            format!("{}:{}:{}\n", f.name(), f.data_type(), f.is_nullable()).as_bytes(),
        );
    }
    text.extend(json_lines(&sorted)?);
    Ok(Digest::of(&text, sorted.num_rows()))
}

/// What landed: a hash of a canonical dump and the rows in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Digest {
    pub hash: String,
    pub rows: usize,
}

impl Digest {
    pub fn of(bytes: &[u8], rows: usize) -> Digest {
        Digest {
            hash: sha1_smol::Sha1::from(bytes).digest().to_string(),
            rows,
        }
    }

    /// The first 12 hex digits and the rows, for the table.
    pub fn short(&self) -> String {
        format!("`{}` ({} rows)", &self.hash[..12], self.rows)
    }
}

/// A digest made row by row, for dumps too large to keep whole (SQL, Redis).
pub struct Hasher {
    sha: sha1_smol::Sha1,
    rows: usize,
}

impl Hasher {
    pub fn new() -> Hasher {
        Hasher {
            sha: sha1_smol::Sha1::new(),
            rows: 0,
        }
    }

    pub fn update(&mut self, bytes: &[u8]) {
        self.sha.update(bytes);
    }

    pub fn row(&mut self) {
        self.rows += 1;
    }

    pub fn finish(self) -> Digest {
        Digest {
            hash: self.sha.digest().to_string(),
            rows: self.rows,
        }
    }
}
