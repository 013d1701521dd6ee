//! The `detections` stage: checks its inputs (SSD-style or YOLO), decodes each row with
//! [`ssd`](super::ssd) or [`yolo`](super::yolo), and writes the detections as a list column
//! with labels and a count column.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use arrow_array::{
    Array, ArrayRef, Float32Array, Int32Array, Int64Array, ListArray, RecordBatch, StringArray,
    StructArray,
};
use arrow_buffer::{NullBuffer, OffsetBuffer};
use arrow_schema::{DataType, Field, FieldRef, Fields, Schema, SchemaRef};
use riffle_dataflow::{DataflowError, DataflowResult, Stage, StageOutput};

use super::columns::size_column;
use super::{ssd, yolo, Detection, DetectionsConfig, HEIGHT, LETTERBOX, NAME, WIDTH};

/// The `detections` stage.
///
/// Turns an SSD-style model's fixed `K` candidate boxes into the detections worth reporting,
/// in pixels of the original image: weak scores and duplicate boxes of one object are dropped.
///
/// # Examples
/// ```
/// use std::sync::Arc;
/// use arrow_array::cast::AsArray;
/// use arrow_array::types::{Float32Type, Int32Type};
/// use arrow_array::{ArrayRef, RecordBatch, UInt32Array};
/// use arrow_schema::{DataType, Field, Schema};
/// use riffle_dataflow::tensor::{tensor_column, tensor_field};
/// use riffle_dataflow::Stage;
/// use riffle_operators::vision::detections::Detections;
///
/// // One 200x100 frame, K = 3: a person, a near-duplicate of it, a weak class-3 box.
/// let boxes = tensor_field("detection_boxes", DataType::Float32, &[3, 4]);
/// let scores = tensor_field("detection_scores", DataType::Float32, &[3]);
/// let classes = tensor_field("detection_classes", DataType::Float32, &[3]);
/// let f32s = |field: &Field, v: Vec<f32>| tensor_column::<Float32Type>(field, v).unwrap();
/// let columns: Vec<ArrayRef> = vec![
///     // [ymin, xmin, ymax, xmax] in 0..1 of the image.
///     f32s(&boxes, vec![0.25, 0.25, 0.5, 0.75, 0.25, 0.3, 0.5, 0.75, 0.0, 0.0, 0.1, 0.1]),
///     f32s(&scores, vec![0.9, 0.8, 0.3]),
///     f32s(&classes, vec![1.0, 1.0, 3.0]),
///     Arc::new(UInt32Array::from(vec![200])),
///     Arc::new(UInt32Array::from(vec![100])),
/// ];
/// let size = |name| Field::new(name, DataType::UInt32, false);
/// let schema = Schema::new(vec![boxes, scores, classes, size("width"), size("height")]);
/// let batch = RecordBatch::try_new(Arc::new(schema), columns).unwrap();
/// let config = serde_json::json!({ "score_threshold": 0.5, "labels": { "1": "person" } });
/// let mut stage = Detections::new(serde_json::from_value(config).unwrap()).unwrap();
/// let out = stage.process_batch(&batch).unwrap().records;
///
/// // The duplicate fell to NMS, the class-3 box to the score threshold.
/// let count = out.column_by_name("detections_count").unwrap();
/// assert_eq!(count.as_primitive::<Int32Type>().value(0), 1);
/// let list = out.column_by_name("detections").unwrap().as_list::<i32>().value(0);
/// let found = list.as_struct();
/// assert_eq!(found.column_by_name("label").unwrap().as_string::<i32>().value(0), "person");
/// let coord = |c: &str| found.column_by_name(c).unwrap().as_primitive::<Float32Type>().value(0);
/// assert_eq!([coord("x1"), coord("y1"), coord("x2"), coord("y2")], [50.0, 25.0, 150.0, 50.0]);
/// ```
#[derive(Debug)]
pub struct Detections {
    config: DetectionsConfig,
    entry_fields: Fields,
    /// `labels_file` then `labels`.
    pub(super) labels: BTreeMap<i64, String>,
}

/// What the stage reads per row, from the input's schema.
#[derive(Clone, Copy, Debug)]
enum Inputs {
    /// `K` SSD-style detections.
    Ssd(usize),
    Yolo(yolo::Layout),
}

impl Detections {
    pub fn new(config: DetectionsConfig) -> DataflowResult<Self> {
        if !(0.0..=1.0).contains(&config.iou_threshold) {
            return Err(DataflowError::Config(format!(
                "{NAME}: iou_threshold must be within 0..=1, got {}",
                config.iou_threshold
            ))
            .at("iou_threshold"));
        }
        if config.score_threshold.is_nan() {
            return Err(
                DataflowError::Config(format!("{NAME}: score_threshold must be a number"))
                    .at("score_threshold"),
            );
        }
        let mut labels = match &config.labels_file {
            Some(path) => load_labels(path).map_err(|e| e.at("labels_file"))?,
            None => BTreeMap::new(),
        };
        labels.extend(config.labels.clone());
        Ok(Detections {
            config,
            entry_fields: entry_fields(),
            labels,
        })
    }

    fn count_column(&self) -> String {
        format!("{}_count", self.config.output)
    }

    fn list_field(&self) -> FieldRef {
        Arc::new(Field::new_list_field(
            DataType::Struct(self.entry_fields.clone()),
            false,
        ))
    }

    fn is_input(&self, name: &str) -> bool {
        match &self.config.yolo {
            Some(y) => name == y.predictions || name == LETTERBOX,
            None => {
                name == self.config.boxes
                    || name == self.config.scores
                    || name == self.config.classes
            }
        }
    }

    /// What each row holds, after checking every input column's type and shape. Errors about
    /// a configured column are located at the key naming it.
    fn check_inputs(&self, input: &Schema) -> DataflowResult<Inputs> {
        match &self.config.yolo {
            Some(y) => yolo::check(input, y).map(Inputs::Yolo),
            None => ssd::check(&self.config, input).map(Inputs::Ssd),
        }
    }
}

/// Class names from a text file, line `i` naming class `i`.
fn load_labels(path: &Path) -> DataflowResult<BTreeMap<i64, String>> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        DataflowError::Config(format!(
            "{NAME}: cannot read labels file {}: {e}",
            path.display()
        ))
    })?;
    // Trailing whitespace (and a Windows `\r`) is never part of a class name.
    Ok((0..)
        .zip(text.lines())
        .map(|(i, l)| (i, l.trim_end().to_string()))
        .collect())
}

fn entry_fields() -> Fields {
    let coord = |name: &str| Field::new(name, DataType::Float32, false);
    Fields::from(vec![
        Field::new("class_id", DataType::Int64, false),
        Field::new("label", DataType::Utf8, true),
        Field::new("score", DataType::Float32, false),
        coord("x1"),
        coord("y1"),
        coord("x2"),
        coord("y2"),
    ])
}

impl Stage for Detections {
    fn name(&self) -> &str {
        NAME
    }

    fn output_schema(&self, input: &SchemaRef) -> DataflowResult<SchemaRef> {
        self.check_inputs(input)?;
        let mut fields: Vec<FieldRef> = input
            .fields()
            .iter()
            .filter(|f| !(self.config.drop_inputs && self.is_input(f.name())))
            .cloned()
            .collect();
        let added = [
            Field::new(&self.config.output, DataType::List(self.list_field()), true),
            Field::new(self.count_column(), DataType::Int32, false),
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
        Ok(Arc::new(Schema::new_with_metadata(
            fields,
            input.metadata().clone(),
        )))
    }

    fn process_batch(&mut self, batch: &RecordBatch) -> DataflowResult<StageOutput> {
        let schema = self.output_schema(batch.schema_ref())?;
        let rows = batch.num_rows();
        let widths = size_column(batch, WIDTH);
        let heights = size_column(batch, HEIGHT);
        let size_of = |row: usize| match (widths, heights) {
            (Some(w), Some(h)) if w.is_valid(row) && h.is_valid(row) => {
                Some((w.value(row) as f32, h.value(row) as f32))
            }
            _ => None,
        };
        // Per row: its detections, or None for a null list.
        let found: Vec<Option<Vec<Detection>>> = match self.check_inputs(batch.schema_ref())? {
            Inputs::Ssd(k) => ssd::rows(&self.config, batch, k, &size_of)?,
            Inputs::Yolo(layout) => yolo::rows(&self.config, batch, layout, &size_of)?,
        };
        let mut lengths = Vec::with_capacity(rows);
        let mut valid = Vec::with_capacity(rows);
        let mut kept: Vec<Detection> = Vec::new();
        for row in found {
            valid.push(row.is_some());
            let row = row.unwrap_or_default();
            lengths.push(row.len());
            kept.extend(row);
        }

        let mut coords: [Vec<f32>; 4] = Default::default();
        for d in &kept {
            for (coord, &v) in coords.iter_mut().zip(&d.rect) {
                coord.push(v);
            }
        }
        let [x1, y1, x2, y2] = coords.map(|c| Arc::new(Float32Array::from(c)) as ArrayRef);
        let entries = StructArray::try_new(
            self.entry_fields.clone(),
            vec![
                Arc::new(Int64Array::from_iter_values(
                    kept.iter().map(|d| d.class_id),
                )),
                Arc::new(StringArray::from_iter(
                    kept.iter().map(|d| self.labels.get(&d.class_id)),
                )),
                Arc::new(Float32Array::from_iter_values(kept.iter().map(|d| d.score))),
                x1,
                y1,
                x2,
                y2,
            ],
            None,
        )?;
        let counts = lengths
            .iter()
            .map(|&n| i32::try_from(n))
            .collect::<Result<Vec<i32>, _>>()
            .map_err(|e| DataflowError::stage(NAME, e))?;
        let offsets = OffsetBuffer::<i32>::try_from_lengths(lengths)
            .map_err(|e| DataflowError::stage(NAME, e))?;
        let nulls = NullBuffer::from(valid);
        let nulls = (nulls.null_count() > 0).then_some(nulls);
        let list = ListArray::try_new(self.list_field(), offsets, Arc::new(entries), nulls)?;

        let mut columns: Vec<ArrayRef> = batch
            .schema()
            .fields()
            .iter()
            .zip(batch.columns())
            .filter(|(f, _)| !(self.config.drop_inputs && self.is_input(f.name())))
            .map(|(_, c)| c.clone())
            .collect();
        columns.push(Arc::new(list));
        columns.push(Arc::new(Int32Array::from(counts)));
        Ok(StageOutput::all(RecordBatch::try_new(schema, columns)?))
    }

    fn preserves_rows(&self) -> bool {
        true
    }
}
