//! The unit of data between operators.

use std::cell::RefCell;
use std::io::Cursor;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use arrow_array::RecordBatch;
use arrow_ipc::reader::StreamReader;
use arrow_ipc::writer::StreamWriter;
use serde::de::Error as _;
use serde::ser::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::compression::{decode, encode, Compression};

/// What a batch carries: results on their way to the sink, or records that failed a stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum BatchKind {
    Records,
    /// Rows in the [`crate::dead_letter`] schema; stages pass them through untouched.
    DeadLetters,
    /// Keys whose per-key state is finished with (a camera removed while running): one column,
    /// named as the key column it retires from. Stages pass it through; a keyed stage on that
    /// column drops those keys' state once it has processed the rows of the batch's epoch;
    /// the sink ignores it.
    Retired,
}

/// An Arrow `RecordBatch` plus what the engine needs to know about it.
///
/// Within a process, batches move between workers by pointer (Arrow buffers are reference
/// counted); across processes timely serialises them, and we encode the payload as Arrow IPC
/// so the receiving side gets the same buffers without a row-by-row conversion, after
/// [`encode`]-ing its FP32 columns as `compression` says (the receiver [`decode`]s them).
#[derive(Clone, Debug)]
pub struct Batch {
    pub kind: BatchKind,
    pub data: RecordBatch,
    /// Wall-clock time (ns since the Unix epoch) at which the source read the oldest row, used
    /// for end-to-end latency. Wall clock, not `Instant`, because batches cross processes.
    pub ingest_ns: u64,
    /// Worker the batch is routed to by the next keyed exchange (set by `exchange_by_key`).
    pub route: u64,
    /// How FP32 columns are encoded when the batch crosses a process boundary.
    pub compression: Compression,
    /// Where the batch's time went so far (the run summary's latency breakdown).
    pub trace: Trace,
}

/// Time a batch spent, by cause, from its source's queue to the sink operator: what the
/// runtime measures anyway (stage timers, batcher queues), carried along with the rows so the
/// sink can split each result's latency. The rest of a result's time (channels, scheduling,
/// the wait for its epoch) is what the sink finds left over.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Trace {
    /// The oldest row's wait in the source's own queue before the worker read it (a camera's
    /// frame queue: capture → read), when the source knows it.
    pub queued_ns: u64,
    /// Waiting in a batcher for a model batch to form.
    pub batching_ns: u64,
    /// Inside stages' `process_batch`, summed over the stages passed.
    pub stages_ns: u64,
}

impl Batch {
    pub fn records(data: RecordBatch, ingest_ns: u64) -> Self {
        Batch {
            kind: BatchKind::Records,
            data,
            ingest_ns,
            route: 0,
            compression: Compression::None,
            trace: Trace::default(),
        }
    }

    pub fn dead_letters(data: RecordBatch, ingest_ns: u64) -> Self {
        Batch {
            kind: BatchKind::DeadLetters,
            data,
            ingest_ns,
            route: 0,
            compression: Compression::None,
            trace: Trace::default(),
        }
    }

    pub fn retired(keys: RecordBatch, ingest_ns: u64) -> Self {
        Batch {
            kind: BatchKind::Retired,
            data: keys,
            ingest_ns,
            route: 0,
            compression: Compression::None,
            trace: Trace::default(),
        }
    }

    pub fn num_rows(&self) -> usize {
        self.data.num_rows()
    }

    /// The same provenance around different rows (a stage's output).
    pub fn with_data(&self, data: RecordBatch) -> Self {
        Batch {
            kind: self.kind,
            data,
            ingest_ns: self.ingest_ns,
            route: self.route,
            compression: self.compression,
            trace: self.trace,
        }
    }
}

/// Nanoseconds since the Unix epoch; 0 if the clock is before 1970.
pub fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Arrow IPC stream bytes of one batch.
pub fn to_ipc_bytes(batch: &RecordBatch) -> Result<Vec<u8>, arrow_schema::ArrowError> {
    let mut buf = Vec::with_capacity(batch.get_array_memory_size() + 1024);
    {
        let mut writer = StreamWriter::try_new(&mut buf, &batch.schema())?;
        writer.write(batch)?;
        writer.finish()?;
    }
    Ok(buf)
}

/// The one batch in an Arrow IPC stream written by [`to_ipc_bytes`].
pub fn from_ipc_bytes(bytes: &[u8]) -> Result<RecordBatch, arrow_schema::ArrowError> {
    let mut reader = StreamReader::try_new(Cursor::new(bytes), None)?;
    match reader.next() {
        Some(batch) => batch,
        None => Err(arrow_schema::ArrowError::IpcError(
            "IPC stream holds no batch".into(),
        )),
    }
}

/// Arrow IPC bytes of batches this process received from other processes (counted on
/// arrival: senders may serialise a message more than once to size it).
static EXCHANGE_BYTES_IN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Bytes of batches received from other processes so far (the exchange's wire volume).
pub fn exchange_bytes_received() -> u64 {
    EXCHANGE_BYTES_IN.load(std::sync::atomic::Ordering::Relaxed)
}

#[derive(Serialize, Deserialize)]
struct WireBatch {
    kind: BatchKind,
    ingest_ns: u64,
    trace: Trace,
    route: u64,
    compression: Compression,
    #[serde(with = "serde_bytes_compat")]
    ipc: Vec<u8>,
}

// bincode writes a `Vec<u8>` as length + bytes either way; this keeps the field a byte string
// for self-describing formats too.
mod serde_bytes_compat {
    use serde::{Deserialize, Deserializer, Serializer};
    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(bytes)
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        Vec::<u8>::deserialize(d)
    }
}

/// [`WireBatch`] as written, borrowing the payload.
#[derive(Serialize)]
struct WireBatchRef<'a> {
    kind: BatchKind,
    ingest_ns: u64,
    trace: Trace,
    route: u64,
    compression: Compression,
    #[serde(serialize_with = "serialize_slice")]
    ipc: &'a [u8],
}

fn serialize_slice<S: Serializer>(bytes: &&[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_bytes(bytes)
}

/// A payload encoded for sending, with the batch it came from.
type Encoded = (RecordBatch, Compression, Arc<Vec<u8>>);

thread_local! {
    /// timely serialises a message twice, once to size it and once to write it (and bincode
    /// sizes before writing too): later passes reuse the first's encoding. The entry holds the
    /// batch's columns, so their addresses cannot be reused by other arrays while it is here.
    static LAST_ENCODED: RefCell<Option<Encoded>> = const { RefCell::new(None) };
}

#[cfg(test)]
thread_local! {
    static ENCODINGS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

impl Batch {
    /// The compressed Arrow IPC payload of this batch.
    fn wire_payload(&self) -> Result<Arc<Vec<u8>>, String> {
        LAST_ENCODED.with(|cell| {
            let mut cell = cell.borrow_mut();
            if let Some((data, compression, bytes)) = cell.as_ref() {
                if *compression == self.compression && same_columns(data, &self.data) {
                    return Ok(Arc::clone(bytes));
                }
            }
            #[cfg(test)]
            ENCODINGS.with(|n| n.set(n.get() + 1));
            let encoded = encode(&self.data, self.compression).map_err(|e| e.to_string())?;
            let bytes = Arc::new(to_ipc_bytes(&encoded).map_err(|e| e.to_string())?);
            *cell = Some((self.data.clone(), self.compression, Arc::clone(&bytes)));
            Ok(bytes)
        })
    }
}

/// The same rows in the same column arrays (the IPC payload depends on nothing else).
fn same_columns(a: &RecordBatch, b: &RecordBatch) -> bool {
    a.num_rows() == b.num_rows()
        && a.num_columns() == b.num_columns()
        && Arc::ptr_eq(&a.schema(), &b.schema())
        && a.columns()
            .iter()
            .zip(b.columns())
            .all(|(x, y)| Arc::ptr_eq(x, y))
}

impl Serialize for Batch {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let ipc = self.wire_payload().map_err(S::Error::custom)?;
        WireBatchRef {
            kind: self.kind,
            ingest_ns: self.ingest_ns,
            trace: self.trace,
            route: self.route,
            compression: self.compression,
            ipc: ipc.as_slice(),
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Batch {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let wire = WireBatch::deserialize(deserializer)?;
        EXCHANGE_BYTES_IN.fetch_add(wire.ipc.len() as u64, std::sync::atomic::Ordering::Relaxed);
        let encoded = from_ipc_bytes(&wire.ipc).map_err(D::Error::custom)?;
        let data = decode(&encoded).map_err(D::Error::custom)?;
        Ok(Batch {
            kind: wire.kind,
            data,
            ingest_ns: wire.ingest_ns,
            route: wire.route,
            compression: wire.compression,
            trace: wire.trace,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{Int64Array, StringArray};
    use std::sync::Arc;

    #[test]
    fn batch_round_trips_through_bincode_as_ipc() {
        let data = RecordBatch::try_from_iter(vec![
            (
                "camera_id",
                Arc::new(StringArray::from(vec!["a", "b"])) as _,
            ),
            ("frame", Arc::new(Int64Array::from(vec![1, 2])) as _),
        ])
        .unwrap();
        let mut batch = Batch::records(data.clone(), 42);
        batch.route = 3;
        // timely serialises exchanged data with bincode.
        let bytes = bincode::serialize(&batch).unwrap();
        let back: Batch = bincode::deserialize(&bytes).unwrap();
        assert_eq!(back.data, data);
        assert_eq!(back.ingest_ns, 42);
        assert_eq!(back.route, 3);
        assert_eq!(back.kind, BatchKind::Records);
        assert_eq!(back.compression, Compression::None);
    }

    #[test]
    fn fp16_batch_crosses_bincode_at_half_the_size() {
        use crate::tensor::{tensor_column, tensor_field};
        use arrow_array::cast::AsArray;
        use arrow_array::types::Float32Type;
        use arrow_schema::{DataType, Schema};

        let field = tensor_field("features", DataType::Float32, &[3, 32, 32]);
        let values: Vec<f32> = (0..4 * 3 * 32 * 32)
            .map(|i| ((i * 7919) % 1000) as f32 / 100.0 - 5.0)
            .collect();
        let tensor = tensor_column::<Float32Type>(&field, values).unwrap();
        let labels = Arc::new(StringArray::from(vec!["a", "b", "c", "d"]));
        let schema = Schema::new(vec![
            field,
            arrow_schema::Field::new("camera_id", DataType::Utf8, false),
        ]);
        let data = RecordBatch::try_new(Arc::new(schema), vec![tensor, labels]).unwrap();
        let plain = Batch::records(data.clone(), 7);
        let mut compressed = plain.with_data(data.clone());
        compressed.compression = Compression::Fp16;
        assert_eq!(
            compressed.with_data(data.clone()).compression,
            Compression::Fp16
        );

        let plain_bytes = bincode::serialize(&plain).unwrap();
        let bytes = bincode::serialize(&compressed).unwrap();
        let ratio = bytes.len() as f64 / plain_bytes.len() as f64;
        assert!(
            (0.45..0.55).contains(&ratio),
            "{} / {}",
            bytes.len(),
            plain_bytes.len()
        );

        let back: Batch = bincode::deserialize(&bytes).unwrap();
        assert_eq!(back.compression, Compression::Fp16);
        assert_eq!(back.data.schema(), data.schema());
        assert_eq!(back.data.column(1), data.column(1));
        let sent = data.column(0).as_fixed_size_list().values();
        let got = back.data.column(0).as_fixed_size_list().values();
        let sent = sent.as_primitive::<Float32Type>().values();
        let got = got.as_primitive::<Float32Type>().values();
        for (a, b) in sent.iter().zip(got) {
            assert!(
                (a - b).abs() <= a.abs() * 2f32.powi(-11) + 2f32.powi(-25),
                "{a} vs {b}"
            );
        }
    }

    #[test]
    fn sizing_then_writing_a_message_encodes_it_once() {
        let data = |v: Vec<i64>| {
            RecordBatch::try_from_iter(vec![("x", Arc::new(Int64Array::from(v)) as _)]).unwrap()
        };
        let a = Batch::records(data(vec![1, 2, 3]), 1);
        let b = Batch::records(data(vec![4, 5, 6]), 1);
        let before = ENCODINGS.with(|n| n.get());
        // As timely does: size, then write (bincode sizes again inside).
        let size = bincode::serialized_size(&a).unwrap();
        let bytes = bincode::serialize(&a).unwrap();
        assert_eq!(bytes.len() as u64, size);
        assert_eq!(ENCODINGS.with(|n| n.get()) - before, 1);
        let back: Batch = bincode::deserialize(&bytes).unwrap();
        assert_eq!(back.data, a.data);
        // Same shape, other arrays: encoded afresh, not mistaken for `a`.
        let other = bincode::serialize(&b).unwrap();
        let back: Batch = bincode::deserialize(&other).unwrap();
        assert_eq!(back.data, b.data);
        // A routed clone shares the columns and reuses the encoding; the route is its own.
        let mut routed = b.clone();
        routed.route = 9;
        let back: Batch = bincode::deserialize(&bincode::serialize(&routed).unwrap()).unwrap();
        assert_eq!((back.route, back.data), (9, b.data.clone()));
        assert_eq!(ENCODINGS.with(|n| n.get()) - before, 2);
    }
}
