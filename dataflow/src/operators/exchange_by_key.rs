use std::hash::{DefaultHasher, Hash, Hasher};

use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, Int64Type, UInt32Type, UInt64Type};
use arrow_array::{Array, RecordBatch, UInt32Array};
use arrow_schema::DataType;
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::Operator;

use super::BatchStream;
use crate::error::{DataflowError, DataflowResult};
use crate::{Batch, BatchKind};

/// Moves every row to the worker that owns its key, so per-key state and order stay on one
/// worker (e.g. all frames of a camera).
pub trait ExchangeByKey<'scope> {
    /// Routes rows by a hash of `column` (strings or integers) across all workers of all
    /// processes. Batches are split per destination; across processes they travel as Arrow IPC.
    ///
    /// # Examples
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// use arrow_array::{RecordBatch, StringArray};
    /// use riffle_dataflow::Batch;
    /// use riffle_dataflow::operators::ExchangeByKey;
    /// use timely::dataflow::operators::{Inspect, ToStream};
    ///
    /// let rows = Arc::new(Mutex::new(0));
    /// let rows2 = rows.clone();
    /// timely::example(move |scope| {
    ///     let cams = RecordBatch::try_from_iter(vec![
    ///         ("camera_id", Arc::new(StringArray::from(vec!["a", "b", "a"])) as _),
    ///     ]).unwrap();
    ///     vec![Batch::records(cams, 0)]
    ///         .to_stream(scope)
    ///         .container::<Vec<_>>()
    ///         .exchange_by_key("camera_id")
    ///         .inspect(move |b: &Batch| *rows2.lock().unwrap() += b.num_rows());
    /// });
    /// assert_eq!(*rows.lock().unwrap(), 3);
    /// ```
    fn exchange_by_key(self, column: &str) -> Self;
}

impl<'scope> ExchangeByKey<'scope> for BatchStream<'scope> {
    fn exchange_by_key(self, column: &str) -> Self {
        let column = column.to_string();
        let peers = self.scope().peers();
        let me = self.scope().index() as u64;
        let routed = self.unary(Pipeline, "SplitByKey", move |_, _| {
            move |input, output| {
                input.for_each(|cap, data| {
                    let mut session = output.session(&cap);
                    for batch in data.drain(..) {
                        // Retired keys go where their rows went; other retirements stay.
                        let keyed = match batch.kind {
                            BatchKind::Records => true,
                            BatchKind::Retired => batch.data.column_by_name(&column).is_some(),
                            BatchKind::DeadLetters => false,
                        };
                        if !keyed {
                            let mut b = batch;
                            b.route = me;
                            session.give(b);
                            continue;
                        }
                        let parts = route_rows(&batch.data, &column, peers);
                        let what = format!("exchange by `{column}`");
                        give_parts(batch, parts, me, &what, &mut |b| session.give(b));
                    }
                });
            }
        });
        super::to_routes(routed, "ExchangeByKey")
    }
}

/// Splits `batch` into one batch per destination worker (of `peers`) by a hash of `column`.
pub fn route_rows(
    batch: &RecordBatch,
    column: &str,
    peers: usize,
) -> DataflowResult<Vec<(usize, RecordBatch)>> {
    let peers = peers.max(1) as u64;
    route_by(batch, column, &mut |hash| Ok((hash % peers) as usize))
}

/// Splits `batch` by the worker `dest` names for each row's key hash in `column` (equal keys,
/// equal hashes), one batch per worker, in worker order.
pub(crate) fn route_by(
    batch: &RecordBatch,
    column: &str,
    dest: &mut dyn FnMut(u64) -> DataflowResult<usize>,
) -> DataflowResult<Vec<(usize, RecordBatch)>> {
    let keys = batch
        .column_by_name(column)
        .ok_or_else(|| DataflowError::schema(column, "a key column", "no such column"))?;
    let mut rows_for: std::collections::BTreeMap<usize, Vec<u32>> = Default::default();
    for row in 0..batch.num_rows() {
        rows_for
            .entry(dest(key_hash(keys.as_ref(), row)?)?)
            .or_default()
            .push(row as u32);
    }
    rows_for
        .into_iter()
        .map(|(to, rows)| Ok((to, take_rows(batch, rows)?)))
        .collect()
}

/// Gives the parts of a split batch to their workers, or, when the split failed (the key
/// column drifted from what validation saw), the whole batch to this worker, logged.
pub(crate) fn give_parts<S: FnMut(Batch)>(
    batch: Batch,
    parts: DataflowResult<Vec<(usize, RecordBatch)>>,
    me: u64,
    what: &str,
    give: &mut S,
) {
    match parts {
        Ok(parts) => {
            for (dest, rows) in parts {
                let mut part = batch.with_data(rows);
                part.route = dest as u64;
                give(part);
            }
        }
        Err(e) => {
            tracing::error!("{what}: {e}");
            let mut b = batch;
            b.route = me;
            give(b);
        }
    }
}

/// The given rows of `batch`, in that order (the batch itself when that is all of it).
pub fn take_rows(batch: &RecordBatch, rows: Vec<u32>) -> DataflowResult<RecordBatch> {
    if rows.len() == batch.num_rows() && rows.iter().enumerate().all(|(i, r)| i as u32 == *r) {
        return Ok(batch.clone());
    }
    let indices = UInt32Array::from(rows);
    let columns = batch
        .columns()
        .iter()
        .map(|c| arrow_select::take::take(c.as_ref(), &indices, None))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(RecordBatch::try_new(batch.schema(), columns)?)
}

/// The worker owning row `row`'s key. SipHash with fixed keys: the same in every process.
pub fn worker_for(keys: &dyn Array, row: usize, peers: usize) -> DataflowResult<usize> {
    Ok((key_hash(keys, row)? % peers as u64) as usize)
}

/// The hash of row `row`'s key (integers hash as i64, so every integer type agrees with
/// [`worker_for_int`]).
pub(crate) fn key_hash(keys: &dyn Array, row: usize) -> DataflowResult<u64> {
    let mut h = DefaultHasher::new();
    if keys.is_null(row) {
        0u8.hash(&mut h);
    } else {
        match keys.data_type() {
            DataType::Utf8 => keys.as_string::<i32>().value(row).hash(&mut h),
            DataType::LargeUtf8 => keys.as_string::<i64>().value(row).hash(&mut h),
            DataType::Int64 => keys.as_primitive::<Int64Type>().value(row).hash(&mut h),
            DataType::Int32 => i64::from(keys.as_primitive::<Int32Type>().value(row)).hash(&mut h),
            DataType::UInt64 => keys.as_primitive::<UInt64Type>().value(row).hash(&mut h),
            DataType::UInt32 => {
                i64::from(keys.as_primitive::<UInt32Type>().value(row)).hash(&mut h)
            }
            other => {
                return Err(DataflowError::schema(
                    "key",
                    "a string or integer column",
                    other.to_string(),
                ))
            }
        }
    }
    Ok(h.finish())
}

/// The worker owning integer key `key`: what [`worker_for`] gives a row of an Int64 column, for
/// operators that route plain values to the owner of their key.
pub fn worker_for_int(key: i64, peers: usize) -> usize {
    let mut h = DefaultHasher::new();
    key.hash(&mut h);
    (h.finish() % peers.max(1) as u64) as usize
}

/// Whether `data_type` can key an exchange.
pub fn is_key_type(data_type: &DataType) -> bool {
    matches!(
        data_type,
        DataType::Utf8
            | DataType::LargeUtf8
            | DataType::Int64
            | DataType::Int32
            | DataType::UInt64
            | DataType::UInt32
    )
}
