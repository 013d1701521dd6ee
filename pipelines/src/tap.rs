//! `tap`: a stage that writes the rows it sees to a sink and passes them on unchanged, so a
//! point in the middle of a pipeline can be watched (the frames with their tracks, before a
//! `crop` turns them into one row per object): `- tap: { video: { dir: out/video } }`.
//!
//! Every worker opens a writer of its own for the rows it holds, so only sink kinds whose
//! rows of different workers never share a file take part ([`riffle_connectors::kind::SinkKind::per_worker`]: the
//! `video` sink, one file per camera). A tap writes as rows pass, at least once: after a
//! restart from a checkpoint the replayed rows are written again. Its failures are logged and
//! the rows go on: the pipeline's results never depend on it.

use std::path::PathBuf;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use riffle_connectors::SinkConfig;
use riffle_dataflow::runtime::Step;
use riffle_dataflow::sink::Sink;
use riffle_dataflow::{DataflowError, DataflowResult, Stage, StageOutput};
use riffle_operators::{ConfigFile, FileKind, StageContext, StageKind};
use serde::Deserialize;

/// `tap: { <sink kind>: { ... } }`: the same blocks as `sink:`.
#[derive(Clone, Debug, Deserialize)]
#[serde(transparent)]
pub struct TapConfig(pub SinkConfig);

impl TapConfig {
    fn per_worker(&self) -> DataflowResult<()> {
        let kind = self.0.kind();
        if kind.per_worker() {
            return Ok(());
        }
        Err(DataflowError::Config(format!(
            "a `{}` sink cannot be written from every worker at once (their rows would meet \
             in one output); a tap takes: video",
            kind.kind()
        ))
        .at(kind.kind()))
    }
}

impl StageKind for TapConfig {
    fn kind(&self) -> &'static str {
        "tap"
    }

    /// The folder of live streams its sink writes, which the live view serves.
    fn live_stream_dir(&self) -> Option<PathBuf> {
        self.0.kind().build().ok()?.live_stream_dir()
    }

    fn files_mut(&mut self) -> Vec<ConfigFile<'_>> {
        let key = self.0.kind().kind();
        self.0
            .kind_mut()
            .paths_mut()
            .into_iter()
            .map(|path| ConfigFile {
                key,
                path,
                expected: "a folder to write in",
                kind: FileKind::Output,
            })
            .collect()
    }

    fn output_schema(&self, input: &SchemaRef) -> DataflowResult<SchemaRef> {
        self.per_worker()?;
        let kind = self.0.kind();
        kind.check_input(input)
            .map_err(|e| DataflowError::Config(e).at(kind.kind()))?;
        Ok(input.clone())
    }

    fn check(&self, _ctx: &StageContext<'_>) -> DataflowResult<()> {
        self.per_worker()?;
        self.0.kind().build().map(|_| ())
    }

    fn build(&self, _ctx: &StageContext<'_>) -> DataflowResult<Step> {
        self.per_worker()?;
        let sink = self.0.kind().build()?.open()?;
        Ok(Step::Apply(Box::new(Tap {
            sink,
            kind: self.0.kind().kind(),
            failures: 0,
        })))
    }

    fn describe(&self, _ctx: &StageContext<'_>) -> String {
        format!(
            "on the worker holding the batch: a `{}` sink of its own, rows passed on",
            self.0.kind().kind()
        )
    }
}

/// One worker's tap.
struct Tap {
    sink: Box<dyn Sink>,
    kind: &'static str,
    failures: u64,
}

impl Tap {
    fn write(&mut self, batch: &RecordBatch) -> DataflowResult<()> {
        self.sink.write_batch(batch)?;
        // What it wrote is readable now (a video's fragments), not only at the end.
        self.sink.flush()
    }
}

impl Stage for Tap {
    fn name(&self) -> &str {
        "tap"
    }

    fn output_schema(&self, input: &SchemaRef) -> DataflowResult<SchemaRef> {
        Ok(input.clone())
    }

    fn process_batch(&mut self, batch: &RecordBatch) -> DataflowResult<StageOutput> {
        if let Err(e) = self.write(batch) {
            self.failures += 1;
            // A line for the first few, then one every thousand: never a flood.
            if self.failures <= 10 || self.failures.is_multiple_of(1000) {
                tracing::warn!(
                    "tap: the `{}` sink failed ({} time(s)), the rows go on: {e}",
                    self.kind,
                    self.failures
                );
            }
        }
        Ok(StageOutput::all(batch.clone()))
    }

    fn preserves_rows(&self) -> bool {
        true
    }
}

impl Drop for Tap {
    /// The run's end (or a worker's): the sink closes its outputs whole.
    fn drop(&mut self) {
        if let Err(e) = self.sink.finish() {
            tracing::warn!("tap: closing the `{}` sink: {e}", self.kind);
        }
    }
}
