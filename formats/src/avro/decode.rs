//! Kafka message values to Arrow rows, read into one reader schema whatever version of it
//! each message was written with.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use arrow_array::{RecordBatch, RecordBatchOptions};
use arrow_avro::reader::{Decoder, DecoderMode, ReaderBuilder};
use arrow_avro::schema::{AvroSchema, Fingerprint, FingerprintAlgorithm, SchemaStore};
use arrow_schema::{ArrowError, SchemaRef};
use riffle_dataflow::dead_letter::DeadLetter;
use riffle_dataflow::{DataflowError, DataflowResult};

use super::{AvroFormatError, AvroFraming};
use crate::schema_registry::{wire, RegistryError, SchemaLookup, SchemaType};
use crate::{excerpt, Decoded};

/// Decodes Avro payloads into batches of the reader schema's columns.
///
/// Each writer schema id seen gets an arrow-avro decoder from that writer schema to the reader
/// schema, built once and kept for the life of this value (so is an id that cannot be read:
/// unknown, not Avro, or incompatible); only a registry that cannot be reached is asked again,
/// with the next batch. A clone starts with no decoders of its own (one per worker), so the
/// lock around them is never contended.
pub struct AvroDecoder {
    shared: Arc<Shared>,
    state: Mutex<State>,
}

struct Shared {
    reader: AvroSchema,
    schema: SchemaRef,
    framing: AvroFraming,
    writers: Option<Arc<dyn SchemaLookup>>,
}

/// Decoders by writer schema id (`None`: the reader schema itself, for plain payloads).
#[derive(Default)]
struct State {
    writers: HashMap<Option<u32>, Writer>,
}

enum Writer {
    Ready(Box<Ready>),
    /// Why payloads of this writer are rejected; the registry's answer will not change.
    Unusable(String),
}

struct Ready {
    writer: AvroSchema,
    decoder: Decoder,
}

impl Clone for AvroDecoder {
    fn clone(&self) -> Self {
        AvroDecoder {
            shared: self.shared.clone(),
            state: Mutex::new(State::default()),
        }
    }
}

impl fmt::Debug for AvroDecoder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AvroDecoder")
            .field("framing", &self.shared.framing)
            .field("schema", &self.shared.schema)
            .field("writers", &self.shared.writers)
            .finish()
    }
}

/// A decoder of bare datums written with `writer`, read as `reader`. Its batch holds any
/// number of rows: every call to [`decode_or_reject`](AvroDecoder::decode_or_reject) flushes it.
pub(super) fn unframed(writer: &AvroSchema, reader: &AvroSchema) -> Result<Decoder, ArrowError> {
    let fingerprint = Fingerprint::Id(0);
    let mut store = SchemaStore::new_with_type(FingerprintAlgorithm::Id);
    store.set(fingerprint, writer.clone())?;
    ReaderBuilder::new()
        .with_batch_size(usize::MAX)
        .with_decoder_mode(DecoderMode::UnframedDatum)
        .with_writer_schema_store(store)
        .with_active_fingerprint(fingerprint)
        .with_reader_schema(reader.clone())
        .build_decoder()
}

impl AvroDecoder {
    /// A decoder into `reader_schema` (Avro JSON). With [`AvroFraming::Confluent`], writer
    /// schemas are found by id in `writers`, which must be given.
    pub fn new(
        reader_schema: &str,
        framing: AvroFraming,
        writers: Option<Arc<dyn SchemaLookup>>,
    ) -> Result<Self, AvroFormatError> {
        if framing == AvroFraming::Confluent && writers.is_none() {
            return Err(AvroFormatError::NoLookup);
        }
        let reader = AvroSchema::new(reader_schema.to_string());
        let decoder = unframed(&reader, &reader)
            .map_err(|e| AvroFormatError::ReaderSchema(excerpt(&e.to_string())))?;
        let schema = decoder.schema();
        let mut state = State::default();
        if framing == AvroFraming::Plain {
            let ready = Ready {
                writer: reader.clone(),
                decoder,
            };
            state.writers.insert(None, Writer::Ready(Box::new(ready)));
        }
        Ok(AvroDecoder {
            shared: Arc::new(Shared {
                reader,
                schema,
                framing,
                writers,
            }),
            state: Mutex::new(state),
        })
    }

    /// The columns of the decoded batches: the reader schema as arrow-avro maps it.
    pub fn schema(&self) -> &SchemaRef {
        &self.shared.schema
    }

    /// Decodes `payloads` into rows in payload order, rejecting those that cannot be read:
    /// `dead_letter(i, reason)` describes bad payload `i`. Consecutive payloads of one writer
    /// are decoded in one sequence; a bad one costs its run a second pass over the rows before
    /// it.
    pub fn decode_or_reject(
        &self,
        payloads: &[&[u8]],
        mut dead_letter: impl FnMut(usize, &str) -> DeadLetter,
    ) -> DataflowResult<Decoded> {
        let shared = &*self.shared;
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let mut out = Out {
            batches: Vec::new(),
            kept: Vec::with_capacity(payloads.len()),
            reasons: Vec::new(),
        };
        let mut bodies: Vec<Body<'_>> = Vec::with_capacity(payloads.len());
        for (index, payload) in payloads.iter().enumerate() {
            match shared.framing {
                AvroFraming::Plain => bodies.push(Body {
                    index,
                    writer: None,
                    bytes: payload,
                }),
                AvroFraming::Confluent => match wire::split(payload) {
                    Ok((id, bytes)) => bodies.push(Body {
                        index,
                        writer: Some(id),
                        bytes,
                    }),
                    Err(e) => out.reasons.push((index, e.to_string())),
                },
            }
        }
        // Registry outages met in this call: asked once per call, not cached.
        let mut unreachable: HashMap<u32, String> = HashMap::new();
        for run in bodies.chunk_by(|a, b| a.writer == b.writer) {
            let Some(writer) = run.first().map(|b| b.writer) else {
                continue;
            };
            match state.ready(shared, writer, &mut unreachable) {
                Ok(ready) => ready.decode_run(shared, run, &mut out)?,
                Err(reason) => out
                    .reasons
                    .extend(run.iter().map(|b| (b.index, reason.clone()))),
            }
        }
        // A registry that cannot be reached (after the client's retries) says nothing about
        // the messages: stop rather than turn good messages into dead letters.
        if let Some(reason) = unreachable.values().next() {
            return Err(riffle_dataflow::DataflowError::stage(
                "source",
                format!("{reason}; stopping rather than rejecting messages that may be good (raise schema_registry.timeout_ms to ride out longer outages)"),
            ));
        }
        out.finish(&shared.schema, &mut dead_letter)
    }
}

/// A payload's datum and the id of the schema it was written with.
struct Body<'a> {
    index: usize,
    writer: Option<u32>,
    bytes: &'a [u8],
}

/// What a call has decoded so far.
struct Out {
    batches: Vec<RecordBatch>,
    kept: Vec<usize>,
    /// Bad payloads by index, with their reasons (not yet excerpted).
    reasons: Vec<(usize, String)>,
}

impl Out {
    fn finish(
        mut self,
        schema: &SchemaRef,
        dead_letter: &mut impl FnMut(usize, &str) -> DeadLetter,
    ) -> DataflowResult<Decoded> {
        // Runs are decoded in payload order, so `kept` is ascending and the batches in order.
        let batch = match self.batches.len() {
            0 => RecordBatch::new_empty(schema.clone()),
            1 => self.batches.swap_remove(0),
            _ => arrow_select::concat::concat_batches(schema, &self.batches)?,
        };
        Ok(Decoded {
            batch,
            kept: self.kept,
            rejected: rejected(self.reasons, dead_letter),
        })
    }
}

fn rejected(
    mut reasons: Vec<(usize, String)>,
    dead_letter: &mut impl FnMut(usize, &str) -> DeadLetter,
) -> Vec<DeadLetter> {
    reasons.sort_by_key(|(index, _)| *index);
    reasons
        .into_iter()
        .map(|(index, reason)| dead_letter(index, &excerpt(&reason)))
        .collect()
}

/// How a writer schema could not be had.
enum Unusable {
    /// For good: the registry answered.
    Permanent(String),
    /// The registry could not be reached: asked again with the next batch.
    Transient(String),
}

impl State {
    /// The decoder of payloads written with schema `writer`, or why they cannot be read.
    fn ready(
        &mut self,
        shared: &Shared,
        writer: Option<u32>,
        unreachable: &mut HashMap<u32, String>,
    ) -> Result<&mut Ready, String> {
        if let Some(reason) = writer.and_then(|id| unreachable.get(&id)) {
            return Err(reason.clone());
        }
        let entry = match self.writers.entry(writer) {
            Entry::Occupied(occupied) => occupied.into_mut(),
            Entry::Vacant(vacant) => match fetch(shared, writer) {
                Ok(ready) => vacant.insert(Writer::Ready(Box::new(ready))),
                Err(Unusable::Permanent(reason)) => vacant.insert(Writer::Unusable(reason)),
                Err(Unusable::Transient(reason)) => {
                    if let Some(id) = writer {
                        unreachable.insert(id, reason.clone());
                    }
                    return Err(reason);
                }
            },
        };
        match entry {
            Writer::Ready(ready) => Ok(ready),
            Writer::Unusable(reason) => Err(reason.clone()),
        }
    }
}

/// Builds the decoder of writer schema `writer` (fetched by id) into the reader schema.
fn fetch(shared: &Shared, writer: Option<u32>) -> Result<Ready, Unusable> {
    let Some(id) = writer else {
        return unframed(&shared.reader, &shared.reader)
            .map(|decoder| Ready {
                writer: shared.reader.clone(),
                decoder,
            })
            .map_err(|e| Unusable::Permanent(format!("the reader schema does not build: {e}")));
    };
    let lookup = shared
        .writers
        .as_ref()
        .ok_or_else(|| Unusable::Permanent(AvroFormatError::NoLookup.to_string()))?;
    let registered = match lookup.by_id(id) {
        Ok(registered) => registered,
        Err(e @ RegistryError::Request { .. }) => {
            return Err(Unusable::Transient(format!(
                "writer schema id {id} could not be fetched: {e}"
            )))
        }
        Err(e) => {
            return Err(Unusable::Permanent(format!(
                "writer schema id {id} could not be fetched: {e}"
            )))
        }
    };
    let kind = match registered.schema_type {
        SchemaType::Avro => None,
        SchemaType::Protobuf => Some("PROTOBUF"),
        SchemaType::Json => Some("JSON"),
    };
    if let Some(kind) = kind {
        return Err(Unusable::Permanent(format!(
            "writer schema id {id} is a {kind} schema, not Avro"
        )));
    }
    if !registered.references.is_empty() {
        let names: Vec<&str> = registered
            .references
            .iter()
            .map(|r| r.name.as_str())
            .collect();
        return Err(Unusable::Permanent(format!(
            "writer schema id {id} references other schemas ({}), which Avro decoding does not \
             resolve: expected a self-contained schema",
            names.join(", ")
        )));
    }
    let writer = AvroSchema::new(registered.schema.clone());
    match unframed(&writer, &shared.reader) {
        Ok(decoder) => Ok(Ready { writer, decoder }),
        Err(e) => Err(Unusable::Permanent(format!(
            "writer schema id {id} cannot be read as the reader schema: {e}"
        ))),
    }
}

impl Ready {
    /// Decodes a run of payloads of this writer into `out`. A bad payload (a datum that does
    /// not decode, or bytes left over after it) is rejected; since the decoder may then hold
    /// part of a row, it is rebuilt and the good rows before it decoded again and flushed.
    fn decode_run(
        &mut self,
        shared: &Shared,
        run: &[Body<'_>],
        out: &mut Out,
    ) -> DataflowResult<()> {
        let mut good: Vec<usize> = Vec::with_capacity(run.len());
        for (position, body) in run.iter().enumerate() {
            let bad = match self.decoder.decode(body.bytes) {
                Ok(read) if read == body.bytes.len() => None,
                Ok(read) => {
                    let left = body.bytes.len() - read;
                    Some(format!(
                        "{left} byte{} left over after the Avro datum ({read} of {} bytes read{})",
                        if left == 1 { "" } else { "s" },
                        body.bytes.len(),
                        body.writer
                            .map(|id| format!(", writer schema id {id}"))
                            .unwrap_or_default()
                    ))
                }
                Err(e) => Some(format!(
                    "Avro datum does not decode{}: {e}",
                    written_with(body.writer)
                )),
            };
            let Some(reason) = bad else {
                good.push(position);
                continue;
            };
            out.reasons.push((body.index, reason));
            self.decoder = unframed(&self.writer, &shared.reader)?;
            for &g in &good {
                if let Some(body) = run.get(g) {
                    self.decoder.decode(body.bytes).map_err(|e| {
                        DataflowError::stage(
                            "source",
                            format!("an Avro datum that decoded once does not decode again: {e}"),
                        )
                    })?;
                }
            }
            self.flush(shared, run, &mut good, out)?;
        }
        self.flush(shared, run, &mut good, out)
    }

    /// Moves the decoded rows (of `run`'s payloads at `good`) to `out`.
    fn flush(
        &mut self,
        shared: &Shared,
        run: &[Body<'_>],
        good: &mut Vec<usize>,
        out: &mut Out,
    ) -> DataflowResult<()> {
        if good.is_empty() {
            return Ok(());
        }
        let batch = self
            .decoder
            .flush()
            .map_err(|e| DataflowError::stage("source", format!("flushing Avro rows: {e}")))?;
        if let Some(batch) = batch {
            out.batches.push(with_schema(batch, &shared.schema)?);
        }
        out.kept
            .extend(good.drain(..).filter_map(|g| run.get(g).map(|b| b.index)));
        Ok(())
    }
}

/// `batch`'s columns under the reader schema's fields: writers' decoders give the same types,
/// and every batch shares one schema.
fn with_schema(batch: RecordBatch, schema: &SchemaRef) -> DataflowResult<RecordBatch> {
    if batch.schema_ref() == schema {
        return Ok(batch);
    }
    let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
    Ok(RecordBatch::try_new_with_options(
        schema.clone(),
        batch.columns().to_vec(),
        &options,
    )?)
}

fn written_with(writer: Option<u32>) -> String {
    match writer {
        Some(id) => format!(" with writer schema id {id}"),
        None => String::new(),
    }
}
