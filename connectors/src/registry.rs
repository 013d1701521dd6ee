//! The registered source and sink kinds: one line each. A line names the YAML key's variant
//! and the configuration type, which implements [`SourceKind`] or [`SinkKind`] (everything
//! validation, planning and running need) and [`Limits`] (its numbers' ranges). Kinds depend
//! on [`crate::kind`] only, never on this list.

use std::path::PathBuf;

use riffle_dataflow::range::Range;
use riffle_dataflow::sink::SinkFactory;
use riffle_dataflow::{DataflowResult, SourceFactory};
use serde::Deserialize;

#[cfg(feature = "kafka")]
use crate::kafka;
use crate::kind::{Feature, Limits, SinkKind, SourceKind};
use crate::{annotate, csv, images, ipc, jsonl, stdout, video};

impl<T: SinkKind> SinkKind for Box<T> {
    fn kind(&self) -> &'static str {
        (**self).kind()
    }
    fn paths_mut(&mut self) -> Vec<&mut PathBuf> {
        (**self).paths_mut()
    }
    fn output_mut(&mut self) -> Option<&mut PathBuf> {
        (**self).output_mut()
    }
    fn outputs(&self) -> Vec<&std::path::Path> {
        (**self).outputs()
    }
    fn prepare(&mut self, ctx: &crate::kind::SinkContext<'_>) {
        (**self).prepare(ctx)
    }
    fn check_input(&self, schema: &arrow_schema::Schema) -> Result<(), String> {
        (**self).check_input(schema)
    }
    fn check_runtime(&self, interval_ms: Option<u64>) -> Result<(), (&'static str, String)> {
        (**self).check_runtime(interval_ms)
    }
    fn commit_source_offsets(&mut self, group: &crate::kind::SourceGroup) -> bool {
        (**self).commit_source_offsets(group)
    }
    fn dead_letters(&self) -> Option<Self> {
        (**self).dead_letters().map(Box::new)
    }
    fn build(&self) -> DataflowResult<Box<dyn SinkFactory>> {
        (**self).build()
    }
}

impl<T: SourceKind> SourceKind for Box<T> {
    fn kind(&self) -> &'static str {
        (**self).kind()
    }
    fn paths_mut(&mut self) -> Vec<&mut PathBuf> {
        (**self).paths_mut()
    }
    fn inputs(&self) -> Vec<&std::path::Path> {
        (**self).inputs()
    }
    fn offsets_with_output(&self) -> Option<crate::kind::OffsetsWithOutput> {
        (**self).offsets_with_output()
    }
    fn build(&self) -> DataflowResult<Box<dyn SourceFactory>> {
        (**self).build()
    }
    fn absorb_scale(&mut self, column: &str, width: u32, height: u32) -> bool {
        (**self).absorb_scale(column, width, height)
    }
    fn plan_note(&self) -> Option<String> {
        (**self).plan_note()
    }
}

macro_rules! source_kinds {
    ($($(#[$doc:meta])* $variant:ident($config:ty) $(if $cfg:meta)?),* $(,)?) => {
        /// Where a pipeline's records come from (externally tagged: `source: { images: {...} }`).
        #[derive(Clone, Debug, Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub enum SourceConfig {
            $($(#[$doc])* $(#[cfg($cfg)])? $variant($config),)*
        }

        impl SourceConfig {
            /// What the kind says about itself.
            pub fn kind(&self) -> &dyn SourceKind {
                match self {
                    $($(#[cfg($cfg)])? SourceConfig::$variant(c) => c,)*
                }
            }

            pub fn kind_mut(&mut self) -> &mut dyn SourceKind {
                match self {
                    $($(#[cfg($cfg)])? SourceConfig::$variant(c) => c,)*
                }
            }

            /// The kind's own ranges.
            pub fn ranges(&self) -> &'static [Range] {
                match self {
                    $($(#[cfg($cfg)])? SourceConfig::$variant(c) => ranges_of(c),)*
                }
            }
        }

        /// Every source kind's ranges (for the reference's table).
        // Pushes, not `vec![…]`: an element cannot carry a `cfg` (a kind left out of the build).
        #[allow(clippy::vec_init_then_push)]
        pub fn source_ranges() -> Vec<&'static [Range]> {
            let mut all = Vec::new();
            $($(#[cfg($cfg)])? all.push(<$config as Limits>::RANGES);)*
            all
        }
    };
}

macro_rules! sink_kinds {
    ($($(#[$doc:meta])* $variant:ident($config:ty) $(if $cfg:meta)?),* $(,)?) => {
        /// Where a pipeline's results (or dead letters) go (`sink: { jsonl: { path: ... } }`,
        /// `sink: { stdout: {} }`).
        #[derive(Clone, Debug, Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub enum SinkConfig {
            $($(#[$doc])* $(#[cfg($cfg)])? $variant($config),)*
        }

        impl SinkConfig {
            /// What the kind says about itself.
            pub fn kind(&self) -> &dyn SinkKind {
                match self {
                    $($(#[cfg($cfg)])? SinkConfig::$variant(c) => c,)*
                }
            }

            pub fn kind_mut(&mut self) -> &mut dyn SinkKind {
                match self {
                    $($(#[cfg($cfg)])? SinkConfig::$variant(c) => c,)*
                }
            }

            /// The kind's own ranges.
            pub fn ranges(&self) -> &'static [Range] {
                match self {
                    $($(#[cfg($cfg)])? SinkConfig::$variant(c) => ranges_of(c),)*
                }
            }

            /// What the kind says of its dead letters ([`SinkKind::dead_letters`]).
            fn own_dead_letters(&self) -> Option<SinkConfig> {
                match self {
                    $($(#[cfg($cfg)])? SinkConfig::$variant(c) => c.dead_letters().map(SinkConfig::$variant),)*
                }
            }
        }

        /// Every sink kind's ranges (for the reference's table).
        // Pushes, not `vec![…]`: an element cannot carry a `cfg` (a kind left out of the build).
        #[allow(clippy::vec_init_then_push)]
        pub fn sink_ranges() -> Vec<&'static [Range]> {
            let mut all = Vec::new();
            $($(#[cfg($cfg)])? all.push(<$config as Limits>::RANGES);)*
            all
        }
    };
}

/// A kind's ranges, from a value of it (the match arms name no type, so a kind left out of
/// the build names nothing that is not there).
fn ranges_of<T: Limits>(_: &T) -> &'static [Range] {
    T::RANGES
}

/// Declares the marker of a kind that a cargo feature builds ([`crate::kind::Unbuilt`]).
macro_rules! feature_marker {
    ($($name:ident: $kind:literal by $feature:literal),* $(,)?) => {
        $(
            #[derive(Clone, Debug)]
            pub struct $name;
            impl Feature for $name {
                const KIND: &'static str = $kind;
                const FEATURE: &'static str = $feature;
            }
        )*
    };
}

feature_marker! {
    KafkaFeature: "kafka" by "kafka",
    AvroFeature: "avro" by "schemas",
    PostgresFeature: "postgres" by "postgres",
    RedisFeature: "redis" by "redis",
    ParquetFeature: "parquet" by "parquet",
}

source_kinds! {
    /// A directory of images, one row per file.
    Images(images::ImagesConfig),
    /// An Arrow IPC file.
    Ipc(ipc::IpcSourceConfig),
    Csv(csv::CsvSourceConfig),
    Jsonl(jsonl::JsonlSourceConfig),
    /// A topic's partitions.
    Kafka(Box<kafka::KafkaSourceConfig>) if feature = "kafka",
    Kafka(crate::kind::Unbuilt<KafkaFeature>) if not(feature = "kafka"),
    /// Video files and live cameras, decoded by FFmpeg.
    Video(video::VideoConfig),
    /// Avro object container files.
    Avro(crate::avro::AvroSourceConfig) if feature = "schemas",
    Avro(crate::kind::Unbuilt<AvroFeature>) if not(feature = "schemas"),
}

sink_kinds! {
    Jsonl(jsonl::JsonlSinkConfig),
    Csv(csv::CsvSinkConfig),
    Stdout(stdout::StdoutSinkConfig),
    Ipc(ipc::IpcSinkConfig),
    Kafka(Box<kafka::KafkaSinkConfig>) if feature = "kafka",
    Kafka(crate::kind::Unbuilt<KafkaFeature>) if not(feature = "kafka"),
    /// Pictures of the results drawn on their frames, one file a frame.
    Annotate(annotate::AnnotateSinkConfig),
    Postgres(crate::postgres::PostgresSinkConfig) if feature = "postgres",
    Postgres(crate::kind::Unbuilt<PostgresFeature>) if not(feature = "postgres"),
    Redis(crate::redis::RedisSinkConfig) if feature = "redis",
    Redis(crate::kind::Unbuilt<RedisFeature>) if not(feature = "redis"),
    Parquet(crate::parquet::ParquetSinkConfig) if feature = "parquet",
    Parquet(crate::kind::Unbuilt<ParquetFeature>) if not(feature = "parquet"),
    Http(crate::http::HttpSinkConfig),
    /// Each camera's frames with their detections drawn, as H.264 MP4 files (FFmpeg).
    Video(crate::video_sink::VideoSinkConfig),
}

impl SourceConfig {
    /// Opens the source ([`SourceKind::build`]).
    pub fn build(&self) -> DataflowResult<Box<dyn SourceFactory>> {
        self.kind().build()
    }

    /// Checkpoints resume a source from offsets: one that cannot seek would fail at run time.
    /// `factory` is this configuration, built.
    pub fn check_resumable(&self, factory: &dyn SourceFactory) -> Result<(), String> {
        if factory.checkpoint_id().is_some() {
            return Ok(());
        }
        Err(format!(
            "a `{}` source cannot resume from a checkpoint: expected a `kafka` source or \
             video files (or no `runtime.checkpoint`)",
            self.kind().kind()
        ))
    }
}

impl SinkConfig {
    pub fn build(&self) -> DataflowResult<Box<dyn SinkFactory>> {
        self.kind().build()
    }

    /// Where rejected records go when the pipeline names no `dead_letter`: what the kind says
    /// ([`SinkKind::dead_letters`]), else `<stem>.dead-letters.jsonl` beside its first path,
    /// else `dead-letters.jsonl`.
    pub fn default_dead_letters(&self) -> SinkConfig {
        if let Some(own) = self.own_dead_letters() {
            return own;
        }
        let mut sink = self.clone();
        let path = match sink.kind_mut().output_mut() {
            Some(p) => {
                let stem = p
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_else(|| "results".into());
                p.with_file_name(format!("{stem}.dead-letters.jsonl"))
            }
            None => PathBuf::from("dead-letters.jsonl"),
        };
        SinkConfig::Jsonl(jsonl::JsonlSinkConfig::at(path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kind::Unbuilt;
    use serde_json::json;

    #[test]
    fn each_kind_names_its_own_yaml_key() {
        let sources = [
            json!({"images": {"path": "f"}}),
            json!({"ipc": {"path": "f"}}),
            json!({"csv": {"path": "f"}}),
            json!({"jsonl": {"path": "f"}}),
            json!({"kafka": {"brokers": "b", "topic": "t", "format": "json"}}),
            json!({"video": {"glob": "*.mp4"}}),
            json!({"avro": {"path": "f"}}),
        ];
        for source in sources {
            let key = source.as_object().unwrap().keys().next().unwrap().clone();
            let config: SourceConfig = serde_json::from_value(source).unwrap();
            assert_eq!(config.kind().kind(), key);
        }
        let sinks = [
            json!({"jsonl": {"path": "f"}}),
            json!({"stdout": {}}),
            json!({"ipc": {"path": "f"}}),
            json!({"kafka": {"brokers": "b", "topic": "t"}}),
            json!({"annotate": {"dir": "d"}}),
            json!({"parquet": {"path": "d"}}),
            json!({"redis": {"url": "redis://h", "key": "k"}}),
            json!({"postgres": {"url": "postgres://h/db", "table": "t"}}),
            json!({"http": {"url": "http://h/hook"}}),
            json!({"video": {"dir": "d"}}),
        ];
        for sink in sinks {
            let key = sink.as_object().unwrap().keys().next().unwrap().clone();
            let config: SinkConfig = serde_json::from_value(sink).unwrap();
            assert_eq!(config.kind().kind(), key);
        }
    }

    #[test]
    fn dead_letters_go_where_the_kind_says_or_beside_the_first_path() {
        let file: SinkConfig =
            serde_json::from_value(json!({"jsonl": {"path": "out/r.jsonl"}})).unwrap();
        let dl = file.default_dead_letters();
        assert_eq!(
            dl.kind().outputs(),
            [std::path::Path::new("out/r.dead-letters.jsonl")]
        );
        let stdout: SinkConfig = serde_json::from_value(json!({"stdout": {}})).unwrap();
        assert_eq!(
            stdout.default_dead_letters().kind().outputs(),
            [std::path::Path::new("dead-letters.jsonl")]
        );
        #[cfg(feature = "kafka")]
        {
            let topic: SinkConfig =
                serde_json::from_value(json!({"kafka": {"brokers": "b", "topic": "recs"}}))
                    .unwrap();
            let SinkConfig::Kafka(dlq) = topic.default_dead_letters() else {
                panic!("a Kafka sink's dead letters go to a topic");
            };
            assert_eq!(dlq.topic, "recs-dead-letters");
            assert_eq!(
                dlq.headers.get("reason").map(String::as_str),
                Some("reason")
            );
        }
    }

    #[test]
    fn a_kind_left_out_of_the_build_fails_to_parse_naming_its_feature() {
        let e = serde_json::from_value::<Unbuilt<KafkaFeature>>(json!({"brokers": "b"}))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`kafka` is not in this build") && e.contains("`kafka` feature"),
            "{e}"
        );
        let e = serde_json::from_value::<Unbuilt<AvroFeature>>(json!({"path": "f"}))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`avro` is not in this build") && e.contains("`schemas` feature"),
            "{e}"
        );
    }

    #[test]
    fn every_kind_declares_each_range_once() {
        for ranges in source_ranges().into_iter().chain(sink_ranges()) {
            let mut keys: Vec<&str> = ranges.iter().map(|r| r.key).collect();
            keys.sort_unstable();
            let before = keys.len();
            keys.dedup();
            assert_eq!(keys.len(), before, "a key declared twice: {ranges:?}");
        }
    }
}
