//! The `candidates` stage kind: a stateful step whose features are checkpointed.

use std::sync::Arc;

use arrow_schema::SchemaRef;
use riffle_dataflow::observe::registry::StageMetrics;
use riffle_dataflow::operators::{BatchStream, StateUpdates};
use riffle_dataflow::state::SavedState;
use riffle_dataflow::{DataflowResult, Epoch};

use super::{Candidates, CandidatesConfig};

impl crate::StageKind for CandidatesConfig {
    fn kind(&self) -> &'static str {
        "candidates"
    }

    fn output_schema(&self, input: &SchemaRef) -> DataflowResult<SchemaRef> {
        CandidatesConfig::output_schema(self, input)
    }

    fn build(
        &self,
        _ctx: &crate::StageContext<'_>,
    ) -> DataflowResult<riffle_dataflow::runtime::Step> {
        Ok(riffle_dataflow::runtime::Step::Stateful(Box::new(
            CandidatesStep(self.clone()),
        )))
    }

    fn describe(&self, _ctx: &crate::StageContext<'_>) -> String {
        let features = match self.features {
            super::FeaturesAsOf::PerClick => "every earlier click",
            super::FeaturesAsOf::PreviousEpoch => "clicks of earlier epochs only",
        };
        format!(
            "clicks sharded by `{}`; popularity window {}, seen window {}; ≤ {} candidates per click, from {features}",
            self.user,
            self.window.map_or("unbounded".into(), |w| w.to_string()),
            self.seen_window.map_or("unbounded".into(), |w| w.to_string()),
            self.max_candidates
        )
    }

    fn stateful(&self) -> bool {
        true
    }
}

/// Candidates as the runtime runs it: its features are its checkpointed state.
struct CandidatesStep(CandidatesConfig);

impl riffle_dataflow::runtime::StatefulStep for CandidatesStep {
    fn state_kind(&self) -> &'static str {
        <super::WindowClick as riffle_dataflow::state::StateRecord>::KIND
    }

    fn attach<'scope>(
        self: Box<Self>,
        stream: BatchStream<'scope>,
        metrics: Arc<StageMetrics>,
        state: &SavedState,
        first_epoch: Epoch,
    ) -> (BatchStream<'scope>, StateUpdates<'scope>) {
        stream.candidates_from(self.0, metrics, state, first_epoch)
    }
}
