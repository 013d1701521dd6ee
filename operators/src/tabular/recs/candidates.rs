//! Candidate generation: for every click, the most popular items the user has not seen.
//!
//! The configuration and the stage's extension trait are here; the modes are in
//! [`super::per_click`] (the default) and [`super::previous_epoch`], and what both share in
//! [`super::checkpoint`] (the checkpointed records) and [`super::answer_rows`] (the answers).

use std::sync::Arc;

use arrow_schema::{DataType, Field, Schema, SchemaRef};
use riffle_dataflow::observe::registry::StageMetrics;
use riffle_dataflow::operators::StateUpdates;
use riffle_dataflow::state::SavedState;
use riffle_dataflow::{DataflowError, DataflowResult, Epoch};
use serde::Deserialize;
use serde_inline_default::serde_inline_default;

/// Which clicks the features that answer a click include.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FeaturesAsOf {
    /// Every earlier click and the click itself, in event-time order (equal times in input
    /// order), as a loop over the clicks one at a time would have them: real-time features.
    #[default]
    PerClick,
    /// Only the clicks of earlier epochs: no worker waits for another's clicks of the same
    /// epoch, but a click does not see the clicks just before it (not even its own user's).
    PreviousEpoch,
}

/// YAML block of a `candidates` stage.
#[serde_inline_default]
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CandidatesConfig {
    /// Int64 column of user ids; clicks are sharded by it.
    #[serde_inline_default("user_id".to_string())]
    pub user: String,
    /// Int64 column of item ids.
    #[serde_inline_default("item_id".to_string())]
    pub item: String,
    /// Int64 column of event times (any unit; `window` and `seen_window` use the same).
    #[serde_inline_default("timestamp".to_string())]
    pub time: String,
    /// Popularity counts clicks this recent (in event time); unset: every click so far.
    #[serde(default)]
    pub window: Option<i64>,
    /// A user's seen items are those clicked this recently; unset: every click so far.
    #[serde(default)]
    pub seen_window: Option<i64>,
    /// Candidates per click (fewer while few items are known).
    #[serde_inline_default(100)]
    pub max_candidates: usize,
    /// What a click's features include: `per_click` (every earlier click and itself) or
    /// `previous_epoch` (clicks of earlier epochs only, the faster, stale mode).
    #[serde(default)]
    pub features: FeaturesAsOf,
    /// Int64 column written with each candidate item (null for a click with none).
    #[serde_inline_default("candidate".to_string())]
    pub output: String,
    /// Int64 column written with an id shared by the rows of one click (unique: the epoch in
    /// the high 32 bits; with `per_click`, the click's place in the epoch's order below).
    #[serde_inline_default("event".to_string())]
    pub event: String,
    /// UInt64 column written with the click's epoch (`per_click`: its features hold every
    /// click of earlier epochs and the earlier clicks of this one; `previous_epoch`: only the
    /// clicks of earlier epochs).
    #[serde_inline_default("epoch".to_string())]
    pub epoch: String,
}

impl CandidatesConfig {
    /// The output schema for `input`, or what is wrong with the configuration.
    pub fn output_schema(&self, input: &Schema) -> DataflowResult<SchemaRef> {
        // Every error is located at the key it is about.
        if self.max_candidates == 0 {
            return Err(DataflowError::Config(
                "candidates: max_candidates must be at least 1".into(),
            )
            .at("max_candidates"));
        }
        for (key, window) in [("window", self.window), ("seen_window", self.seen_window)] {
            if let Some(w) = window.filter(|&w| w <= 0) {
                return Err(DataflowError::Config(format!(
                    "candidates: windows must be positive, got {w}"
                ))
                .at(key));
            }
        }
        for (key, column) in [
            ("user", &self.user),
            ("item", &self.item),
            ("time", &self.time),
        ] {
            let field = input.field_with_name(column).map_err(|_| {
                DataflowError::schema(column, "an Int64 column", "no such column").at(key)
            })?;
            if field.data_type() != &DataType::Int64 {
                return Err(DataflowError::schema(
                    column,
                    "an Int64 column",
                    field.data_type().to_string(),
                )
                .at(key));
            }
        }
        let mut fields: Vec<Field> = input.fields().iter().map(|f| f.as_ref().clone()).collect();
        for (key, name, data_type, nullable) in [
            ("event", &self.event, DataType::Int64, false),
            ("output", &self.output, DataType::Int64, true),
            ("epoch", &self.epoch, DataType::UInt64, false),
        ] {
            if input.field_with_name(name).is_ok() {
                return Err(
                    DataflowError::schema(name, "a new column name", "an existing column").at(key),
                );
            }
            fields.push(Field::new(name, data_type, nullable));
        }
        Ok(Arc::new(Schema::new_with_metadata(
            fields,
            input.metadata().clone(),
        )))
    }
}

/// Extension trait adding candidate generation to batch streams.
pub trait Candidates<'scope>: Sized {
    /// Shards clicks by user, keeps item popularity and each user's seen items, and replaces
    /// every click row by one row per candidate item (or one row with a null candidate when
    /// there is none yet). With `features: per_click` (the default) a click's features include
    /// every earlier click and itself; with `previous_epoch`, the clicks of earlier epochs.
    /// Rows with a null user, item or time become dead letters.
    ///
    /// # Examples
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// use arrow_array::{Array, Int64Array, RecordBatch};
    /// use riffle_dataflow::observe::registry::Metrics;
    /// use riffle_dataflow::Batch;
    /// use riffle_operators::tabular::recs::{Candidates, CandidatesConfig};
    /// use timely::dataflow::operators::{Inspect, ToStream};
    ///
    /// let clicks = |users: Vec<i64>, items: Vec<i64>| {
    ///     let times = Int64Array::from_iter_values(0..users.len() as i64);
    ///     RecordBatch::try_from_iter(vec![
    ///         ("user_id", Arc::new(Int64Array::from(users)) as _),
    ///         ("item_id", Arc::new(Int64Array::from(items)) as _),
    ///         ("timestamp", Arc::new(times) as _),
    ///     ]).unwrap()
    /// };
    /// let config: CandidatesConfig = serde_json::from_str(r#"{"max_candidates": 2}"#).unwrap();
    /// let metrics = Metrics::new().unwrap().stage("candidates").unwrap();
    /// let out = Arc::new(Mutex::new(Vec::new()));
    /// let sink = out.clone();
    /// timely::example(move |scope| {
    ///     use timely::dataflow::operators::vec::Input;
    ///     let (mut input, stream) = scope.new_input();
    ///     stream
    ///         .candidates(config, metrics)
    ///         .inspect(move |b: &Batch| sink.lock().unwrap().push(b.data.clone()));
    ///     input.send(Batch::records(clicks(vec![1, 2, 3], vec![10, 10, 11]), 0));
    ///     input.advance_to(1);
    ///     input.send(Batch::records(clicks(vec![4, 1], vec![12, 13]), 0));
    /// });
    /// let out = out.lock().unwrap();
    /// let candidates = |user: i64| -> Vec<Option<i64>> {
    ///     out.iter().flat_map(|b| {
    ///         let users = b.column_by_name("user_id").unwrap().as_any().downcast_ref::<Int64Array>().unwrap().clone();
    ///         let c = b.column_by_name("candidate").unwrap().as_any().downcast_ref::<Int64Array>().unwrap().clone();
    ///         (0..b.num_rows()).filter(move |&r| users.value(r) == user).map(move |r| c.is_valid(r).then(|| c.value(r)))
    ///     }).collect()
    /// };
    /// // Each click sees the clicks before it: user 3 sees 10 (twice, by users 1 and 2).
    /// assert_eq!(candidates(3), vec![Some(10)]);
    /// // 10 (twice), then 11 and 12 (once; ties go to the smaller id).
    /// assert_eq!(candidates(4), vec![Some(10), Some(11)]);
    /// // User 1 has no candidate for its first click, and already clicked 10 for its second.
    /// assert_eq!(candidates(1), vec![None, Some(11), Some(12)]);
    /// ```
    fn candidates(self, config: CandidatesConfig, metrics: Arc<StageMetrics>) -> Self {
        self.candidates_from(config, metrics, &SavedState::default(), 0)
            .0
    }

    /// As [`Candidates::candidates`], restoring the features from a checkpoint's `state` (as
    /// the returned updates wrote it) before `first_epoch`, and returning the updates of the
    /// state to checkpoint: the clicks in each window, as [`WindowClick`](super::WindowClick)
    /// records.
    fn candidates_from(
        self,
        config: CandidatesConfig,
        metrics: Arc<StageMetrics>,
        state: &SavedState,
        first_epoch: Epoch,
    ) -> (Self, StateUpdates<'scope>);
}
