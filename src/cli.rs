use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use riffle_pipelines::run::{ClusterSpec, Workers};

/// Riffle: declarative stream-processing inference on timely dataflow.
#[derive(Parser, Debug)]
#[command(name = "riffle", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Log lines as text, or as JSON objects (one a line, for log collectors).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run a pipeline to the end of its input.
    Run(RunArgs),
    /// Check a pipeline file (files, model signatures, column types) without running it.
    Validate { file: PathBuf },
    /// Compare the pipeline with a straight-line loop and with ONNX Runtime alone.
    Bench(BenchArgs),
    /// Replay image frames or click events into a Kafka topic (demos, load tests).
    Produce(ProduceArgs),
    /// Print a results topic to its current end as an exactly-once reader sees it (commit and
    /// fence markers applied), or raw.
    Consume(ConsumeArgs),
    /// List the CPU cores and CUDA GPUs this machine offers to pipelines.
    Devices,
    /// On a GPU host: the GPU paths (model stage on the GPU, resize kernel) against the CPU
    /// paths on the same inputs, with throughput.
    GpuCheck {
        #[arg(default_value = "models/ml100k_ncf_ctr.onnx")]
        model: PathBuf,
        /// JPEG frames for the resize check.
        #[arg(long, default_value = "data/frames/bikes")]
        frames: PathBuf,
        /// (user, item) pairs per run.
        #[arg(long, default_value_t = 100_000)]
        pairs: usize,
        /// Which GPU.
        #[arg(long, default_value_t = 0)]
        ordinal: usize,
    },
    /// Print how a pipeline would run here: workers, threads, batches, placement.
    Plan {
        file: PathBuf,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
}

#[derive(Args, Debug, Clone)]
pub struct ConsumeArgs {
    /// Kafka bootstrap servers.
    #[arg(long, default_value = "127.0.0.1:9092")]
    pub brokers: String,
    /// Topic to read, from the beginning to its end at start.
    #[arg(long)]
    pub topic: String,
    /// Every result message, committed or not (what a reader ignoring the markers sees).
    #[arg(long)]
    pub raw: bool,
    #[command(flatten)]
    pub kafka: KafkaOptions,
}

/// librdkafka properties for every client a command makes, as kcat's `-X`.
#[derive(Args, Debug, Clone, Default)]
pub struct KafkaOptions {
    /// A librdkafka property, e.g. `-X security.protocol=SASL_SSL` (repeatable; a later one
    /// wins; applied over Riffle's settings).
    #[arg(short = 'X', long = "option", value_name = "KEY=VALUE", value_parser = key_value)]
    pub options: Vec<(String, String)>,
}

#[cfg_attr(not(feature = "kafka"), allow(dead_code))]
impl KafkaOptions {
    pub fn map(&self) -> BTreeMap<String, String> {
        self.options.iter().cloned().collect()
    }
}

/// `KEY=VALUE` (the value may hold `=` and may be empty).
pub fn key_value(s: &str) -> Result<(String, String), String> {
    let Some((key, value)) = s.split_once('=') else {
        return Err("expected KEY=VALUE (e.g. security.protocol=SASL_SSL): no `=`".into());
    };
    if key.is_empty() || key.contains(char::is_whitespace) {
        return Err(format!(
            "expected KEY=VALUE (e.g. security.protocol=SASL_SSL): `{key}` is not a property name"
        ));
    }
    Ok((key.to_string(), value.to_string()))
}

#[derive(Args, Debug, Clone)]
pub struct ProduceArgs {
    /// Kafka bootstrap servers.
    #[arg(long, default_value = "127.0.0.1:9092")]
    pub brokers: String,
    /// Topic to write (created if missing).
    #[arg(long)]
    pub topic: String,
    /// Partitions of a topic this command creates.
    #[arg(long, default_value_t = 4)]
    pub partitions: i32,
    /// Replicas of a topic this command creates (-1: the broker's default.replication.factor).
    #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
    pub replication_factor: i32,
    /// A config of a topic this command creates, e.g. `--topic-config retention.ms=86400000`
    /// (repeatable).
    #[arg(long, value_name = "KEY=VALUE", value_parser = key_value)]
    pub topic_config: Vec<(String, String)>,
    /// A directory of frames: one message per image, key = camera id, headers frame and path.
    #[arg(long)]
    pub frames: Option<PathBuf>,
    /// Split each directory's frames into this many camera streams.
    #[arg(long)]
    pub cameras: Option<usize>,
    /// Frames per second per camera (default: as fast as possible).
    #[arg(long)]
    pub fps: Option<f64>,
    /// Replay the frames this many times.
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
    /// A CSV file with a header: one JSON message per row.
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// A JSON-lines file: one message per line.
    #[arg(long)]
    pub jsonl: Option<PathBuf>,
    /// Messages per second for --csv/--jsonl (default: as fast as possible).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Column whose value is the message key (--csv/--jsonl).
    #[arg(long)]
    pub key: Option<String>,
    /// Message format of --jsonl rows: JSON as read, or Avro / Protobuf of a declared schema
    /// (--avro-schema, --proto and --message).
    #[arg(long, value_enum, default_value_t = ProduceFormat::Json)]
    pub format: ProduceFormat,
    /// The Avro schema (.avsc) of --format avro.
    #[arg(long, value_name = "FILE")]
    pub avro_schema: Option<PathBuf>,
    /// The .proto file of --format protobuf.
    #[arg(long, value_name = "FILE")]
    pub proto: Option<PathBuf>,
    /// The message type of --format protobuf (e.g. `shop.Click`).
    #[arg(long)]
    pub message: Option<String>,
    /// Register the schema with this schema registry (Confluent REST API) and frame every
    /// message with its id, as its serializers do.
    #[arg(long, value_name = "URL")]
    pub schema_registry: Option<String>,
    #[command(flatten)]
    pub kafka: KafkaOptions,
}

/// `riffle produce --format`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProduceFormat {
    Json,
    Avro,
    Protobuf,
}

#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// The pipeline file.
    pub file: PathBuf,
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Serve Prometheus metrics, /healthz and /readyz at this address while running (e.g.
    /// 127.0.0.1:9898). With --processes N, process i serves its own at this port + i.
    #[arg(long)]
    pub metrics_addr: Option<String>,
    /// Serve the live view at this address (e.g. 127.0.0.1:8080): cameras with their
    /// detections, stage charts, latest results and dead letters, plus /metrics, /healthz and
    /// /readyz. Process 0 serves it for the whole cluster; when the input ends it stays up with
    /// the final state until Ctrl-C.
    #[arg(long)]
    pub ui: Option<String>,
    /// Write results to this file instead of the sink's configured path.
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// Checkpoint into this directory and resume from it (overrides `runtime.checkpoint.dir`).
    #[arg(long, conflicts_with = "checkpoint_url")]
    pub checkpoint_dir: Option<PathBuf>,
    /// Checkpoint under this object-store prefix (s3://bucket/prefix) and resume from it
    /// (overrides `runtime.checkpoint.url`); connection settings come from the file's
    /// `runtime.checkpoint`, else AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
    /// AWS_REGION.
    #[arg(long, value_name = "URL")]
    pub checkpoint_url: Option<String>,
    /// No progress display and no summary.
    #[arg(long, short)]
    pub quiet: bool,
    /// With --processes: how many times in a row the supervisor restarts a failed cluster
    /// (a run that stayed up a minute starts the count afresh).
    #[arg(long, default_value_t = 10)]
    pub max_restarts: usize,
}

#[derive(Args, Debug, Clone)]
pub struct ClusterArgs {
    /// Worker threads per process, or `auto` (this host's cores ÷ processes here ÷ ONNX
    /// Runtime threads per worker). Default: `runtime.workers` of the pipeline.
    #[arg(long, short = 'w')]
    pub workers: Option<Workers>,
    /// Processes in the cluster. Without --process or --hostfile, riffle starts them all on
    /// this host.
    #[arg(long, default_value_t = 1)]
    pub processes: usize,
    /// Index of this process in the cluster (0-based).
    #[arg(long)]
    pub process: Option<usize>,
    /// File listing `host:port` of every process, one per line.
    #[arg(long)]
    pub hostfile: Option<PathBuf>,
    /// First port of a local cluster (process i listens on base-port + i).
    #[arg(long, default_value_t = 2101)]
    pub base_port: u16,
}

impl ClusterArgs {
    /// The cluster of the run (or of `riffle plan`), as the library takes it.
    pub fn spec(&self) -> ClusterSpec {
        ClusterSpec {
            workers: self.workers,
            processes: self.processes,
            process: self.process,
            hostfile: self.hostfile.clone(),
            base_port: self.base_port,
        }
    }
}

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// The pipeline file.
    pub file: PathBuf,
    /// Worker threads for the pipeline; the loop and ONNX Runtime alone get the same total
    /// number of ONNX Runtime threads.
    #[arg(long, short = 'w')]
    pub workers: Option<usize>,
    /// Runs of each variant; the table reports the median.
    #[arg(long, default_value_t = 3)]
    pub repeats: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Command, clap::Error> {
        Cli::try_parse_from([&["riffle"], args].concat()).map(|c| c.command)
    }

    #[test]
    fn produce_takes_librdkafka_options_and_topic_settings() {
        let command = parse(&[
            "produce",
            "--topic",
            "t",
            "--csv",
            "c.csv",
            "-X",
            "security.protocol=SASL_SSL",
            "--option",
            "sasl.password=a=b",
            "-Xcompression.type=zstd",
            "-X",
            "compression.type=lz4",
            "--replication-factor",
            "3",
            "--topic-config",
            "retention.ms=60000",
        ])
        .unwrap();
        let Command::Produce(args) = command else {
            panic!("{command:?}")
        };
        assert_eq!(
            args.kafka.map(),
            BTreeMap::from([
                ("compression.type".to_string(), "lz4".to_string()),
                ("sasl.password".to_string(), "a=b".to_string()),
                ("security.protocol".to_string(), "SASL_SSL".to_string()),
            ])
        );
        assert_eq!(args.replication_factor, 3);
        assert_eq!(
            args.topic_config,
            vec![("retention.ms".to_string(), "60000".to_string())]
        );
        let Command::Produce(args) = parse(&["produce", "--topic", "t"]).unwrap() else {
            panic!()
        };
        assert_eq!(args.replication_factor, -1);
        assert!(args.kafka.options.is_empty() && args.topic_config.is_empty());
        let Command::Produce(args) =
            parse(&["produce", "--topic", "t", "--replication-factor", "-1"]).unwrap()
        else {
            panic!()
        };
        assert_eq!(args.replication_factor, -1);
    }

    #[test]
    fn consume_takes_librdkafka_options() {
        let Command::Consume(args) = parse(&[
            "consume",
            "--topic",
            "t",
            "-X",
            "isolation.level=read_committed",
            "-X",
            "empty=",
        ])
        .unwrap() else {
            panic!()
        };
        assert_eq!(
            args.kafka.options,
            vec![
                ("isolation.level".to_string(), "read_committed".to_string()),
                ("empty".to_string(), String::new()),
            ]
        );
    }

    #[test]
    fn bad_key_value_syntax_is_a_cli_error() {
        for (args, why) in [
            (
                vec!["consume", "--topic", "t", "-X", "security.protocol"],
                "no `=`",
            ),
            (
                vec!["consume", "--topic", "t", "-X", "=x"],
                "not a property name",
            ),
            (
                vec!["produce", "--topic", "t", "--option", "a b=c"],
                "not a property name",
            ),
            (
                vec!["produce", "--topic", "t", "--topic-config", "retention"],
                "no `=`",
            ),
        ] {
            let e = parse(&args).unwrap_err();
            assert_eq!(
                e.kind(),
                clap::error::ErrorKind::ValueValidation,
                "{args:?}"
            );
            let message = e.to_string();
            assert!(
                message.contains("KEY=VALUE") && message.contains(why),
                "{message}"
            );
        }
    }
}
