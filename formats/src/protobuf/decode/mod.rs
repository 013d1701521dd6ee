//! Protobuf payloads to Arrow rows: each payload decoded by prost-reflect with the reader's
//! descriptor, the messages then appended straight into Arrow builders (faster than going
//! through arrow-json with prost-reflect's serde, see the benchmark in `tests.rs`, and bytes
//! stay bytes).
//!
//! - `columns.rs`: the Arrow builders messages are appended to, one per column.
//! - `writers.rs`: checking and remembering the writer schemas the Confluent framing names.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use arrow_array::{RecordBatch, RecordBatchOptions};
use arrow_schema::{ArrowError, SchemaRef};
use prost_reflect::DynamicMessage;
use riffle_dataflow::dead_letter::DeadLetter;
use riffle_dataflow::DataflowResult;

use super::{read_message_indexes, ProtoFormatError, ProtoSchema};
use crate::schema_registry::{wire, SchemaLookup};
use crate::{excerpt, Decoded};

mod columns;
mod writers;

use columns::Root;
use writers::Writer;

/// What a payload holds around the message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProtoFraming {
    /// The registry's prefix (a zero byte, the writer schema's id), the message indexes, then
    /// the message.
    Confluent,
    /// The message alone.
    Plain,
}

/// Decodes Protobuf payloads into batches of the reader's columns.
///
/// Every payload decodes with the reader's message (fields it does not know are skipped, as
/// protobuf readers do). With the Confluent framing and `writers`, each writer schema id (and
/// message indexes) is checked once, then remembered: its message must be the reader's (same
/// full name) and every field number both have must have types that read as each other
/// (strictly: see `schema::first_conflict`); payloads of other writers are rejected. Registry
/// failures reject the payloads of that id for the rest of the call and are asked again on the
/// next. Without `writers` the framing is stripped unchecked.
#[derive(Clone)]
pub struct ProtobufDecoder {
    reader: ProtoSchema,
    schema: SchemaRef,
    framing: ProtoFraming,
    writers: Option<Arc<dyn SchemaLookup>>,
    /// Verdicts on writer schemas by id; shared by clones. Registry failures are not kept here.
    checked: Arc<Mutex<HashMap<u32, Writer>>>,
}

impl fmt::Debug for ProtobufDecoder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProtobufDecoder")
            .field("reader", &self.reader)
            .field("framing", &self.framing)
            // The lookup's own Debug could show registry credentials.
            .field("checks_writers", &self.writers.is_some())
            .finish_non_exhaustive()
    }
}

/// What one call of `decode_or_reject` remembers about writers beyond the shared cache.
#[derive(Default)]
struct Session {
    /// The last writer id and message path found compatible.
    last_ok: Option<(u32, Vec<i32>)>,
    /// Registry failures by id, asked again on the next call, not for every payload of this one.
    failed: HashMap<u32, String>,
}

/// The rows, the payloads behind them, and the payloads rejected with their reasons.
type Outcome = (RecordBatch, Vec<usize>, Vec<(usize, String)>);

fn schema_error(e: ProtoFormatError) -> ArrowError {
    match e {
        ProtoFormatError::Arrow(e) => e,
        other => ArrowError::SchemaError(other.to_string()),
    }
}

impl ProtobufDecoder {
    /// A decoder of `reader`'s messages, framed by `framing`; `writers` are where Confluent
    /// framing's writer schema ids are looked up for checking.
    pub fn new(
        reader: ProtoSchema,
        framing: ProtoFraming,
        writers: Option<Arc<dyn SchemaLookup>>,
    ) -> Result<Self, ProtoFormatError> {
        // Columns are built from the reader's descriptor and these fields, which must agree.
        Root::new(&reader, 0)?;
        Ok(ProtobufDecoder {
            schema: reader.arrow_schema(),
            reader,
            framing,
            writers,
            checked: Arc::default(),
        })
    }

    /// The columns of the decoded batches.
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// Decodes `payloads` into rows in payload order; a payload that does not decode (bad
    /// framing, bytes that are not the message, an incompatible or unknown writer schema)
    /// becomes `dead_letter(i, reason)` instead, the others are kept.
    pub fn decode_or_reject(
        &self,
        payloads: &[&[u8]],
        mut dead_letter: impl FnMut(usize, &str) -> DeadLetter,
    ) -> DataflowResult<Decoded> {
        let mut session = Session::default();
        let (batch, kept, mut bad) = match self.decode_streaming(payloads, &mut session)? {
            Some(outcome) => outcome,
            None => self.decode_keeping(payloads, &mut session)?,
        };
        // A registry that cannot be reached (after the client's retries) says nothing about
        // the messages: stop rather than turn good messages into dead letters.
        if let Some(reason) = session.failed.values().next() {
            return Err(riffle_dataflow::DataflowError::stage(
                "source",
                format!("{reason}; stopping rather than rejecting messages that may be good (raise schema_registry.timeout_ms to ride out longer outages)"),
            ));
        }
        bad.sort_by_key(|(i, _)| *i);
        let rejected = bad
            .iter()
            .map(|(i, reason)| dead_letter(*i, &excerpt(reason)))
            .collect();
        Ok(Decoded {
            batch,
            kept,
            rejected,
        })
    }

    /// Appends each message as it is decoded (the fast path); `None` when a message's values
    /// do not fit its columns (a Timestamp out of range), which builders cannot take back.
    fn decode_streaming(
        &self,
        payloads: &[&[u8]],
        session: &mut Session,
    ) -> DataflowResult<Option<Outcome>> {
        let mut root = Root::new(&self.reader, payloads.len()).map_err(schema_error)?;
        let mut kept = Vec::with_capacity(payloads.len());
        let mut bad = Vec::new();
        let mut indexes = Vec::new();
        for (i, payload) in payloads.iter().enumerate() {
            match self.message(payload, &mut indexes, session) {
                Ok(message) => {
                    if root.append(&message).is_err() {
                        return Ok(None);
                    }
                    kept.push(i);
                }
                Err(reason) => bad.push((i, reason)),
            }
        }
        let batch = self.finish(root, kept.len())?;
        Ok(Some((batch, kept, bad)))
    }

    /// Decodes every message first, then builds the columns, dropping each message whose
    /// values do not fit and building again.
    fn decode_keeping(&self, payloads: &[&[u8]], session: &mut Session) -> DataflowResult<Outcome> {
        let mut messages = Vec::with_capacity(payloads.len());
        let mut kept = Vec::with_capacity(payloads.len());
        let mut bad = Vec::new();
        let mut indexes = Vec::new();
        for (i, payload) in payloads.iter().enumerate() {
            match self.message(payload, &mut indexes, session) {
                Ok(message) => {
                    messages.push(message);
                    kept.push(i);
                }
                Err(reason) => bad.push((i, reason)),
            }
        }
        let batch = loop {
            let mut root = Root::new(&self.reader, messages.len()).map_err(schema_error)?;
            let failed = messages
                .iter()
                .enumerate()
                .find_map(|(row, m)| root.append(m).err().map(|e| (row, e)));
            match failed {
                None => break self.finish(root, messages.len())?,
                Some((row, reason)) if row < messages.len() => {
                    messages.remove(row);
                    bad.push((kept.remove(row), reason));
                }
                Some((_, reason)) => return Err(ArrowError::InvalidArgumentError(reason).into()),
            }
        };
        Ok((batch, kept, bad))
    }

    fn finish(&self, root: Root, rows: usize) -> Result<RecordBatch, ArrowError> {
        RecordBatch::try_new_with_options(
            self.schema.clone(),
            root.finish()?,
            &RecordBatchOptions::new().with_row_count(Some(rows)),
        )
    }

    /// The message in `payload`, or why there is none.
    fn message(
        &self,
        payload: &[u8],
        indexes: &mut Vec<i32>,
        session: &mut Session,
    ) -> Result<DynamicMessage, String> {
        let body = self.body(payload, indexes, session)?;
        let descriptor = self.reader.descriptor();
        DynamicMessage::decode(descriptor.clone(), body).map_err(|e| {
            format!(
                "protobuf: payload of {} bytes is not a `{}` message: {e}",
                body.len(),
                descriptor.full_name()
            )
        })
    }

    /// The message bytes of `payload`, its framing checked.
    fn body<'a>(
        &self,
        payload: &'a [u8],
        indexes: &mut Vec<i32>,
        session: &mut Session,
    ) -> Result<&'a [u8], String> {
        match self.framing {
            ProtoFraming::Plain => Ok(payload),
            ProtoFraming::Confluent => {
                let (id, rest) = wire::split(payload).map_err(|e| e.to_string())?;
                let body = read_message_indexes(rest, indexes)?;
                if let Some(writers) = &self.writers {
                    self.check_writer(writers.as_ref(), id, indexes, session)?;
                }
                Ok(body)
            }
        }
    }
}
