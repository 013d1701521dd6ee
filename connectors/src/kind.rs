//! What a source or sink kind says about itself, so that validation, planning and running
//! need to know nothing of any one connector: [`SourceKind`] and [`SinkKind`], implemented by
//! each kind's configuration type, as `riffle_operators::StageKind` is by each stage's.
//!
//! A kind is its own module plus one line in [`crate::registry`]; its numbers' ranges are
//! declared beside its keys (`RANGES`, an associated constant of its configuration type) and
//! checked by validation before it is built.

use std::fmt;
use std::path::{Path, PathBuf};

use arrow_schema::Schema;
use riffle_dataflow::range::Range;
use riffle_dataflow::sink::SinkFactory;
use riffle_dataflow::{DataflowResult, SourceFactory};

/// A `source:` kind (`images`, `kafka`, …).
pub trait SourceKind: fmt::Debug + Send + Sync {
    /// The YAML key.
    fn kind(&self) -> &'static str;

    /// Paths the configuration names, for validation to resolve against the pipeline file's
    /// folder.
    fn paths_mut(&mut self) -> Vec<&mut PathBuf> {
        Vec::new()
    }

    /// Files or directories that must exist before the source is opened.
    fn inputs(&self) -> Vec<&Path> {
        Vec::new()
    }

    /// A consumer group whose offsets must be committed with the output (by a sink that can:
    /// [`SinkKind::commit_source_offsets`]), which also needs checkpoints.
    fn offsets_with_output(&self) -> Option<OffsetsWithOutput> {
        None
    }

    /// Opens the source: lists or inspects its input and fixes its schema, so a missing or
    /// unusable input is reported before the dataflow starts. The factory splits it across
    /// workers (`SourceFactory::partition`) and says whether it resumes from checkpoints.
    fn build(&self) -> DataflowResult<Box<dyn SourceFactory>>;

    /// Offered a first stage that only scales the picture in `column` to `width`×`height`
    /// (`riffle_operators::StageKind::scale_only`): true when the source does it as it decodes,
    /// the stage then finding its pictures at that size already.
    fn absorb_scale(&mut self, _column: &str, _width: u32, _height: u32) -> bool {
        false
    }

    /// A line for `riffle plan` on what it does beyond reading (after [`SourceKind::absorb_scale`]).
    fn plan_note(&self) -> Option<String> {
        None
    }
}

/// A consumer group of a source, with the key that asks for it and what the rest of the
/// pipeline must be for its offsets to be committed with the output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OffsetsWithOutput {
    /// The source's key (`group_id`).
    pub key: &'static str,
    pub group: SourceGroup,
    /// What the sink and runtime must be, for the error when they are not.
    pub expected: &'static str,
}

/// The consumer group (and topic) whose offsets a sink's transactions commit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceGroup {
    pub topic: String,
    pub group_id: String,
}

/// What a sink is for in a pipeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SinkRole {
    /// `sink:`, written as epochs commit.
    Results,
    /// `dead_letter:` (or the default beside the results).
    DeadLetters,
    /// `live_sink:`, written as results arrive and never committed.
    Live,
    /// `events.sink`: rows taken out of the results, written as each epoch's results are (at
    /// least once: an epoch replayed after a crash writes its events again).
    Events,
}

/// What a sink learns of its pipeline before it is built.
#[derive(Clone, Copy, Debug)]
pub struct SinkContext<'a> {
    /// The pipeline's name (its `name:`, or the file's stem).
    pub pipeline: &'a str,
    pub role: SinkRole,
}

/// A `sink:` kind (`jsonl`, `kafka`, …); the same kinds serve `dead_letter:` and `live_sink:`.
pub trait SinkKind: fmt::Debug + Send + Sync {
    /// The YAML key.
    fn kind(&self) -> &'static str;

    /// Paths the configuration names, for validation to resolve against the pipeline file's
    /// folder.
    fn paths_mut(&mut self) -> Vec<&mut PathBuf> {
        Vec::new()
    }

    /// The path `riffle run --output` replaces: the file the results go to, when the sink
    /// writes one (by default the first of [`SinkKind::paths_mut`]); `None` for sinks whose
    /// paths are only inputs (a CA file).
    fn output_mut(&mut self) -> Option<&mut PathBuf> {
        self.paths_mut().into_iter().next()
    }

    /// Files written, checked to be creatable before the run.
    fn outputs(&self) -> Vec<&Path> {
        Vec::new()
    }

    /// Settings that follow from the pipeline and the sink's role, filled in before it is
    /// checked and built (a Kafka producer's `transactional.id`, a live topic's commits).
    fn prepare(&mut self, _ctx: &SinkContext<'_>) {}

    /// Whether it can take the results `schema` describes; the error says what is missing.
    fn check_input(&self, _schema: &Schema) -> Result<(), String> {
        Ok(())
    }

    /// Checks settings that depend on the run's checkpoints (`checkpoint_interval_ms`:
    /// `runtime.checkpoint.interval_ms`, `None` without checkpoints); the error is the key at
    /// fault and what was expected.
    fn check_runtime(
        &self,
        _checkpoint_interval_ms: Option<u64>,
    ) -> Result<(), (&'static str, String)> {
        Ok(())
    }

    /// Takes a source's consumer group, to commit its offsets with the output; `false` when
    /// this sink (as configured) cannot.
    fn commit_source_offsets(&mut self, _group: &SourceGroup) -> bool {
        false
    }

    /// Where its rejected records go when the pipeline names no `dead_letter`, when that is
    /// a sink of its own kind: `None` for a JSON-lines file beside its first path
    /// ([`crate::SinkConfig::default_dead_letters`]).
    fn dead_letters(&self) -> Option<Self>
    where
        Self: Sized,
    {
        None
    }

    /// Whether every worker may open one of its own, each writing the rows it holds (a `tap:`
    /// stage): true where rows of different workers never meet in one file (one per camera).
    fn per_worker(&self) -> bool {
        false
    }

    /// The sink's factory: the runtime opens one writer (worker 0) and commits through it.
    fn build(&self) -> DataflowResult<Box<dyn SinkFactory>>;
}

/// The ranges of a kind's numbers, declared beside its keys.
pub trait Limits {
    /// Checked by validation on the kind's block (`source: { kafka: {...} }`), before the
    /// stages' and runtime's ranges; the kind's own build checks the same constants.
    const RANGES: &'static [Range] = &[];
}

impl<T: Limits> Limits for Box<T> {
    const RANGES: &'static [Range] = T::RANGES;
}

/// Ranges of keys that several kinds share, with the same meaning in each.
pub mod shared {
    use riffle_dataflow::range::Range;

    /// Records per batch, and per chunk dealt to a worker.
    pub const BATCH_SIZE: Range = Range::int("batch_size", 1, 1_048_576);
    /// A replay's pace, per worker.
    pub const MAX_RECORDS_PER_SECOND: Range = Range::real("max_records_per_second", 1e-6, 1e9);
    /// Cameras a source splits its input into, or lists.
    pub const CAMERAS: Range = Range::int("cameras", 1, 4096);
}

/// A kind left out of this build (its cargo feature off, for a quicker first build): the
/// block still parses to a place in the pipeline file, but to an error naming the feature, so
/// a pipeline that needs the kind fails at validation, never at run time.
#[derive(Clone, Debug)]
pub struct Unbuilt<F>(std::marker::PhantomData<F>);

/// The kind an [`Unbuilt`] stands for and the cargo feature that builds it.
pub trait Feature: fmt::Debug + Clone + Send + Sync + 'static {
    const KIND: &'static str;
    const FEATURE: &'static str;
}

/// What every kind or command left out of a build says: which, and the feature that builds it.
pub fn not_built(kind: &str, feature: &str) -> String {
    format!(
        "`{kind}` is not in this build of riffle (built without the `{feature}` feature); \
         rebuild with default features: cargo build --release"
    )
}

impl<F: Feature> Unbuilt<F> {
    fn why() -> String {
        not_built(F::KIND, F::FEATURE)
    }
}

impl<'de, F: Feature> serde::Deserialize<'de> for Unbuilt<F> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        serde::de::IgnoredAny::deserialize(d)?;
        Err(serde::de::Error::custom(Self::why()))
    }
}

impl<F: Feature> Limits for Unbuilt<F> {}

impl<F: Feature> SourceKind for Unbuilt<F> {
    fn kind(&self) -> &'static str {
        F::KIND
    }
    fn build(&self) -> DataflowResult<Box<dyn SourceFactory>> {
        Err(riffle_dataflow::DataflowError::Config(Self::why()))
    }
}

impl<F: Feature> SinkKind for Unbuilt<F> {
    fn kind(&self) -> &'static str {
        F::KIND
    }
    fn build(&self) -> DataflowResult<Box<dyn SinkFactory>> {
        Err(riffle_dataflow::DataflowError::Config(Self::why()))
    }
}
