//! Keeps the listed columns, in the listed order, optionally renaming some of them: the last
//! stage before a sink usually trims tensors and scratch columns this way.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::{Field, FieldRef, Schema, SchemaRef};
use riffle_dataflow::{DataflowError, DataflowResult, Stage, StageOutput};

const NAME: &str = "select";

/// YAML block of a `select` stage.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SelectConfig {
    /// Input columns to keep, in output order.
    pub columns: Vec<String>,
    /// Input name to output name, for some of `columns`.
    #[serde(default)]
    pub rename: BTreeMap<String, String>,
}

/// The `select` stage.
///
/// Gives the sink exactly the columns it should write, in a fixed order and under the names
/// consumers expect, leaving tensors and scratch columns behind.
///
/// # Examples
/// ```
/// use std::sync::Arc;
/// use arrow_array::{ArrayRef, Float32Array, Int64Array, RecordBatch, StringArray};
/// use riffle_dataflow::Stage;
/// use riffle_operators::tabular::select::Select;
///
/// let batch = RecordBatch::try_from_iter(vec![
///     ("frame", Arc::new(Int64Array::from(vec![7, 8])) as ArrayRef),
///     ("scratch", Arc::new(Float32Array::from(vec![0.0, 0.0])) as _),
///     ("top_label", Arc::new(StringArray::from(vec!["tabby", "bicycle"])) as _),
/// ])
/// .unwrap();
/// let config = serde_json::json!({
///     "columns": ["top_label", "frame"],
///     "rename": { "top_label": "label" },
/// });
/// let mut stage = Select::new(serde_json::from_value(config).unwrap()).unwrap();
/// let out = stage.process_batch(&batch).unwrap().records;
///
/// let names: Vec<_> = out.schema().fields().iter().map(|f| f.name().clone()).collect();
/// assert_eq!(names, ["label", "frame"]);
/// assert_eq!(out.column(0), batch.column(2)); // same values, new name
/// ```
#[derive(Debug)]
pub struct Select {
    config: SelectConfig,
}

impl Select {
    pub fn new(config: SelectConfig) -> DataflowResult<Self> {
        if config.columns.is_empty() {
            return Err(DataflowError::Config(format!(
                "{NAME}: `columns` must list at least one column"
            ))
            .at("columns"));
        }
        if let Some(extra) = config.rename.keys().find(|k| !config.columns.contains(k)) {
            return Err(DataflowError::Config(format!(
                "{NAME}: rename of `{extra}`, which is not in `columns`"
            ))
            .at(format!("rename.{}", crate::key_segment(extra))));
        }
        let mut seen = BTreeSet::new();
        for name in &config.columns {
            let out = config.rename.get(name).unwrap_or(name);
            if !seen.insert(out) {
                return Err(DataflowError::Config(format!(
                    "{NAME}: output column `{out}` would appear twice"
                ))
                .at("rename"));
            }
        }
        Ok(Select { config })
    }

    /// Input index and output field of every selected column.
    fn plan(&self, input: &Schema) -> DataflowResult<(Vec<usize>, Vec<FieldRef>)> {
        let mut indices = Vec::with_capacity(self.config.columns.len());
        let mut fields = Vec::with_capacity(self.config.columns.len());
        for (i, name) in self.config.columns.iter().enumerate() {
            let (index, field) = input.column_with_name(name).ok_or_else(|| {
                let available: Vec<&str> =
                    input.fields().iter().map(|f| f.name().as_str()).collect();
                DataflowError::schema(
                    name,
                    "a column to select",
                    format!("no such column (input has: {})", available.join(", ")),
                )
                .at(format!("columns[{i}]"))
            })?;
            indices.push(index);
            fields.push(match self.config.rename.get(name) {
                // Renaming keeps the field's metadata, so a tensor's shape survives.
                Some(new_name) => Arc::new(Field::clone(field).with_name(new_name)),
                None => Arc::new(field.clone()),
            });
        }
        Ok((indices, fields))
    }
}

impl crate::StageKind for SelectConfig {
    fn kind(&self) -> &'static str {
        "select"
    }

    fn output_schema(&self, input: &SchemaRef) -> DataflowResult<SchemaRef> {
        // Building this stage is cheap (no engine): its own check is the one rule.
        Select::new(self.clone())?.output_schema(input)
    }

    fn build(
        &self,
        _ctx: &crate::StageContext<'_>,
    ) -> DataflowResult<riffle_dataflow::runtime::Step> {
        Ok(crate::kind::apply(Select::new(self.clone())?))
    }
}

impl Stage for Select {
    fn name(&self) -> &str {
        NAME
    }

    fn output_schema(&self, input: &SchemaRef) -> DataflowResult<SchemaRef> {
        let (_, fields) = self.plan(input)?;
        Ok(Arc::new(Schema::new_with_metadata(
            fields,
            input.metadata().clone(),
        )))
    }

    fn process_batch(&mut self, batch: &RecordBatch) -> DataflowResult<StageOutput> {
        let (indices, fields) = self.plan(batch.schema_ref())?;
        let schema = Arc::new(Schema::new_with_metadata(
            fields,
            batch.schema_ref().metadata().clone(),
        ));
        let columns = indices.iter().map(|&i| batch.column(i).clone()).collect();
        Ok(StageOutput::all(RecordBatch::try_new(schema, columns)?))
    }

    fn preserves_rows(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Float32Type, Int64Type};
    use arrow_array::{ArrayRef, Int64Array, StringArray};
    use arrow_schema::DataType;
    use riffle_dataflow::tensor::{row_shape, tensor_column, tensor_field};

    fn batch() -> RecordBatch {
        let tensor = tensor_field("logits", DataType::Float32, &[1, 2]);
        let logits = tensor_column::<Float32Type>(&tensor, vec![0.0, 1.0, 2.0, 3.0]).unwrap();
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("path", DataType::Utf8, false),
            tensor,
        ]));
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(vec![7, 8])),
            Arc::new(StringArray::from(vec!["a.jpg", "b.jpg"])),
            logits,
        ];
        RecordBatch::try_new(schema, columns).unwrap()
    }

    #[test]
    fn keeps_orders_and_renames() {
        let mut stage = Select::new(SelectConfig {
            columns: vec!["logits".into(), "id".into()],
            rename: BTreeMap::from([("id".to_string(), "frame".to_string())]),
        })
        .unwrap();
        let input = batch();
        let expected = stage.output_schema(input.schema_ref()).unwrap();
        let out = stage.process_batch(&input).unwrap().records;
        assert_eq!(out.schema(), expected);
        let names: Vec<&str> = expected
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect();
        assert_eq!(names, vec!["logits", "frame"]);
        assert_eq!(row_shape(expected.field(0)).unwrap(), vec![1, 2]);
        let frames = out.column(1).as_primitive::<Int64Type>();
        assert_eq!(frames.values().as_ref(), &[7, 8]);
    }

    #[test]
    fn missing_column_and_bad_config() {
        let stage = Select::new(SelectConfig {
            columns: vec!["id".into(), "score".into()],
            rename: BTreeMap::new(),
        })
        .unwrap();
        match stage
            .output_schema(&batch().schema())
            .map_err(crate::unlocated)
        {
            Err(DataflowError::Schema { column, found, .. }) => {
                assert_eq!(column, "score");
                assert!(found.contains("id, path, logits"), "{found}");
            }
            other => panic!("expected a schema error, got {other:?}"),
        }
        let clash = SelectConfig {
            columns: vec!["id".into(), "path".into()],
            rename: BTreeMap::from([("id".to_string(), "path".to_string())]),
        };
        assert!(Select::new(clash).is_err());
        let stray = SelectConfig {
            columns: vec!["id".into()],
            rename: BTreeMap::from([("path".to_string(), "p".to_string())]),
        };
        assert!(Select::new(stray).is_err());
    }
}
