//! The `resize` stage kind.

use arrow_schema::SchemaRef;
use riffle_dataflow::runtime::Step;
use riffle_dataflow::{DataflowError, DataflowResult};

use riffle_gpu::DeviceSpec;

use super::{output_schema, Resize, ResizeConfig};
use crate::{StageContext, StageKind};

impl StageKind for ResizeConfig {
    fn kind(&self) -> &'static str {
        "resize"
    }

    fn output_schema(&self, input: &SchemaRef) -> DataflowResult<SchemaRef> {
        output_schema(self, input)
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
        match &self.device {
            DeviceSpec::Cpu => "on the worker holding the batch".into(),
            device => format!("on the worker holding the batch, device {device} (GPU kernels)"),
        }
    }

    fn may_use_gpu(&self) -> bool {
        self.device != DeviceSpec::Cpu
    }
}

impl ResizeConfig {
    /// The GPU this worker resizes on, if any.
    fn gpu(&self, ctx: &StageContext<'_>) -> DataflowResult<Option<usize>> {
        riffle_gpu::resolve(&self.device, ctx.worker, ctx.gpus)
            .map_err(|e| DataflowError::Config(e).at("device"))
    }
}
