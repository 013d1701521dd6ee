//! Messages copied out of librdkafka's buffers, and the batch they become: value columns
//! decoded by [`crate::formats`] (or the whole value as `bytes`), then the key, message and
//! header columns.

use std::ops::Range;
use std::sync::Arc;

use arrow_array::{ArrayRef, BinaryArray, Int32Array, Int64Array, RecordBatch, StringArray};
use arrow_buffer::{Buffer, OffsetBuffer};
use rdkafka::message::{BorrowedMessage, Headers, Message};
use riffle_dataflow::dead_letter::DeadLetter;
use riffle_dataflow::{DataflowError, DataflowResult};
use serde_json::Value;

use arrow_schema::SchemaRef;

use crate::formats::value::ValueDecoder;
use crate::formats::{raw, ColumnType};

/// Value columns (`None` when values are kept whole), the messages behind their rows, and dead
/// letters for the messages that did not decode.
type Decoded = (Option<RecordBatch>, Vec<usize>, Vec<DeadLetter>);

/// How a reader's messages become its batches: the value decoder, the output schema and the
/// key and header columns.
pub(super) struct Layout {
    pub(super) topic: String,
    pub(super) max_message_bytes: usize,
    /// Whether the message key is a column.
    pub(super) key: bool,
    /// Decodes `json`/`csv`/`avro`/`protobuf` values (`None`: values are kept whole).
    pub(super) decoder: Option<ValueDecoder>,
    pub(super) schema: SchemaRef,
    pub(super) header_columns: Vec<(String, ColumnType)>,
}

impl Layout {
    /// The value columns of the messages that decode, with the indices of those messages and
    /// dead letters for the others.
    #[allow(
        clippy::indexing_slicing,
        reason = "`fits` and the decoder's indices are positions in `pending.messages`"
    )]
    pub(super) fn decode(&self, pending: &Pending) -> DataflowResult<Decoded> {
        let letter = |m: &Received, reason: String| DeadLetter {
            stage: "source".to_string(),
            reason,
            record: serde_json::json!({
                "topic": self.topic,
                "partition": m.partition,
                "offset": m.offset,
            })
            .to_string(),
        };
        let mut fits = Vec::with_capacity(pending.messages.len());
        let mut rejected = Vec::new();
        for (i, m) in pending.messages.iter().enumerate() {
            match m.oversized {
                Some(size) => rejected.push(letter(
                    m,
                    format!(
                        "message of {size} bytes exceeds max_message_bytes ({})",
                        self.max_message_bytes
                    ),
                )),
                None => fits.push(i),
            }
        }
        let Some(decoder) = &self.decoder else {
            return Ok((None, fits, rejected));
        };
        let values: Vec<&[u8]> = fits
            .iter()
            .map(|&i| pending.value(&pending.messages[i]))
            .collect();
        let decoded = decoder.decode_or_reject(&values, |i, reason| {
            letter(&pending.messages[fits[i]], reason)
        })?;
        rejected.extend(decoded.rejected);
        let kept = decoded.kept.iter().map(|&i| fits[i]).collect();
        Ok((Some(decoded.batch), kept, rejected))
    }

    /// The output batch: value columns (or `bytes` and the message fields) and the key and
    /// header columns of messages `rows`.
    #[allow(
        clippy::indexing_slicing,
        reason = "`rows` are positions in `pending.messages`; each message has one header value per header column"
    )]
    pub(super) fn assemble(
        &self,
        pending: &mut Pending,
        values: Option<RecordBatch>,
        rows: &[usize],
    ) -> DataflowResult<RecordBatch> {
        let raw = values.is_none();
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(self.schema.fields().len());
        match values {
            Some(values) => columns.extend(values.columns().iter().cloned()),
            None => columns.push(pending.take_values(rows)?),
        }
        let messages: Vec<&Received> = rows.iter().map(|&i| &pending.messages[i]).collect();
        if self.key {
            columns.push(Arc::new(StringArray::from_iter(
                messages.iter().map(|m| m.key.as_deref()),
            )));
        }
        if raw {
            columns.push(Arc::new(Int32Array::from_iter_values(
                messages.iter().map(|m| m.partition),
            )));
            columns.push(Arc::new(Int64Array::from_iter_values(
                messages.iter().map(|m| m.offset),
            )));
            columns.push(Arc::new(Int64Array::from_iter(
                messages.iter().map(|m| m.timestamp),
            )));
            columns.push(Arc::new(StringArray::from_iter(
                messages.iter().map(|m| m.headers_json.as_deref()),
            )));
        }
        for (i, (_, t)) in self.header_columns.iter().enumerate() {
            let texts = messages.iter().map(|m| m.header_values[i].as_deref());
            columns.push(t.parse_column(texts));
        }
        Ok(RecordBatch::try_new(self.schema.clone(), columns)?)
    }
}

/// A message copied out of librdkafka's buffers.
pub(super) struct Received {
    pub(super) partition: i32,
    pub(super) offset: i64,
    pub(super) timestamp: Option<i64>,
    pub(super) key: Option<String>,
    /// Where the value lies in [`Pending::values`].
    pub(super) value: Range<usize>,
    /// Key and value bytes, for the byte counter.
    pub(super) size: usize,
    /// The value's length when it was over `max_message_bytes` and so not kept.
    pub(super) oversized: Option<usize>,
    pub(super) headers_json: Option<String>,
    /// The text of each configured header column's header (last one of that name).
    pub(super) header_values: Vec<Option<String>>,
}

/// The messages of the batch being filled; values are stored back to back.
#[derive(Default)]
pub(super) struct Pending {
    pub(super) messages: Vec<Received>,
    pub(super) values: Vec<u8>,
}

impl Pending {
    pub(super) fn with_capacity(messages: usize, bytes: usize) -> Self {
        Pending {
            messages: Vec::with_capacity(messages),
            values: Vec::with_capacity(bytes),
        }
    }

    #[allow(
        clippy::indexing_slicing,
        reason = "`i` is a position in `header_columns`, which sized `header_values`"
    )]
    pub(super) fn push(
        &mut self,
        message: &BorrowedMessage<'_>,
        header_columns: &[(String, ColumnType)],
        keep_headers_json: bool,
        keep_key: bool,
        max_value_bytes: usize,
    ) {
        let payload = message.payload().unwrap_or_default();
        let key = message.key();
        // Copied out only when a column keeps it (still counted in the byte counter).
        let kept_key = key.filter(|_| keep_key);
        let start = self.values.len();
        let oversized = (payload.len() > max_value_bytes).then_some(payload.len());
        if oversized.is_none() {
            self.values.extend_from_slice(payload);
        }
        let mut header_values = vec![None; header_columns.len()];
        let mut json = keep_headers_json.then(serde_json::Map::new);
        // Parsing headers allocates in librdkafka: only when some are kept.
        let wanted = !header_columns.is_empty() || keep_headers_json;
        if let Some(headers) = wanted.then(|| message.headers()).flatten() {
            for header in headers.iter() {
                let text = header
                    .value
                    .map(|v| String::from_utf8_lossy(v).into_owned());
                if let Some(i) = header_columns.iter().position(|(n, _)| n == header.key) {
                    header_values[i] = text.clone();
                }
                if let Some(map) = json.as_mut() {
                    map.insert(
                        header.key.to_string(),
                        text.map_or(Value::Null, Value::String),
                    );
                }
            }
        }
        self.messages.push(Received {
            partition: message.partition(),
            offset: message.offset(),
            timestamp: message.timestamp().to_millis(),
            key: kept_key.map(|k| String::from_utf8_lossy(k).into_owned()),
            value: start..self.values.len(),
            size: payload.len() + key.map_or(0, <[u8]>::len),
            oversized,
            headers_json: json
                .filter(|m| !m.is_empty())
                .map(|m| Value::Object(m).to_string()),
            header_values,
        });
    }

    #[allow(
        clippy::indexing_slicing,
        reason = "`message.value` is the range `push` wrote into `values`"
    )]
    pub(super) fn value(&self, message: &Received) -> &[u8] {
        &self.values[message.value.clone()]
    }

    /// The values of messages `rows` as a binary column. When that is every message in order
    /// (raw values: always), the value buffer becomes the column as is: one copy out of
    /// librdkafka, none more.
    #[allow(
        clippy::indexing_slicing,
        reason = "`rows` are positions in `self.messages`"
    )]
    fn take_values(&mut self, rows: &[usize]) -> DataflowResult<ArrayRef> {
        let whole =
            rows.len() == self.messages.len() && rows.iter().enumerate().all(|(i, &r)| i == r);
        if !whole {
            return Ok(raw::bytes_column(
                rows.iter().map(|&i| self.value(&self.messages[i])),
                self.values.len(),
            ));
        }
        let too_big = || {
            DataflowError::stage(
                "source",
                "the messages of one batch exceed the 2 GiB of a binary column (lower batch_size)",
            )
        };
        let mut offsets = Vec::with_capacity(self.messages.len() + 1);
        offsets.push(0i32);
        for m in &self.messages {
            offsets.push(i32::try_from(m.value.end).map_err(|_| too_big())?);
        }
        let values = Buffer::from_vec(std::mem::take(&mut self.values));
        let array = BinaryArray::try_new(OffsetBuffer::new(offsets.into()), values, None)?;
        Ok(Arc::new(array))
    }
}
