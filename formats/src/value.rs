//! Schema'd message values: where an Avro or Protobuf schema comes from (a file of the pipeline,
//! or a schema registry), and every value format's decoder and encoder behind one type, so the
//! Kafka source and sink treat JSON, CSV, Avro and Protobuf alike.
//!
//! Reading: the *reader* schema is fixed when the source opens (the declared file, else the
//! subject's latest version); each message's *writer* schema is found by the id in its framing
//! and read into the reader schema, so a producer moving to a compatible version goes on
//! without a restart and an incompatible one becomes dead letters.
//!
//! Writing: the sink's schema (declared, or derived from the results' columns for Avro) is
//! registered under its subject when the first batch is written, and every message carries its
//! id.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::{Schema, SchemaRef};
use bytes::Bytes;
use riffle_dataflow::dead_letter::DeadLetter;
use riffle_dataflow::DataflowResult;
use serde::Deserialize;

use super::avro::{AvroDecoder, AvroEncoder, AvroFraming};
use super::protobuf::{ProtoFraming, ProtoSchema, ProtobufDecoder, ProtobufEncoder};
use super::{Decoded, Decoder};
use crate::schema_registry::client::subject_for;
use crate::schema_registry::{
    RegisteredSchema, RegistryClient, RegistryConfig, SchemaLookup, SchemaType,
};

/// How schema'd payloads are framed.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum WireFraming {
    /// The schema registry's wire format: a zero byte, the schema id, then the payload (and,
    /// for Protobuf, the message's indexes). The default with a `schema_registry`.
    Confluent,
    /// The payload alone, written with the declared schema. The default without a registry.
    Plain,
}

/// `avro: { schema, framing }` of a Kafka source or sink.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct AvroValueConfig {
    /// An `.avsc` file. A source reads every message into it (its reader schema); a sink
    /// writes it (its fields must be columns of the results). Unset: a source takes the
    /// subject's latest version, a sink derives a schema from the results' columns.
    #[serde(default)]
    pub schema: Option<PathBuf>,
    #[serde(default)]
    pub framing: Option<WireFraming>,
}

/// `protobuf: { proto | descriptor_set, message, includes, framing }` of a Kafka source or sink.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ProtobufValueConfig {
    /// A `.proto` file, compiled when the pipeline is validated.
    #[serde(default)]
    pub proto: Option<PathBuf>,
    /// A `FileDescriptorSet` (`protoc --include_imports -o x.desc`).
    #[serde(default)]
    pub descriptor_set: Option<PathBuf>,
    /// The message type's full name (`shop.Click`); with a registry's schema, unset means the
    /// file's first message.
    #[serde(default)]
    pub message: Option<String>,
    /// Folders imports are found in (default: the `.proto` file's folder).
    #[serde(default)]
    pub includes: Vec<PathBuf>,
    #[serde(default)]
    pub framing: Option<WireFraming>,
}

/// The schema'd formats of a Kafka source or sink, as its configuration gives them.
#[derive(Clone, Copy, Debug)]
pub struct SchemaSettings<'a> {
    pub topic: &'a str,
    pub avro: Option<&'a AvroValueConfig>,
    pub protobuf: Option<&'a ProtobufValueConfig>,
    pub registry: Option<&'a RegistryConfig>,
    /// Framing that overrides the blocks' (`None`: as configured): checks and replays that
    /// work offline read and write plain payloads.
    pub framing: Option<WireFraming>,
}

/// Which schema'd format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SchemaFormat {
    Avro,
    Protobuf,
}

impl SchemaSettings<'_> {
    /// Paths of the avro/protobuf blocks, for validation to resolve against the pipeline's
    /// folder.
    pub fn paths_mut<'b>(
        avro: Option<&'b mut AvroValueConfig>,
        protobuf: Option<&'b mut ProtobufValueConfig>,
    ) -> Vec<&'b mut PathBuf> {
        let mut paths = Vec::new();
        if let Some(a) = avro {
            paths.extend(a.schema.as_mut());
        }
        if let Some(p) = protobuf {
            paths.extend(p.proto.as_mut());
            paths.extend(p.descriptor_set.as_mut());
            paths.extend(p.includes.iter_mut());
        }
        paths
    }

    fn framing(&self, format: SchemaFormat) -> WireFraming {
        let declared = self.framing.or(match format {
            SchemaFormat::Avro => self.avro.and_then(|a| a.framing),
            SchemaFormat::Protobuf => self.protobuf.and_then(|p| p.framing),
        });
        declared.unwrap_or(if self.registry.is_some() {
            WireFraming::Confluent
        } else {
            WireFraming::Plain
        })
    }

    fn client(&self) -> Result<Option<RegistryClient>, String> {
        self.registry
            .map(RegistryClient::new)
            .transpose()
            .map_err(|e| e.to_string())
    }

    /// The value subject: `subject`, else by the strategy (record names need the schema's).
    fn subject(&self, registry: &RegistryConfig, record: Option<&str>) -> Result<String, String> {
        subject_for(registry, self.topic, record).map_err(|e| {
            format!("{e}: expected `schema_registry.subject` or a declared schema file")
        })
    }

    /// The Arrow columns a reader of the declared schema (or, with a registry, the subject's
    /// latest version) gets.
    pub fn read_schema(&self, format: SchemaFormat) -> Result<SchemaRef, String> {
        let plain = SchemaSettings {
            framing: Some(WireFraming::Plain),
            ..*self
        };
        Ok(plain.decoder(format)?.schema().clone())
    }

    /// The decoder of a source's values: the reader schema declared or the subject's latest.
    pub fn decoder(&self, format: SchemaFormat) -> Result<ValueDecoder, String> {
        let client = self.client()?;
        let framing = self.framing(format);
        if framing == WireFraming::Confluent && client.is_none() {
            return Err(
                "`framing: confluent` finds each message's writer schema by its id: expected a \
                 `schema_registry`"
                    .into(),
            );
        }
        let writers = client.clone().map(|c| Arc::new(c) as Arc<dyn SchemaLookup>);
        match format {
            SchemaFormat::Avro => {
                let declared = self.avro.and_then(|a| a.schema.as_deref());
                let reader = match declared {
                    Some(path) => read_file(path, "avro.schema", "an Avro schema (.avsc)")?,
                    None => self
                        .latest(client.as_ref(), SchemaType::Avro, "avro.schema")?
                        .schema
                        .clone(),
                };
                let framing = match framing {
                    WireFraming::Confluent => AvroFraming::Confluent,
                    WireFraming::Plain => AvroFraming::Plain,
                };
                AvroDecoder::new(&reader, framing, writers)
                    .map(ValueDecoder::Avro)
                    .map_err(|e| match declared {
                        Some(path) => format!("avro.schema ({}): {e}", path.display()),
                        None => format!("the subject's latest Avro schema: {e}"),
                    })
            }
            SchemaFormat::Protobuf => {
                let reader = match self.declared_proto()? {
                    Some(schema) => schema,
                    None => {
                        let latest =
                            self.latest(client.as_ref(), SchemaType::Protobuf, "protobuf.proto")?;
                        let client = client.as_ref().ok_or("no registry")?;
                        let references = client.references(&latest).map_err(|e| e.to_string())?;
                        let message = self.protobuf.and_then(|p| p.message.as_deref());
                        ProtoSchema::from_registered(&latest, &references, message)
                            .map_err(|e| format!("the subject's latest Protobuf schema: {e}"))?
                    }
                };
                let framing = match framing {
                    WireFraming::Confluent => ProtoFraming::Confluent,
                    WireFraming::Plain => ProtoFraming::Plain,
                };
                ProtobufDecoder::new(reader, framing, writers)
                    .map(ValueDecoder::Protobuf)
                    .map_err(|e| e.to_string())
            }
        }
    }

    /// The Protobuf schema the pipeline file declares, if it does.
    fn declared_proto(&self) -> Result<Option<ProtoSchema>, String> {
        let Some(p) = self.protobuf else {
            return Ok(None);
        };
        let message = || {
            p.message.as_deref().ok_or_else(|| {
                "protobuf.message: expected the message type's full name (e.g. `shop.Click`)"
                    .to_string()
            })
        };
        match (&p.proto, &p.descriptor_set) {
            (Some(_), Some(_)) => {
                Err("protobuf: give `proto` or `descriptor_set`, not both".into())
            }
            (Some(proto), None) => ProtoSchema::from_proto_file(proto, &p.includes, message()?)
                .map(Some)
                .map_err(|e| format!("protobuf.proto ({}): {e}", proto.display())),
            (None, Some(set)) => ProtoSchema::from_descriptor_set(set, message()?)
                .map(Some)
                .map_err(|e| format!("protobuf.descriptor_set ({}): {e}", set.display())),
            (None, None) => Ok(None),
        }
    }

    /// The subject's latest schema, which must be of `expected` type.
    fn latest(
        &self,
        client: Option<&RegistryClient>,
        expected: SchemaType,
        key: &str,
    ) -> Result<Arc<RegisteredSchema>, String> {
        let (Some(client), Some(registry)) = (client, self.registry) else {
            return Err(format!(
                "no schema: expected `{key}` (a file) or a `schema_registry` holding the topic's schema"
            ));
        };
        let subject = self.subject(registry, None)?;
        let latest = client.latest(&subject).map_err(|e| {
            format!("{e} (the reader schema is the latest version of subject `{subject}`; declare `{key}` to read without one)")
        })?;
        if latest.schema_type != expected {
            return Err(format!(
                "subject `{subject}` holds a {:?} schema, not {expected:?}",
                latest.schema_type
            ));
        }
        Ok(latest)
    }

    /// The encoder of a sink's values for results of `input`, its schema registered (with a
    /// registry) so every message carries the id.
    pub fn encoder(&self, format: SchemaFormat, input: &Schema) -> Result<ValueEncoder, String> {
        let client = self.client()?;
        let framing = self.framing(format);
        let (encoder, text, record, schema_type) = match format {
            SchemaFormat::Avro => {
                let declared = self
                    .avro
                    .and_then(|a| a.schema.as_deref())
                    .map(|p| read_file(p, "avro.schema", "an Avro schema (.avsc)"))
                    .transpose()?;
                let encoder =
                    AvroEncoder::new(input, declared.as_deref(), &record_name(self.topic))
                        .map_err(|e| format!("avro: {e}"))?;
                let text = encoder.schema_text().to_string();
                let record = encoder.record_name();
                (Encoder::Avro(encoder), text, record, SchemaType::Avro)
            }
            SchemaFormat::Protobuf => {
                let schema = self.declared_proto()?.ok_or(
                    "protobuf: a sink writes a declared message: expected `protobuf.proto` (or \
                     `descriptor_set` without a registry) and `protobuf.message`",
                )?;
                let record = Some(schema.message_name().to_string());
                let text = schema.proto_text().map(str::to_string);
                let encoder = ProtobufEncoder::new(input, schema).map_err(|e| e.to_string())?;
                let text = match (text, framing) {
                    (Some(t), _) => t,
                    (None, WireFraming::Plain) => String::new(),
                    (None, WireFraming::Confluent) => {
                        return Err("protobuf: registering a schema needs its source: expected \
                                    `protobuf.proto` rather than `descriptor_set`"
                            .into())
                    }
                };
                (
                    Encoder::Protobuf(encoder),
                    text,
                    record,
                    SchemaType::Protobuf,
                )
            }
        };
        let id = match (framing, client, self.registry) {
            (WireFraming::Confluent, Some(client), Some(registry)) => {
                let subject = self.subject(registry, record.as_deref())?;
                if registry.auto_register {
                    Some(
                        client
                            .register(&subject, schema_type, &text, &[])
                            .map_err(|e| {
                                format!("registering the output schema under `{subject}`: {e}")
                            })?,
                    )
                } else {
                    let found = client.lookup(&subject, schema_type, &text).map_err(|e| {
                        format!("looking up the output schema under `{subject}`: {e}")
                    })?;
                    Some(found.ok_or_else(|| {
                        format!(
                            "the output schema is not registered under `{subject}` and \
                             `schema_registry.auto_register` is false: register it first, or \
                             set auto_register: true (the schema: {})",
                            super::excerpt(&text)
                        )
                    })?)
                }
            }
            (WireFraming::Confluent, _, _) => {
                return Err(
                    "`framing: confluent` needs the schema's id: expected a `schema_registry`"
                        .into(),
                )
            }
            (WireFraming::Plain, _, _) => None,
        };
        Ok(ValueEncoder { encoder, id })
    }
}

/// The record name of a schema derived from results written to `topic`.
fn record_name(topic: &str) -> String {
    let name: String = topic
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    match name.chars().next() {
        Some(c) if c.is_ascii_digit() => format!("riffle.r_{name}"),
        _ => format!("riffle.{name}"),
    }
}

fn read_file(path: &Path, key: &str, expected: &str) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| {
        format!(
            "{key}: cannot read {}: {e}; expected {expected}",
            path.display()
        )
    })
}

/// The decoder of a Kafka source's values, whatever their format.
#[derive(Clone, Debug)]
pub enum ValueDecoder {
    /// JSON or CSV.
    Text(Decoder),
    Avro(AvroDecoder),
    Protobuf(ProtobufDecoder),
}

impl ValueDecoder {
    /// The value columns.
    pub fn schema(&self) -> &SchemaRef {
        match self {
            ValueDecoder::Text(d) => d.schema(),
            ValueDecoder::Avro(d) => d.schema(),
            ValueDecoder::Protobuf(d) => d.schema(),
        }
    }

    /// Decodes `payloads`, rejecting the bad ones: `dead_letter(i, reason)` describes bad
    /// payload `i`.
    pub fn decode_or_reject(
        &self,
        payloads: &[&[u8]],
        mut dead_letter: impl FnMut(usize, String) -> DeadLetter,
    ) -> DataflowResult<Decoded> {
        match self {
            ValueDecoder::Text(d) => {
                d.decode_or_reject(payloads, |i, e| dead_letter(i, d.reason(e, None)))
            }
            ValueDecoder::Avro(d) => {
                d.decode_or_reject(payloads, |i, reason| dead_letter(i, reason.to_string()))
            }
            ValueDecoder::Protobuf(d) => {
                d.decode_or_reject(payloads, |i, reason| dead_letter(i, reason.to_string()))
            }
        }
    }
}

enum Encoder {
    Avro(AvroEncoder),
    Protobuf(ProtobufEncoder),
}

/// The encoder of a Kafka sink's Avro or Protobuf values, with the registered schema's id.
pub struct ValueEncoder {
    encoder: Encoder,
    /// The registered schema's id (`None`: plain payloads).
    id: Option<u32>,
}

impl std::fmt::Debug for ValueEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ValueEncoder")
            .field("id", &self.id)
            .finish()
    }
}

impl ValueEncoder {
    /// The registered schema's id.
    pub fn id(&self) -> Option<u32> {
        self.id
    }

    /// One payload per row of `batch`, in order.
    pub fn encode(&mut self, batch: &RecordBatch) -> Result<Vec<Bytes>, String> {
        match &mut self.encoder {
            Encoder::Avro(e) => {
                let framing = match self.id {
                    Some(id) => super::avro::EncodeFraming::Confluent(id),
                    None => super::avro::EncodeFraming::Plain,
                };
                e.encode(batch, framing)
                    .map_err(|e| format!("encoding Avro: {e}"))
            }
            Encoder::Protobuf(e) => {
                let framing = match self.id {
                    Some(id) => super::protobuf::EncodeFraming::Confluent(id),
                    None => super::protobuf::EncodeFraming::Plain,
                };
                e.encode(batch, framing)
                    .map_err(|e| format!("encoding Protobuf: {e}"))
            }
        }
    }
}
