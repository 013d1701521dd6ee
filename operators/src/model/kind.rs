//! The `model` stage kind: what validation, planning and each worker ask of a model stage.

use std::time::Duration;

use arrow_schema::SchemaRef;
use riffle_dataflow::operators::BatchPolicy;
use riffle_dataflow::runtime::Step;
use riffle_dataflow::{DataflowError, DataflowResult};

use super::shared::{Server, SharedModel};
use super::{output_schema, planned_engine, DeviceSpec, Model, ModelConfig, Share, Signature};
use crate::{ConfigFile, StageContext, StageKind};

impl StageKind for ModelConfig {
    fn kind(&self) -> &'static str {
        "model"
    }

    fn files_mut(&mut self) -> Vec<ConfigFile<'_>> {
        vec![ConfigFile {
            key: "path",
            path: &mut self.path,
            expected: "an .onnx file",
        }]
    }

    fn output_schema(&self, input: &SchemaRef) -> DataflowResult<SchemaRef> {
        if self.batch.max_size == 0 {
            return Err(
                DataflowError::Config("expected a number ≥ 1, found 0".into()).at("batch.max_size"),
            );
        }
        output_schema(self, &Signature::read(&self.path)?, input)
    }

    fn check(&self, ctx: &StageContext<'_>) -> DataflowResult<()> {
        planned_engine(self, ctx.worker, ctx.gpus).map(|_| ())
    }

    fn build(&self, ctx: &StageContext<'_>) -> DataflowResult<Step> {
        let load = || Model::for_worker(self.clone(), ctx.intra_op_threads, ctx.worker, ctx.gpus);
        let stage: Box<dyn riffle_dataflow::Stage> = match self.share {
            Share::Worker => Box::new(load()?),
            Share::Process => {
                let engine = planned_engine(self, ctx.worker, ctx.gpus)?;
                // The one instance does every worker's work, so it gets their threads (up to
                // the cores). Merged batches stay at `batch.max_size` rows: larger ones grow
                // ONNX Runtime's arena, the memory sharing is meant to save.
                let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
                let threads = (ctx.intra_op_threads * ctx.peers).clamp(1, cores.max(1));
                let threads = self.intra_op_threads.unwrap_or(threads);
                let max_rows = self.batch.max_size;
                let load = || Model::for_worker(self.clone(), threads, ctx.worker, ctx.gpus);
                let server = Server::for_process(self, &format!("{engine:?}"), max_rows, load)?;
                Box::new(SharedModel::new(self.clone(), server))
            }
        };
        Ok(Step::Batched(stage, self.batching().unwrap_or(POLICY)))
    }

    fn batching(&self) -> Option<BatchPolicy> {
        Some(BatchPolicy {
            max_size: self.batch.max_size,
            max_delay: Duration::from_millis(self.batch.max_delay_ms),
            late_after: self.batch.late_after_ms.map(Duration::from_millis),
            drop_late: self.batch.drop_late,
        })
    }

    fn describe(&self, ctx: &StageContext<'_>) -> String {
        format!(
            "{}, {}, {} ORT thread(s)",
            match planned_engine(self, ctx.worker, ctx.gpus) {
                Ok(engine) => format!("runs on {engine} (worker {})", ctx.worker),
                Err(e) => format!("cannot run here: {e}"),
            },
            self.path
                .file_name()
                .map_or_else(String::new, |f| f.to_string_lossy().into_owned()),
            self.intra_op_threads.unwrap_or(ctx.intra_op_threads)
        ) + match self.share {
            Share::Worker => "",
            Share::Process => ", one instance per process shared by its workers",
        }
    }

    fn may_use_gpu(&self) -> bool {
        self.device != DeviceSpec::Cpu
    }
}

const POLICY: BatchPolicy = BatchPolicy {
    max_size: 1,
    max_delay: Duration::ZERO,
    late_after: None,
    drop_late: false,
};
