//! Protobuf payloads: messages decoded with a reader's descriptor into Arrow rows, and rows
//! encoded back into messages.
//!
//! - [`ProtoSchema`] (`schema/`; the Arrow mapping in `mapping.rs`, writer compatibility in
//!   `compat.rs`): a message type and its descriptor pool, from a `.proto` file (compiled
//!   in-process with protox), a `FileDescriptorSet` file, or a schema registry's `.proto` text
//!   with its references; and its Arrow schema.
//! - [`ProtobufDecoder`] (`decode/`; column builders in `columns.rs`, writer schemas in
//!   `writers.rs`): payloads, plain or in the Confluent framing, to batches; writer schemas
//!   named by the framing are checked once each for compatibility.
//! - [`ProtobufEncoder`] (`encode/`; a plan per column in `plan.rs`, values in `values.rs`):
//!   batches to payloads.
//!
//! # Arrow mapping
//!
//! | protobuf | Arrow |
//! |---|---|
//! | `int32`, `sint32`, `sfixed32` | `Int32` |
//! | `int64`, `sint64`, `sfixed64` | `Int64` |
//! | `uint32`, `fixed32` / `uint64`, `fixed64` | `UInt32` / `UInt64` |
//! | `float` / `double` / `bool` | `Float32` / `Float64` / `Boolean` |
//! | `string` / `bytes` | `Utf8` / `Binary` |
//! | enum | `Utf8`: the value's name (an unknown number as its decimal digits) |
//! | message | `Struct` of its fields |
//! | `google.protobuf.Timestamp` | `Timestamp(Microsecond, "+00:00")` (sub-microsecond digits are dropped) |
//! | `google.protobuf.Int64Value` and the other wrappers | the wrapped scalar, nullable |
//! | `repeated T` | `List<T>` (items not null) |
//! | `map<K, V>` | `Map<K, V>` (entries `key`, `value`, not null; keys in ascending order) |
//!
//! Columns are named by the proto field names (not the JSON camelCase ones), in declaration
//! order. A field with presence (`optional`, a message, a member of a `oneof`, proto2 fields)
//! is nullable: null when absent. Other proto3 fields are not null and read as their default
//! (0, `""`, the first enum value) when absent, as protobuf defines. Repeated and map fields
//! are never null (absent means empty). The time zone `+00:00` (not `UTC`) keeps Arrow's
//! offset parsing working without chrono-tz. Recursive message types have no Arrow type and
//! are refused when the schema is built.
//!
//! # Confluent framing
//!
//! After the registry's 5-byte prefix (`schema_registry::wire`), a Protobuf payload holds the
//! path of its message type in the schema's file: a zigzag varint count, then that many zigzag
//! varint indexes (top-level message index, then nested). The first message of the file, `[0]`,
//! is written as a single zero byte (count 0).

mod decode;
mod encode;
mod schema;

#[cfg(test)]
mod tests;

use std::path::PathBuf;

pub use decode::{ProtoFraming, ProtobufDecoder};
pub use encode::{EncodeFraming, ProtobufEncoder};
pub use schema::ProtoSchema;

/// Errors of loading Protobuf schemas and of encoding rows; each names the file, message,
/// field or column concerned and what was expected.
#[derive(Debug, thiserror::Error)]
pub enum ProtoFormatError {
    /// A schema file could not be read.
    #[error("cannot read {}: {cause}", path.display())]
    Read {
        path: PathBuf,
        cause: std::io::Error,
    },
    /// A `.proto` source (a file or a registered schema) does not compile, or a descriptor set
    /// does not decode.
    #[error("{file}: {what}")]
    Schema { file: String, what: String },
    /// The message named in the configuration is not in the schema.
    #[error("message `{message}` not found in {file}; it defines: {defined}")]
    MessageNotFound {
        message: String,
        file: String,
        defined: String,
    },
    /// A field whose type has no Arrow equivalent here.
    #[error("message `{message}`, field `{field}`: {what}")]
    Unsupported {
        message: String,
        field: String,
        what: String,
    },
    /// An input column of the encoder does not fit the message, or one of its values does not.
    #[error("column `{column}`: {what}")]
    Column { column: String, what: String },
    /// An Arrow array could not be built or cast.
    #[error("arrow: {0}")]
    Arrow(#[from] arrow_schema::ArrowError),
}

/// Reads the Confluent message indexes at the start of `buf` into `out` (the first message of
/// the file, `[0]`, when the count is 0) and returns the rest of `buf`: the message.
pub(crate) fn read_message_indexes<'a>(
    mut buf: &'a [u8],
    out: &mut Vec<i32>,
) -> Result<&'a [u8], String> {
    out.clear();
    let count = read_zigzag(&mut buf, "message index count")?;
    if count == 0 {
        out.push(0);
        return Ok(buf);
    }
    // Each index takes at least a byte: a larger count is garbage, not a long path.
    if count < 0 || count as usize > buf.len() {
        return Err(format!(
            "protobuf framing: message index count {count} does not fit the {} bytes after the schema id",
            buf.len()
        ));
    }
    for _ in 0..count {
        let index = read_zigzag(&mut buf, "message index")?;
        if index < 0 {
            return Err(format!(
                "protobuf framing: negative message index {index} (expected the position of a message in the schema's file)"
            ));
        }
        out.push(index);
    }
    Ok(buf)
}

fn read_zigzag(buf: &mut &[u8], what: &str) -> Result<i32, String> {
    let raw = prost::encoding::decode_varint(buf)
        .map_err(|e| format!("protobuf framing: bad {what} after the schema id: {e}"))?;
    let raw = u32::try_from(raw).map_err(|_| {
        format!("protobuf framing: {what} {raw} after the schema id is larger than 32 bits")
    })?;
    Ok((raw >> 1) as i32 ^ -((raw & 1) as i32))
}

/// Appends the Confluent message indexes of `indexes` to `out` (`[0]` as a single zero byte).
pub(crate) fn write_message_indexes(indexes: &[i32], out: &mut Vec<u8>) {
    if indexes == [0] {
        out.push(0);
        return;
    }
    let count = i32::try_from(indexes.len()).unwrap_or(i32::MAX);
    prost::encoding::encode_varint(zigzag(count), out);
    for &index in indexes {
        prost::encoding::encode_varint(zigzag(index), out);
    }
}

fn zigzag(n: i32) -> u64 {
    u64::from(((n << 1) ^ (n >> 31)) as u32)
}
