//! `riffle produce`: replay bundled frames or clicks into a Kafka topic at a chosen rate.

use anyhow::{bail, Result};
use riffle_connectors::kafka::replay::{replay, Pace, ReplayInput};
use riffle_connectors::kafka::topics::{ensure_topic, TopicSpec};

use crate::cli::{ProduceArgs, ProduceFormat};

pub fn produce_command(args: ProduceArgs) -> Result<()> {
    if args.format != ProduceFormat::Json {
        return produce_schemaful(&args);
    }
    let (input, per_second) = match (&args.frames, &args.csv, &args.jsonl) {
        (Some(dir), None, None) => (
            ReplayInput::Frames {
                dir,
                cameras: args.cameras,
                repeat: args.repeat,
            },
            // --fps is per camera, as each camera streams at its own frame rate.
            args.fps.map(|f| f * args.cameras.unwrap_or(1) as f64),
        ),
        (None, Some(file), None) => (ReplayInput::Csv(file), args.rate),
        (None, None, Some(file)) => (ReplayInput::Jsonl(file), args.rate),
        _ => bail!("give exactly one of --frames DIR, --csv FILE, --jsonl FILE"),
    };
    let source = input.source();
    let factory = source.build()?;
    let options = args.kafka.map();
    ensure_topic(
        &args.brokers,
        &options,
        &TopicSpec {
            name: args.topic.clone(),
            partitions: args.partitions,
            replication_factor: args.replication_factor,
            config: args.topic_config.iter().cloned().collect(),
        },
    )?;
    let done = replay(
        &args.brokers,
        &options,
        &args.topic,
        factory.as_ref(),
        args.key.as_deref(),
        Pace {
            messages_per_second: per_second,
        },
    )?;
    println!(
        "produced {} messages ({:.1} MB) to `{}` in {:.2} s ({:.0} msg/s)",
        done.messages,
        done.bytes as f64 / 1e6,
        args.topic,
        done.elapsed.as_secs_f64(),
        done.messages as f64 / done.elapsed.as_secs_f64().max(1e-9)
    );
    Ok(())
}

/// `--jsonl FILE --format avro|protobuf`: each line as one message of the declared schema,
/// through the Kafka sink's encoder (so keys, registration and framing are the sink's).
fn produce_schemaful(args: &ProduceArgs) -> Result<()> {
    let source = match (&args.csv, &args.jsonl) {
        (Some(file), None) => ReplayInput::Csv(file).source(),
        (None, Some(file)) => ReplayInput::Jsonl(file).source(),
        _ => bail!(
            "--format avro/protobuf writes the rows of a file: expected --jsonl FILE or --csv FILE"
        ),
    };
    let mut sink = serde_json::json!({
        "brokers": args.brokers,
        "topic": args.topic,
        "key": args.key,
        "partitions": args.partitions,
        "replication_factor": args.replication_factor,
        "topic_config": args.topic_config.iter().cloned().collect::<std::collections::BTreeMap<_, _>>(),
        "exactly_once": "off",
        "options": args.kafka.map(),
    });
    match args.format {
        ProduceFormat::Avro => {
            let Some(schema) = &args.avro_schema else {
                bail!("--format avro: expected --avro-schema FILE (.avsc)");
            };
            sink["format"] = "avro".into();
            sink["avro"] = serde_json::json!({ "schema": schema });
        }
        ProduceFormat::Protobuf => {
            let (Some(proto), Some(message)) = (&args.proto, &args.message) else {
                bail!("--format protobuf: expected --proto FILE and --message NAME");
            };
            sink["format"] = "protobuf".into();
            sink["protobuf"] = serde_json::json!({ "proto": proto, "message": message });
        }
        ProduceFormat::Json => bail!("JSON lines are replayed as they are: drop --format"),
    }
    if let Some(url) = &args.schema_registry {
        sink["schema_registry"] = serde_json::json!({ "url": url });
    }
    let config = serde_json::from_value(sink)?;
    let factory = source.build()?;
    let done = riffle_connectors::kafka::replay::replay_schemaful(
        &config,
        factory.as_ref(),
        Pace {
            messages_per_second: args.rate,
        },
    )?;
    println!(
        "produced {} {} messages to `{}` in {:.2} s ({:.0} msg/s)",
        done.messages,
        match args.format {
            ProduceFormat::Avro => "Avro",
            _ => "Protobuf",
        },
        args.topic,
        done.elapsed.as_secs_f64(),
        done.messages as f64 / done.elapsed.as_secs_f64().max(1e-9)
    );
    Ok(())
}
