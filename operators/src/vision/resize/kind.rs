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
        match (&self.device, self.gpu_unsupported()) {
            (DeviceSpec::Cpu, _) => "on the worker holding the batch".into(),
            (DeviceSpec::Auto, Some((_, what))) => {
                format!("on the worker holding the batch, on the CPU ({what} has no GPU kernel)")
            }
            (device, _) => {
                format!("on the worker holding the batch, device {device} (GPU kernels)")
            }
        }
    }

    fn may_use_gpu(&self) -> bool {
        self.device != DeviceSpec::Cpu && self.gpu_unsupported().is_none()
    }

    fn follows_gpu_map(&self) -> bool {
        self.device == DeviceSpec::Auto
    }

    /// A CPU stretch that antialiases like a decoder's bilinear scaler (whose filter widens
    /// with the ratio) and keeps no full-size picture.
    fn scale_only(&self) -> Option<(&str, u32, u32)> {
        let fits = self.mode == super::ResizeMode::Stretch
            && self.antialiased()
            && self.device == DeviceSpec::Cpu
            && !self.keep_input;
        fits.then_some((self.input.as_str(), self.width, self.height))
    }
}

impl ResizeConfig {
    /// The GPU this worker resizes on, if any.
    fn gpu(&self, ctx: &StageContext<'_>) -> DataflowResult<Option<usize>> {
        self.placement(|device| riffle_gpu::resolve(device, ctx.worker, ctx.gpus))
    }

    /// The GPU this worker resizes on, if any, given `resolve` (what `device` comes to on this
    /// host: [`riffle_gpu::resolve`] outside tests). A resize the kernels cannot do
    /// ([`ResizeConfig::gpu_unsupported`]) is an error at its key with `device: cuda:N`, before
    /// any GPU is looked for, and runs on the CPU with `device: auto`, said once in the log.
    pub(crate) fn placement(
        &self,
        resolve: impl FnOnce(&DeviceSpec) -> Result<Option<usize>, String>,
    ) -> DataflowResult<Option<usize>> {
        let unsupported = self.gpu_unsupported();
        if let (DeviceSpec::Cuda(n), Some((key, what))) = (&self.device, unsupported) {
            return Err(DataflowError::Config(format!(
                "resize: {what} runs on the CPU only (the GPU kernels do the antialiased \
                 stretch), not on `device: cuda:{n}`; set `device: cpu`, or `auto` to use a \
                 GPU only where it can"
            ))
            .at(key));
        }
        let gpu = resolve(&self.device).map_err(|e| DataflowError::Config(e).at("device"))?;
        match (gpu, unsupported) {
            (Some(ordinal), Some((_, what))) => {
                static SAID: std::sync::Once = std::sync::Once::new();
                SAID.call_once(|| {
                    tracing::info!(
                        "resize: {what} has no GPU kernel; `device: auto` runs it on the CPU, \
                         not on cuda:{ordinal}"
                    )
                });
                Ok(None)
            }
            (gpu, _) => Ok(gpu),
        }
    }
}
