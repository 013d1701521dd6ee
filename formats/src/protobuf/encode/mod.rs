//! Arrow rows to Protobuf payloads: each column converted to prost-reflect values, each row
//! set into a `DynamicMessage` and encoded by prost.
//!
//! - `plan.rs`: how each column becomes values of its field's type, checked once per encoder.
//! - `values.rs`: an array's values by its plan, one per row.

use std::fmt;

use arrow_array::RecordBatch;
use arrow_schema::DataType;
use bytes::Bytes;
use prost::Message as _;
use prost_reflect::{DynamicMessage, FieldDescriptor, Value};

use super::{write_message_indexes, ProtoFormatError, ProtoSchema};
use crate::schema_registry::wire;

mod plan;
mod values;

use plan::{plan_members, Member};
use values::values;

/// What is written around each message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EncodeFraming {
    /// The registry's prefix with this schema id, the message indexes, then the message.
    Confluent(u32),
    /// The message alone.
    Plain,
}

/// Encodes rows as messages of one type: each column fills the field of its name.
///
/// Accepted column types, by field type: `bool` ← Boolean; integers and enum numbers ← any
/// integer type (values out of the field's range are an error); `float`/`double` ← floats and
/// integers; `string` ← Utf8 (any width); `bytes` ← binary or Utf8; enums ← Utf8 value names or
/// integers; `Timestamp` ← Timestamp of any unit; wrappers ← their scalar; messages ← Struct
/// (each child a field, by name); `repeated` ← List, LargeList, FixedSizeList; maps ← Map or a
/// List of Struct<key, value>; a Null column ← anything. Null values leave their field unset;
/// null list items, map keys or map values are errors (protobuf has no place for them).
#[derive(Clone)]
pub struct ProtobufEncoder {
    schema: ProtoSchema,
    input: Vec<DataType>,
    members: Vec<Member>,
    /// The encoded message indexes, for the Confluent framing.
    indexes: Vec<u8>,
}

impl fmt::Debug for ProtobufEncoder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProtobufEncoder")
            .field("schema", &self.schema)
            .field(
                "columns",
                &self.members.iter().map(|m| &m.name).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl ProtobufEncoder {
    /// An encoder of rows of `input` as `schema`'s message. Every column must be a field of
    /// the message with a type that fits (see the type documentation); fields without a
    /// column are left unset.
    pub fn new(
        input: &arrow_schema::Schema,
        schema: ProtoSchema,
    ) -> Result<Self, ProtoFormatError> {
        let members = plan_members(schema.descriptor(), input.fields(), "")
            .map_err(|(column, what)| ProtoFormatError::Column { column, what })?;
        let mut indexes = Vec::new();
        write_message_indexes(&schema.message_indexes(), &mut indexes);
        Ok(ProtobufEncoder {
            input: input
                .fields()
                .iter()
                .map(|f| f.data_type().clone())
                .collect(),
            schema,
            members,
            indexes,
        })
    }

    /// One payload per row of `batch`, framed by `framing`.
    pub fn encode(
        &mut self,
        batch: &RecordBatch,
        framing: EncodeFraming,
    ) -> Result<Vec<Bytes>, ProtoFormatError> {
        let types: Vec<&DataType> = batch
            .schema_ref()
            .fields()
            .iter()
            .map(|f| f.data_type())
            .collect();
        if types.len() != self.input.len() || types.iter().zip(&self.input).any(|(a, b)| *a != b) {
            return Err(ProtoFormatError::Column {
                column: "(all)".into(),
                what: format!(
                    "batch columns ({}) differ from the columns the encoder was made for ({})",
                    join_types(types.iter().copied()),
                    join_types(self.input.iter())
                ),
            });
        }
        let mut columns = Vec::with_capacity(self.members.len());
        for member in &self.members {
            let array = batch.column(member.index);
            columns.push(
                values(&member.plan, array).map_err(|what| ProtoFormatError::Column {
                    column: member.name.clone(),
                    what,
                })?,
            );
        }
        let descriptor = self.schema.descriptor();
        let mut payloads = Vec::with_capacity(batch.num_rows());
        for row in 0..batch.num_rows() {
            let mut message = DynamicMessage::new(descriptor.clone());
            for (member, column) in self.members.iter().zip(columns.iter_mut()) {
                if let Some(value) = column.get_mut(row).and_then(Option::take) {
                    set(&mut message, &member.field, value).map_err(|what| {
                        ProtoFormatError::Column {
                            column: member.name.clone(),
                            what: format!("row {row}: {what}"),
                        }
                    })?;
                }
            }
            let mut buf =
                Vec::with_capacity(message.encoded_len() + wire::PREFIX_LEN + self.indexes.len());
            if let EncodeFraming::Confluent(id) = framing {
                buf.extend_from_slice(&wire::prefix(id));
                buf.extend_from_slice(&self.indexes);
            }
            message
                .encode(&mut buf)
                .map_err(|e| ProtoFormatError::Column {
                    column: "(all)".into(),
                    what: format!("row {row}: {e}"),
                })?;
            payloads.push(Bytes::from(buf));
        }
        Ok(payloads)
    }
}

fn join_types<'a>(types: impl Iterator<Item = &'a DataType>) -> String {
    types.map(|t| t.to_string()).collect::<Vec<_>>().join(", ")
}

fn set(message: &mut DynamicMessage, field: &FieldDescriptor, value: Value) -> Result<(), String> {
    message
        .try_set_field(field, value)
        .map_err(|e| format!("field `{}`: {e}", field.name()))
}
