//! A model stage over a repository of versions, switched while running at one epoch for every
//! worker. Three operators per worker:
//!
//! - **announce** ([`Announce`], worker 0 decides, every worker takes part): holds a
//!   capability a few epochs ([`LOOKAHEAD`]) ahead of its input's frontier, and when the
//!   process's [`Watcher`] has a newer version ready, announces "version `v` from epoch `c`"
//!   at that capability's time `c`, broadcast to every worker. The announcement is also the
//!   operator's state (a [`Switch`]), so a checkpoint covering epoch `c` records it and a
//!   restart serves epochs from `c` with `v`.
//! - **tag** ([`BySchedule`]): adds `model_version` to each batch, from the announcements at or
//!   before its epoch, once no announcement for that epoch can still arrive (the
//!   announcements' frontier has passed it: with the lookahead, that is almost always at once).
//! - the model itself, dynamically batched: rows run on the session of their version, each
//!   worker having loaded it in the background when the watcher found it.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{ArrayRef, Int64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use riffle_dataflow::observe::registry::StageMetrics;
use riffle_dataflow::operators::{
    Announce, BatchPolicy, BatchStream, BySchedule, DynamicBatch, StateUpdates, Switch,
};
use riffle_dataflow::runtime::StatefulStep;
use riffle_dataflow::state::{SavedState, StateRecord};
use riffle_dataflow::{DataflowError, DataflowResult, Epoch, Stage, StageOutput};

use super::repository::{config_for, Watcher};
use super::{output_schema, Model, ModelConfig, Signature};

/// Column naming the version each row ran on.
pub const VERSION_COLUMN: &str = "model_version";

/// How many epochs ahead of worker 0's input a switch takes effect: workers run at most
/// `runtime.max_epochs_in_flight` (4 by default) epochs apart, so rows rarely wait for the
/// announcement of their epoch.
pub const LOOKAHEAD: Epoch = 8;

/// `input` with the version column the tag operator adds.
pub fn with_version_field(input: &SchemaRef) -> DataflowResult<SchemaRef> {
    if input.field_with_name(VERSION_COLUMN).is_ok() {
        return Err(DataflowError::schema(
            VERSION_COLUMN,
            "no such column before a model read from a repository (it adds it)",
            "an existing column",
        )
        .at("path"));
    }
    let mut fields: Vec<_> = input.fields().iter().cloned().collect();
    fields.push(Arc::new(Field::new(VERSION_COLUMN, DataType::Int64, false)));
    Ok(Arc::new(Schema::new_with_metadata(
        fields,
        input.metadata().clone(),
    )))
}

/// The versioned model step of one worker.
pub struct Versioned {
    pub(crate) config: ModelConfig,
    pub(crate) watcher: Arc<Watcher>,
    pub(crate) policy: BatchPolicy,
    pub(crate) threads: usize,
    pub(crate) worker: usize,
    pub(crate) gpus: Vec<usize>,
    /// The version the run starts with (when no checkpoint says otherwise) and its model.
    pub(crate) start: (u64, Model),
}

impl StatefulStep for Versioned {
    fn state_kind(&self) -> &'static str {
        Switch::<u64>::KIND
    }

    fn attach<'scope>(
        self: Box<Self>,
        stream: BatchStream<'scope>,
        metrics: Arc<StageMetrics>,
        state: &SavedState,
        first_epoch: Epoch,
    ) -> (BatchStream<'scope>, StateUpdates<'scope>) {
        let Versioned {
            config,
            watcher,
            policy,
            threads,
            worker,
            gpus,
            start,
        } = *self;
        let restored: BTreeMap<Epoch, u64> = Switch::schedule(state, "model");
        let start_version = start.0;
        let ready = watcher.clone();
        // The start version first, then each newer one the watcher has ready.
        let next = move |current: Option<&u64>| match (current, ready.ready()) {
            (None, _) => Some(start_version),
            (Some(&c), Some((v, _))) if v > c => Some(v),
            _ => None,
        };
        let (switches, state_updates) = stream.clone().announce(
            "ModelVersions",
            LOOKAHEAD,
            restored.clone(),
            first_epoch,
            next,
        );
        let tagged = stream.by_schedule(
            switches,
            restored,
            "ModelVersionTag",
            |batch, version: Option<&u64>| {
                match version.and_then(|&v| tag(&batch.data, v).ok()) {
                    Some(data) => batch.with_data(data),
                    // No version announced for an epoch: only if the announcing worker's
                    // input has ended, i.e. never for rows.
                    None => batch,
                }
            },
        );

        let stage = VersionedModel {
            config,
            watcher,
            threads,
            worker,
            gpus,
            models: HashMap::from([start]),
            loading: HashMap::new(),
            sample: None,
        };
        let out = tagged.dynamic_batch(Box::new(stage), policy, metrics);
        (out, state_updates)
    }
}

/// `batch` with the version column.
fn tag(batch: &RecordBatch, version: u64) -> DataflowResult<RecordBatch> {
    let schema = with_version_field(batch.schema_ref())?;
    let mut columns = batch.columns().to_vec();
    let v = i64::try_from(version).map_err(|e| DataflowError::stage("model", e))?;
    columns.push(Arc::new(Int64Array::from(vec![v; batch.num_rows()])) as ArrayRef);
    Ok(RecordBatch::try_new(schema, columns)?)
}

/// The model stage of one worker over several versions.
struct VersionedModel {
    config: ModelConfig,
    watcher: Arc<Watcher>,
    threads: usize,
    worker: usize,
    gpus: Vec<usize>,
    models: HashMap<u64, Model>,
    /// Versions loading in the background.
    loading: HashMap<u64, JoinHandle<DataflowResult<Model>>>,
    /// A one-row batch seen, to warm newly loaded versions with.
    sample: Option<RecordBatch>,
}

impl VersionedModel {
    /// Starts loading (and warming) the watcher's newest version if this worker lacks it.
    fn preload(&mut self) {
        let Some((version, file)) = self.watcher.ready() else {
            return;
        };
        if self.models.contains_key(&version) || self.loading.contains_key(&version) {
            return;
        }
        let config = config_for(&self.config, &file);
        let (threads, worker, gpus) = (self.threads, self.worker, self.gpus.clone());
        let sample = self.sample.clone();
        let spawned = std::thread::Builder::new()
            .name("riffle-model-load".into())
            .spawn(move || load(config, threads, worker, &gpus, sample, file));
        if let Ok(handle) = spawned {
            self.loading.insert(version, handle);
        }
    }

    /// The model of `version`, waiting for its background load if need be.
    fn model(&mut self, version: u64) -> DataflowResult<&mut Model> {
        if !self.models.contains_key(&version) {
            let model = match self.loading.remove(&version) {
                Some(handle) => handle
                    .join()
                    .map_err(|_| DataflowError::stage("model", "loading a version panicked"))??,
                // Announced before this worker saw it ready (another process found it first).
                None => {
                    let file = super::repository::versions(&self.config.path)?
                        .into_iter()
                        .find(|(v, _)| *v == version)
                        .map(|(_, f)| f)
                        .ok_or_else(|| {
                            DataflowError::stage(
                                "model",
                                format!("version {version} is no longer in the repository"),
                            )
                        })?;
                    Model::for_worker(
                        config_for(&self.config, &file),
                        self.threads,
                        self.worker,
                        &self.gpus,
                    )?
                }
            };
            self.models.insert(version, model);
            // Two versions are enough around a switch; an older one still needed (rows of an
            // earlier epoch arriving late) is loaded again.
            while self.models.len() > 2 {
                let Some(&oldest) = self.models.keys().min() else {
                    break;
                };
                self.models.remove(&oldest);
            }
        }
        self.models
            .get_mut(&version)
            .ok_or_else(|| DataflowError::stage("model", format!("version {version} not loaded")))
    }
}

fn load(
    config: ModelConfig,
    threads: usize,
    worker: usize,
    gpus: &[usize],
    sample: Option<RecordBatch>,
    file: PathBuf,
) -> DataflowResult<Model> {
    let mut model = Model::for_worker(config, threads, worker, gpus)?;
    // The first run allocates ONNX Runtime's arena and picks kernels: done here, not on the
    // first batch after the switch.
    if let Some(sample) = sample {
        if let Err(e) = model.process_batch(&sample) {
            tracing::warn!(model = %file.display(), "warming a new version failed: {e}");
        }
    }
    Ok(model)
}

impl Stage for VersionedModel {
    fn name(&self) -> &str {
        "model"
    }

    fn preserves_rows(&self) -> bool {
        true
    }

    fn output_schema(&self, input: &SchemaRef) -> DataflowResult<SchemaRef> {
        let signature: &Signature = self
            .models
            .values()
            .next()
            .map(Model::signature)
            .ok_or_else(|| DataflowError::stage("model", "no version loaded"))?;
        output_schema(&self.config, signature, input)
    }

    fn process_batch(&mut self, batch: &RecordBatch) -> DataflowResult<StageOutput> {
        if self.sample.is_none() && batch.num_rows() > 0 {
            self.sample = Some(batch.slice(0, 1));
        }
        self.preload();
        let versions = batch
            .column_by_name(VERSION_COLUMN)
            .and_then(|c| c.as_primitive_opt::<Int64Type>())
            .ok_or_else(|| DataflowError::schema(VERSION_COLUMN, "Int64", "no such column"))?
            .clone();
        // Runs of rows sharing a version (one run but around a switch).
        let mut parts = Vec::new();
        let mut start = 0;
        let rows = batch.num_rows();
        while start < rows {
            let v = versions.value(start);
            let mut end = start + 1;
            while end < rows && versions.value(end) == v {
                end += 1;
            }
            let version = u64::try_from(v).map_err(|e| DataflowError::stage("model", e))?;
            let part = batch.slice(start, end - start);
            parts.push(self.model(version)?.process_batch(&part)?.records);
            start = end;
        }
        match parts.len() {
            1 => Ok(StageOutput::all(parts.remove(0))),
            _ => {
                let schema = self.output_schema(batch.schema_ref())?;
                Ok(StageOutput::all(arrow_select::concat::concat_batches(
                    &schema, &parts,
                )?))
            }
        }
    }
}
