//! Casts columns to another element type: a scalar column value by value, a tensor
//! (`FixedSizeList`) or list column element by element, keeping its per-row shape. It matches a
//! source's types to a model's (`float64` scores into a `float16` model, ids into `int32`).
//! A value that does not fit the new type (`"abc"` or `300` into `int8`, NaN into an integer)
//! makes its row a dead letter naming the column and the value.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, BooleanArray, RecordBatch};
use arrow_cast::display::{ArrayFormatter, FormatOptions};
use arrow_cast::{can_cast_types, cast_with_options, CastOptions};
use arrow_schema::{DataType, Field, FieldRef, Schema, SchemaRef};
use riffle_dataflow::dead_letter::DeadLetter;
use riffle_dataflow::{DataflowError, DataflowResult, Stage, StageOutput};

const NAME: &str = "cast";

/// The element types a column can be cast to, by their YAML names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CastType {
    Float16,
    Float32,
    Float64,
    Int8,
    Int16,
    Int32,
    Int64,
    Uint8,
    Uint16,
    Uint32,
    Uint64,
    Bool,
    /// Scalar columns only.
    String,
}

impl CastType {
    /// The Arrow type of one value.
    pub fn data_type(self) -> DataType {
        match self {
            CastType::Float16 => DataType::Float16,
            CastType::Float32 => DataType::Float32,
            CastType::Float64 => DataType::Float64,
            CastType::Int8 => DataType::Int8,
            CastType::Int16 => DataType::Int16,
            CastType::Int32 => DataType::Int32,
            CastType::Int64 => DataType::Int64,
            CastType::Uint8 => DataType::UInt8,
            CastType::Uint16 => DataType::UInt16,
            CastType::Uint32 => DataType::UInt32,
            CastType::Uint64 => DataType::UInt64,
            CastType::Bool => DataType::Boolean,
            CastType::String => DataType::Utf8,
        }
    }
}

impl fmt::Display for CastType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CastType::Float16 => "float16",
            CastType::Float32 => "float32",
            CastType::Float64 => "float64",
            CastType::Int8 => "int8",
            CastType::Int16 => "int16",
            CastType::Int32 => "int32",
            CastType::Int64 => "int64",
            CastType::Uint8 => "uint8",
            CastType::Uint16 => "uint16",
            CastType::Uint32 => "uint32",
            CastType::Uint64 => "uint64",
            CastType::Bool => "bool",
            CastType::String => "string",
        })
    }
}

/// YAML block of a `cast` stage.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CastConfig {
    /// Column → the element type it is cast to.
    pub columns: BTreeMap<String, CastType>,
}

/// The `cast` stage.
///
/// Casts each configured column to its element type; other columns pass through. Tensor
/// columns keep their per-row shape. Rows holding a value that cannot be converted are dead
/// letters; the others pass on.
///
/// # Examples
/// ```
/// use std::sync::Arc;
/// use arrow_array::cast::AsArray;
/// use arrow_array::types::{Float16Type, Int64Type};
/// use arrow_array::{ArrayRef, Float64Array, RecordBatch, StringArray};
/// use riffle_dataflow::Stage;
/// use riffle_operators::tabular::cast::Cast;
///
/// let batch = RecordBatch::try_from_iter(vec![
///     ("user", Arc::new(StringArray::from(vec!["7", "abc", "42"])) as ArrayRef),
///     ("score", Arc::new(Float64Array::from(vec![0.5, 1.0, 2.25])) as _),
/// ])
/// .unwrap();
/// let config = serde_json::json!({ "columns": { "user": "int64", "score": "float16" } });
/// let mut stage = Cast::new(serde_json::from_value(config).unwrap()).unwrap();
/// let out = stage.process_batch(&batch).unwrap();
///
/// // "abc" is no int64: its row is a dead letter, the others are cast.
/// let users = out.records.column(0).as_primitive::<Int64Type>();
/// assert_eq!(users.values(), &[7, 42]);
/// let scores = out.records.column(1).as_primitive::<Float16Type>();
/// assert_eq!(scores.value(1).to_f32(), 2.25);
/// assert_eq!(out.rejected.len(), 1);
/// assert_eq!(out.rejected[0].reason, r#"column `user`: cannot cast "abc" to int64"#);
/// ```
#[derive(Debug)]
pub struct Cast {
    config: CastConfig,
}

/// How one column is cast: to `lenient` first (list items nullable, so that a failed element
/// becomes a null instead of an error), then, once the failed rows are gone, to the output
/// field's own type (list items as non-nullable as the input's).
struct Plan {
    index: usize,
    to: CastType,
    lenient: DataType,
    field: FieldRef,
}

impl Cast {
    pub fn new(config: CastConfig) -> DataflowResult<Self> {
        if config.columns.is_empty() {
            return Err(DataflowError::Config(format!(
                "{NAME}: `columns` must name at least one column"
            ))
            .at("columns"));
        }
        Ok(Cast { config })
    }

    /// The cast of every configured column, in input order, and the output schema.
    fn plan(&self, input: &Schema) -> DataflowResult<(Vec<Plan>, SchemaRef)> {
        for name in self.config.columns.keys() {
            if input.column_with_name(name).is_none() {
                let available: Vec<&str> =
                    input.fields().iter().map(|f| f.name().as_str()).collect();
                return Err(DataflowError::schema(
                    name,
                    "a column to cast",
                    format!("no such column (input has: {})", available.join(", ")),
                )
                .at(format!("columns.{}", crate::key_segment(name))));
            }
        }
        let mut plans = Vec::with_capacity(self.config.columns.len());
        let mut fields = Vec::with_capacity(input.fields().len());
        for (index, field) in input.fields().iter().enumerate() {
            let Some(&to) = self.config.columns.get(field.name()) else {
                fields.push(field.clone());
                continue;
            };
            let at = format!("columns.{}", crate::key_segment(field.name()));
            let (lenient, output) = cast_types(field.data_type(), to)
                .ok_or_else(|| {
                    DataflowError::schema(
                        field.name(),
                        format!("a scalar, tensor or list column that casts to {to}"),
                        field.data_type().to_string(),
                    )
                })
                .map_err(|e| e.at(at.clone()))?;
            if !can_cast_types(field.data_type(), &lenient) {
                return Err(DataflowError::schema(
                    field.name(),
                    format!("a column that casts to {to}"),
                    field.data_type().to_string(),
                )
                .at(at));
            }
            // Keeping the metadata keeps a tensor's shape.
            let out = Arc::new(Field::clone(field).with_data_type(output));
            plans.push(Plan {
                index,
                to,
                lenient,
                field: out.clone(),
            });
            fields.push(out);
        }
        let schema = Schema::new_with_metadata(fields, input.metadata().clone());
        Ok((plans, Arc::new(schema)))
    }
}

/// The lenient and output types of a column of `from` cast to `to`: `None` for a string cast of
/// a list or tensor, or a nested type this stage does not cast.
fn cast_types(from: &DataType, to: CastType) -> Option<(DataType, DataType)> {
    let element = to.data_type();
    let item = |item: &FieldRef, nullable: bool| {
        Arc::new(
            Field::clone(item)
                .with_data_type(element.clone())
                .with_nullable(nullable),
        )
    };
    match from {
        DataType::FixedSizeList(i, size) if to != CastType::String => Some((
            DataType::FixedSizeList(item(i, true), *size),
            DataType::FixedSizeList(item(i, i.is_nullable()), *size),
        )),
        DataType::List(i) if to != CastType::String => Some((
            DataType::List(item(i, true)),
            DataType::List(item(i, i.is_nullable())),
        )),
        DataType::LargeList(i) if to != CastType::String => Some((
            DataType::LargeList(item(i, true)),
            DataType::LargeList(item(i, i.is_nullable())),
        )),
        DataType::FixedSizeList(..) | DataType::List(_) | DataType::LargeList(_) => None,
        DataType::Struct(_) | DataType::Map(..) | DataType::Union(..) => None,
        _ => Some((element.clone(), element)),
    }
}

/// For each row that held a value `before` whose cast `after` is null, the value.
fn failures(before: &dyn Array, after: &dyn Array) -> DataflowResult<Vec<(usize, String)>> {
    if before.null_count() == after.null_count() && nested_nulls(before) == nested_nulls(after) {
        return Ok(Vec::new());
    }
    let mut failed = Vec::new();
    for row in 0..before.len() {
        if before.is_null(row) {
            continue;
        }
        if after.is_null(row) {
            failed.push((row, format_value(before, row)?));
            continue;
        }
        // A list row whose own element failed.
        let items = match (before.data_type(), after.data_type()) {
            (DataType::FixedSizeList(..), DataType::FixedSizeList(..)) => Some((
                before.as_fixed_size_list().value(row),
                after.as_fixed_size_list().value(row),
            )),
            (DataType::List(_), DataType::List(_)) => Some((
                before.as_list::<i32>().value(row),
                after.as_list::<i32>().value(row),
            )),
            (DataType::LargeList(_), DataType::LargeList(_)) => Some((
                before.as_list::<i64>().value(row),
                after.as_list::<i64>().value(row),
            )),
            _ => None,
        };
        if let Some((b, a)) = items {
            if let Some((at, value)) = failures(b.as_ref(), a.as_ref())?.into_iter().next() {
                failed.push((row, format!("{value} (element {at})")));
            }
        }
    }
    Ok(failed)
}

/// Nulls among a list column's elements (0 for other columns).
fn nested_nulls(array: &dyn Array) -> usize {
    match array.data_type() {
        DataType::FixedSizeList(..) => array.as_fixed_size_list().values().null_count(),
        DataType::List(_) => array.as_list::<i32>().values().null_count(),
        DataType::LargeList(_) => array.as_list::<i64>().values().null_count(),
        _ => 0,
    }
}

/// The value at `row` as a dead letter quotes it (strings in quotes).
fn format_value(array: &dyn Array, row: usize) -> DataflowResult<String> {
    let text = ArrayFormatter::try_new(array, &FormatOptions::default())?
        .value(row)
        .to_string();
    Ok(match array.data_type() {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => format!("{text:?}"),
        _ => text,
    })
}

impl crate::StageKind for CastConfig {
    fn kind(&self) -> &'static str {
        NAME
    }

    fn output_schema(&self, input: &SchemaRef) -> DataflowResult<SchemaRef> {
        Cast::new(self.clone())?.output_schema(input)
    }

    fn build(
        &self,
        _ctx: &crate::StageContext<'_>,
    ) -> DataflowResult<riffle_dataflow::runtime::Step> {
        Ok(crate::kind::apply(Cast::new(self.clone())?))
    }
}

impl Stage for Cast {
    fn name(&self) -> &str {
        NAME
    }

    fn output_schema(&self, input: &SchemaRef) -> DataflowResult<SchemaRef> {
        self.plan(input).map(|(_, schema)| schema)
    }

    fn process_batch(&mut self, batch: &RecordBatch) -> DataflowResult<StageOutput> {
        let (plans, schema) = self.plan(batch.schema_ref())?;
        // Unconvertible values become nulls (`safe`), found by comparing with the input.
        let options = CastOptions {
            safe: true,
            ..CastOptions::default()
        };
        let mut columns = batch.columns().to_vec();
        let mut reasons: BTreeMap<usize, Vec<String>> = BTreeMap::new();
        for plan in &plans {
            let before = batch.column(plan.index);
            let after = cast_with_options(before, &plan.lenient, &options)?;
            for (row, value) in failures(before.as_ref(), after.as_ref())? {
                let column = plan.field.name();
                let reason = format!("column `{column}`: cannot cast {value} to {}", plan.to);
                reasons.entry(row).or_default().push(reason);
            }
            if let Some(slot) = columns.get_mut(plan.index) {
                *slot = after;
            }
        }
        let rejected: Vec<DeadLetter> = reasons
            .iter()
            .map(|(row, why)| DeadLetter::for_row(NAME, batch, *row, why.join("; ")))
            .collect();
        if !rejected.is_empty() {
            let failed: BTreeSet<usize> = reasons.into_keys().collect();
            let keep =
                BooleanArray::from_iter((0..batch.num_rows()).map(|r| Some(!failed.contains(&r))));
            columns = columns
                .iter()
                .map(|c| arrow_select::filter::filter(c.as_ref(), &keep))
                .collect::<Result<_, _>>()?;
        }
        for plan in &plans {
            if plan.lenient != *plan.field.data_type() {
                if let Some(slot) = columns.get_mut(plan.index) {
                    // No failed element is left, so the items fit the output's nullability.
                    *slot = arrow_cast::cast(slot.as_ref(), plan.field.data_type())?;
                }
            }
        }
        let records = RecordBatch::try_new(schema, columns)?;
        Ok(StageOutput { records, rejected })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::types::{
        Float16Type, Float32Type, Float64Type, Int16Type, Int64Type, Int8Type, UInt32Type,
    };
    use arrow_array::{
        ArrayRef, Float32Array, Float64Array, Int64Array, ListArray, StringArray, UInt64Array,
    };
    use riffle_dataflow::tensor::{
        bool_tensor_values, row_shape, tensor_column, tensor_field, tensor_values,
    };

    fn stage(columns: &[(&str, CastType)]) -> Cast {
        let columns = columns.iter().map(|(n, t)| (n.to_string(), *t)).collect();
        Cast::new(CastConfig { columns }).unwrap()
    }

    fn batch(columns: Vec<(&str, ArrayRef)>) -> RecordBatch {
        RecordBatch::try_from_iter(columns).unwrap()
    }

    #[test]
    fn yaml_names_and_unknown_types() {
        let config: CastConfig = serde_json::from_str(
            r#"{"columns": {"a": "float16", "b": "uint64", "c": "bool", "d": "string"}}"#,
        )
        .unwrap();
        let types: Vec<CastType> = config.columns.values().copied().collect();
        use CastType::*;
        assert_eq!(types, [Float16, Uint64, Bool, String]);
        let e = serde_json::from_str::<CastConfig>(r#"{"columns": {"a": "fp16"}}"#).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("unknown variant `fp16`"), "{text}");
        for name in ["float16", "int16", "uint32", "bool", "string"] {
            assert!(text.contains(name), "{text}");
        }
        let e = serde_json::from_str::<CastConfig>(r#"{"columns": {}, "x": 1}"#).unwrap_err();
        assert!(e.to_string().contains("unknown field `x`"), "{e}");
        assert!(Cast::new(CastConfig {
            columns: BTreeMap::new()
        })
        .is_err());
    }

    #[test]
    fn scalars_cast_and_other_columns_pass() {
        let input = batch(vec![
            ("id", Arc::new(Int64Array::from(vec![1, 2])) as ArrayRef),
            ("score", Arc::new(Float64Array::from(vec![0.5, -3.0])) as _),
            ("n", Arc::new(StringArray::from(vec!["1", "-2"])) as _),
            ("u", Arc::new(UInt64Array::from(vec![7, 8])) as _),
            ("t", Arc::new(StringArray::from(vec!["true", "false"])) as _),
        ]);
        let mut stage = stage(&[
            ("score", CastType::Float32),
            ("n", CastType::Int16),
            ("u", CastType::String),
            ("id", CastType::Bool),
            ("t", CastType::Bool),
        ]);
        let expected = stage.output_schema(input.schema_ref()).unwrap();
        let out = stage.process_batch(&input).unwrap();
        assert!(out.rejected.is_empty());
        assert_eq!(out.records.schema(), expected);
        let r = &out.records;
        assert_eq!(
            r.column(0).as_boolean().values().iter().collect::<Vec<_>>(),
            [true, true]
        );
        assert_eq!(
            r.column(1).as_primitive::<Float32Type>().values(),
            &[0.5, -3.0]
        );
        assert_eq!(r.column(2).as_primitive::<Int16Type>().values(), &[1, -2]);
        let u = r.column(3).as_string::<i32>();
        assert_eq!((u.value(0), u.value(1)), ("7", "8"));
        let t = r.column(4).as_boolean();
        assert_eq!(t.values().iter().collect::<Vec<_>>(), [true, false]);
    }

    #[test]
    fn unconvertible_values_are_dead_letters_naming_column_and_value() {
        let input = batch(vec![
            (
                "id",
                Arc::new(Int64Array::from(vec![1, 2, 3, 4])) as ArrayRef,
            ),
            (
                "n",
                Arc::new(StringArray::from(vec!["5", "abc", "6", "7"])) as _,
            ),
            ("big", Arc::new(Int64Array::from(vec![1, 2, 300, 4])) as _),
            (
                "f",
                Arc::new(Float64Array::from(vec![1.5, 2.0, 3.0, f64::NAN])) as _,
            ),
        ]);
        let mut stage = stage(&[
            ("n", CastType::Int64),
            ("big", CastType::Int8),
            ("f", CastType::Uint32),
        ]);
        let out = stage.process_batch(&input).unwrap();
        let reasons: Vec<&str> = out.rejected.iter().map(|l| l.reason.as_str()).collect();
        assert_eq!(
            reasons,
            [
                r#"column `n`: cannot cast "abc" to int64"#,
                "column `big`: cannot cast 300 to int8",
                "column `f`: cannot cast NaN to uint32",
            ]
        );
        assert!(out.rejected.iter().all(|l| l.stage == "cast"));
        assert!(
            out.rejected[0].record.contains(r#""id":2"#),
            "{:?}",
            out.rejected[0]
        );
        let r = &out.records;
        assert_eq!(r.num_rows(), 1);
        assert_eq!(r.column(0).as_primitive::<Int64Type>().values(), &[1]);
        assert_eq!(r.column(1).as_primitive::<Int64Type>().values(), &[5]);
        assert_eq!(r.column(2).as_primitive::<Int8Type>().values(), &[1]);
        // Truncation toward zero is a conversion, not a failure.
        assert_eq!(r.column(3).as_primitive::<UInt32Type>().values(), &[1]);
    }

    #[test]
    fn a_row_failing_in_two_columns_is_one_dead_letter() {
        let input = batch(vec![
            ("a", Arc::new(StringArray::from(vec!["x", "1"])) as ArrayRef),
            ("b", Arc::new(StringArray::from(vec!["y", "2"])) as _),
        ]);
        let out = stage(&[("a", CastType::Int32), ("b", CastType::Float32)])
            .process_batch(&input)
            .unwrap();
        assert_eq!(out.rejected.len(), 1);
        assert_eq!(
            out.rejected[0].reason,
            r#"column `a`: cannot cast "x" to int32; column `b`: cannot cast "y" to float32"#
        );
        assert_eq!(out.records.num_rows(), 1);
    }

    #[test]
    fn tensors_cast_element_wise_keeping_their_shape() {
        let field = tensor_field("image", DataType::Float32, &[2, 2]);
        let image = tensor_column::<Float32Type>(
            &field,
            vec![
                0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 70000.0, 3.5, 0.0, 1.0, 0.0, 2.0,
            ],
        )
        .unwrap();
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            field,
        ]));
        let input = RecordBatch::try_new(
            schema,
            vec![Arc::new(Int64Array::from(vec![1, 2, 3])), image],
        )
        .unwrap();
        let mut f16 = stage(&[("image", CastType::Float16)]);
        let out = f16.process_batch(&input).unwrap();
        assert!(out.rejected.is_empty());
        let image_field = out.records.schema().field(1).clone();
        assert_eq!(row_shape(&image_field).unwrap(), vec![2, 2]);
        let DataType::FixedSizeList(item, 4) = image_field.data_type() else {
            panic!("{image_field:?}");
        };
        assert_eq!(item.data_type(), &DataType::Float16);
        assert!(!item.is_nullable());
        let values = tensor_values::<Float16Type>(out.records.column(1).as_ref()).unwrap();
        assert_eq!(values[1].to_f32(), 0.5);
        // Beyond f16's range is infinity, as IEEE casts go, not a failure.
        assert!(values[6].to_f32().is_infinite());

        // 70000 does not fit an int16 element: that row is a dead letter.
        let mut i16s = stage(&[("image", CastType::Int16)]);
        let out = i16s.process_batch(&input).unwrap();
        assert_eq!(out.rejected.len(), 1);
        assert_eq!(
            out.rejected[0].reason,
            "column `image`: cannot cast 70000.0 (element 2) to int16"
        );
        assert!(out.rejected[0].record.contains(r#""id":2"#));
        let values = tensor_values::<Int16Type>(out.records.column(1).as_ref()).unwrap();
        assert_eq!(values, &[0, 0, 1, 1, 0, 1, 0, 2]);

        let mut bools = stage(&[("image", CastType::Bool)]);
        let out = bools.process_batch(&input.slice(2, 1)).unwrap();
        let values = bool_tensor_values(out.records.column(1).as_ref()).unwrap();
        assert_eq!(values, [false, true, false, true]);
    }

    #[test]
    fn lists_cast_element_wise() {
        let list = ListArray::from_iter_primitive::<Float64Type, _, _>(vec![
            Some(vec![Some(1.0), Some(2.0)]),
            None,
            Some(vec![Some(3.0)]),
        ]);
        let input = batch(vec![("feat", Arc::new(list) as ArrayRef)]);
        let mut stage = stage(&[("feat", CastType::Float32)]);
        let out = stage.process_batch(&input).unwrap();
        assert!(out.rejected.is_empty());
        let feat = out.records.column(0).as_list::<i32>();
        assert!(feat.is_null(1));
        let values = feat.values().as_primitive::<Float32Type>();
        assert_eq!(values.values(), &[1.0, 2.0, 3.0]);
    }

    #[test]
    fn schema_errors_are_located_at_the_column() {
        let input = batch(vec![
            ("id", Arc::new(Int64Array::from(vec![1])) as ArrayRef),
            (
                "list",
                Arc::new(ListArray::from_iter_primitive::<Float32Type, _, _>(vec![
                    Some(vec![Some(1.0)]),
                ])) as _,
            ),
        ]);
        let e = stage(&[("score", CastType::Float32)])
            .output_schema(input.schema_ref())
            .unwrap_err();
        assert_eq!(e.located().0, Some("columns.score"));
        assert!(
            e.to_string()
                .contains("no such column (input has: id, list)"),
            "{e}"
        );
        let e = stage(&[("list", CastType::String)])
            .output_schema(input.schema_ref())
            .unwrap_err();
        assert_eq!(e.located().0, Some("columns.list"));
        assert!(matches!(
            crate::unlocated(e),
            DataflowError::Schema { ref column, .. } if column == "list"
        ));
        // Nulls stay nulls, not failures.
        let nullable = batch(vec![(
            "x",
            Arc::new(Float32Array::from(vec![Some(1.0), None])) as ArrayRef,
        )]);
        let out = stage(&[("x", CastType::Int32)])
            .process_batch(&nullable)
            .unwrap();
        assert!(out.rejected.is_empty());
        assert!(out.records.column(0).is_null(1));
    }
}
