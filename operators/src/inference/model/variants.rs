//! A/B variants and a shadow model for one model stage.
//!
//! - `variants:` route a share of keys (`weight`, a fraction of the key space) to other
//!   models; the rest go to the stage's own `path` (variant `control`). A key's variant comes
//!   from a stable hash of the `variant_key` column, so it sticks across batches, workers,
//!   processes and restarts. Rows get a `variant` column.
//! - `shadow:` runs another model on a sample of keys on a thread of its own, off the main
//!   path: its results are appended to a JSON-lines file and never reach the main output. When
//!   it falls behind, sampled batches are skipped (counted), not waited for.
//!
//! Each variant and the shadow report metrics as stages of their own (`model[candidate]`,
//! `model[shadow]`): rows, batches and run time, in the summary, `/metrics` and the live view.

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, RecordBatch, StringArray, UInt32Array};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use riffle_dataflow::observe::registry::StageMetrics;
use riffle_dataflow::operators::{
    no_state_updates, BatchPolicy, BatchStream, DynamicBatch, StateUpdates,
};
use riffle_dataflow::runtime::StatefulStep;
use riffle_dataflow::state::SavedState;
use riffle_dataflow::{DataflowError, DataflowResult, Epoch, Stage, StageOutput};
use serde::Deserialize;

use super::repository::config_for;
use super::{output_schema, Model, ModelConfig};

/// Column naming the variant that served each row.
pub const VARIANT_COLUMN: &str = "variant";
/// The variant of rows no other variant takes: the stage's own `path`.
pub const CONTROL: &str = "control";

/// One entry of `variants:`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct VariantSpec {
    /// Its name in the `variant` column and in metrics.
    pub name: String,
    pub path: PathBuf,
    /// The fraction of keys it serves (0..1); the variants' weights add up to at most 1.
    pub weight: f64,
}

/// `shadow:`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ShadowSpec {
    pub path: PathBuf,
    /// The fraction of keys (or, without `variant_key`, of rows) it sees.
    #[serde(default = "all")]
    pub sample: f64,
    /// JSON-lines file its results are appended to.
    pub output: PathBuf,
}

fn all() -> f64 {
    1.0
}

/// The config's variants and shadow checked: each error at its key.
pub fn check(config: &ModelConfig) -> DataflowResult<()> {
    let bad = |key: String, msg: String| Err(DataflowError::Config(msg).at(key));
    let mut total = 0.0;
    let mut names = vec![CONTROL.to_string()];
    for (i, v) in config.variants.iter().enumerate() {
        if !(v.weight > 0.0 && v.weight <= 1.0) {
            return bad(
                format!("variants[{i}].weight"),
                format!("expected a fraction of keys in (0, 1], found {}", v.weight),
            );
        }
        if names.contains(&v.name) || v.name.is_empty() {
            return bad(
                format!("variants[{i}].name"),
                format!(
                    "expected a unique name other than `{CONTROL}`, found `{}`",
                    v.name
                ),
            );
        }
        names.push(v.name.clone());
        total += v.weight;
    }
    if total > 1.0 + 1e-9 {
        return bad(
            "variants".into(),
            format!("the variants' weights add up to {total}, more than all keys (1)"),
        );
    }
    if let Some(s) = &config.shadow {
        if !(s.sample > 0.0 && s.sample <= 1.0) {
            return bad(
                "shadow.sample".into(),
                format!("expected a fraction in (0, 1], found {}", s.sample),
            );
        }
    }
    if !config.variants.is_empty() && config.variant_key.is_none() {
        return bad(
            "variant_key".into(),
            "variants need `variant_key`: the column whose value keeps a key on one variant".into(),
        );
    }
    Ok(())
}

/// A key's place in `[0, 1)`, stable everywhere; `salt` makes independent draws per use.
fn unit(key: &str, salt: &[u8]) -> f64 {
    let mut h = crc32fast::Hasher::new();
    h.update(salt);
    h.update(key.as_bytes());
    f64::from(h.finalize()) / 4_294_967_296.0
}

/// The key column as text (null keys are `None`).
fn keys(batch: &RecordBatch, column: &str) -> DataflowResult<Vec<Option<String>>> {
    let array = batch
        .column_by_name(column)
        .ok_or_else(|| DataflowError::schema(column, "a key column", "no such column"))?;
    let text = arrow_cast::cast(array, &DataType::Utf8)?;
    let text = text.as_string::<i32>();
    Ok((0..text.len())
        .map(|i| text.is_valid(i).then(|| text.value(i).to_string()))
        .collect())
}

/// The input with the `variant` column the stage adds.
pub fn with_variant_field(input: &SchemaRef) -> DataflowResult<SchemaRef> {
    if input.field_with_name(VARIANT_COLUMN).is_ok() {
        return Err(DataflowError::schema(
            VARIANT_COLUMN,
            "no such column before a model with variants (it adds it)",
            "an existing column",
        )
        .at("variants"));
    }
    let mut fields: Vec<_> = input.fields().iter().cloned().collect();
    fields.push(Arc::new(Field::new(VARIANT_COLUMN, DataType::Utf8, false)));
    Ok(Arc::new(Schema::new_with_metadata(
        fields,
        input.metadata().clone(),
    )))
}

/// The stage's model, variants and shadow, loaded for one worker.
pub struct Variants {
    pub(crate) config: ModelConfig,
    pub(crate) policy: BatchPolicy,
    pub(crate) control: Model,
    pub(crate) variants: Vec<(String, f64, Model)>,
    pub(crate) shadow: Option<(ShadowSpec, Model)>,
}

/// A stateful step for its metrics (each variant's and the shadow's are siblings of the
/// stage's), with no state of its own.
impl StatefulStep for Variants {
    fn state_kind(&self) -> &'static str {
        "none"
    }

    fn attach<'scope>(
        self: Box<Self>,
        stream: BatchStream<'scope>,
        metrics: Arc<StageMetrics>,
        _state: &SavedState,
        _first_epoch: Epoch,
    ) -> (BatchStream<'scope>, StateUpdates<'scope>) {
        let Variants {
            config,
            policy,
            control,
            variants,
            shadow,
        } = *self;
        let name = metrics.name.clone();
        let sibling = |variant: &str| metrics.sibling(&format!("{name}[{variant}]")).ok();
        let mut served = vec![(CONTROL.to_string(), 0.0, control, sibling(CONTROL))];
        for (n, w, m) in variants {
            let metrics = sibling(&n);
            served.push((n, w, m, metrics));
        }
        let shadow = shadow.and_then(|(spec, model)| {
            ShadowRunner::start(spec, model, sibling("shadow"))
                .map_err(|e| tracing::warn!("shadow model not started: {e}"))
                .ok()
        });
        let stage = VariantModel {
            key: config.variant_key.clone(),
            config,
            served,
            shadow,
            rows_seen: 0,
        };
        let scope = stream.scope();
        let out = stream.dynamic_batch(Box::new(stage), policy, metrics);
        (out, no_state_updates(scope))
    }
}

/// The model stage of one worker over the control, its variants and a shadow.
struct VariantModel {
    config: ModelConfig,
    key: Option<String>,
    /// (name, weight, model, its metrics), the control first.
    served: Vec<(String, f64, Model, Option<Arc<StageMetrics>>)>,
    shadow: Option<ShadowRunner>,
    rows_seen: u64,
}

impl VariantModel {
    /// Which served model each row goes to.
    fn route(&self, keys: &[Option<String>]) -> Vec<usize> {
        keys.iter()
            .map(|key| {
                let Some(key) = key else { return 0 };
                let u = unit(key, b"variant");
                let mut edge = 0.0;
                for (i, (_, weight, _, _)) in self.served.iter().enumerate().skip(1) {
                    edge += weight;
                    if u < edge {
                        return i;
                    }
                }
                0
            })
            .collect()
    }

    /// Rows the shadow sees.
    fn sampled(&mut self, keys: Option<&[Option<String>]>, rows: usize, sample: f64) -> Vec<u32> {
        let mut picked = Vec::new();
        for row in 0..rows {
            let take = match keys.and_then(|k| k.get(row)) {
                Some(Some(key)) => unit(key, b"shadow") < sample,
                Some(None) => false,
                // Without keys, every (1/sample)-th row.
                None => {
                    self.rows_seen += 1;
                    (self.rows_seen as f64 * sample).floor()
                        > ((self.rows_seen - 1) as f64 * sample).floor()
                }
            };
            if take {
                picked.push(row as u32);
            }
        }
        picked
    }
}

impl Stage for VariantModel {
    fn name(&self) -> &str {
        "model"
    }

    fn preserves_rows(&self) -> bool {
        true
    }

    fn output_schema(&self, input: &SchemaRef) -> DataflowResult<SchemaRef> {
        let (_, _, control, _) = self
            .served
            .first()
            .ok_or_else(|| DataflowError::stage("model", "no model loaded"))?;
        let out = output_schema(&self.config, control.signature(), input)?;
        if self.served.len() > 1 {
            with_variant_field(&out)
        } else {
            Ok(out)
        }
    }

    fn process_batch(&mut self, batch: &RecordBatch) -> DataflowResult<StageOutput> {
        let rows = batch.num_rows();
        let keys = match &self.key {
            Some(column) => Some(keys(batch, column)?),
            None => None,
        };
        if let Some(sample) = self.shadow.as_ref().map(|s| s.sample) {
            let picked = self.sampled(keys.as_deref(), rows, sample);
            if let (Some(shadow), false) = (&self.shadow, picked.is_empty()) {
                let indices = UInt32Array::from(picked);
                shadow.offer(arrow_select::take::take_record_batch(batch, &indices)?);
            }
        }
        let schema = self.output_schema(batch.schema_ref())?;
        if self.served.len() == 1 {
            return run(self.served.as_mut_slice(), 0, batch);
        }
        let route = match &keys {
            Some(k) => self.route(k),
            None => vec![0; rows],
        };
        // Each variant's rows, in order; then everything back in the input's order.
        let mut parts = Vec::new();
        let mut order: Vec<u32> = Vec::with_capacity(rows);
        for v in 0..self.served.len() {
            let mine: Vec<u32> = (0..rows as u32)
                .filter(|&r| route.get(r as usize) == Some(&v))
                .collect();
            if mine.is_empty() {
                continue;
            }
            let part = if mine.len() == rows {
                batch.clone()
            } else {
                arrow_select::take::take_record_batch(batch, &UInt32Array::from(mine.clone()))?
            };
            let out = run(self.served.as_mut_slice(), v, &part)?.records;
            let name = self.served.get(v).map_or(CONTROL, |s| s.0.as_str());
            let names: ArrayRef = Arc::new(StringArray::from(vec![name; out.num_rows()]));
            let mut columns = out.columns().to_vec();
            columns.push(names);
            parts.push(RecordBatch::try_new(schema.clone(), columns)?);
            order.extend(mine);
        }
        let merged = arrow_select::concat::concat_batches(&schema, &parts)?;
        // Output row i is input row order[i]: invert.
        let mut back = vec![0u32; rows];
        for (i, &r) in order.iter().enumerate() {
            if let Some(slot) = back.get_mut(r as usize) {
                *slot = i as u32;
            }
        }
        let records = arrow_select::take::take_record_batch(&merged, &UInt32Array::from(back))?;
        Ok(StageOutput::all(records))
    }
}

/// Runs served model `i` on `batch`, recording its metrics.
fn run(
    served: &mut [(String, f64, Model, Option<Arc<StageMetrics>>)],
    i: usize,
    batch: &RecordBatch,
) -> DataflowResult<StageOutput> {
    let (_, _, model, metrics) = served
        .get_mut(i)
        .ok_or_else(|| DataflowError::stage("model", format!("no variant {i}")))?;
    let started = Instant::now();
    let out = model.process_batch(batch)?;
    if let Some(m) = metrics {
        let n = batch.num_rows();
        m.record_batch(n, out.records.num_rows(), 0, started.elapsed());
    }
    Ok(out)
}

/// The shadow model's thread: sampled input batches in, JSON lines out.
struct ShadowRunner {
    sample: f64,
    batches: SyncSender<RecordBatch>,
    skipped: Option<Arc<StageMetrics>>,
}

impl ShadowRunner {
    fn start(
        spec: ShadowSpec,
        mut model: Model,
        metrics: Option<Arc<StageMetrics>>,
    ) -> DataflowResult<ShadowRunner> {
        let file = shared_file(&spec.output)?;
        // A few batches of slack; beyond them the main path never waits.
        let (tx, rx) = mpsc::sync_channel::<RecordBatch>(4);
        let worker_metrics = metrics.clone();
        std::thread::Builder::new()
            .name("riffle-shadow".into())
            .spawn(move || {
                for batch in rx {
                    let started = Instant::now();
                    let out = match model.process_batch(&batch) {
                        Ok(out) => out.records,
                        Err(e) => {
                            tracing::warn!("shadow model failed on a batch: {e}");
                            continue;
                        }
                    };
                    if let Some(m) = &worker_metrics {
                        let n = batch.num_rows();
                        m.record_batch(n, n, 0, started.elapsed());
                    }
                    if let Err(e) = append_json(&file, &out) {
                        tracing::warn!("shadow output not written: {e}");
                    }
                }
            })
            .map_err(|e| DataflowError::stage("model", format!("starting its shadow: {e}")))?;
        Ok(ShadowRunner {
            sample: spec.sample,
            batches: tx,
            skipped: metrics,
        })
    }

    /// Hands a batch to the shadow, or counts it skipped when the shadow is behind.
    fn offer(&self, batch: RecordBatch) {
        let n = batch.num_rows();
        match self.batches.try_send(batch) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                if let Some(m) = &self.skipped {
                    m.record_late(n);
                }
            }
        }
    }
}

/// One appending handle per output file in the process, shared by its workers' shadows.
fn shared_file(path: &Path) -> DataflowResult<Arc<Mutex<File>>> {
    static FILES: Mutex<Option<HashMap<PathBuf, Weak<Mutex<File>>>>> = Mutex::new(None);
    let mut files = FILES.lock().unwrap_or_else(|p| p.into_inner());
    let files = files.get_or_insert_with(HashMap::new);
    if let Some(f) = files.get(path).and_then(Weak::upgrade) {
        return Ok(f);
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| DataflowError::Io {
            context: format!("shadow output {}", path.display()),
            cause: e,
        })?;
    }
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| DataflowError::Io {
            context: format!("shadow output {}", path.display()),
            cause: e,
        })?;
    let file = Arc::new(Mutex::new(file));
    files.insert(path.to_path_buf(), Arc::downgrade(&file));
    Ok(file)
}

/// Appends `batch` as JSON lines, without binary and tensor columns (images, model inputs).
fn append_json(file: &Mutex<File>, batch: &RecordBatch) -> DataflowResult<()> {
    let schema = batch.schema();
    let keep: Vec<usize> = (0..schema.fields().len())
        .filter(|&i| {
            !matches!(
                schema.field(i).data_type(),
                DataType::Binary
                    | DataType::LargeBinary
                    | DataType::BinaryView
                    | DataType::FixedSizeList(..)
            )
        })
        .collect();
    let batch = batch.project(&keep)?;
    let mut lines = arrow_json::LineDelimitedWriter::new(Vec::new());
    lines.write(&batch)?;
    lines.finish()?;
    let bytes = lines.into_inner();
    let mut file = file.lock().unwrap_or_else(|p| p.into_inner());
    // One write per batch: appends from several workers never interleave within it.
    file.write_all(&bytes).map_err(|e| DataflowError::Io {
        context: "shadow output".into(),
        cause: e,
    })
}

/// Each variant's (name, weight, model), and the shadow's spec and model.
pub(crate) type Loaded = (Vec<(String, f64, Model)>, Option<(ShadowSpec, Model)>);

/// The served models for `config`: each variant's and the shadow's, loaded like the control.
pub(crate) fn load(
    config: &ModelConfig,
    load: impl Fn(ModelConfig) -> DataflowResult<Model>,
) -> DataflowResult<Loaded> {
    let mut variants = Vec::new();
    for (i, v) in config.variants.iter().enumerate() {
        let model =
            load(config_for(config, &v.path)).map_err(|e| e.at(format!("variants[{i}].path")))?;
        variants.push((v.name.clone(), v.weight, model));
    }
    let shadow = match &config.shadow {
        Some(s) => Some((
            s.clone(),
            load(config_for(config, &s.path)).map_err(|e| e.at("shadow.path"))?,
        )),
        None => None,
    };
    Ok((variants, shadow))
}
