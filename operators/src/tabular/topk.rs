//! Top-k classification post-processing: per-row class scores (logits) to the k best classes.
//!
//! Output columns (with the default `output: top`):
//! - `top`: `List<Struct{class_id: Int32, label: Utf8?, score: Float32}>`, best first;
//! - `top_label`: the best class's label, or its id as text when it has none;
//! - `top_score`: the best class's score.

use std::cmp::Ordering;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::types::Float32Type;
use arrow_array::{
    Array, ArrayRef, FixedSizeListArray, Float32Array, Int32Array, ListArray, RecordBatch,
    StringArray, StructArray,
};
use arrow_buffer::{NullBuffer, OffsetBuffer};
use arrow_schema::{DataType, Field, FieldRef, Fields, Schema, SchemaRef};
use riffle_dataflow::tensor::{element_type, row_shape, tensor_values};
use riffle_dataflow::{DataflowError, DataflowResult, Stage, StageOutput};
use serde_inline_default::serde_inline_default;

const NAME: &str = "topk";

/// YAML block of a `topk` stage.
#[serde_inline_default]
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopKConfig {
    /// Tensor column of per-row class scores, shape `[C]` (or any shape of `C` elements).
    #[serde_inline_default("logits".to_string())]
    pub input: String,
    /// Name of the list column written; `{output}_label` and `{output}_score` come with it.
    #[serde_inline_default("top".to_string())]
    pub output: String,
    /// How many classes to keep per row (fewer when the model has fewer classes).
    #[serde_inline_default(5)]
    pub k: usize,
    /// Turn raw logits into probabilities before reporting scores.
    #[serde_inline_default(true)]
    pub softmax: bool,
    /// Text file of class names: line `i` names class `i`.
    #[serde(default)]
    pub labels: Option<PathBuf>,
    /// Drop the input tensor from the output (it is large and rarely wanted downstream).
    #[serde_inline_default(true)]
    pub drop_input: bool,
}

/// The `topk` stage.
///
/// Turns a classifier's raw per-class scores into the few answers worth keeping: the `k` best
/// classes of each row, with softmax probabilities and labels when a labels file is given.
///
/// # Examples
/// ```
/// use std::sync::Arc;
/// use arrow_array::cast::AsArray;
/// use arrow_array::types::{Float32Type, Int32Type};
/// use arrow_array::{RecordBatch, StringArray};
/// use arrow_schema::{DataType, Schema};
/// use riffle_dataflow::tensor::{tensor_column, tensor_field};
/// use riffle_dataflow::Stage;
/// use riffle_operators::tabular::topk::TopK;
///
/// // Two rows of logits over 3 classes.
/// let field = tensor_field("logits", DataType::Float32, &[3]);
/// let logits = tensor_column::<Float32Type>(&field, vec![0.1, 2.0, 1.0, 3.0, 0.0, 0.0]).unwrap();
/// let batch = RecordBatch::try_new(Arc::new(Schema::new(vec![field])), vec![logits]).unwrap();
/// let config = serde_json::json!({ "k": 2, "softmax": false });
/// let mut stage = TopK::new(serde_json::from_value(config).unwrap()).unwrap();
/// let out = stage.process_batch(&batch).unwrap().records;
///
/// // Without a labels file, a class's label is its id as text.
/// let labels = out.column_by_name("top_label").unwrap();
/// assert_eq!(labels.as_string::<i32>(), &StringArray::from(vec!["1", "0"]));
/// let scores = out.column_by_name("top_score").unwrap();
/// assert_eq!(scores.as_primitive::<Float32Type>().values().as_ref(), [2.0, 3.0]);
/// // Row 0's two best classes, best first.
/// let top = out.column_by_name("top").unwrap().as_list::<i32>().value(0);
/// assert_eq!(top.as_struct().column(0).as_primitive::<Int32Type>().values().as_ref(), [1, 2]);
/// ```
#[derive(Debug)]
pub struct TopK {
    config: TopKConfig,
    labels: Vec<String>,
    entry_fields: Fields,
    /// Reused per row, so a batch does not allocate one index vector per record.
    scratch: Vec<usize>,
}

impl TopK {
    pub fn new(config: TopKConfig) -> DataflowResult<Self> {
        if config.k == 0 {
            return Err(DataflowError::Config(format!(
                "{NAME}: k must be at least 1 (output `{}`)",
                config.output
            ))
            .at("k"));
        }
        let labels = match &config.labels {
            Some(path) => load_labels(path).map_err(|e| e.at("labels"))?,
            None => Vec::new(),
        };
        Ok(TopK {
            config,
            labels,
            entry_fields: entry_fields(),
            scratch: Vec::new(),
        })
    }

    fn label_column(&self) -> String {
        format!("{}_label", self.config.output)
    }

    fn score_column(&self) -> String {
        format!("{}_score", self.config.output)
    }

    fn list_field(&self) -> FieldRef {
        Arc::new(Field::new_list_field(
            DataType::Struct(self.entry_fields.clone()),
            false,
        ))
    }

    /// Number of classes per row, after checking the input column is an f32 tensor.
    fn classes(&self, input: &Schema) -> DataflowResult<usize> {
        let name = &self.config.input;
        let field = input.field_with_name(name).map_err(|_| {
            DataflowError::schema(name, "a float32 tensor column", "no such column")
        })?;
        let is_tensor = matches!(field.data_type(), DataType::FixedSizeList(_, _));
        if !is_tensor || element_type(field) != DataType::Float32 {
            return Err(DataflowError::schema(
                name,
                "a float32 tensor column (FixedSizeList<Float32>)",
                field.data_type().to_string(),
            ));
        }
        let classes: usize = row_shape(field)?.iter().product();
        if classes == 0 {
            return Err(DataflowError::schema(
                name,
                "at least one class per row",
                "an empty tensor",
            ));
        }
        Ok(classes)
    }

    /// Top-k (class, score) pairs of one row, best first.
    #[allow(
        clippy::indexing_slicing,
        reason = "`idx` holds class indices 0..logits.len(), and only those index `logits`"
    )]
    fn top_of_row(&mut self, logits: &[f32], out: &mut Vec<(usize, f32)>) {
        out.clear();
        let k = self.config.k.min(logits.len());
        let idx = &mut self.scratch;
        idx.clear();
        idx.extend(0..logits.len());
        // Softmax is monotonic, so the best classes are chosen on raw values; ties go to the
        // lower class id so results are deterministic.
        let by_score = |a: &usize, b: &usize| desc(logits[*a], logits[*b]).then(a.cmp(b));
        if k < idx.len() {
            idx.select_nth_unstable_by(k - 1, by_score);
            idx.truncate(k);
        }
        idx.sort_unstable_by(by_score);
        if self.config.softmax {
            // Subtracting the max keeps exp() from overflowing on large logits.
            let max = logits
                .iter()
                .copied()
                .filter(|v| !v.is_nan())
                .fold(f32::NEG_INFINITY, f32::max);
            let sum: f32 = logits.iter().map(|v| (v - max).exp()).sum();
            out.extend(idx.iter().map(|&c| (c, (logits[c] - max).exp() / sum)));
        } else {
            out.extend(idx.iter().map(|&c| (c, logits[c])));
        }
    }
}

impl TopK {
    /// The input tensor column of `batch` and its values, `classes` per row.
    fn logits<'a>(
        &self,
        batch: &'a RecordBatch,
        classes: usize,
    ) -> DataflowResult<(&'a FixedSizeListArray, &'a [f32])> {
        let column = batch
            .column_by_name(&self.config.input)
            .ok_or_else(|| DataflowError::schema(&self.config.input, "a column", "none"))?;
        let list = column
            .as_any()
            .downcast_ref::<FixedSizeListArray>()
            .ok_or_else(|| {
                DataflowError::schema(
                    &self.config.input,
                    "FixedSizeList<Float32>",
                    column.data_type().to_string(),
                )
            })?;
        let values = tensor_values::<Float32Type>(list)?;
        let rows = batch.num_rows();
        if values.len() != rows * classes {
            return Err(DataflowError::stage(
                NAME,
                format!(
                    "`{}` holds {} values for {rows} rows of {classes} classes",
                    self.config.input,
                    values.len()
                ),
            ));
        }
        Ok((list, values))
    }

    /// The `{output}`, `{output}_label` and `{output}_score` columns; `nulls`: the rows whose
    /// tensor is null.
    fn top_columns(
        &self,
        top: TopRows,
        nulls: Option<NullBuffer>,
    ) -> DataflowResult<[ArrayRef; 3]> {
        let entries = StructArray::try_new(
            self.entry_fields.clone(),
            vec![
                Arc::new(Int32Array::from(top.class_ids)) as ArrayRef,
                Arc::new(StringArray::from(top.labels)),
                Arc::new(Float32Array::from(top.scores)),
            ],
            None,
        )?;
        let offsets = OffsetBuffer::<i32>::try_from_lengths(top.lengths)
            .map_err(|e| DataflowError::stage(NAME, e))?;
        let list = ListArray::try_new(self.list_field(), offsets, Arc::new(entries), nulls)?;
        Ok([
            Arc::new(list),
            Arc::new(StringArray::from(top.top_labels)),
            Arc::new(Float32Array::from(top.top_scores)),
        ])
    }
}

/// The best classes of a batch's rows, as they are found: the entries of every row's list, one
/// row after another, and each row's best class.
struct TopRows {
    lengths: Vec<usize>,
    class_ids: Vec<i32>,
    labels: Vec<Option<String>>,
    scores: Vec<f32>,
    top_labels: Vec<Option<String>>,
    top_scores: Vec<Option<f32>>,
}

impl TopRows {
    fn with_capacity(rows: usize, k: usize) -> Self {
        TopRows {
            lengths: Vec::with_capacity(rows),
            class_ids: Vec::with_capacity(rows * k),
            labels: Vec::with_capacity(rows * k),
            scores: Vec::with_capacity(rows * k),
            top_labels: Vec::with_capacity(rows),
            top_scores: Vec::with_capacity(rows),
        }
    }

    /// A row without classes: an empty list and null best class.
    fn push_null(&mut self) {
        self.lengths.push(0);
        self.top_labels.push(None);
        self.top_scores.push(None);
    }

    /// A row's best classes (best first), named from `labels`.
    fn push(&mut self, best: &[(usize, f32)], labels: &[String]) -> DataflowResult<()> {
        self.lengths.push(best.len());
        for &(class, score) in best {
            let id = i32::try_from(class).map_err(|_| {
                DataflowError::stage(NAME, format!("class index {class} exceeds Int32"))
            })?;
            self.class_ids.push(id);
            self.labels.push(labels.get(class).cloned());
            self.scores.push(score);
        }
        match best.first() {
            Some(&(class, score)) => {
                let label = labels.get(class).cloned();
                self.top_labels
                    .push(Some(label.unwrap_or_else(|| class.to_string())));
                self.top_scores.push(Some(score));
            }
            None => {
                self.top_labels.push(None);
                self.top_scores.push(None);
            }
        }
        Ok(())
    }
}

/// Descending order of scores with NaN last.
fn desc(a: f32, b: f32) -> Ordering {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        (false, false) => b.total_cmp(&a),
    }
}

fn entry_fields() -> Fields {
    Fields::from(vec![
        Field::new("class_id", DataType::Int32, false),
        Field::new("label", DataType::Utf8, true),
        Field::new("score", DataType::Float32, false),
    ])
}

fn load_labels(path: &Path) -> DataflowResult<Vec<String>> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        DataflowError::Config(format!(
            "{NAME}: cannot read labels file {}: {e}",
            path.display()
        ))
    })?;
    // Trailing whitespace (and a Windows `\r`) is never part of a class name.
    Ok(text.lines().map(|l| l.trim_end().to_string()).collect())
}

fn collision(column: &str) -> DataflowError {
    DataflowError::schema(
        column,
        "a column name not already in the input",
        "an existing column",
    )
}

impl crate::StageKind for TopKConfig {
    fn kind(&self) -> &'static str {
        "topk"
    }

    fn files_mut(&mut self) -> Vec<crate::ConfigFile<'_>> {
        self.labels
            .iter_mut()
            .map(|path| crate::ConfigFile {
                key: "labels",
                path,
                expected: "a text file, one class name per line",
                kind: crate::kind::FileKind::File,
            })
            .collect()
    }

    fn output_schema(&self, input: &SchemaRef) -> DataflowResult<SchemaRef> {
        // Building this stage is cheap (no engine): its own check is the one rule.
        TopK::new(self.clone())?.output_schema(input)
    }

    fn build(
        &self,
        _ctx: &crate::StageContext<'_>,
    ) -> DataflowResult<riffle_dataflow::runtime::Step> {
        Ok(crate::kind::apply(TopK::new(self.clone())?))
    }
}

impl Stage for TopK {
    fn name(&self) -> &str {
        NAME
    }

    fn output_schema(&self, input: &SchemaRef) -> DataflowResult<SchemaRef> {
        self.classes(input).map_err(|e| e.at("input"))?;
        let mut fields: Vec<FieldRef> = input
            .fields()
            .iter()
            .filter(|f| !(self.config.drop_input && f.name() == &self.config.input))
            .cloned()
            .collect();
        let added = [
            Field::new(&self.config.output, DataType::List(self.list_field()), true),
            Field::new(self.label_column(), DataType::Utf8, true),
            Field::new(self.score_column(), DataType::Float32, true),
        ];
        for field in added {
            if fields.iter().any(|f| f.name() == field.name()) {
                return Err(collision(field.name()).at("output"));
            }
            fields.push(Arc::new(field));
        }
        Ok(Arc::new(Schema::new_with_metadata(
            fields,
            input.metadata().clone(),
        )))
    }

    fn process_batch(&mut self, batch: &RecordBatch) -> DataflowResult<StageOutput> {
        let schema = self.output_schema(batch.schema_ref())?;
        let classes = self.classes(batch.schema_ref())?;
        let (list, values) = self.logits(batch, classes)?;
        let rows = batch.num_rows();
        let mut top = TopRows::with_capacity(rows, self.config.k);
        let mut best = Vec::with_capacity(self.config.k);
        for row in 0..rows {
            // A null tensor row has no classes to rank: null outputs, the row is kept.
            if list.is_null(row) {
                top.push_null();
                continue;
            }
            let logits = values
                .get(row * classes..(row + 1) * classes)
                .ok_or_else(|| {
                    DataflowError::stage(NAME, format!("row {row} is beyond the logits"))
                })?;
            self.top_of_row(logits, &mut best);
            top.push(&best, &self.labels)?;
        }
        let added = self.top_columns(top, list.nulls().cloned())?;

        let mut columns: Vec<ArrayRef> = batch
            .schema()
            .fields()
            .iter()
            .zip(batch.columns())
            .filter(|(f, _)| !(self.config.drop_input && f.name() == &self.config.input))
            .map(|(_, c)| c.clone())
            .collect();
        columns.extend(added);
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
    use riffle_dataflow::tensor::{tensor_column, tensor_field};

    fn config(k: usize, labels: Option<PathBuf>) -> TopKConfig {
        TopKConfig {
            input: "logits".to_string(),
            output: "top".to_string(),
            k,
            softmax: true,
            labels,
            drop_input: true,
        }
    }

    fn logits_batch(shape: &[usize], values: Vec<f32>) -> RecordBatch {
        let field = tensor_field("logits", DataType::Float32, shape);
        let column = tensor_column::<Float32Type>(&field, values).unwrap();
        let ids = Arc::new(Int32Array::from(vec![10, 11]));
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int32, false),
            field,
        ]));
        RecordBatch::try_new(schema, vec![ids, column]).unwrap()
    }

    #[test]
    fn ranks_classes_with_softmax_and_labels() {
        let path = std::env::temp_dir().join(format!("riffle-topk-{}.txt", std::process::id()));
        std::fs::write(&path, "cat\ndog\nbird\r\nfish\n").unwrap();
        let mut stage = TopK::new(config(2, Some(path.clone()))).unwrap();
        std::fs::remove_file(&path).unwrap();

        // Row 0: argmax is class 2 (bird); row 1: argmax is class 0 (cat), with huge logits
        // that would overflow a naive exp().
        let batch = logits_batch(
            &[1, 4],
            vec![0.5, 1.0, 3.0, -1.0, 1000.0, 999.0, 10.0, 998.0],
        );
        let expected = stage.output_schema(batch.schema_ref()).unwrap();
        let out = stage.process_batch(&batch).unwrap().records;
        assert_eq!(out.schema(), expected);
        assert!(out.column_by_name("logits").is_none());
        assert_eq!(out.num_rows(), 2);

        let labels = out.column_by_name("top_label").unwrap().as_string::<i32>();
        assert_eq!(labels.value(0), "bird");
        assert_eq!(labels.value(1), "cat");

        let top = out.column_by_name("top").unwrap().as_list::<i32>();
        let row0 = top.value(0);
        let row0 = row0.as_struct();
        assert_eq!(row0.len(), 2);
        let ids = row0
            .column(0)
            .as_primitive::<arrow_array::types::Int32Type>();
        assert_eq!(ids.values().as_ref(), &[2, 1]);
        assert_eq!(row0.column(1).as_string::<i32>().value(1), "dog");

        // Full softmax (k = all classes) sums to one and matches the reported top score.
        let mut all = TopK::new(config(10, None)).unwrap();
        let out_all = all.process_batch(&batch).unwrap().records;
        let top_all = out_all.column_by_name("top").unwrap().as_list::<i32>();
        for row in 0..2 {
            let entries = top_all.value(row);
            let scores = entries.as_struct().column(2).as_primitive::<Float32Type>();
            assert_eq!(scores.len(), 4);
            let sum: f32 = scores.values().iter().sum();
            assert!((sum - 1.0).abs() < 1e-5, "row {row} sums to {sum}");
            assert!(scores.values().windows(2).all(|w| w[0] >= w[1]));
            assert!(entries.as_struct().column(1).is_null(0));
        }
        let best = out_all.column_by_name("top_score").unwrap();
        let best = best.as_primitive::<Float32Type>();
        let expected0 = 3f32.exp()
            / [0.5f32, 1.0, 3.0, -1.0]
                .iter()
                .map(|v| v.exp())
                .sum::<f32>();
        assert!((best.value(0) - expected0).abs() < 1e-6);
        // Without labels the top label falls back to the class id.
        let fallback = out_all
            .column_by_name("top_label")
            .unwrap()
            .as_string::<i32>();
        assert_eq!(fallback.value(0), "2");
    }

    #[test]
    fn raw_scores_without_softmax_and_input_kept() {
        let mut cfg = config(1, None);
        cfg.softmax = false;
        cfg.drop_input = false;
        let mut stage = TopK::new(cfg).unwrap();
        let batch = logits_batch(&[3], vec![0.1, 0.7, 0.2, 5.0, -2.0, 4.0]);
        let out = stage.process_batch(&batch).unwrap().records;
        assert!(out.column_by_name("logits").is_some());
        let scores = out.column_by_name("top_score").unwrap();
        assert_eq!(
            scores.as_primitive::<Float32Type>().values().as_ref(),
            &[0.7, 5.0]
        );
    }

    #[test]
    fn schema_and_config_errors() {
        let missing = TopK::new(config(5, Some(PathBuf::from("/no/such/labels.txt"))))
            .map_err(crate::unlocated);
        match missing {
            Err(DataflowError::Config(msg)) => assert!(msg.contains("/no/such/labels.txt")),
            other => panic!("expected a config error, got {other:?}"),
        }
        assert!(TopK::new(config(0, None)).is_err());

        let stage = TopK::new(config(5, None)).unwrap();
        let wrong = Arc::new(Schema::new(vec![Field::new(
            "logits",
            DataType::Int64,
            false,
        )]));
        assert!(matches!(
            stage.output_schema(&wrong).map_err(crate::unlocated),
            Err(DataflowError::Schema { .. })
        ));
        let absent = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
        assert!(stage.output_schema(&absent).is_err());
    }
}
