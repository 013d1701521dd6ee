//! The `model` stage kind: what validation, planning and each worker ask of a model stage.

use std::time::Duration;

use arrow_schema::SchemaRef;
use riffle_dataflow::operators::BatchPolicy;
use riffle_dataflow::runtime::Step;
use riffle_dataflow::{DataflowError, DataflowResult};

use super::repository::{self, Watcher};
use super::shared::{Server, SharedModel};
use super::variants::{self, with_variant_field, Variants};
use super::versions::{with_version_field, Versioned};
use super::{output_schema, planned_engine, DeviceSpec, Model, ModelConfig, Share, Signature};
use crate::{ConfigFile, StageContext, StageKind};

impl StageKind for ModelConfig {
    fn kind(&self) -> &'static str {
        "model"
    }

    /// A model read from a repository, or with variants or a shadow, runs operators of its own
    /// in the dataflow; outside it, the model serving now stands for it.
    fn build_alone(&self, ctx: &StageContext<'_>) -> DataflowResult<Step> {
        self.serving_now()?.build(ctx)
    }

    fn set_intra_op_threads(&mut self, threads: usize) {
        self.intra_op_threads = Some(threads);
    }

    fn files_mut(&mut self) -> Vec<ConfigFile<'_>> {
        use crate::kind::FileKind;
        let mut files = vec![ConfigFile {
            key: "path",
            path: &mut self.path,
            expected: "an .onnx file or a model repository (<version>/model.onnx)",
            kind: FileKind::FileOrDirectory,
        }];
        for v in &mut self.variants {
            files.push(ConfigFile {
                key: "variants",
                path: &mut v.path,
                expected: "an .onnx file",
                kind: FileKind::File,
            });
        }
        if let Some(s) = &mut self.shadow {
            files.push(ConfigFile {
                key: "shadow.path",
                path: &mut s.path,
                expected: "an .onnx file",
                kind: FileKind::File,
            });
            files.push(ConfigFile {
                key: "shadow.output",
                path: &mut s.output,
                expected: "a JSON-lines file to append to",
                kind: FileKind::Output,
            });
        }
        files
    }

    fn output_schema(&self, input: &SchemaRef) -> DataflowResult<SchemaRef> {
        self.check_settings()?;
        let (version, config) = self.resolved()?;
        let input = match version {
            Some(_) => with_version_field(input)?,
            None => input.clone(),
        };
        let base = Signature::read(&config.path)?;
        let out = output_schema(&config, &base, &input)?;
        if self.variants.is_empty() && self.shadow.is_none() {
            return Ok(out);
        }
        variants::check(self)?;
        if version.is_some() || self.share == Share::Process {
            return Err(DataflowError::Config(
                "variants and shadow models need a model file as `path` and share: worker".into(),
            )
            .at("variants"));
        }
        let others = self
            .variants
            .iter()
            .enumerate()
            .map(|(i, v)| (format!("variants[{i}].path"), &v.path))
            .chain(
                self.shadow
                    .iter()
                    .map(|s| ("shadow.path".to_string(), &s.path)),
            );
        for (key, path) in others {
            let signature = Signature::read(path).map_err(|e| e.at(key.clone()))?;
            if let Some(why) = repository::incompatibility(self, &base, &signature) {
                return Err(DataflowError::Config(format!(
                    "{} cannot stand in for {}: {why}",
                    path.display(),
                    config.path.display()
                ))
                .at(key));
            }
        }
        if self.variants.is_empty() {
            Ok(out)
        } else {
            with_variant_field(&out)
        }
    }

    fn check(&self, ctx: &StageContext<'_>) -> DataflowResult<()> {
        self.check_settings()?;
        let (version, config) = self.resolved()?;
        self.check_share(version)?;
        planned_engine(&config, ctx.worker, ctx.gpus).map(|_| ())
    }

    fn build(&self, ctx: &StageContext<'_>) -> DataflowResult<Step> {
        self.check_settings()?;
        let (version, config) = self.resolved()?;
        if version.is_none() && (!self.variants.is_empty() || self.shadow.is_some()) {
            variants::check(self)?;
            let threads = self.intra_op_threads.unwrap_or(ctx.intra_op_threads).max(1);
            let load = |c: ModelConfig| Model::for_worker(c, threads, ctx.worker, ctx.gpus);
            let control = load(config.clone())?;
            let (variants, shadow) = variants::load(self, load)?;
            return Ok(Step::Stateful(Box::new(Variants {
                config: self.clone(),
                policy: self.batching().unwrap_or(POLICY),
                control,
                variants,
                shadow,
            })));
        }
        if let Some(version) = version {
            self.check_share(Some(version))?;
            let threads = self.intra_op_threads.unwrap_or(ctx.intra_op_threads).max(1);
            let model = Model::for_worker(config.clone(), threads, ctx.worker, ctx.gpus)?;
            let watcher = Watcher::for_process(
                self,
                (version, config.path.clone()),
                model.signature().clone(),
                threads,
                Duration::from_millis(self.poll_ms),
            )?;
            return Ok(Step::Stateful(Box::new(Versioned {
                config: self.clone(),
                watcher,
                policy: self.batching().unwrap_or(POLICY),
                threads,
                worker: ctx.worker,
                gpus: ctx.gpus.to_vec(),
                start: (version, model),
            })));
        }
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
        let (version, config) = match self.resolved() {
            Ok(r) => r,
            Err(e) => return format!("cannot run here: {e}"),
        };
        let from = match version {
            Some(v) => format!(
                " (repository {}: version {v} now, new versions switched to while running)",
                self.path.display()
            ),
            None => String::new(),
        };
        let this = &config;
        format!(
            "{}, {}, {} ORT thread(s)",
            match planned_engine(this, ctx.worker, ctx.gpus) {
                Ok(engine) => format!("runs on {engine} (worker {})", ctx.worker),
                Err(e) => format!("cannot run here: {e}"),
            },
            this.path
                .file_name()
                .map_or_else(String::new, |f| f.to_string_lossy().into_owned()),
            self.intra_op_threads.unwrap_or(ctx.intra_op_threads)
        ) + match self.share {
            Share::Worker => "",
            Share::Process => ", one instance per process shared by its workers",
        } + &from
    }

    fn may_use_gpu(&self) -> bool {
        self.device != DeviceSpec::Cpu
    }

    fn follows_gpu_map(&self) -> bool {
        self.device == DeviceSpec::Auto
    }

    /// A repository's, variants' or shadow's stage runs operators of its own on every worker
    /// (the version announcements, the shadow), so it cannot be placed on some of them.
    fn stateful(&self) -> bool {
        self.path.is_dir() || !self.variants.is_empty() || self.shadow.is_some()
    }
}

const POLICY: BatchPolicy = BatchPolicy {
    max_size: 1,
    max_delay: Duration::ZERO,
    late_after: None,
    drop_late: false,
};

/// The shortest `poll_ms`: a repository looked at more often than this would spend a core on
/// listing its directory.
pub const MIN_POLL_MS: u64 = 10;

impl ModelConfig {
    /// Settings that cannot take effect as written are errors naming their key, never
    /// silently changed or ignored.
    pub fn check_settings(&self) -> DataflowResult<()> {
        if self.batch.max_size == 0 {
            return Err(
                DataflowError::Config("expected a number ≥ 1, found 0".into()).at("batch.max_size"),
            );
        }
        if self.batch.drop_late && self.batch.late_after_ms.is_none() {
            return Err(DataflowError::Config(
                "drop_late: true needs batch.late_after_ms, the budget after which a row is \
                 late: without it no row is ever late and none would be dropped"
                    .into(),
            )
            .at("batch.drop_late"));
        }
        if self.poll_ms < MIN_POLL_MS {
            return Err(DataflowError::Config(format!(
                "expected at least {MIN_POLL_MS} (ms between looks at the model repository), \
                 found {}",
                self.poll_ms
            ))
            .at("poll_ms"));
        }
        Ok(())
    }

    /// A repository (`version` is its current one) is served per worker only.
    fn check_share(&self, version: Option<u64>) -> DataflowResult<()> {
        if version.is_some() && self.share == Share::Process {
            return Err(DataflowError::Config(
                "share: process serves one model file; a model repository needs share: worker"
                    .into(),
            )
            .at("share"));
        }
        Ok(())
    }

    /// This stage as one plain model: the repository's current version, or the control
    /// without its variants and shadow (for benchmarks that run stages outside the dataflow).
    pub fn serving_now(&self) -> DataflowResult<ModelConfig> {
        let (_, mut config) = self.resolved()?;
        config.variants.clear();
        config.variant_key = None;
        config.shadow = None;
        Ok(config)
    }

    /// The config of the file that serves now: `path` itself, or the highest version of the
    /// repository it names (with that version).
    fn resolved(&self) -> DataflowResult<(Option<u64>, ModelConfig)> {
        if self.path.is_dir() {
            let (version, file) = repository::latest(&self.path)?;
            Ok((Some(version), repository::config_for(self, &file)))
        } else {
            Ok((None, self.clone()))
        }
    }
}
