//! Turning a pipeline file into a [`Pipeline`] that is known to run: every check that does
//! not need data happens here, and each failure points at the file, line and field.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_schema::SchemaRef;
use riffle_connectors::formats::excerpt_within;
use riffle_connectors::SinkConfig;
use riffle_dataflow::sink::SinkFactory;
use riffle_dataflow::{DataflowError, SourceFactory};
use serde_saphyr::Spanned;

use riffle_operators::{FileKind, StageContext};

use crate::env::{substitute, Redactions};
use crate::error::PipelineError;
use crate::exchange::column_list;
use crate::locate::{parser_message, Locator};
use crate::spec::{PipelineSpec, RuntimeConfig, StageSpec};

mod sinks;
use sinks::{events, live_sink, open_sinks, sink_configs};

/// A validated pipeline, ready to run.
pub struct Pipeline {
    pub file: PathBuf,
    pub spec: PipelineSpec,
    pub runtime: RuntimeConfig,
    pub source: Arc<dyn SourceFactory>,
    pub sink: Arc<dyn SinkFactory>,
    pub dead_letter: Arc<dyn SinkFactory>,
    /// Where rejected records go: the file's `dead_letter` (moved by `--output`) or the default.
    pub dead_letter_config: SinkConfig,
    /// The file's `live_sink`, if any (see [`crate::spec::PipelineSpec::live_sink`]).
    pub live_sink: Option<Arc<dyn SinkFactory>>,
    /// The file's `events`, if any (see [`crate::spec::EventsConfig`]).
    pub events: Option<riffle_dataflow::runtime::EventsOutput>,
    /// Schema after the source (index 0) and after each stage.
    pub schemas: Vec<SchemaRef>,
    /// Values of secret `${VAR}`s in the file, kept out of what is shown (`riffle plan`).
    pub redactions: Redactions,
}

impl Pipeline {
    /// The folder of live streams (`<camera>/live/index.m3u8`) the live view serves: the
    /// sink's, else a `tap` stage's.
    pub fn live_stream_dir(&self) -> Option<PathBuf> {
        self.sink.live_stream_dir().or_else(|| {
            self.spec
                .stages
                .iter()
                .find_map(|s| s.value.stage()?.live_stream_dir())
        })
    }

    pub fn name(&self) -> String {
        self.spec.name.clone().unwrap_or_else(|| {
            self.file
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "pipeline".into())
        })
    }

    /// Checkpoints from the command line (`--checkpoint-dir` or `--checkpoint-url`), checked
    /// as the file's are.
    pub fn set_checkpoint(
        &mut self,
        checkpoint: crate::spec::CheckpointConfig,
    ) -> Result<(), PipelineError> {
        let flag = if checkpoint.url.is_some() {
            "--checkpoint-url"
        } else {
            "--checkpoint-dir"
        };
        let error = |message| PipelineError {
            file: self.file.clone(),
            line: None,
            field: flag.into(),
            message,
        };
        checkpoint.check().map_err(|(_, message)| error(message))?;
        let source = &self.spec.source.value;
        source
            .check_resumable(self.source.as_ref())
            .map_err(error)?;
        let sink = self.spec.sink.value.kind();
        sink.check_runtime(Some(checkpoint.interval_ms))
            .map_err(|(key, message)| PipelineError {
                field: format!("sink.{}.{key}", sink.kind()),
                ..error(message)
            })?;
        self.runtime.checkpoint = Some(checkpoint);
        Ok(())
    }

    /// The schema of the records reaching the sink.
    pub fn output_schema(&self) -> Option<&SchemaRef> {
        self.schemas.last()
    }
}

/// Reads, parses and validates a pipeline file. `output` replaces the sink's file path.
/// `${VAR}` and `${VAR:-default}` are replaced from the environment first ([`crate::env`]);
/// every command that takes a pipeline file comes through here.
pub fn load(file: &Path, output: Option<&Path>) -> Result<Pipeline, PipelineError> {
    let written = std::fs::read_to_string(file).map_err(|e| PipelineError {
        file: file.to_path_buf(),
        line: None,
        field: String::new(),
        message: format!("cannot read the pipeline file: {e}"),
    })?;
    load_text(file, &written, output)
}

/// [`load`] of a pipeline given as text (YAML, or JSON, which is YAML too) instead of read from
/// `file`, which names it in errors and whose folder relative paths start from (a program's
/// pipeline: `<working directory>/<name>`).
pub fn load_text(
    file: &Path,
    written: &str,
    output: Option<&Path>,
) -> Result<Pipeline, PipelineError> {
    let env = substitute(written, |name| std::env::var(name)).map_err(|e| PipelineError {
        file: file.to_path_buf(),
        line: Some(e.line),
        field: e.key.clone(),
        message: e.to_string(),
    })?;
    // Messages may quote values (a wrong type, a path not found): never a secret's, and
    // never more than an excerpt of a long one.
    let redact = |mut e: PipelineError| {
        e.field = excerpt_within(&env.redactions.redact(&e.field), 200);
        e.message = excerpt_within(&env.redactions.redact(&e.message), 1000);
        e
    };
    let spec = parse(file, &env.text).map_err(redact)?;
    check_ranges(file, &env.text, &spec).map_err(redact)?;
    let mut pipeline = validate(file, &env.text, spec, output).map_err(redact)?;
    pipeline.redactions = env.redactions;
    Ok(pipeline)
}

/// Parses YAML into a spec; syntax errors, unknown keys and wrong types carry their line and
/// the whole path of the innermost key (`stages[2].model.batch.max_size`), with the range a
/// number must be in.
pub fn parse(file: &Path, text: &str) -> Result<PipelineSpec, PipelineError> {
    serde_saphyr::from_str::<PipelineSpec>(text).map_err(|e| {
        let line = e.location().map(|l| l.line());
        let at = Locator {
            file,
            lines: text.lines().collect(),
        };
        // A number out of its range fails here first (a u64 cannot hold -3): say the range.
        if let Some(out) = line.and_then(|l| out_of_range_at(&at, text, l)) {
            return PipelineError {
                file: file.to_path_buf(),
                line,
                field: format!("{}.{}", out.top, out.path),
                message: out.message,
            };
        }
        let column = e.location().map(|l| l.column());
        let field = line.map_or_else(String::new, |l| at.field_at(l, column));
        let mut message = parser_message(&e.to_string());
        // A number of the wrong type: what it must be, and what was written.
        if let Some(rule) = crate::ranges::rule_at(&field) {
            message = match line.and_then(|l| at.value_at(l, column?)) {
                Some(found) => format!("{}, found {found} ({message})", rule.expected()),
                None => format!("{message} ({})", rule.expected()),
            };
        }
        PipelineError {
            file: file.to_path_buf(),
            line,
            field,
            message,
        }
    })
}

/// The number out of its range that a parse error at `line` is about, if there is one.
fn out_of_range_at(at: &Locator, text: &str, line: u64) -> Option<crate::ranges::OutOfRange> {
    let document = serde_saphyr::from_str::<serde_json::Value>(text).ok()?;
    let out = crate::ranges::check(&document).err()?;
    let key = crate::locate::split_path(&out.path).pop()?;
    let written = at.lines.get((line as usize).checked_sub(1)?)?;
    crate::locate::holds_key(written, &key).then_some(out)
}

/// Every number within its range ([`crate::ranges`]), before any of them is used.
fn check_ranges(file: &Path, text: &str, spec: &PipelineSpec) -> Result<(), PipelineError> {
    // The file parsed into `spec`, so it parses as a plain value too.
    let Ok(document) = serde_saphyr::from_str::<serde_json::Value>(text) else {
        return Ok(());
    };
    // A source's or sink's own keys by its kind's ranges, declared beside them.
    let own = |top: &str| match top {
        "source" => spec.source.value.ranges(),
        "sink" => spec.sink.value.ranges(),
        "dead_letter" => spec
            .dead_letter
            .as_ref()
            .map_or(&[][..], |d| d.value.ranges()),
        "live_sink" => spec
            .live_sink
            .as_ref()
            .map_or(&[][..], |d| d.value.ranges()),
        _ => &[],
    };
    let Err(e) = crate::ranges::check_with(&document, &own) else {
        return Ok(());
    };
    let start = match e.top.as_str() {
        "source" => line_of(&spec.source),
        "sink" => line_of(&spec.sink),
        "runtime" => spec.runtime.as_ref().and_then(line_of),
        "dead_letter" => spec.dead_letter.as_ref().and_then(line_of),
        "live_sink" => spec.live_sink.as_ref().and_then(line_of),
        top => top
            .strip_prefix("stages[")
            .and_then(|rest| rest.strip_suffix(']'))
            .and_then(|i| i.parse::<usize>().ok())
            .and_then(|i| spec.stages.get(i))
            .and_then(line_of),
    };
    let at = Locator {
        file,
        lines: text.lines().collect(),
    };
    let line = start.and_then(|s| at.find_path(s, &e.path)).or(start);
    Err(PipelineError {
        file: file.to_path_buf(),
        line,
        field: format!("{}.{}", e.top, e.path),
        message: e.message,
    })
}

fn line_of<T>(spanned: &Spanned<T>) -> Option<u64> {
    let line = spanned.referenced.line();
    (line > 0).then_some(line)
}

/// Offers the first stage to the source when all it does is scale a picture (a source that
/// decodes does it while converting its frames: one pass, no full-size frame).
fn fuse_first_scale(spec: &mut PipelineSpec) {
    let Some(first) = spec.stages.first().and_then(|s| s.value.stage()) else {
        return;
    };
    if let Some((column, width, height)) = first.scale_only() {
        spec.source
            .value
            .kind_mut()
            .absorb_scale(column, width, height);
    }
}

fn validate(
    file: &Path,
    text: &str,
    mut spec: PipelineSpec,
    output: Option<&Path>,
) -> Result<Pipeline, PipelineError> {
    let at = Locator {
        file,
        lines: text.lines().collect(),
    };
    let base = file.parent().map(Path::to_path_buf).unwrap_or_default();
    let resolve = |p: &mut PathBuf| {
        if p.is_relative() {
            *p = base.join(&*p);
        }
    };
    let runtime = runtime_block(&at, &spec, &resolve)?;
    let (source, source_schema) = open_source(&at, &mut spec, &runtime, &resolve)?;
    let schemas = stage_schemas(&at, &mut spec, &runtime, &resolve, source_schema)?;
    let pipeline = spec.name.clone().unwrap_or_else(|| {
        file.file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default()
    });
    let dead_letter_config = sink_configs(&at, &mut spec, &runtime, &resolve, &pipeline, output)?;
    let (sink, dead_letter) =
        open_sinks(&at, &spec, &runtime, &dead_letter_config, schemas.last())?;
    let live_sink = live_sink(&mut spec, &pipeline, &at, &resolve)?;
    let events = events(&mut spec, &pipeline, &at, &resolve, schemas.last())?;

    Ok(Pipeline {
        file: file.to_path_buf(),
        spec,
        runtime,
        source,
        sink,
        dead_letter,
        dead_letter_config,
        live_sink,
        events,
        schemas,
        redactions: Redactions::default(),
    })
}

/// `runtime:` as written: its checkpoint checked (its folder resolved), a GPU map only where a
/// stage reads it.
fn runtime_block(
    at: &Locator<'_>,
    spec: &PipelineSpec,
    resolve: &dyn Fn(&mut PathBuf),
) -> Result<RuntimeConfig, PipelineError> {
    let mut runtime = spec
        .runtime
        .as_ref()
        .map(|r| r.value.clone())
        .unwrap_or_default();
    let runtime_line = spec.runtime.as_ref().and_then(line_of);
    if let Some(checkpoint) = runtime.checkpoint.as_mut() {
        checkpoint.check().map_err(|(key, message)| {
            let field = match key {
                "checkpoint" => "runtime.checkpoint".to_string(),
                key => format!("runtime.checkpoint.{key}"),
            };
            at.error(runtime_line, Some(key), field, message)
        })?;
        if let Some(dir) = checkpoint.dir.as_mut() {
            resolve(dir);
        }
    }
    // A GPU map that no stage reads would be a silent no-op.
    if !runtime.gpus.is_empty()
        && !spec
            .stages
            .iter()
            .filter_map(|s| s.value.stage())
            .any(|s| s.follows_gpu_map())
    {
        return Err(at.error(
            runtime_line,
            Some("gpus"),
            "runtime.gpus".into(),
            "maps workers to GPUs for stages with `device: auto`, and no stage has it (`cpu` \
             and `cuda:N` stages ignore the map): expected a `device: auto` stage, or no \
             `gpus`"
                .into(),
        ));
    }
    // Zero workers, epochs of zero records and the like are out of range (crate::ranges).
    Ok(runtime)
}

/// The source: its files exist, a first stage that only scales offered to it, opened, with
/// the schema it reads; one that cannot seek refused under checkpoints.
fn open_source(
    at: &Locator<'_>,
    spec: &mut PipelineSpec,
    runtime: &RuntimeConfig,
    resolve: &dyn Fn(&mut PathBuf),
) -> Result<(Arc<dyn SourceFactory>, SchemaRef), PipelineError> {
    let runtime_line = spec.runtime.as_ref().and_then(line_of);
    let source_line = line_of(&spec.source);
    for p in spec.source.value.kind_mut().paths_mut() {
        resolve(p);
    }
    for p in spec.source.value.kind().inputs() {
        if !p.exists() {
            return Err(at.error(
                source_line,
                Some("path"),
                "source.path".into(),
                format!(
                    "`{}` does not exist (expected an existing file or directory)",
                    p.display()
                ),
            ));
        }
    }
    fuse_first_scale(spec);
    let source: Arc<dyn SourceFactory> = Arc::from(
        spec.source
            .value
            .build()
            .map_err(|e| at.error(source_line, None, "source".into(), e.to_string()))?,
    );
    let source_schema = source
        .schema()
        .map_err(|e| at.error(source_line, None, "source".into(), e.to_string()))?;
    if runtime.checkpoint.is_some() {
        spec.source
            .value
            .check_resumable(source.as_ref())
            .map_err(|message| {
                at.error(
                    runtime_line,
                    Some("checkpoint"),
                    "runtime.checkpoint".into(),
                    message,
                )
            })?;
    }

    Ok((source, source_schema))
}

/// The schema after each stage (the source's first). Files exist, what a stage needs of this
/// machine is here, and the columns fit from one stage to the next. No stage is built: no model
/// session, no GPU context.
fn stage_schemas(
    at: &Locator<'_>,
    spec: &mut PipelineSpec,
    runtime: &RuntimeConfig,
    resolve: &dyn Fn(&mut PathBuf),
    source: SchemaRef,
) -> Result<Vec<SchemaRef>, PipelineError> {
    let mut schemas = vec![source];
    // Whether the stages here run on some workers only (after `exchange: { workers }`).
    let mut placed = false;
    let context = StageContext {
        worker: 0,
        peers: 1,
        intra_op_threads: runtime.intra_op_threads,
        gpus: &runtime.gpus,
    };
    for (i, stage) in spec.stages.iter_mut().enumerate() {
        let line = line_of(stage);
        let kind = stage.value.kind();
        let field = |sub: &str| {
            if sub.is_empty() {
                format!("stages[{i}].{kind}")
            } else {
                format!("stages[{i}].{kind}.{sub}")
            }
        };
        let previous = schemas
            .last()
            .cloned()
            .unwrap_or_else(|| Arc::new(arrow_schema::Schema::empty()));
        let next = match &mut stage.value {
            StageSpec::Exchange(e) => {
                placed = e.places();
                e.check(&runtime.placement, &previous)
                    .map_err(|(key, message)| at.error(line, Some(key), field(key), message))?;
                previous.clone()
            }
            other => {
                let Some(stage) = other.stage_mut() else {
                    continue;
                };
                check_files(at, line, &field, stage, resolve)?;
                if placed && stage.stateful() {
                    return Err(at.error(
                        line,
                        None,
                        field(""),
                        "shards its input itself and keeps state on every worker: it cannot \
                         follow `exchange: { workers }`"
                            .into(),
                    ));
                }
                stage
                    .check(&context)
                    .and_then(|()| stage.output_schema(&previous))
                    .map_err(|e| stage_error(at, line, &field, with_columns(e, &previous)))?
            }
        };
        schemas.push(next);
    }

    Ok(schemas)
}

/// The files a stage names, resolved against the pipeline's folder; those it reads exist.
fn check_files(
    at: &Locator<'_>,
    line: Option<u64>,
    field: &dyn Fn(&str) -> String,
    stage: &mut dyn riffle_operators::StageKind,
    resolve: &dyn Fn(&mut PathBuf),
) -> Result<(), PipelineError> {
    for file in stage.files_mut() {
        resolve(file.path);
        let found = match file.kind {
            FileKind::File => file.path.is_file(),
            FileKind::FileOrDirectory => file.path.is_file() || file.path.is_dir(),
            FileKind::Output => true,
        };
        if !found {
            return Err(at.error(
                line,
                Some(file.key),
                field(file.key),
                format!(
                    "`{}` not found (expected {})",
                    file.path.display(),
                    file.expected
                ),
            ));
        }
    }
    Ok(())
}

fn with_columns(e: DataflowError, schema: &SchemaRef) -> DataflowError {
    match e {
        DataflowError::At { key, source } => DataflowError::At {
            key,
            source: Box::new(with_columns(*source, schema)),
        },
        DataflowError::Schema {
            column,
            expected,
            found,
        } if found == "no such column" => DataflowError::Schema {
            column,
            expected,
            found: format!("no such column (columns here: {})", column_list(schema)),
        },
        other => other,
    }
}

fn stage_error(
    at: &Locator<'_>,
    line: Option<u64>,
    field: &dyn Fn(&str) -> String,
    e: DataflowError,
) -> PipelineError {
    // The stage says which of its keys the error is about (that key's line, or the stage's
    // when the key is a default not written in the file); without one, the stage's own line.
    match (e.located().0, line) {
        (Some(key), Some(start)) => {
            let key_line = at.find_path(start, key).unwrap_or(start);
            at.error(Some(key_line), None, field(key), e.to_string())
        }
        _ => at.error(line, None, field(""), e.to_string()),
    }
}
