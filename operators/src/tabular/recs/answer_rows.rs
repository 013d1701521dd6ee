//! What both modes of `candidates` share to answer a batch: its click columns in, one row per
//! candidate out (the input row repeated, with the click's event id and the candidate).

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{ArrayRef, Int64Array, RecordBatch, UInt32Array, UInt64Array};
use arrow_buffer::NullBuffer;
use arrow_schema::SchemaRef;
use riffle_dataflow::{DataflowError, DataflowResult, Epoch};

use super::CandidatesConfig;

/// The output schema last built, for the input schema it was built for (batches share one).
#[derive(Default)]
pub(super) struct Schemas(Option<(SchemaRef, SchemaRef)>);

impl Schemas {
    /// The output schema for `input`.
    pub(super) fn output(
        &mut self,
        input: &SchemaRef,
        config: &CandidatesConfig,
    ) -> DataflowResult<SchemaRef> {
        match &self.0 {
            Some((seen, output)) if seen == input => Ok(output.clone()),
            _ => {
                let output = config.output_schema(input.as_ref())?;
                self.0 = Some((input.clone(), output.clone()));
                Ok(output)
            }
        }
    }
}

/// The candidate rows of one batch, as they are answered: each click's input row repeated once
/// per candidate, with the click's event id and the candidate.
pub(super) struct AnswerRows {
    schema: SchemaRef,
    take: Vec<u32>,
    events: Vec<i64>,
    candidates: Vec<i64>,
    valid: Vec<bool>,
}

impl AnswerRows {
    /// Room for `rows` clicks of up to `limit` candidates each, written as `schema`.
    pub(super) fn new(schema: SchemaRef, rows: usize, limit: usize) -> Self {
        let capacity = rows.saturating_mul(limit.min(128));
        AnswerRows {
            schema,
            take: Vec::with_capacity(capacity),
            events: Vec::with_capacity(capacity),
            candidates: Vec::with_capacity(capacity),
            valid: Vec::with_capacity(capacity),
        }
    }

    /// Answers the click in input row `row` with `items`.
    pub(super) fn push(
        &mut self,
        row: usize,
        event: i64,
        clicked: i64,
        items: impl Iterator<Item = i64>,
    ) {
        let before = self.candidates.len();
        self.candidates.extend(items);
        let n = self.candidates.len() - before;
        self.valid.extend(std::iter::repeat_n(true, n));
        if n == 0 {
            // The click still gets its row, so every click has an answer downstream; the
            // model needs a valid id, so the clicked item stands in under a null.
            self.candidates.push(clicked);
            self.valid.push(false);
        }
        let rows = n.max(1);
        let row = u32::try_from(row).unwrap_or(u32::MAX);
        self.take.extend(std::iter::repeat_n(row, rows));
        self.events.extend(std::iter::repeat_n(event, rows));
    }

    /// The rows: `batch`'s columns taken per candidate, then the event, candidate and epoch.
    pub(super) fn finish(self, batch: &RecordBatch, epoch: Epoch) -> DataflowResult<RecordBatch> {
        let indices = UInt32Array::from(self.take);
        let mut columns: Vec<ArrayRef> = batch
            .columns()
            .iter()
            .map(|c| arrow_select::take::take(c.as_ref(), &indices, None))
            .collect::<Result<_, _>>()?;
        let rows = indices.len();
        columns.push(Arc::new(Int64Array::from(self.events)));
        let nulls = NullBuffer::from(self.valid);
        let nulls = (nulls.null_count() > 0).then_some(nulls);
        columns.push(Arc::new(Int64Array::new(self.candidates.into(), nulls)));
        columns.push(Arc::new(UInt64Array::from_value(epoch, rows)));
        Ok(RecordBatch::try_new(self.schema, columns)?)
    }
}

/// The user, item and time columns of `batch`, or which is missing or not Int64.
pub(super) fn click_columns<'a>(
    batch: &'a RecordBatch,
    config: &CandidatesConfig,
) -> DataflowResult<(&'a Int64Array, &'a Int64Array, &'a Int64Array)> {
    let column = |key: &str, name: &str| -> DataflowResult<&'a Int64Array> {
        let c = batch.column_by_name(name).ok_or_else(|| {
            DataflowError::schema(name, "an Int64 column", "no such column").at(key)
        })?;
        c.as_primitive_opt::<Int64Type>().ok_or_else(|| {
            DataflowError::schema(name, "an Int64 column", c.data_type().to_string()).at(key)
        })
    };
    Ok((
        column("user", &config.user)?,
        column("item", &config.item)?,
        column("time", &config.time)?,
    ))
}
