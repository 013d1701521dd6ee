//! Group top-k: the k best-scored items of each group of consecutive rows, one row per group.
//!
//! A recommendation request arrives as one row per candidate (`event`, `candidate`, features);
//! after the model has scored them (`p_click`), this stage folds each request back into one row
//! carrying its ranked list. With the default `output: recs` it appends:
//! - `recs`: `List<Int64>`, never null: items by score descending (ties by item ascending,
//!   NaN and null scores last), at most `k`;
//! - `recs_score`: `List<Float32>`, the scores of those items, aligned with `recs`.
//!
//! Every other column is taken from the group's first row; the item and score columns are
//! dropped. A group is a run of consecutive rows with the same group key, so a key that comes
//! back after another one starts a new group. Groups never span batches: the operator upstream
//! emits each request's candidate rows whole, in one batch (a group split across two batches
//! would come out as two rows with the same key). A row whose item is null contributes nothing:
//! it stands for a request with no candidates, whose lists are empty.

use std::cmp::Ordering;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, Int64Type, UInt64Type};
use arrow_array::{Array, ArrayRef, Float32Array, Int64Array, ListArray, RecordBatch, UInt32Array};
use arrow_buffer::{ArrowNativeType, NullBuffer, NullBufferBuilder, OffsetBuffer, ScalarBuffer};
use arrow_schema::{DataType, Field, FieldRef, Schema, SchemaRef};
use arrow_select::take::take_arrays;
use riffle_dataflow::tensor::tensor_values;
use riffle_dataflow::{DataflowError, DataflowResult, Stage, StageOutput};

const NAME: &str = "rank";

const GROUP_TYPES: &str = "Int64 or UInt64";
const ITEM_TYPE: &str = "Int64";
const SCORE_TYPES: &str = "Float32, or FixedSizeList<Float32> of size 1 (a [N] or [N,1] output)";

/// YAML block of a `rank` stage.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RankConfig {
    /// Group key column (Int64 or UInt64): consecutive rows with equal keys form one group.
    pub group: String,
    /// Item column (Int64, nullable): what is ranked; a null item contributes nothing.
    pub item: String,
    /// Score column: Float32, or `FixedSizeList<Float32>` of size 1 as a model stage writes it.
    pub score: String,
    /// How many items to keep per group, at least 1 (fewer when the group has fewer).
    pub k: usize,
    /// Name of the item list column written; `{output}_score` comes with it.
    pub output: String,
}

impl Default for RankConfig {
    fn default() -> Self {
        RankConfig {
            group: "event".to_string(),
            item: "candidate".to_string(),
            score: "p_click".to_string(),
            k: 10,
            output: "recs".to_string(),
        }
    }
}

/// The `rank` stage.
///
/// # Examples
/// ```
/// use std::sync::Arc;
/// use arrow_array::cast::AsArray;
/// use arrow_array::types::Int64Type;
/// use arrow_array::{ArrayRef, Float32Array, Int64Array, RecordBatch};
/// use riffle_dataflow::Stage;
/// use riffle_operators::tabular::rank::{Rank, RankConfig};
///
/// // Request 7 has three candidates, request 8 has none (a null candidate).
/// let batch = RecordBatch::try_from_iter(vec![
///     ("event", Arc::new(Int64Array::from(vec![7, 7, 7, 8])) as ArrayRef),
///     ("candidate", Arc::new(Int64Array::from(vec![Some(30), Some(10), Some(20), None])) as _),
///     ("p_click", Arc::new(Float32Array::from(vec![0.2, 0.9, 0.5, 0.0])) as _),
/// ])
/// .unwrap();
/// let mut stage = Rank::new(RankConfig { k: 2, ..RankConfig::default() }).unwrap();
/// let out = stage.process_batch(&batch).unwrap().records;
///
/// assert_eq!(out.num_rows(), 2);
/// let recs = out.column_by_name("recs").unwrap().as_list::<i32>();
/// assert_eq!(recs.value(0).as_primitive::<Int64Type>().values().as_ref(), &[10, 20]);
/// assert!(recs.value(1).is_empty());
/// assert!(out.column_by_name("candidate").is_none());
/// ```
#[derive(Debug)]
pub struct Rank {
    config: RankConfig,
    /// Reused per group, so a batch does not allocate one vector per request.
    scratch: Vec<Candidate>,
}

/// One ranked row of a group: its sort key and where it came from.
#[derive(Clone, Copy, Debug)]
struct Candidate {
    /// The row's score, NaN when the score is null (both rank last).
    score: f32,
    item: i64,
    row: u32,
}

/// Where the stage's columns are in an input schema, and the output schema.
struct Plan {
    group: usize,
    item: usize,
    score: usize,
    /// Input columns carried over (from each group's first row), in input order.
    kept: Vec<usize>,
    schema: SchemaRef,
    score_field: FieldRef,
}

impl Rank {
    pub fn new(config: RankConfig) -> DataflowResult<Self> {
        if config.k == 0 {
            return Err(DataflowError::Config(format!(
                "{NAME}: k must be at least 1 (output `{}`)",
                config.output
            ))
            .at("k"));
        }
        if config.group == config.item || config.group == config.score {
            return Err(DataflowError::Config(format!(
                "{NAME}: group column `{}` must differ from the item and score columns",
                config.group
            ))
            .at("group"));
        }
        Ok(Rank {
            config,
            scratch: Vec::new(),
        })
    }

    fn score_column(&self) -> String {
        format!("{}_score", self.config.output)
    }

    /// Column errors are located at the key naming the column.
    fn plan(&self, input: &Schema) -> DataflowResult<Plan> {
        let (group, group_field) =
            find(input, &self.config.group, GROUP_TYPES).map_err(|e| e.at("group"))?;
        if !matches!(group_field.data_type(), DataType::Int64 | DataType::UInt64) {
            return Err(wrong_type(group_field, GROUP_TYPES).at("group"));
        }
        let (item, item_field) =
            find(input, &self.config.item, ITEM_TYPE).map_err(|e| e.at("item"))?;
        if item_field.data_type() != &DataType::Int64 {
            return Err(wrong_type(item_field, ITEM_TYPE).at("item"));
        }
        let (score, score_field) =
            find(input, &self.config.score, SCORE_TYPES).map_err(|e| e.at("score"))?;
        let scores_nullable = match score_field.data_type() {
            DataType::Float32 => score_field.is_nullable(),
            DataType::FixedSizeList(child, 1) if child.data_type() == &DataType::Float32 => {
                score_field.is_nullable() || child.is_nullable()
            }
            _ => return Err(wrong_type(score_field, SCORE_TYPES).at("score")),
        };

        let kept: Vec<usize> = (0..input.fields().len())
            .filter(|&i| i != item && i != score)
            .collect();
        let mut fields: Vec<FieldRef> = kept
            .iter()
            .filter_map(|&i| input.fields().get(i).cloned())
            .collect();
        let item_list = Arc::new(Field::new_list_field(DataType::Int64, false));
        let score_list = Arc::new(Field::new_list_field(DataType::Float32, scores_nullable));
        let added = [
            Field::new(&self.config.output, DataType::List(item_list), false),
            Field::new(
                self.score_column(),
                DataType::List(score_list.clone()),
                false,
            ),
        ];
        for field in added {
            if fields.iter().any(|f| f.name() == field.name()) {
                // Both added columns are named from `output`.
                return Err(DataflowError::schema(
                    field.name(),
                    "a column name not already in the input",
                    "an existing column",
                )
                .at("output"));
            }
            fields.push(Arc::new(field));
        }
        let schema = Arc::new(Schema::new_with_metadata(fields, input.metadata().clone()));
        Ok(Plan {
            group,
            item,
            score,
            kept,
            schema,
            score_field: score_list,
        })
    }
}

/// Index and field of column `name`, or a schema error saying what was expected there.
fn find<'a>(input: &'a Schema, name: &str, expected: &str) -> DataflowResult<(usize, &'a Field)> {
    input.column_with_name(name).ok_or_else(|| {
        let available: Vec<&str> = input.fields().iter().map(|f| f.name().as_str()).collect();
        DataflowError::schema(
            name,
            format!("a {expected} column"),
            format!("no such column (input has: {})", available.join(", ")),
        )
    })
}

fn wrong_type(field: &Field, expected: &str) -> DataflowError {
    DataflowError::schema(field.name(), expected, field.data_type().to_string())
}

/// First row of every run of equal consecutive keys.
fn run_starts<T: ArrowNativeType>(keys: &[T]) -> Vec<u32> {
    let mut starts = Vec::new();
    if !keys.is_empty() {
        starts.push(0);
    }
    // Rows are counted in u32 (take indices); the caller checked the batch fits in i32.
    starts.extend(
        keys.iter()
            .zip(keys.iter().skip(1))
            .enumerate()
            .filter(|(_, (a, b))| a != b)
            .map(|(i, _)| i as u32 + 1),
    );
    starts
}

/// `values[row]`; an error when the column is shorter (`scores` was checked to hold a value
/// per row, and every column of a batch has its rows).
fn value_at<T: Copy>(values: &[T], row: usize) -> DataflowResult<T> {
    values.get(row).copied().ok_or_else(|| {
        DataflowError::stage(
            NAME,
            format!("row {row} is beyond the column's {} values", values.len()),
        )
    })
}

/// Descending scores with NaN last; equal scores (0.0 and -0.0 included) compare equal.
fn score_desc(a: f32, b: f32) -> Ordering {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        (false, false) => b.partial_cmp(&a).unwrap_or(Ordering::Equal),
    }
}

/// Ranking order: best score first, then the smaller item, then input order (so duplicate
/// items and null-versus-NaN scores come out the same way every time).
fn rank_order(a: &Candidate, b: &Candidate) -> Ordering {
    score_desc(a.score, b.score)
        .then(a.item.cmp(&b.item))
        .then(a.row.cmp(&b.row))
}

/// Keeps the `k` best candidates, best first.
fn keep_best(candidates: &mut Vec<Candidate>, k: usize) {
    if candidates.len() > k {
        candidates.select_nth_unstable_by(k - 1, rank_order);
        candidates.truncate(k);
    }
    candidates.sort_unstable_by(rank_order);
}

/// A batch's item and score columns, as the ranking reads them.
struct Scored<'a> {
    items: &'a [i64],
    item_nulls: Option<&'a NullBuffer>,
    /// One score per row.
    scores: &'a [f32],
    /// A score is null when its list row or its value is (size 1: they line up).
    score_nulls: Option<NullBuffer>,
}

impl Scored<'_> {
    fn score_is_null(&self, row: usize) -> bool {
        self.score_nulls.as_ref().is_some_and(|n| n.is_null(row))
    }
}

/// Every group's ranked items and scores, one group after another, with the offsets of the
/// list columns they become.
struct Ranked {
    offsets: Vec<i32>,
    items: Vec<i64>,
    scores: Vec<f32>,
    valid: NullBufferBuilder,
}

impl Ranked {
    /// The `{output}` and `{output}_score` list columns.
    fn into_lists(mut self, score_field: FieldRef) -> DataflowResult<(ListArray, ListArray)> {
        let offsets = OffsetBuffer::new(ScalarBuffer::from(self.offsets));
        let item_values = Int64Array::new(ScalarBuffer::from(self.items), None);
        let score_values = Float32Array::new(ScalarBuffer::from(self.scores), self.valid.finish());
        let item_list = ListArray::try_new(
            Arc::new(Field::new_list_field(DataType::Int64, false)),
            offsets.clone(),
            Arc::new(item_values),
            None,
        )?;
        let score_list = ListArray::try_new(score_field, offsets, Arc::new(score_values), None)?;
        Ok((item_list, score_list))
    }
}

impl Rank {
    /// The first row of each group; every row must have a group key.
    fn group_starts(&self, batch: &RecordBatch, plan: &Plan) -> DataflowResult<Vec<u32>> {
        let group = batch.column(plan.group);
        if group.null_count() > 0 {
            return Err(DataflowError::stage(
                NAME,
                format!(
                    "group column `{}` has {} null rows: every row must belong to a group",
                    self.config.group,
                    group.null_count()
                ),
            ));
        }
        if let Some(keys) = group.as_primitive_opt::<Int64Type>() {
            Ok(run_starts(keys.values()))
        } else if let Some(keys) = group.as_primitive_opt::<UInt64Type>() {
            Ok(run_starts(keys.values()))
        } else {
            Err(DataflowError::schema(
                &self.config.group,
                GROUP_TYPES,
                group.data_type().to_string(),
            )
            .at("group"))
        }
    }

    /// The item and score columns of `batch`, checked to be what the plan expects.
    fn scored<'a>(&self, batch: &'a RecordBatch, plan: &Plan) -> DataflowResult<Scored<'a>> {
        let item_column = batch.column(plan.item);
        let items = item_column.as_primitive_opt::<Int64Type>().ok_or_else(|| {
            DataflowError::schema(
                &self.config.item,
                ITEM_TYPE,
                item_column.data_type().to_string(),
            )
            .at("item")
        })?;
        let score_column = batch.column(plan.score);
        let scores = tensor_values::<Float32Type>(score_column.as_ref()).map_err(|_| {
            DataflowError::schema(
                &self.config.score,
                SCORE_TYPES,
                score_column.data_type().to_string(),
            )
            .at("score")
        })?;
        let rows = batch.num_rows();
        if scores.len() != rows {
            return Err(DataflowError::stage(
                NAME,
                format!(
                    "`{}` holds {} scores for {rows} rows",
                    self.config.score,
                    scores.len()
                ),
            ));
        }
        let score_nulls = match score_column.as_fixed_size_list_opt() {
            Some(list) => NullBuffer::union(list.nulls(), list.values().nulls()),
            None => score_column.nulls().cloned(),
        };
        Ok(Scored {
            items: items.values(),
            item_nulls: items.nulls(),
            scores,
            score_nulls,
        })
    }

    /// The `k` best items of every group (of `rows` rows starting at `starts`), best first.
    fn rank_groups(
        &mut self,
        starts: &[u32],
        scored: &Scored<'_>,
        rows: usize,
    ) -> DataflowResult<Ranked> {
        let k = self.config.k;
        let capacity = rows.min(starts.len().saturating_mul(k));
        let mut ranked = Ranked {
            offsets: Vec::with_capacity(starts.len() + 1),
            items: Vec::with_capacity(capacity),
            scores: Vec::with_capacity(capacity),
            valid: NullBufferBuilder::new(capacity),
        };
        ranked.offsets.push(0i32);
        for (g, &start) in starts.iter().enumerate() {
            let end = starts.get(g + 1).map_or(rows, |&s| s as usize);
            let candidates = &mut self.scratch;
            gather(candidates, scored, start as usize..end)?;
            keep_best(candidates, k);
            for c in candidates.iter() {
                let row = c.row as usize;
                ranked.items.push(c.item);
                ranked.scores.push(value_at(scored.scores, row)?);
                ranked.valid.append(!scored.score_is_null(row));
            }
            // At most one entry per input row, and rows fit in i32 (the caller checked).
            ranked.offsets.push(ranked.items.len() as i32);
        }
        Ok(ranked)
    }
}

/// The candidates of the group in `rows`: every row with an item, a null score as NaN.
fn gather(
    candidates: &mut Vec<Candidate>,
    scored: &Scored<'_>,
    rows: std::ops::Range<usize>,
) -> DataflowResult<()> {
    candidates.clear();
    for row in rows {
        if scored.item_nulls.is_some_and(|n| n.is_null(row)) {
            continue;
        }
        candidates.push(Candidate {
            score: if scored.score_is_null(row) {
                f32::NAN
            } else {
                value_at(scored.scores, row)?
            },
            item: value_at(scored.items, row)?,
            row: row as u32,
        });
    }
    Ok(())
}

impl crate::StageKind for RankConfig {
    fn kind(&self) -> &'static str {
        "rank"
    }

    fn output_schema(&self, input: &SchemaRef) -> DataflowResult<SchemaRef> {
        // Building this stage is cheap (no engine): its own check is the one rule.
        Rank::new(self.clone())?.output_schema(input)
    }

    fn build(
        &self,
        _ctx: &crate::StageContext<'_>,
    ) -> DataflowResult<riffle_dataflow::runtime::Step> {
        Ok(crate::kind::apply(Rank::new(self.clone())?))
    }
}

impl Stage for Rank {
    fn name(&self) -> &str {
        NAME
    }

    fn output_schema(&self, input: &SchemaRef) -> DataflowResult<SchemaRef> {
        Ok(self.plan(input)?.schema)
    }

    fn process_batch(&mut self, batch: &RecordBatch) -> DataflowResult<StageOutput> {
        let plan = self.plan(batch.schema_ref())?;
        let rows = batch.num_rows();
        if i32::try_from(rows).is_err() {
            return Err(DataflowError::stage(
                NAME,
                format!("a batch of {rows} rows exceeds the i32 offsets of a list column"),
            ));
        }
        let starts = self.group_starts(batch, &plan)?;
        let scored = self.scored(batch, &plan)?;
        let (item_list, score_list) = self
            .rank_groups(&starts, &scored, rows)?
            .into_lists(plan.score_field.clone())?;

        let first_rows = UInt32Array::new(ScalarBuffer::from(starts), None);
        let kept: Vec<ArrayRef> = plan.kept.iter().map(|&i| batch.column(i).clone()).collect();
        let mut columns = take_arrays(&kept, &first_rows, None)?;
        columns.push(Arc::new(item_list));
        columns.push(Arc::new(score_list));
        Ok(StageOutput::all(RecordBatch::try_new(
            plan.schema,
            columns,
        )?))
    }

    /// Rows are merged: one output row per group.
    fn preserves_rows(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests;
