//! Avro message values: Kafka payloads to Arrow rows ([`AvroDecoder`]) and Arrow rows to
//! payloads ([`AvroEncoder`]), in the schema registry's framing (a zero byte, the writer
//! schema's id as 4 big-endian bytes, the datum) or as bare datums.
//!
//! The binary encoding and schema resolution are arrow-avro's: a payload written with any
//! compatible version of a schema (fields added with defaults, fields removed, promotions) is
//! read into the one reader schema, so every batch has the same columns.
//!
//! Object container files (`.avro`) are a source of their own: `riffle_connectors::avro`.

mod decode;
mod encode;

#[cfg(test)]
mod tests;

pub use decode::AvroDecoder;
pub use encode::AvroEncoder;

/// What a Kafka message value holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AvroFraming {
    /// The schema registry's framing: a zero byte, the writer schema's id (4 bytes, big
    /// endian), then the datum, read with the writer schema the registry holds for that id.
    Confluent,
    /// A bare Avro datum written with the reader schema itself.
    Plain,
}

/// How [`AvroEncoder::encode`] frames each row's datum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EncodeFraming {
    /// The schema registry's framing, with the id the writer schema is registered under.
    Confluent(u32),
    /// The bare datum.
    Plain,
}

/// Errors of building an Avro decoder or encoder, and of encoding.
#[derive(Debug, thiserror::Error)]
pub enum AvroFormatError {
    /// The reader schema is not valid Avro, or not a record arrow-avro can decode into rows.
    #[error("invalid Avro reader schema: {0}")]
    ReaderSchema(String),
    /// The declared writer schema is not valid Avro, or not a record.
    #[error("invalid Avro writer schema: {0}")]
    WriterSchema(String),
    /// The results' columns cannot be written with the Avro schema.
    #[error("{0}")]
    Columns(String),
    /// The decoder was asked for the registry's framing but given nowhere to find writer schemas.
    #[error("the schema registry framing needs the registry to find each writer schema by id")]
    NoLookup,
    /// Encoding a batch failed.
    #[error("encoding Avro: {0}")]
    Encode(String),
}
