//! One of this worker's batches of an epoch, answered click by click as the replay reaches
//! them, then turned into candidate rows and dead letters.

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Array, Int64Array, RecordBatch};
use riffle_dataflow::dead_letter::{self, DeadLetter};
use riffle_dataflow::observe::registry::StageMetrics;
use riffle_dataflow::{Batch, Epoch};

use super::PLACE;
use crate::tabular::recs::answer_rows::{click_columns, AnswerRows, Schemas};
use crate::tabular::recs::{CandidatesConfig, NAME};

/// One of this worker's batches of an epoch, being answered.
pub(super) struct Part {
    /// The rows as they came in (their place left out).
    pub(super) batch: Batch,
    pub(super) places: Option<Int64Array>,
    /// The candidate rows so far, or why the batch cannot be answered.
    pub(super) answers: Option<AnswerRows>,
    problem: Option<String>,
    pub(super) answered: Vec<bool>,
}

impl Part {
    pub(super) fn new(mut batch: Batch, config: &CandidatesConfig, schemas: &mut Schemas) -> Part {
        let rows = batch.num_rows();
        let schema = batch.data.schema();
        let places = schema.index_of(PLACE).ok().and_then(|i| {
            let places = batch
                .data
                .column(i)
                .as_primitive_opt::<Int64Type>()
                .cloned();
            let keep: Vec<usize> = (0..schema.fields().len()).filter(|&c| c != i).collect();
            batch.data = batch.data.project(&keep).ok()?;
            places
        });
        let mut part = Part {
            answers: None,
            problem: None,
            answered: vec![false; rows],
            places: None,
            batch,
        };
        let ready = schemas
            .output(&part.batch.data.schema(), config)
            .and_then(|schema| {
                click_columns(&part.batch.data, config)?;
                Ok(schema)
            });
        match (ready, places) {
            (Ok(schema), Some(places)) => {
                part.places = Some(places);
                part.answers = Some(AnswerRows::new(schema, rows, config.max_candidates));
            }
            (Ok(_), None) => {
                part.problem = Some("the row lost its place in the click order".into());
            }
            (Err(e), _) => part.problem = Some(e.to_string()),
        }
        part
    }

    /// The candidate rows and the dead letters of this batch.
    pub(super) fn finish(
        self,
        config: &CandidatesConfig,
        epoch: Epoch,
        elapsed: std::time::Duration,
        metrics: &StageMetrics,
    ) -> Vec<Batch> {
        let data = &self.batch.data;
        let mut rejected = Vec::new();
        let mut records = None;
        match (self.answers, self.problem) {
            (Some(answers), None) => {
                if let Ok((users, items, times)) = click_columns(data, config) {
                    for (row, answered) in self.answered.iter().enumerate() {
                        if *answered {
                            continue;
                        }
                        let reason =
                            if users.is_valid(row) && items.is_valid(row) && times.is_valid(row) {
                                "the click was not in its epoch's order".to_string()
                            } else {
                                format!(
                                    "`{}`, `{}` and `{}` must not be null",
                                    config.user, config.item, config.time
                                )
                            };
                        rejected.push(DeadLetter::for_row(NAME, data, row, reason));
                    }
                }
                match answers.finish(data, epoch) {
                    Ok(r) => records = Some(r),
                    Err(e) => {
                        let reason = e.to_string();
                        rejected = (0..data.num_rows())
                            .map(|r| DeadLetter::for_row(NAME, data, r, &reason))
                            .collect();
                    }
                }
            }
            (_, problem) => {
                let reason = problem.unwrap_or_else(|| "no answers".into());
                rejected = (0..data.num_rows())
                    .map(|r| DeadLetter::for_row(NAME, data, r, &reason))
                    .collect();
            }
        }
        let rows_out = records.as_ref().map_or(0, RecordBatch::num_rows);
        metrics.record_batch(data.num_rows(), rows_out, rejected.len(), elapsed);
        let mut out = Vec::with_capacity(2);
        if let Some(records) = records.filter(|r| r.num_rows() > 0) {
            out.push(self.batch.with_data(records));
        }
        if !rejected.is_empty() {
            match dead_letter::to_batch(&rejected) {
                Ok(letters) => out.push(Batch::dead_letters(letters, self.batch.ingest_ns)),
                Err(e) => tracing::error!("candidates: dead letters: {e}"),
            }
        }
        out
    }
}
