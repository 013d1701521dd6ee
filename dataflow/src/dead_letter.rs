//! Records that could not be processed, and why.
//!
//! Every dead letter names the stage that rejected it, the reason, and the record itself as
//! JSON of its small columns (ids, paths, offsets; binary payloads and tensors are left out),
//! so a user can find the input that failed.

use std::sync::Arc;

use arrow_array::{Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};

use crate::error::DataflowResult;

/// One rejected record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadLetter {
    pub stage: String,
    pub reason: String,
    /// JSON object describing the record.
    pub record: String,
}

impl DeadLetter {
    /// Describes row `row` of `batch` as rejected by `stage` for `reason`.
    pub fn for_row(stage: &str, batch: &RecordBatch, row: usize, reason: impl ToString) -> Self {
        DeadLetter {
            stage: stage.to_string(),
            reason: reason.to_string(),
            record: describe_row(batch, row),
        }
    }
}

/// Schema of dead-letter batches.
pub fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("stage", DataType::Utf8, false),
        Field::new("reason", DataType::Utf8, false),
        Field::new("record", DataType::Utf8, false),
    ]))
}

/// Dead letters as a batch in [`schema`].
pub fn to_batch(letters: &[DeadLetter]) -> DataflowResult<RecordBatch> {
    let col = |f: fn(&DeadLetter) -> &str| -> Arc<dyn Array> {
        Arc::new(StringArray::from_iter_values(letters.iter().map(f)))
    };
    Ok(RecordBatch::try_new(
        schema(),
        vec![col(|l| &l.stage), col(|l| &l.reason), col(|l| &l.record)],
    )?)
}

/// JSON object of the row's scalar columns (numbers, strings, booleans).
pub fn describe_row(batch: &RecordBatch, row: usize) -> String {
    if row >= batch.num_rows() {
        return "{}".to_string();
    }
    let scalar: Vec<usize> = batch
        .schema()
        .fields()
        .iter()
        .enumerate()
        .filter(|(_, f)| {
            let t = f.data_type();
            t.is_numeric() || matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Boolean)
        })
        .map(|(i, _)| i)
        .collect();
    let described = batch
        .project(&scalar)
        .map(|b| b.slice(row, 1))
        .and_then(|b| {
            let mut writer = arrow_json::LineDelimitedWriter::new(Vec::new());
            writer.write(&b)?;
            writer.finish()?;
            Ok(writer.into_inner())
        });
    match described {
        Ok(bytes) => String::from_utf8_lossy(&bytes).trim_end().to_string(),
        Err(e) => format!("{{\"describe_error\":{:?}}}", e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{BinaryArray, Int64Array};

    #[test]
    fn describes_scalar_columns_and_skips_payloads() {
        let batch = RecordBatch::try_from_iter(vec![
            (
                "camera_id",
                Arc::new(StringArray::from(vec!["a", "b"])) as _,
            ),
            ("frame", Arc::new(Int64Array::from(vec![7, 8])) as _),
            (
                "bytes",
                Arc::new(BinaryArray::from_vec(vec![b"x", b"y"])) as _,
            ),
        ])
        .unwrap();
        let letter = DeadLetter::for_row("decode", &batch, 1, "truncated JPEG");
        assert_eq!(letter.record, r#"{"camera_id":"b","frame":8}"#);
        let out = to_batch(&[letter]).unwrap();
        assert_eq!(out.num_rows(), 1);
        assert_eq!(out.schema(), schema());
    }
}
