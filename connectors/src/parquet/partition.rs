//! Splitting a batch by its `partition_by` columns into one batch per hive folder, without
//! those columns (the folder holds their value, as Hive, Spark and DuckDB lay it out).

use std::collections::HashMap;

use arrow_array::{RecordBatch, UInt32Array};
use arrow_cast::display::{ArrayFormatter, FormatOptions};
use arrow_schema::{DataType, Schema};
use riffle_dataflow::{DataflowError, DataflowResult};

use super::layout::partition_segment;

/// What a `partition_by` column may be.
pub const EXPECTED: &str =
    "a primitive column (integer, float, decimal, boolean, string, date, time or timestamp)";

/// Whether a column of type `t` can name a folder.
pub fn can_partition(t: &DataType) -> bool {
    t.is_primitive()
        || matches!(
            t,
            DataType::Boolean | DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
        )
}

/// `schema` checked against `partition_by`: every key a primitive column, and some column left
/// to write. Returns the schema of the files (without the keys).
pub fn check(schema: &Schema, partition_by: &[String]) -> Result<Schema, String> {
    for key in partition_by {
        match schema.field_with_name(key) {
            Ok(field) if can_partition(field.data_type()) => {}
            Ok(field) => {
                return Err(format!(
                    "partition_by: column `{key}` is {}, expected {EXPECTED}",
                    field.data_type()
                ))
            }
            Err(_) => {
                let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
                return Err(format!(
                    "partition_by: no column `{key}` in the results (expected one of: {})",
                    names.join(", ")
                ));
            }
        }
    }
    let fields: Vec<_> = schema
        .fields()
        .iter()
        .filter(|f| !partition_by.contains(f.name()))
        .cloned()
        .collect();
    if fields.is_empty() {
        return Err(
            "partition_by names every column: expected at least one column left to write".into(),
        );
    }
    Ok(Schema::new_with_metadata(fields, schema.metadata().clone()))
}

/// Splits batches by the values of `keys`.
#[derive(Clone, Debug, Default)]
pub struct Partitioner {
    keys: Vec<String>,
}

impl Partitioner {
    pub fn new(keys: Vec<String>) -> Self {
        Partitioner { keys }
    }

    /// `(folder, rows without the key columns)` for each distinct folder, in order of first
    /// appearance; one `("", batch)` when not partitioned.
    pub fn split(&self, batch: &RecordBatch) -> DataflowResult<Vec<(String, RecordBatch)>> {
        if self.keys.is_empty() {
            return Ok(vec![(String::new(), batch.clone())]);
        }
        let schema = batch.schema();
        let mut key_columns = Vec::with_capacity(self.keys.len());
        for key in &self.keys {
            let index = schema.index_of(key).map_err(|_| {
                DataflowError::schema(key.clone(), EXPECTED, "no such column in the results")
            })?;
            key_columns.push(index);
        }
        let options = FormatOptions::default();
        let mut formatters = Vec::with_capacity(key_columns.len());
        for (&index, key) in key_columns.iter().zip(&self.keys) {
            let column = batch.column(index);
            let formatter = ArrayFormatter::try_new(column.as_ref(), &options)?;
            formatters.push((key.as_str(), column, formatter));
        }
        let mut groups: Vec<(String, Vec<u32>)> = Vec::new();
        let mut by_folder: HashMap<String, usize> = HashMap::new();
        for row in 0..batch.num_rows() {
            let segments: Vec<String> = formatters
                .iter()
                .map(|(key, column, formatter)| {
                    let value = (!column.is_null(row)).then(|| formatter.value(row).to_string());
                    partition_segment(key, value.as_deref())
                })
                .collect();
            let folder = segments.join("/");
            let row = u32::try_from(row).map_err(|_| {
                DataflowError::Config(format!(
                    "parquet sink: a batch of {} rows is too large to partition",
                    batch.num_rows()
                ))
            })?;
            match by_folder.get(&folder) {
                Some(&at) => {
                    if let Some((_, rows)) = groups.get_mut(at) {
                        rows.push(row);
                    }
                }
                None => {
                    by_folder.insert(folder.clone(), groups.len());
                    groups.push((folder, vec![row]));
                }
            }
        }
        let data: Vec<usize> = (0..schema.fields().len())
            .filter(|i| !key_columns.contains(i))
            .collect();
        let data = batch.project(&data)?;
        let mut out = Vec::with_capacity(groups.len());
        for (folder, rows) in groups {
            let part = if rows.len() == batch.num_rows() {
                data.clone()
            } else {
                arrow_select::take::take_record_batch(&data, &UInt32Array::from(rows))?
            };
            out.push((folder, part));
        }
        Ok(out)
    }
}
