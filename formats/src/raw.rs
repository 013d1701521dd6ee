//! `raw` and `jpeg` payloads: kept whole, as one binary column. A JPEG is not decoded here;
//! the `decode` stage of the pipeline does that, so a corrupt image becomes a dead letter there.

use std::sync::Arc;

use arrow_array::builder::BinaryBuilder;
use arrow_array::ArrayRef;
use arrow_schema::{DataType, Field};

/// Name of the column holding undecoded payloads (the images source uses the same name).
pub const BYTES: &str = "bytes";

/// The `bytes` column's field.
pub fn bytes_field() -> Field {
    Field::new(BYTES, DataType::Binary, false)
}

/// The payloads as a `bytes` column; `total` (their summed length) sizes the buffer.
pub fn bytes_column<'a>(payloads: impl Iterator<Item = &'a [u8]>, total: usize) -> ArrayRef {
    let (rows, _) = payloads.size_hint();
    let mut bytes = BinaryBuilder::with_capacity(rows, total);
    for payload in payloads {
        bytes.append_value(payload);
    }
    Arc::new(bytes.finish())
}
