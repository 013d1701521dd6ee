//! The `resize` stage kind.

use arrow_schema::SchemaRef;
use riffle_dataflow::runtime::Step;
use riffle_dataflow::{DataflowError, DataflowResult, Stage};

use super::{Resize, ResizeConfig};
use crate::model::Device;
use crate::{StageContext, StageKind};

impl StageKind for ResizeConfig {
    fn kind(&self) -> &'static str {
        "resize"
    }

    fn output_schema(&self, input: &SchemaRef) -> DataflowResult<SchemaRef> {
        // The CPU stage is cheap to make and computes the same schema as the GPU one.
        Resize::new(self.clone())?.output_schema(input)
    }

    fn check(&self, ctx: &StageContext<'_>) -> DataflowResult<()> {
        self.gpu(ctx).map(|_| ())
    }

    fn build(&self, ctx: &StageContext<'_>) -> DataflowResult<Step> {
        let gpu = self.gpu(ctx)?;
        let stage = match gpu {
            Some(ordinal) => Resize::on_gpu(self.clone(), ordinal)?,
            None => Resize::new(self.clone())?,
        };
        Ok(Step::Apply(Box::new(stage)))
    }

    fn describe(&self, _ctx: &StageContext<'_>) -> String {
        match self.device {
            Device::Cpu => "on the worker holding the batch".into(),
            _ => format!(
                "on the worker holding the batch, {} (GPU kernels)",
                self.device_name()
            ),
        }
    }

    fn may_use_gpu(&self) -> bool {
        self.device != Device::Cpu
    }
}

impl ResizeConfig {
    /// The GPU this worker resizes on, if any.
    fn gpu(&self, ctx: &StageContext<'_>) -> DataflowResult<Option<usize>> {
        crate::gpu::resolve(&self.device, ctx.worker, ctx.gpus)
            .map_err(|e| DataflowError::Config(e).at("device"))
    }

    fn device_name(&self) -> String {
        match self.device {
            Device::Cpu => "cpu".into(),
            Device::Auto => "device auto".into(),
            Device::Cuda(n) => format!("cuda:{n}"),
        }
    }
}
