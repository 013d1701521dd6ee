//! Gathers numeric columns into one tensor column: k scalar columns (listed, or all those
//! whose name starts with a prefix) or one list column of k values per row become a `[k]`
//! tensor per row, the input a tabular model takes.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, BooleanArray, FixedSizeListArray, RecordBatch};
use arrow_cast::cast::{cast_with_options, CastOptions};
use arrow_schema::{DataType, Field, FieldRef, Schema, SchemaRef};
use riffle_dataflow::dead_letter::DeadLetter;
use riffle_dataflow::tensor::tensor_field;
use riffle_dataflow::{DataflowError, DataflowResult, Stage, StageOutput};
use serde_inline_default::serde_inline_default;

use values::{convertible, gather, unconverted};

const NAME: &str = "tensor";

/// Element type of the tensor a `tensor` stage makes.
#[derive(Clone, Copy, Debug, Default, serde::Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum TensorDtype {
    #[default]
    Float32,
    Float64,
    Float16,
    Int64,
    Int32,
}

impl TensorDtype {
    pub fn data_type(self) -> DataType {
        match self {
            TensorDtype::Float32 => DataType::Float32,
            TensorDtype::Float64 => DataType::Float64,
            TensorDtype::Float16 => DataType::Float16,
            TensorDtype::Int64 => DataType::Int64,
            TensorDtype::Int32 => DataType::Int32,
        }
    }

    /// Its name in the pipeline file.
    pub fn name(self) -> &'static str {
        match self {
            TensorDtype::Float32 => "float32",
            TensorDtype::Float64 => "float64",
            TensorDtype::Float16 => "float16",
            TensorDtype::Int64 => "int64",
            TensorDtype::Int32 => "int32",
        }
    }
}

/// YAML block of a `tensor` stage: exactly one of `columns`, `columns_prefix` and `from`.
#[serde_inline_default]
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorConfig {
    /// The tensor column to create.
    pub output: String,
    /// Scalar columns, one tensor element each, in this order.
    #[serde(default)]
    pub columns: Option<Vec<String>>,
    /// Every column whose name starts with this, in the input's order.
    #[serde(default)]
    pub columns_prefix: Option<String>,
    /// One List, LargeList or FixedSizeList column of `length` numbers per row.
    #[serde(default)]
    pub from: Option<String>,
    /// Values per row of `from` (required for List and LargeList; a row with another number
    /// is a dead letter).
    #[serde(default)]
    pub length: Option<usize>,
    /// Element type of the tensor.
    #[serde(default)]
    pub dtype: TensorDtype,
    /// Remove the source columns from the output.
    #[serde_inline_default(true)]
    pub drop_inputs: bool,
}

/// The `tensor` stage.
///
/// Tabular models take one `[N, k]` tensor per input, while records carry their features as
/// separate columns or as JSON arrays: this stage makes the tensor, converting values with
/// arrow-cast (text that parses as a number is taken). A row it cannot make a tensor row of (a
/// null, a value that is not a number, a NaN for an integer tensor, a list of another length)
/// becomes a dead letter naming the column; the other rows go on.
///
/// # Examples
/// ```
/// use std::sync::Arc;
/// use arrow_array::cast::AsArray;
/// use arrow_array::types::Float32Type;
/// use arrow_array::{ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray};
/// use riffle_dataflow::tensor::row_shape;
/// use riffle_dataflow::Stage;
/// use riffle_operators::tabular::tensor_stage::Tensor;
///
/// let batch = RecordBatch::try_from_iter(vec![
///     ("id", Arc::new(Int64Array::from(vec![7, 8, 9])) as ArrayRef),
///     ("age", Arc::new(Int64Array::from(vec![31, 45, 27])) as _),
///     ("score", Arc::new(StringArray::from(vec!["0.5", "n/a", "1.25"])) as _),
///     ("spend", Arc::new(Float64Array::from(vec![10.0, 20.0, 30.0])) as _),
/// ])
/// .unwrap();
/// let config = serde_json::json!({ "output": "features", "columns": ["age", "score", "spend"] });
/// let mut stage = Tensor::new(serde_json::from_value(config).unwrap()).unwrap();
/// let out = stage.process_batch(&batch).unwrap();
///
/// // Row 8's score is not a number: a dead letter naming the column; the others go on.
/// assert_eq!(out.rejected.len(), 1);
/// assert!(out.rejected[0].reason.contains("`score`"));
/// let records = out.records;
/// assert_eq!(records.num_columns(), 2); // id, features: the inputs are dropped
/// let features = records.column_by_name("features").unwrap().as_fixed_size_list();
/// let values = features.values().as_primitive::<Float32Type>().values();
/// assert_eq!(values.as_ref(), &[31.0, 0.5, 10.0, 27.0, 1.25, 30.0]);
/// assert_eq!(row_shape(records.schema().field(1)).unwrap(), [3]);
/// ```
#[derive(Debug)]
pub struct Tensor {
    config: TensorConfig,
    /// The plan for the last input schema seen (batches of one source share it).
    plan: Option<(SchemaRef, Arc<Plan>)>,
}

/// Where the tensor's values come from, resolved against an input schema.
#[derive(Debug)]
enum Values {
    /// Input column indices and names, one element each.
    Columns(Vec<(usize, String)>),
    /// One list column.
    List { index: usize, name: String },
}

#[derive(Debug)]
struct Plan {
    values: Values,
    /// Elements per row.
    k: usize,
    /// Input columns carried into the output, in order.
    kept: Vec<usize>,
    /// The tensor's element field.
    item: FieldRef,
    schema: SchemaRef,
}

impl Tensor {
    pub fn new(config: TensorConfig) -> DataflowResult<Self> {
        if config.output.is_empty() {
            return Err(DataflowError::Config(format!(
                "{NAME}: `output` must name the column to create"
            ))
            .at("output"));
        }
        let given = [
            config.columns.is_some(),
            config.columns_prefix.is_some(),
            config.from.is_some(),
        ];
        if given.iter().filter(|g| **g).count() != 1 {
            let key = if config.columns.is_some() && config.columns_prefix.is_some() {
                "columns_prefix"
            } else if config.from.is_some() {
                "from"
            } else {
                "columns"
            };
            return Err(DataflowError::Config(format!(
                "{NAME}: give exactly one of `columns` (a list of scalar columns), \
                 `columns_prefix` or `from` (a list column)"
            ))
            .at(key));
        }
        if let Some(columns) = &config.columns {
            if columns.is_empty() {
                return Err(DataflowError::Config(format!(
                    "{NAME}: `columns` must list at least one column"
                ))
                .at("columns"));
            }
            for (i, name) in columns.iter().enumerate() {
                if columns.get(..i).is_some_and(|before| before.contains(name)) {
                    return Err(DataflowError::Config(format!(
                        "{NAME}: column `{name}` is listed twice"
                    ))
                    .at(format!("columns[{i}]")));
                }
            }
        }
        if config.columns_prefix.as_deref() == Some("") {
            return Err(DataflowError::Config(format!(
                "{NAME}: `columns_prefix` must not be empty"
            ))
            .at("columns_prefix"));
        }
        match config.length {
            Some(_) if config.from.is_none() => {
                return Err(DataflowError::Config(format!(
                    "{NAME}: `length` goes with `from` (with columns, the length is their number)"
                ))
                .at("length"))
            }
            Some(0) => {
                return Err(
                    DataflowError::Config(format!("{NAME}: `length` must be at least 1"))
                        .at("length"),
                )
            }
            _ => {}
        }
        Ok(Tensor { config, plan: None })
    }

    /// The scalar columns named by `columns` or `columns_prefix`, checked.
    fn scalar_columns(&self, input: &Schema) -> DataflowResult<Vec<(usize, String)>> {
        let to = self.config.dtype.data_type();
        // Each column with the key it is located at.
        let names: Vec<(String, String)> = match (&self.config.columns, &self.config.columns_prefix)
        {
            (Some(columns), _) => columns
                .iter()
                .enumerate()
                .map(|(i, c)| (c.clone(), format!("columns[{i}]")))
                .collect(),
            (None, Some(prefix)) => {
                let names: Vec<(String, String)> = input
                    .fields()
                    .iter()
                    .filter(|f| f.name().starts_with(prefix.as_str()))
                    .map(|f| (f.name().clone(), "columns_prefix".to_string()))
                    .collect();
                if names.is_empty() {
                    let available: Vec<&str> =
                        input.fields().iter().map(|f| f.name().as_str()).collect();
                    return Err(DataflowError::schema(
                        format!("{prefix}*"),
                        "columns starting with the prefix",
                        format!("none (input has: {})", available.join(", ")),
                    )
                    .at("columns_prefix"));
                }
                names
            }
            (None, None) => return Ok(Vec::new()),
        };
        let mut out = Vec::with_capacity(names.len());
        for (name, at) in names {
            let (index, field) = input.column_with_name(&name).ok_or_else(|| {
                let available: Vec<&str> =
                    input.fields().iter().map(|f| f.name().as_str()).collect();
                DataflowError::schema(
                    &name,
                    "a numeric column",
                    format!("no such column (input has: {})", available.join(", ")),
                )
                .at(at.clone())
            })?;
            if !convertible(field.data_type(), &to) {
                return Err(DataflowError::schema(
                    &name,
                    format!("a column of numbers (or text) to read as {to}"),
                    field.data_type().to_string(),
                )
                .at(at));
            }
            out.push((index, name));
        }
        Ok(out)
    }

    fn plan(&self, input: &SchemaRef) -> DataflowResult<Plan> {
        let to = self.config.dtype.data_type();
        let (values, k) = match &self.config.from {
            Some(from) => self.list_source(input, from)?,
            None => {
                let columns = self.scalar_columns(input)?;
                let k = columns.len();
                (Values::Columns(columns), k)
            }
        };
        if i32::try_from(k).is_err() {
            return Err(DataflowError::Config(format!(
                "{NAME}: {k} values per row are more than a tensor column holds"
            ))
            .at(self.source_key()));
        }
        let sources: Vec<usize> = match &values {
            Values::Columns(columns) => columns.iter().map(|(i, _)| *i).collect(),
            Values::List { index, .. } => vec![*index],
        };
        let kept: Vec<usize> = (0..input.fields().len())
            .filter(|i| !self.config.drop_inputs || !sources.contains(i))
            .collect();
        let mut fields: Vec<FieldRef> = kept
            .iter()
            .filter_map(|&i| input.fields().get(i).cloned())
            .collect();
        if fields.iter().any(|f| f.name() == &self.config.output) {
            return Err(DataflowError::schema(
                &self.config.output,
                "no existing column (tensor adds it)",
                "a column of that name in the input",
            )
            .at("output"));
        }
        let output = tensor_field(&self.config.output, to, &[k]);
        let item = match output.data_type() {
            DataType::FixedSizeList(item, _) => item.clone(),
            other => Arc::new(Field::new_list_field(other.clone(), false)),
        };
        fields.push(Arc::new(output));
        Ok(Plan {
            values,
            k,
            kept,
            item,
            schema: Arc::new(Schema::new_with_metadata(fields, input.metadata().clone())),
        })
    }

    /// The list column `from`, checked, and the number of values its rows must have.
    fn list_source(&self, input: &Schema, from: &str) -> DataflowResult<(Values, usize)> {
        let to = self.config.dtype.data_type();
        let (index, field) = input.column_with_name(from).ok_or_else(|| {
            DataflowError::schema(from, "a list column", "no such column").at("from")
        })?;
        let (child, fixed) = match field.data_type() {
            DataType::List(child) | DataType::LargeList(child) => (child, None),
            DataType::FixedSizeList(child, size) => (child, usize::try_from(*size).ok()),
            other => {
                return Err(DataflowError::schema(
                    from,
                    "a List, LargeList or FixedSizeList column",
                    other.to_string(),
                )
                .at("from"))
            }
        };
        if !convertible(child.data_type(), &to) {
            return Err(DataflowError::schema(
                from,
                format!("a list of numbers (or text) to read as {to}"),
                field.data_type().to_string(),
            )
            .at("from"));
        }
        let k = match (fixed, self.config.length) {
            (Some(size), Some(length)) if size != length => {
                return Err(DataflowError::schema(
                    from,
                    format!("lists of `length` {length}"),
                    format!("{} (fixed size {size})", field.data_type()),
                )
                .at("length"))
            }
            (Some(size), _) => size,
            (None, Some(length)) => length,
            (None, None) => {
                return Err(DataflowError::Config(format!(
                    "{NAME}: `{from}` is a list whose length varies by row: give \
                     `length`, the number of values a row must have"
                ))
                .at("length"))
            }
        };
        let name = from.to_string();
        Ok((Values::List { index, name }, k))
    }

    /// The config key naming where the values come from.
    fn source_key(&self) -> &'static str {
        if self.config.from.is_some() {
            "from"
        } else if self.config.columns_prefix.is_some() {
            "columns_prefix"
        } else {
            "columns"
        }
    }

    /// The plan for `input`, reused while batches keep its schema.
    fn plan_for(&mut self, input: &SchemaRef) -> DataflowResult<Arc<Plan>> {
        if let Some((schema, plan)) = &self.plan {
            if Arc::ptr_eq(schema, input) || schema == input {
                return Ok(plan.clone());
            }
        }
        let plan = Arc::new(self.plan(input)?);
        self.plan = Some((input.clone(), plan.clone()));
        Ok(plan)
    }
}

impl Tensor {
    /// The tensor's values for every row, row-major (`rows × k`, in input row order), and a
    /// reason for each row that cannot be a tensor row (its values there are null).
    fn lay_out(
        &self,
        plan: &Plan,
        batch: &RecordBatch,
    ) -> DataflowResult<(ArrayRef, Vec<Option<String>>)> {
        let mut reasons: Vec<Option<String>> = vec![None; batch.num_rows()];
        let values = match &plan.values {
            Values::Columns(columns) => {
                self.interleave_columns(columns, plan.k, batch, &mut reasons)?
            }
            Values::List { index, name } => {
                let column = batch.column(*index);
                self.convert_list(column, name, plan.k, &mut reasons)?
            }
        };
        Ok((values, reasons))
    }

    /// `values` cast to the tensor's element type; what does not convert is null.
    fn cast(&self, values: &dyn Array) -> DataflowResult<ArrayRef> {
        let options = CastOptions {
            safe: true,
            ..Default::default()
        };
        Ok(cast_with_options(
            values,
            &self.config.dtype.data_type(),
            &options,
        )?)
    }

    /// The `k` scalar `columns` converted and interleaved, row by row.
    fn interleave_columns(
        &self,
        columns: &[(usize, String)],
        k: usize,
        batch: &RecordBatch,
        reasons: &mut [Option<String>],
    ) -> DataflowResult<ArrayRef> {
        let dtype = self.config.dtype.name();
        let mut converted = Vec::with_capacity(k);
        for (i, name) in columns {
            let column = batch.column(*i);
            let values = self.cast(column)?;
            if values.null_count() > 0 {
                // Columns in order: a row's reason names its first bad column.
                for (r, reason) in reasons.iter_mut().enumerate() {
                    if reason.is_none() && values.is_null(r) {
                        let what = format!("column `{name}`");
                        *reason = Some(unconverted(column.as_ref(), r, &what, dtype));
                    }
                }
            }
            converted.push(values);
        }
        let refs: Vec<&dyn Array> = converted.iter().map(|a| a.as_ref()).collect();
        let indices: Vec<(usize, usize)> = (0..batch.num_rows())
            .flat_map(|r| (0..k).map(move |j| (j, r)))
            .collect();
        Ok(arrow_select::interleave::interleave(&refs, &indices)?)
    }

    /// The `k` values of every row of list `column`, converted.
    fn convert_list(
        &self,
        column: &ArrayRef,
        name: &str,
        k: usize,
        reasons: &mut [Option<String>],
    ) -> DataflowResult<ArrayRef> {
        let source = list_values(column, name, k, reasons)?;
        let converted = self.cast(&source)?;
        if converted.null_count() > 0 {
            let dtype = self.config.dtype.name();
            for (r, reason) in reasons.iter_mut().enumerate() {
                if reason.is_some() {
                    continue;
                }
                if let Some(j) = (0..k).find(|j| converted.is_null(r * k + j)) {
                    let what = format!("column `{name}` element {j}");
                    *reason = Some(unconverted(source.as_ref(), r * k + j, &what, dtype));
                }
            }
        }
        Ok(converted)
    }
}

/// The values of list `column`, `k` per row (a row of another length, or a null row, gets a
/// reason and nulls).
fn list_values(
    column: &ArrayRef,
    name: &str,
    k: usize,
    reasons: &mut [Option<String>],
) -> DataflowResult<ArrayRef> {
    match column.data_type() {
        DataType::FixedSizeList(..) => {
            let list = column.as_fixed_size_list();
            for (r, reason) in reasons.iter_mut().enumerate() {
                if list.is_null(r) {
                    *reason = Some(format!("column `{name}` is null"));
                }
            }
            // A sliced fixed-size list slices its values too: these are the rows'.
            Ok(list.values().clone())
        }
        DataType::List(_) => {
            let list = column.as_list::<i32>();
            let offsets = list.value_offsets().iter().map(|o| i64::from(*o));
            gather(list.values(), list, offsets, k, name, reasons)
        }
        DataType::LargeList(_) => {
            let list = column.as_list::<i64>();
            let offsets = list.value_offsets().iter().copied();
            gather(list.values(), list, offsets, k, name, reasons)
        }
        other => Err(DataflowError::schema(name, "a list column", other.to_string()).at("from")),
    }
}

impl crate::StageKind for TensorConfig {
    fn kind(&self) -> &'static str {
        NAME
    }

    fn output_schema(&self, input: &SchemaRef) -> DataflowResult<SchemaRef> {
        // Building this stage is cheap (no engine): its own checks are the rules.
        Tensor::new(self.clone())?.output_schema(input)
    }

    fn build(
        &self,
        _ctx: &crate::StageContext<'_>,
    ) -> DataflowResult<riffle_dataflow::runtime::Step> {
        Ok(crate::kind::apply(Tensor::new(self.clone())?))
    }
}

impl Stage for Tensor {
    fn name(&self) -> &str {
        NAME
    }

    fn output_schema(&self, input: &SchemaRef) -> DataflowResult<SchemaRef> {
        Ok(self.plan(input)?.schema.clone())
    }

    fn process_batch(&mut self, batch: &RecordBatch) -> DataflowResult<StageOutput> {
        let plan = self.plan_for(batch.schema_ref())?;
        let (converted, reasons) = self.lay_out(&plan, batch)?;
        let k = plan.k;
        let rejected: Vec<DeadLetter> = reasons
            .iter()
            .enumerate()
            .filter_map(|(r, reason)| {
                reason
                    .as_ref()
                    .map(|reason| DeadLetter::for_row(NAME, batch, r, reason))
            })
            .collect();
        let (columns, values): (Vec<ArrayRef>, ArrayRef) = if rejected.is_empty() {
            let columns = plan.kept.iter().map(|&i| batch.column(i).clone()).collect();
            (columns, converted)
        } else {
            let rows = BooleanArray::from_iter(reasons.iter().map(|r| Some(r.is_none())));
            let elements = BooleanArray::from_iter(
                reasons
                    .iter()
                    .flat_map(|r| std::iter::repeat_n(Some(r.is_none()), k)),
            );
            let columns = plan
                .kept
                .iter()
                .map(|&i| arrow_select::filter::filter(batch.column(i), &rows))
                .collect::<Result<_, _>>()?;
            (
                columns,
                arrow_select::filter::filter(&converted, &elements)?,
            )
        };
        let size = i32::try_from(k)
            .map_err(|_| DataflowError::stage(NAME, format!("{k} values per row are too many")))?;
        let tensor = FixedSizeListArray::try_new(plan.item.clone(), size, values, None)?;
        let mut columns = columns;
        columns.push(Arc::new(tensor));
        Ok(StageOutput {
            records: RecordBatch::try_new(plan.schema.clone(), columns)?,
            rejected,
        })
    }
}

#[cfg(test)]
mod tests;
mod values;
