//! Turning a pipeline file into a [`Pipeline`] that is known to run: every check that does
//! not need data happens here, and each failure points at the file, line and field.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_schema::SchemaRef;
use riffle_connectors::{JsonlSinkConfig, SinkConfig};
use riffle_dataflow::sink::SinkFactory;
use riffle_dataflow::{DataflowError, SourceFactory};
use serde_saphyr::Spanned;

use crate::error::PipelineError;
use crate::plan::build_stage;
use crate::spec::{ExchangeConfig, PipelineSpec, RuntimeConfig, StageSpec};

/// A validated pipeline, ready to run.
pub struct Pipeline {
    pub file: PathBuf,
    pub spec: PipelineSpec,
    pub runtime: RuntimeConfig,
    pub source: Arc<dyn SourceFactory>,
    pub sink: Arc<dyn SinkFactory>,
    pub dead_letter: Arc<dyn SinkFactory>,
    /// Schema after the source (index 0) and after each stage.
    pub schemas: Vec<SchemaRef>,
}

impl Pipeline {
    pub fn name(&self) -> String {
        self.spec.name.clone().unwrap_or_else(|| {
            self.file
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "pipeline".into())
        })
    }

    /// The schema of the records reaching the sink.
    pub fn output_schema(&self) -> Option<&SchemaRef> {
        self.schemas.last()
    }
}

/// Reads, parses and validates a pipeline file. `output` replaces the sink's file path.
pub fn load(file: &Path, output: Option<&Path>) -> Result<Pipeline, PipelineError> {
    let text = std::fs::read_to_string(file).map_err(|e| PipelineError {
        file: file.to_path_buf(),
        line: None,
        field: String::new(),
        message: format!("cannot read the pipeline file: {e}"),
    })?;
    let spec = parse(file, &text)?;
    validate(file, &text, spec, output)
}

/// Parses YAML into a spec; syntax errors, unknown keys and wrong types carry their line.
pub fn parse(file: &Path, text: &str) -> Result<PipelineSpec, PipelineError> {
    serde_saphyr::from_str::<PipelineSpec>(text).map_err(|e| {
        let line = e.location().map(|l| l.line());
        // The key on the offending line names the field (`score_threshold: high`).
        let field = line
            .and_then(|l| text.lines().nth(l.saturating_sub(1) as usize))
            .and_then(|l| l.split_once(':'))
            .map(|(k, _)| {
                k.trim()
                    .trim_start_matches(['-', '{', ' '])
                    .trim_matches(['"', '\''])
                    .to_string()
            })
            .unwrap_or_default();
        PipelineError {
            file: file.to_path_buf(),
            line,
            field,
            message: parser_message(&e.to_string()),
        }
    })
}

/// The parser's message without its own location prefix and source snippet (we print ours).
fn parser_message(text: &str) -> String {
    let first = text.lines().next().unwrap_or(text).trim();
    let rest = first.strip_prefix("error:").unwrap_or(first).trim();
    match rest.strip_prefix("line ").and_then(|r| r.split_once(": ")) {
        Some((_, message)) => message.to_string(),
        None => rest.to_string(),
    }
}

/// Locates fields inside the pipeline text for error messages.
struct Locator<'a> {
    file: &'a Path,
    lines: Vec<&'a str>,
}

impl Locator<'_> {
    /// An error at `line`, or at the line of `key:` within the block that starts there.
    fn error(
        &self,
        start: Option<u64>,
        key: Option<&str>,
        field: String,
        message: String,
    ) -> PipelineError {
        let line = match (start, key) {
            (Some(start), Some(key)) => Some(self.find_key(start, key).unwrap_or(start)),
            (start, _) => start,
        };
        PipelineError {
            file: self.file.to_path_buf(),
            line,
            field,
            message,
        }
    }

    /// First line at or after `start` holding `key:` before the block ends (a line indented
    /// no deeper than the block's first line that starts a new entry).
    fn find_key(&self, start: u64, key: &str) -> Option<u64> {
        let first = (start as usize).checked_sub(1)?;
        let indent = |l: &str| l.len() - l.trim_start().len();
        let base = indent(self.lines.get(first)?);
        let needle = format!("{key}:");
        for (i, line) in self.lines.iter().enumerate().skip(first) {
            let trimmed = line.trim_start();
            if i > first && !trimmed.is_empty() && !trimmed.starts_with('#') && indent(line) <= base
            {
                break;
            }
            if contains_key(line, &needle) {
                return Some(i as u64 + 1);
            }
        }
        None
    }
}

impl Locator<'_> {
    /// Line and key of the first `key: value` entry in the block at `start` whose value is `value`.
    fn find_value(&self, start: u64, value: &str) -> Option<(u64, String)> {
        let first = (start as usize).checked_sub(1)?;
        let indent = |l: &str| l.len() - l.trim_start().len();
        let base = indent(self.lines.get(first)?);
        for (i, line) in self.lines.iter().enumerate().skip(first) {
            let trimmed = line.trim_start();
            if i > first && !trimmed.is_empty() && !trimmed.starts_with('#') && indent(line) <= base
            {
                break;
            }
            let mut path: Vec<String> = Vec::new();
            for entry in line.split([',', '{', '}']) {
                let Some((k, v)) = entry.split_once(": ") else {
                    continue;
                };
                let k = k
                    .trim()
                    .trim_start_matches('-')
                    .trim()
                    .trim_matches(['"', '\'']);
                if v.trim().trim_matches(['"', '\'']) == value {
                    path.push(k.to_string());
                    // Block-style parents: the nearest less-indented keys above, up to the stage.
                    let mut depth = indent(line);
                    for above in self.lines[(first + 1).min(i)..i].iter().rev() {
                        if indent(above) < depth && !above.trim().is_empty() {
                            if let Some((pk, _)) = above.split_once(':') {
                                path.insert(0, pk.trim().trim_matches(['"', '\'']).to_string());
                            }
                            depth = indent(above);
                        }
                    }
                    return Some((i as u64 + 1, quote_keys(&path)));
                }
                // `inputs: { name: column }` on one line: `inputs` is the parent (but not the
                // stage's own `- kind:` key, which the field name already starts with).
                if v.trim().is_empty() && !(i == first && entry.trim_start().starts_with('-')) {
                    path.push(k.to_string());
                }
            }
        }
        None
    }
}

/// `a.b."image_tensor:0"`: keys that are not plain identifiers are quoted.
fn quote_keys(path: &[String]) -> String {
    path.iter()
        .map(|k| {
            if k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                k.clone()
            } else {
                format!("\"{k}\"")
            }
        })
        .collect::<Vec<_>>()
        .join(".")
}

fn contains_key(line: &str, needle: &str) -> bool {
    line.match_indices(needle).any(|(at, _)| {
        at == 0 || matches!(line.as_bytes()[at - 1], b' ' | b'{' | b',' | b'-' | b'\t')
    })
}

fn line_of<T>(spanned: &Spanned<T>) -> Option<u64> {
    let line = spanned.referenced.line();
    (line > 0).then_some(line)
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

    let mut runtime = spec
        .runtime
        .as_ref()
        .map(|r| r.value.clone())
        .unwrap_or_default();
    let runtime_line = spec.runtime.as_ref().and_then(line_of);
    if let Some(checkpoint) = runtime.checkpoint.as_mut() {
        resolve(&mut checkpoint.dir);
    }
    for (key, value) in [
        ("workers", runtime.workers),
        ("intra_op_threads", runtime.intra_op_threads),
        ("epoch_records", runtime.epoch_records),
        (
            "max_epochs_in_flight",
            runtime.max_epochs_in_flight as usize,
        ),
    ] {
        if value == 0 {
            return Err(at.error(
                runtime_line,
                Some(key),
                format!("runtime.{key}"),
                "expected a number ≥ 1, found 0".into(),
            ));
        }
    }

    // Source: its files must exist.
    let source_line = line_of(&spec.source);
    for p in spec.source.value.paths_mut() {
        resolve(p);
    }
    for p in spec.source.value.paths() {
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
    let source: Arc<dyn SourceFactory> = Arc::from(
        spec.source
            .value
            .build()
            .map_err(|e| at.error(source_line, None, "source".into(), e.to_string()))?,
    );
    let source_schema = source
        .schema()
        .map_err(|e| at.error(source_line, None, "source".into(), e.to_string()))?;

    // Stages: files exist, configs build, and the columns fit from one stage to the next.
    let mut schemas = vec![source_schema];
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
        match &mut stage.value {
            StageSpec::Model(model) => {
                resolve(&mut model.path);
                if !model.path.is_file() {
                    return Err(at.error(
                        line,
                        Some("path"),
                        field("path"),
                        format!(
                            "model file `{}` not found (expected an .onnx file)",
                            model.path.display()
                        ),
                    ));
                }
                if model.batch.max_size == 0 {
                    return Err(at.error(
                        line,
                        Some("max_size"),
                        field("batch.max_size"),
                        "expected a number ≥ 1, found 0".into(),
                    ));
                }
            }
            StageSpec::Topk(topk) => {
                if let Some(labels) = topk.labels.as_mut() {
                    resolve(labels);
                    if !labels.is_file() {
                        return Err(at.error(
                            line,
                            Some("labels"),
                            field("labels"),
                            format!("labels file `{}` not found (expected a text file, one class name per line)", labels.display()),
                        ));
                    }
                }
            }
            _ => {}
        }
        let previous = schemas
            .last()
            .cloned()
            .unwrap_or_else(|| Arc::new(arrow_schema::Schema::empty()));
        let next = match &stage.value {
            StageSpec::Exchange(e) if e.key.is_some() && e.workers.is_some() => {
                return Err(at.error(
                    line,
                    Some("workers"),
                    field("workers"),
                    "give `key` (re-shard rows) or `workers` (place the next stages), not both"
                        .into(),
                ))
            }
            StageSpec::Exchange(e) if e.key.is_some() && e.balance => {
                return Err(at.error(
                    line,
                    Some("balance"),
                    field("balance"),
                    "`key` routes every row by hash; `balance` cannot apply (use `ordered_by` to keep a key's rows in order)"
                        .into(),
                ))
            }
            StageSpec::Exchange(e)
                if e
                    .ordered_by
                    .as_ref()
                    .is_some_and(|k| previous.field_with_name(k).is_err()) =>
            {
                return Err(at.error(
                    line,
                    Some("ordered_by"),
                    field("ordered_by"),
                    format!(
                        "no column `{}` here; columns are: {}",
                        e.ordered_by.clone().unwrap_or_default(),
                        column_list(&previous)
                    ),
                ))
            }
            StageSpec::Exchange(e) if e.key.is_none() => {
                if let Err(err) = crate::plan::placed_on(e, &runtime) {
                    return Err(at.error(line, Some("workers"), field("workers"), err.to_string()));
                }
                previous.clone()
            }
            StageSpec::Exchange(ExchangeConfig { key: Some(key), .. }) => {
                let key_type = previous.field_with_name(key).map(|f| f.data_type().clone());
                match key_type {
                    Ok(t) if riffle_dataflow::operators::is_key_type(&t) => previous.clone(),
                    Ok(t) => {
                        return Err(at.error(
                            line,
                            Some("key"),
                            field("key"),
                            format!("column `{key}` is {t}; expected a string or integer column"),
                        ))
                    }
                    Err(_) => {
                        return Err(at.error(
                            line,
                            Some("key"),
                            field("key"),
                            format!(
                                "no column `{key}` here; columns are: {}",
                                column_list(&previous)
                            ),
                        ))
                    }
                }
            }
            StageSpec::Candidates(c) => c
                .output_schema(&previous)
                .map_err(|e| stage_error(&at, line, &field, with_columns(e, &previous)))?,
            other => {
                let built =
                    build_stage(other, &runtime, 0).map_err(|e| stage_error(&at, line, &field, e))?;
                match built {
                    Some(stage) => stage
                        .output_schema(&previous)
                        .map_err(|e| stage_error(&at, line, &field, with_columns(e, &previous)))?,
                    None => previous.clone(),
                }
            }
        };
        schemas.push(next);
    }

    // Sinks.
    let sink_line = line_of(&spec.sink);
    if let Some(output) = output {
        if let Some(p) = spec.sink.value.paths_mut().into_iter().next() {
            *p = output.to_path_buf();
        }
    }
    for p in spec.sink.value.paths_mut() {
        resolve(p);
    }
    let dead_letter_config = match spec.dead_letter.as_mut() {
        Some(dl) => {
            for p in dl.value.paths_mut() {
                resolve(p);
            }
            dl.value.clone()
        }
        None => default_dead_letter(&spec.sink.value),
    };
    let sink: Arc<dyn SinkFactory> = Arc::from(
        spec.sink
            .value
            .build()
            .map_err(|e| at.error(sink_line, None, "sink".into(), e.to_string()))?,
    );
    let dead_letter: Arc<dyn SinkFactory> = Arc::from(dead_letter_config.build().map_err(|e| {
        at.error(
            spec.dead_letter.as_ref().and_then(line_of),
            None,
            "dead_letter".into(),
            e.to_string(),
        )
    })?);

    Ok(Pipeline {
        file: file.to_path_buf(),
        spec,
        runtime,
        source,
        sink,
        dead_letter,
        schemas,
    })
}

/// Rejected records go beside the sink's file, to `<topic>-dead-letters` (reason and stage in
/// headers) for a Kafka sink, or to `dead-letters.jsonl` for stdout.
fn default_dead_letter(sink: &SinkConfig) -> SinkConfig {
    if let SinkConfig::Kafka(kafka) = sink {
        let mut dlq = kafka.clone();
        dlq.topic = format!("{}-dead-letters", kafka.topic);
        dlq.format = riffle_connectors::kafka::SinkFormat::Json;
        dlq.key = None;
        dlq.headers = [("reason", "reason"), ("stage", "stage")]
            .into_iter()
            .map(|(h, c)| (h.to_string(), c.to_string()))
            .collect();
        return SinkConfig::Kafka(dlq);
    }
    let mut sink = sink.clone();
    let path = match sink.paths_mut().into_iter().next() {
        Some(p) => {
            let stem = p
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "results".into());
            p.with_file_name(format!("{stem}.dead-letters.jsonl"))
        }
        None => PathBuf::from("dead-letters.jsonl"),
    };
    SinkConfig::Jsonl(JsonlSinkConfig { path })
}

fn column_list(schema: &SchemaRef) -> String {
    schema
        .fields()
        .iter()
        .map(|f| format!("{} ({})", f.name(), f.data_type()))
        .collect::<Vec<_>>()
        .join(", ")
}

fn with_columns(e: DataflowError, schema: &SchemaRef) -> DataflowError {
    match e {
        DataflowError::Schema {
            column,
            expected,
            found,
        } if found == "no such column" => DataflowError::Schema {
            column,
            expected,
            found: format!("no such column (columns here: {})", column_list(schema)),
        },
        // Operators locate errors at config keys: keep the key, complete the error inside.
        DataflowError::At { key, source } => DataflowError::At {
            key,
            source: Box::new(with_columns(*source, schema)),
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
    // Point at the config entry naming the offending column when there is one.
    // Still read from the error: `located()` sees through the key operators now attach.
    let key = match (e.located().1, line) {
        (DataflowError::Schema { column, .. }, Some(start)) => at.find_value(start, column),
        (DataflowError::Config(message), Some(start)) => {
            ["device", "executor", "embedding_devices"]
                .into_iter()
                .find(|k| {
                    message.starts_with(&format!("{k} `")) || message.starts_with(&format!("{k}:"))
                })
                .and_then(|k| at.find_key(start, k).map(|l| (l, k.to_string())))
        }
        _ => None,
    };
    match key {
        Some((line, key)) => at.error(Some(line), None, field(&key), e.to_string()),
        None => at.error(line, None, field(""), e.to_string()),
    }
}
