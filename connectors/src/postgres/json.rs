//! Lists, structs and maps as JSON text, written straight into the COPY buffer by Arrow's JSON
//! encoders. Floats and decimals are read back and written by serde_json, as they were when
//! the sink parsed Arrow's JSON into `serde_json::Value`s: the same numbers reach the column
//! (serde_json's reading of `0.9238829120510784` is not always the nearest double), without
//! the rest of the round trip.

use std::sync::{Arc, LazyLock};

use arrow_array::Array;
use arrow_json::writer::{make_encoder, Encoder, EncoderFactory, EncoderOptions, NullableEncoder};
use arrow_schema::{ArrowError, DataType, FieldRef};

/// The options of the encoders: Arrow's, with [`Numbers`] for floats and decimals.
pub fn options() -> EncoderOptions {
    EncoderOptions::default().with_encoder_factory(Arc::new(Numbers))
}

/// The encoder of a column's values (`field` describes the column; nulls at any depth below
/// the top are JSON `null`s or absent struct fields, as Arrow's JSON writer has them).
pub fn encoder<'a>(
    field: &'a FieldRef,
    array: &'a dyn Array,
    options: &'a EncoderOptions,
) -> Result<NullableEncoder<'a>, String> {
    make_encoder(field, array, options).map_err(|e| format!("as JSON: {e}"))
}

/// Floats and decimals as the serde_json round trip had them; everything else Arrow's.
#[derive(Debug)]
struct Numbers;

impl EncoderFactory for Numbers {
    fn make_default_encoder<'a>(
        &self,
        field: &'a FieldRef,
        array: &'a dyn Array,
        _options: &'a EncoderOptions,
    ) -> Result<Option<NullableEncoder<'a>>, ArrowError> {
        if !matches!(
            array.data_type(),
            DataType::Float16
                | DataType::Float32
                | DataType::Float64
                | DataType::Decimal32(..)
                | DataType::Decimal64(..)
                | DataType::Decimal128(..)
                | DataType::Decimal256(..)
        ) {
            return Ok(None);
        }
        static ARROW: LazyLock<EncoderOptions> = LazyLock::new(EncoderOptions::default);
        let arrow = make_encoder(field, array, &ARROW)?;
        let nulls = array.nulls().cloned();
        Ok(Some(NullableEncoder::new(
            Box::new(Reparsed {
                arrow,
                text: Vec::new(),
            }),
            nulls,
        )))
    }
}

/// Arrow's text of a number, read as a `serde_json::Number` and written again: the number a
/// `serde_json::Value` held (an `f64` for `0.5` or `12.50`), and `null` for what is not one
/// (NaN, infinities).
struct Reparsed<'a> {
    arrow: NullableEncoder<'a>,
    text: Vec<u8>,
}

impl Encoder for Reparsed<'_> {
    fn encode(&mut self, idx: usize, out: &mut Vec<u8>) {
        self.text.clear();
        self.arrow.encode(idx, &mut self.text);
        match serde_json::from_slice::<serde_json::Number>(&self.text) {
            // Writing a number into a Vec cannot fail.
            Ok(n) => {
                let _ = serde_json::to_writer(&mut *out, &n);
            }
            Err(_) => out.extend_from_slice(b"null"),
        }
    }
}
