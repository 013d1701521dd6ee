//! The sinks of a pipeline file: the results', the dead letters', the live sink and the
//! events output, each resolved, checked and opened.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_schema::SchemaRef;
use riffle_connectors::{SinkConfig, SinkContext, SinkRole};
use riffle_dataflow::sink::SinkFactory;

use super::line_of;
use crate::error::PipelineError;
use crate::locate::Locator;
use crate::spec::{PipelineSpec, RuntimeConfig};

/// The results' sink and the dead letters', opened.
type Opened = (Arc<dyn SinkFactory>, Arc<dyn SinkFactory>);

/// The sink's and the dead letters' configurations as they will run: paths resolved (and
/// moved by `--output`), prepared for this pipeline, a consumer group's offsets taken by the
/// sink. Returns the dead letters'.
pub(super) fn sink_configs(
    at: &Locator<'_>,
    spec: &mut PipelineSpec,
    runtime: &RuntimeConfig,
    resolve: &dyn Fn(&mut PathBuf),
    pipeline: &str,
    output: Option<&Path>,
) -> Result<SinkConfig, PipelineError> {
    if let Some(output) = output {
        if let Some(p) = spec.sink.value.kind_mut().output_mut() {
            *p = output.to_path_buf();
        }
    }
    for p in spec.sink.value.kind_mut().paths_mut() {
        resolve(p);
    }
    let mut dead_letter_config = match spec.dead_letter.as_mut() {
        Some(dl) => {
            // `--output` moves a file of dead letters beside the new results, as it does the
            // default one: two runs to different outputs must not share one.
            if output.is_some() {
                let moved = spec.sink.value.default_dead_letters();
                if let (Some(p), Some(to)) = (
                    dl.value.kind_mut().output_mut(),
                    moved.kind().outputs().first(),
                ) {
                    *p = to.to_path_buf();
                }
            }
            for p in dl.value.kind_mut().paths_mut() {
                resolve(p);
            }
            dl.value.clone()
        }
        None => spec.sink.value.default_dead_letters(),
    };
    spec.sink.value.kind_mut().prepare(&SinkContext {
        pipeline,
        role: SinkRole::Results,
    });
    dead_letter_config.kind_mut().prepare(&SinkContext {
        pipeline,
        role: SinkRole::DeadLetters,
    });
    // A consumer group's offsets are committed with the output, by a sink that can.
    if let Some(offsets) = spec.source.value.kind().offsets_with_output() {
        let taken = runtime.checkpoint.is_some()
            && spec
                .sink
                .value
                .kind_mut()
                .commit_source_offsets(&offsets.group);
        if !taken {
            let kind = spec.source.value.kind().kind();
            return Err(at.error(
                line_of(&spec.source),
                Some(offsets.key),
                format!("source.{kind}.{}", offsets.key),
                offsets.expected.into(),
            ));
        }
    }
    Ok(dead_letter_config)
}

/// The sink and the dead letters, checked against the checkpoints, their outputs and the
/// results' schema, then opened.
pub(super) fn open_sinks(
    at: &Locator<'_>,
    spec: &PipelineSpec,
    runtime: &RuntimeConfig,
    dead_letter_config: &SinkConfig,
    results: Option<&SchemaRef>,
) -> Result<Opened, PipelineError> {
    let sink_line = line_of(&spec.sink);
    // Settings that depend on the checkpoints (a Kafka transaction's timeout).
    let interval = runtime.checkpoint.as_ref().map(|c| c.interval_ms);
    let kind = spec.sink.value.kind();
    kind.check_runtime(interval).map_err(|(key, message)| {
        at.error(
            sink_line,
            Some(key),
            format!("sink.{}.{key}", kind.kind()),
            message,
        )
    })?;
    for (field, line, config) in [
        ("sink", sink_line, &spec.sink.value),
        (
            "dead_letter",
            spec.dead_letter.as_ref().and_then(line_of),
            dead_letter_config,
        ),
    ] {
        for path in config.kind().outputs() {
            check_writable(path).map_err(|message| {
                at.error(line, Some("path"), format!("{field}.path"), message)
            })?;
        }
    }
    if let Some(results) = results {
        let kind = spec.sink.value.kind();
        kind.check_input(results).map_err(|message| {
            at.error(sink_line, None, format!("sink.{}", kind.kind()), message)
        })?;
    }
    let sink: Arc<dyn SinkFactory> =
        Arc::from(spec.sink.value.build().map_err(|e| match e.located() {
            (Some(key), inner) => at.error(
                sink_line,
                key.rsplit('.').next(),
                format!("sink.{}.{key}", spec.sink.value.kind().kind()),
                inner.to_string(),
            ),
            (None, _) => at.error(sink_line, None, "sink".into(), e.to_string()),
        })?);
    let dead_letter: Arc<dyn SinkFactory> = Arc::from(dead_letter_config.build().map_err(|e| {
        at.error(
            spec.dead_letter.as_ref().and_then(line_of),
            None,
            "dead_letter".into(),
            e.to_string(),
        )
    })?);

    Ok((sink, dead_letter))
}

/// The `events` output: its rows' schema from the results', and its sink.
pub(super) fn events(
    spec: &mut PipelineSpec,
    pipeline: &str,
    at: &Locator<'_>,
    resolve: &dyn Fn(&mut PathBuf),
    results: Option<&SchemaRef>,
) -> Result<Option<riffle_dataflow::runtime::EventsOutput>, PipelineError> {
    let Some(events) = spec.events.as_mut() else {
        return Ok(None);
    };
    let line = line_of(events);
    let config = &mut events.value;
    let Some(results) = results else {
        return Ok(None);
    };
    let keep = config.keep.clone().unwrap_or_else(|| {
        ["camera_id", "frame", "pts_ms", "ingest_ms"]
            .into_iter()
            .filter(|c| results.field_with_name(c).is_ok())
            .map(str::to_string)
            .collect()
    });
    if config.from.is_empty() {
        return Err(at.error(
            line,
            Some("from"),
            "events.from".into(),
            "expected the list columns holding events, e.g. [line_events, zone_events]".into(),
        ));
    }
    let rows = riffle_dataflow::events::EventsSpec {
        from: config.from.clone(),
        keep,
    };
    let schema = rows.schema(results).map_err(|message| {
        let (key, reason) = message.split_once(": ").unwrap_or(("from", &message));
        at.error(line, Some(key), format!("events.{key}"), reason.to_string())
    })?;
    for p in config.sink.kind_mut().paths_mut() {
        resolve(p);
    }
    config.sink.kind_mut().prepare(&SinkContext {
        pipeline,
        role: SinkRole::Events,
    });
    let kind = config.sink.kind().kind();
    for path in config.sink.kind().outputs() {
        check_writable(path).map_err(|message| {
            at.error(
                line,
                Some("path"),
                format!("events.sink.{kind}.path"),
                message,
            )
        })?;
    }
    config
        .sink
        .kind()
        .check_input(&schema)
        .map_err(|message| at.error(line, Some("sink"), format!("events.sink.{kind}"), message))?;
    let sink = config.sink.build().map_err(|e| {
        at.error(
            line,
            Some("sink"),
            format!("events.sink.{kind}"),
            e.to_string(),
        )
    })?;
    Ok(Some(riffle_dataflow::runtime::EventsOutput {
        spec: rows,
        schema,
        sink: Arc::from(sink),
    }))
}

/// The `live_sink` factory. It writes results as they arrive and never commits: a Kafka live
/// topic is written without transactions or markers, whatever its `exactly_once` says.
pub(super) fn live_sink(
    spec: &mut PipelineSpec,
    pipeline: &str,
    at: &Locator<'_>,
    resolve: &dyn Fn(&mut PathBuf),
) -> Result<Option<Arc<dyn SinkFactory>>, PipelineError> {
    let Some(live) = spec.live_sink.as_mut() else {
        return Ok(None);
    };
    let line = line_of(live);
    for p in live.value.kind_mut().paths_mut() {
        resolve(p);
    }
    live.value.kind_mut().prepare(&SinkContext {
        pipeline,
        role: SinkRole::Live,
    });
    for path in live.value.kind().outputs() {
        check_writable(path)
            .map_err(|message| at.error(line, Some("path"), "live_sink.path".into(), message))?;
    }
    let factory = live
        .value
        .build()
        .map_err(|e| at.error(line, None, "live_sink".into(), e.to_string()))?;
    Ok(Some(Arc::from(factory)))
}

/// An output file can be created where the pipeline says: not a directory, in a directory.
fn check_writable(path: &Path) -> Result<(), String> {
    if path.is_dir() {
        return Err(format!(
            "`{}` is a directory (expected a file to write)",
            path.display()
        ));
    }
    // The nearest existing ancestor: the sink creates the directories below it.
    let mut dir = path.parent();
    while let Some(d) = dir {
        if d.as_os_str().is_empty() || d.exists() {
            break;
        }
        dir = d.parent();
    }
    let Some(dir) = dir.filter(|d| !d.as_os_str().is_empty()) else {
        return Ok(());
    };
    match std::fs::metadata(dir) {
        Ok(m) if !m.is_dir() => Err(format!(
            "`{}` cannot be created: `{}` is a file, not a directory",
            path.display(),
            dir.display()
        )),
        Ok(m) if m.permissions().readonly() => Err(format!(
            "`{}` cannot be written: `{}` is read-only",
            path.display(),
            dir.display()
        )),
        Ok(_) => Ok(()),
        Err(e) => Err(format!("`{}` cannot be written: {e}", path.display())),
    }
}
