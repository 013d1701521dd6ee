//! Keeps the rows whose column satisfies a comparison, e.g. `top_score >= 0.8` or
//! `detections` non-empty. Rows with a null in the column never match.

use std::cmp::Ordering;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    ArrowPrimitiveType, Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, Int8Type,
    UInt16Type, UInt32Type, UInt64Type, UInt8Type,
};
use arrow_array::{Array, BooleanArray, RecordBatch};
use arrow_schema::{DataType, SchemaRef};
use arrow_select::filter::filter_record_batch;
use riffle_dataflow::{DataflowError, DataflowResult, Stage, StageOutput};

const NAME: &str = "filter";

/// Comparison applied to the column.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FilterOp {
    Eq,
    Ne,
    Gt,
    Ge,
    Lt,
    Le,
    /// A list with at least one element, or a string with at least one character.
    NonEmpty,
}

impl FilterOp {
    fn needs_value(self) -> bool {
        !matches!(self, FilterOp::NonEmpty)
    }

    /// Whether `ordering` (column value against the configured value) satisfies the op.
    fn holds(self, ordering: Option<Ordering>) -> bool {
        // `None` is an unordered comparison (NaN): only `ne` holds, as with f64 operators.
        match (self, ordering) {
            (FilterOp::Eq, Some(o)) => o.is_eq(),
            (FilterOp::Ne, Some(o)) => o.is_ne(),
            (FilterOp::Ne, None) => true,
            (FilterOp::Gt, Some(o)) => o.is_gt(),
            (FilterOp::Ge, Some(o)) => o.is_ge(),
            (FilterOp::Lt, Some(o)) => o.is_lt(),
            (FilterOp::Le, Some(o)) => o.is_le(),
            _ => false,
        }
    }
}

/// The value compared against; YAML `0.8`, `person` and `true` map to the three variants.
#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(untagged)]
pub enum FilterValue {
    Number(f64),
    Text(String),
    Bool(bool),
}

/// YAML block of a `filter` stage.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FilterConfig {
    pub column: String,
    pub op: FilterOp,
    /// Required by every op except `non_empty`.
    #[serde(default)]
    pub value: Option<FilterValue>,
}

/// The `filter` stage.
///
/// Passes on only the rows worth sending downstream, e.g. confident classifications or frames
/// with at least one detection; the other rows are dropped, not dead-lettered.
///
/// # Examples
/// ```
/// use std::sync::Arc;
/// use arrow_array::cast::AsArray;
/// use arrow_array::types::Int64Type;
/// use arrow_array::{ArrayRef, Float32Array, Int64Array, RecordBatch};
/// use riffle_dataflow::Stage;
/// use riffle_operators::tabular::filter::Filter;
///
/// let scores = Float32Array::from(vec![Some(0.9), Some(0.4), None, Some(0.5)]);
/// let batch = RecordBatch::try_from_iter(vec![
///     ("frame", Arc::new(Int64Array::from(vec![1, 2, 3, 4])) as ArrayRef),
///     ("top_score", Arc::new(scores) as _),
/// ])
/// .unwrap();
/// let config = serde_json::json!({ "column": "top_score", "op": "ge", "value": 0.5 });
/// let mut stage = Filter::new(serde_json::from_value(config).unwrap()).unwrap();
/// let out = stage.process_batch(&batch).unwrap();
///
/// // A null score never matches.
/// let frames = out.records.column_by_name("frame").unwrap().as_primitive::<Int64Type>();
/// assert_eq!(frames.values().as_ref(), [1, 4]);
/// assert!(out.rejected.is_empty());
/// ```
#[derive(Debug)]
pub struct Filter {
    config: FilterConfig,
}

impl Filter {
    pub fn new(config: FilterConfig) -> DataflowResult<Self> {
        match (config.op.needs_value(), &config.value) {
            (true, None) => Err(DataflowError::Config(format!(
                "{NAME}: op {:?} on `{}` needs a value",
                config.op, config.column
            ))
            .at("op")),
            (false, Some(_)) => Err(DataflowError::Config(format!(
                "{NAME}: op non_empty on `{}` takes no value",
                config.column
            ))
            .at("value")),
            _ => Ok(Filter { config }),
        }
    }

    /// Checks the column's type fits the op and value (so mistakes surface at validation).
    fn check(&self, data_type: &DataType) -> DataflowResult<()> {
        let column = &self.config.column;
        let fits = match (&self.config.value, self.config.op) {
            (None, FilterOp::NonEmpty) => is_list(data_type) || is_string(data_type),
            (Some(FilterValue::Number(_)), _) => is_number(data_type),
            (Some(FilterValue::Text(_)), _) => is_string(data_type),
            (Some(FilterValue::Bool(_)), FilterOp::Eq | FilterOp::Ne) => {
                data_type == &DataType::Boolean
            }
            _ => false,
        };
        if fits {
            return Ok(());
        }
        let expected = match (&self.config.value, self.config.op) {
            (None, _) => "a list or string column for non_empty",
            (Some(FilterValue::Number(_)), _) => "an integer or float column for a number value",
            (Some(FilterValue::Text(_)), _) => "a Utf8 column for a text value",
            (Some(FilterValue::Bool(_)), FilterOp::Eq | FilterOp::Ne) => {
                "a Boolean column for a boolean value"
            }
            (Some(FilterValue::Bool(_)), _) => "eq or ne for a boolean value",
        };
        Err(DataflowError::schema(
            column,
            expected,
            data_type.to_string(),
        ))
    }

    /// Which rows of `column` match.
    fn mask(&self, column: &dyn Array) -> DataflowResult<BooleanArray> {
        let op = self.config.op;
        let mask = match &self.config.value {
            None => non_empty(column),
            Some(FilterValue::Number(v)) => {
                let values = as_f64(&self.config.column, column)?;
                values
                    .into_iter()
                    .map(|x| x.is_some_and(|x| op.holds(x.partial_cmp(v))))
                    .collect()
            }
            Some(FilterValue::Text(v)) => {
                let cmp = |s: Option<&str>| s.is_some_and(|s| op.holds(Some(s.cmp(v.as_str()))));
                match column.data_type() {
                    DataType::LargeUtf8 => column.as_string::<i64>().iter().map(cmp).collect(),
                    DataType::Utf8View => column.as_string_view().iter().map(cmp).collect(),
                    _ => column.as_string::<i32>().iter().map(cmp).collect(),
                }
            }
            Some(FilterValue::Bool(v)) => column
                .as_boolean()
                .iter()
                .map(|b| b.is_some_and(|b| op.holds(Some(b.cmp(v)))))
                .collect(),
        };
        Ok(mask)
    }
}

fn is_number(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::UInt8
            | DataType::UInt16
            | DataType::UInt32
            | DataType::UInt64
            | DataType::Float32
            | DataType::Float64
    )
}

fn is_string(t: &DataType) -> bool {
    matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
}

fn is_list(t: &DataType) -> bool {
    matches!(
        t,
        DataType::List(_) | DataType::LargeList(_) | DataType::FixedSizeList(_, _)
    )
}

/// A numeric column's values widened to f64 (nulls as `None`).
fn as_f64(name: &str, column: &dyn Array) -> DataflowResult<Vec<Option<f64>>> {
    fn widen<T: ArrowPrimitiveType>(
        column: &dyn Array,
        to_f64: impl Fn(T::Native) -> f64,
    ) -> Vec<Option<f64>> {
        column
            .as_primitive::<T>()
            .iter()
            .map(|v| v.map(&to_f64))
            .collect()
    }
    Ok(match column.data_type() {
        DataType::Int8 => widen::<Int8Type>(column, f64::from),
        DataType::Int16 => widen::<Int16Type>(column, f64::from),
        DataType::Int32 => widen::<Int32Type>(column, f64::from),
        // Beyond 2^53 the comparison is approximate, which is fine for thresholds.
        DataType::Int64 => widen::<Int64Type>(column, |v| v as f64),
        DataType::UInt8 => widen::<UInt8Type>(column, f64::from),
        DataType::UInt16 => widen::<UInt16Type>(column, f64::from),
        DataType::UInt32 => widen::<UInt32Type>(column, f64::from),
        DataType::UInt64 => widen::<UInt64Type>(column, |v| v as f64),
        DataType::Float32 => widen::<Float32Type>(column, f64::from),
        DataType::Float64 => widen::<Float64Type>(column, |v| v),
        other => {
            return Err(DataflowError::schema(
                name,
                "an integer or float column",
                other.to_string(),
            ))
        }
    })
}

/// Rows whose list or string value has at least one element; nulls do not match.
fn non_empty(column: &dyn Array) -> BooleanArray {
    let valid = |i: usize| column.is_valid(i);
    let rows = 0..column.len();
    match column.data_type() {
        DataType::List(_) => {
            let list = column.as_list::<i32>();
            rows.map(|i| valid(i) && list.value_length(i) > 0).collect()
        }
        DataType::LargeList(_) => {
            let list = column.as_list::<i64>();
            rows.map(|i| valid(i) && list.value_length(i) > 0).collect()
        }
        DataType::FixedSizeList(_, size) => rows.map(|i| valid(i) && *size > 0).collect(),
        DataType::LargeUtf8 => {
            let s = column.as_string::<i64>();
            rows.map(|i| valid(i) && !s.value(i).is_empty()).collect()
        }
        DataType::Utf8View => {
            let s = column.as_string_view();
            rows.map(|i| valid(i) && !s.value(i).is_empty()).collect()
        }
        DataType::Utf8 => {
            let s = column.as_string::<i32>();
            rows.map(|i| valid(i) && !s.value(i).is_empty()).collect()
        }
        // `check` rejects every other type before data flows.
        _ => rows.map(|_| false).collect(),
    }
}

impl crate::StageKind for FilterConfig {
    fn kind(&self) -> &'static str {
        "filter"
    }

    fn output_schema(&self, input: &SchemaRef) -> DataflowResult<SchemaRef> {
        // Building this stage is cheap (no engine): its own check is the one rule.
        Filter::new(self.clone())?.output_schema(input)
    }

    fn build(
        &self,
        _ctx: &crate::StageContext<'_>,
    ) -> DataflowResult<riffle_dataflow::runtime::Step> {
        Ok(crate::kind::apply(Filter::new(self.clone())?))
    }
}

impl Stage for Filter {
    fn name(&self) -> &str {
        NAME
    }

    fn output_schema(&self, input: &SchemaRef) -> DataflowResult<SchemaRef> {
        let field = input.field_with_name(&self.config.column).map_err(|_| {
            DataflowError::schema(
                &self.config.column,
                "a column to filter on",
                "no such column",
            )
            .at("column")
        })?;
        self.check(field.data_type()).map_err(|e| e.at("column"))?;
        Ok(input.clone())
    }

    fn process_batch(&mut self, batch: &RecordBatch) -> DataflowResult<StageOutput> {
        self.output_schema(batch.schema_ref())?;
        let column = batch.column_by_name(&self.config.column).ok_or_else(|| {
            DataflowError::schema(
                &self.config.column,
                "a column to filter on",
                "no such column",
            )
        })?;
        let mask = self.mask(column.as_ref())?;
        Ok(StageOutput::all(filter_record_batch(batch, &mask)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use arrow_array::{ArrayRef, Float32Array, Int64Array, ListArray, StringArray};

    fn batch() -> RecordBatch {
        let tags = ListArray::from_iter_primitive::<Int32Type, _, _>(vec![
            Some(vec![Some(1)]),
            Some(vec![]),
            None,
            Some(vec![Some(2), Some(3)]),
        ]);
        RecordBatch::try_from_iter(vec![
            (
                "id",
                Arc::new(Int64Array::from(vec![1, 2, 3, 4])) as ArrayRef,
            ),
            (
                "score",
                Arc::new(Float32Array::from(vec![
                    Some(0.9),
                    Some(0.2),
                    None,
                    Some(0.5),
                ])),
            ),
            (
                "label",
                Arc::new(StringArray::from(vec![
                    Some("cat"),
                    Some(""),
                    Some("dog"),
                    Some("cat"),
                ])),
            ),
            (
                "ok",
                Arc::new(BooleanArray::from(vec![true, false, true, false])),
            ),
            ("tags", Arc::new(tags)),
        ])
        .unwrap()
    }

    fn ids(op: FilterOp, column: &str, value: Option<FilterValue>) -> Vec<i64> {
        let mut stage = Filter::new(FilterConfig {
            column: column.to_string(),
            op,
            value,
        })
        .unwrap();
        let input = batch();
        assert_eq!(
            stage.output_schema(input.schema_ref()).unwrap(),
            input.schema()
        );
        let out = stage.process_batch(&input).unwrap().records;
        out.column(0).as_primitive::<Int64Type>().values().to_vec()
    }

    #[test]
    fn numeric_comparisons() {
        let n = |v| Some(FilterValue::Number(v));
        assert_eq!(ids(FilterOp::Gt, "score", n(0.4)), vec![1, 4]);
        assert_eq!(ids(FilterOp::Le, "score", n(0.5)), vec![2, 4]);
        assert_eq!(ids(FilterOp::Eq, "id", n(3.0)), vec![3]);
        assert_eq!(ids(FilterOp::Ne, "id", n(3.0)), vec![1, 2, 4]);
        assert_eq!(ids(FilterOp::Ge, "id", n(3.0)), vec![3, 4]);
        assert_eq!(ids(FilterOp::Lt, "id", n(2.0)), vec![1]);
    }

    #[test]
    fn text_bool_and_non_empty() {
        let t = |v: &str| Some(FilterValue::Text(v.to_string()));
        assert_eq!(ids(FilterOp::Eq, "label", t("cat")), vec![1, 4]);
        assert_eq!(ids(FilterOp::Gt, "label", t("cat")), vec![3]);
        assert_eq!(
            ids(FilterOp::Eq, "ok", Some(FilterValue::Bool(true))),
            vec![1, 3]
        );
        assert_eq!(ids(FilterOp::NonEmpty, "tags", None), vec![1, 4]);
        assert_eq!(ids(FilterOp::NonEmpty, "label", None), vec![1, 3, 4]);
    }

    #[test]
    fn config_and_schema_errors() {
        let cfg = |op, column: &str, value| FilterConfig {
            column: column.to_string(),
            op,
            value,
        };
        assert!(matches!(
            Filter::new(cfg(FilterOp::Gt, "score", None)).map_err(crate::unlocated),
            Err(DataflowError::Config(_))
        ));
        let schema = batch().schema();
        let wrong = Filter::new(cfg(FilterOp::Gt, "label", Some(FilterValue::Number(1.0))));
        assert!(matches!(
            wrong
                .unwrap()
                .output_schema(&schema)
                .map_err(crate::unlocated),
            Err(DataflowError::Schema { .. })
        ));
        let empty_num = Filter::new(cfg(FilterOp::NonEmpty, "score", None)).unwrap();
        assert!(empty_num.output_schema(&schema).is_err());
        let missing = Filter::new(cfg(FilterOp::Eq, "nope", Some(FilterValue::Bool(true))));
        let err = missing.unwrap().output_schema(&schema).unwrap_err();
        assert!(err.to_string().contains("nope"), "{err}");
    }

    #[test]
    fn op_and_value_deserialize_from_plain_scalars() {
        use serde::de::value::{BoolDeserializer, Error, I64Deserializer, StrDeserializer};
        use serde::Deserialize;
        let op = FilterOp::deserialize(StrDeserializer::<Error>::new("non_empty")).unwrap();
        assert_eq!(op, FilterOp::NonEmpty);
        let ge = FilterOp::deserialize(StrDeserializer::<Error>::new("ge")).unwrap();
        assert_eq!(ge, FilterOp::Ge);
        let n = FilterValue::deserialize(I64Deserializer::<Error>::new(3)).unwrap();
        assert_eq!(n, FilterValue::Number(3.0));
        let t = FilterValue::deserialize(StrDeserializer::<Error>::new("cat")).unwrap();
        assert_eq!(t, FilterValue::Text("cat".into()));
        let b = FilterValue::deserialize(BoolDeserializer::<Error>::new(true)).unwrap();
        assert_eq!(b, FilterValue::Bool(true));
    }
}
