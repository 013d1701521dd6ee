//! The source's columns: value columns declared with `schema:` or inferred from the messages at
//! the start position (by [`crate::formats`]), then the key, message and header columns.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_schema::{DataType, Field, Schema, SchemaRef};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use riffle_dataflow::DataflowResult;
use tracing::debug;

use super::assignment::{start_offsets, watermarks};
use super::{config_error, consumer_config, POLL_SLICE};
use crate::formats::{self, raw, Decoder, TextFormat};
use crate::kafka::client::ReadsToEnd;
use crate::kafka::config::{KafkaSourceConfig, StartAt};

/// Messages read to infer a `json`/`csv` schema.
const INFER_MESSAGES: usize = 500;
/// Longest wait for those messages.
const INFER_WAIT: Duration = Duration::from_secs(5);

/// The decoder of `json`/`csv` message values: declared columns (required unless declared
/// nullable), or inferred ones (required when every sampled message had them).
pub(super) fn value_decoder(
    config: &KafkaSourceConfig,
    format: TextFormat,
    partitions: &[i32],
) -> DataflowResult<Decoder> {
    let decoder = |schema| Decoder::new(format, formats::Framing::Message, schema);
    match &config.schema {
        Some(declared) => {
            let schema = formats::declared_schema(declared)
                .ok_or_else(|| config_error(config, "`schema` declares no columns"))?;
            Ok(decoder(schema).with_required(&formats::declared_required(declared)))
        }
        None => {
            let sample = sample_messages(config, partitions)?;
            let schema = infer_schema(config, format, &sample)?;
            let payloads: Vec<&[u8]> = sample.iter().map(Vec::as_slice).collect();
            let d = decoder(schema);
            let required = d.complete_columns(&payloads);
            Ok(d.with_required(&required))
        }
    }
}

/// Infers the value columns from up to [`INFER_MESSAGES`] messages at the start position (the
/// newest ones for `start: latest`, where nothing would be there yet).
fn infer_schema(
    config: &KafkaSourceConfig,
    format: TextFormat,
    sample: &[Vec<u8>],
) -> DataflowResult<SchemaRef> {
    let name = format.name();
    if sample.is_empty() {
        return Err(config_error(
            config,
            format!(
                "no messages at the start position to infer the {name} columns from (waited up to {} s); declare them with `schema:`",
                INFER_WAIT.as_secs()
            ),
        ));
    }
    let payloads = sample.iter().map(Vec::as_slice);
    let schema = match format {
        TextFormat::Csv { .. } => formats::csv::infer_schema_from_payloads(payloads, INFER_MESSAGES),
        TextFormat::Json => formats::json::infer_schema(payloads),
    }
    .map_err(|e| {
        config_error(
            config,
            format!("cannot infer the {name} columns from the first messages: {e}; declare them with `schema:`"),
        )
    })?;
    if schema.fields().is_empty() {
        return Err(config_error(
            config,
            format!("the first messages hold no {name} fields; declare them with `schema:`"),
        ));
    }
    Ok(Arc::new(schema))
}

fn sample_messages(config: &KafkaSourceConfig, partitions: &[i32]) -> DataflowResult<Vec<Vec<u8>>> {
    let consumer: BaseConsumer<ReadsToEnd> = consumer_config(config, true, false)
        .create_with_context(ReadsToEnd)
        .map_err(|e| config_error(config, format!("creating a consumer: {e}")))?;
    let per_partition = (INFER_MESSAGES / partitions.len()).max(1) as i64;
    let starts = start_offsets(&consumer, config, partitions)?;
    let mut assignment = TopicPartitionList::new();
    // Partition → its high watermark; a partition leaves once read up to it.
    let mut open: HashMap<i32, i64> = HashMap::new();
    for (p, start) in starts {
        let (low, high) = watermarks(&consumer, config, p)?;
        let from = match start {
            Offset::End if config.start == StartAt::Latest => (high - per_partition).max(low),
            Offset::Offset(n) => n.max(low),
            Offset::End => high,
            _ => low,
        };
        if from < high {
            assignment
                .add_partition_offset(&config.topic, p, Offset::Offset(from))
                .map_err(|e| config_error(config, format!("partition {p}: {e}")))?;
            open.insert(p, high);
        }
    }
    let mut sample = Vec::new();
    if open.is_empty() {
        return Ok(sample);
    }
    consumer
        .assign(&assignment)
        .map_err(|e| config_error(config, format!("assigning partitions: {e}")))?;
    let deadline = Instant::now() + INFER_WAIT;
    while sample.len() < INFER_MESSAGES && !open.is_empty() {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            break;
        }
        match consumer.poll(remaining.min(POLL_SLICE)) {
            None => {}
            Some(Ok(message)) => {
                let p = message.partition();
                if let Some(&high) = open.get(&p) {
                    if let Some(value) = message.payload() {
                        sample.push(value.to_vec());
                    }
                    if message.offset() + 1 >= high {
                        open.remove(&p);
                    }
                }
            }
            Some(Err(KafkaError::PartitionEOF(p))) => {
                open.remove(&p);
            }
            Some(Err(e)) => debug!(topic = %config.topic, "kafka source: while sampling: {e}"),
        }
    }
    Ok(sample)
}

/// Every column of the source's batches, given the value columns (`None` for `jpeg`/`raw`).
pub(super) fn output_schema(
    config: &KafkaSourceConfig,
    value_schema: Option<&SchemaRef>,
) -> DataflowResult<SchemaRef> {
    let mut fields: Vec<Field> = match value_schema {
        Some(values) => values.fields().iter().map(|f| f.as_ref().clone()).collect(),
        None => vec![raw::bytes_field()],
    };
    if let Some(key) = &config.key {
        fields.push(Field::new(key, DataType::Utf8, true));
    }
    if value_schema.is_none() {
        fields.push(Field::new("partition", DataType::Int32, false));
        fields.push(Field::new("offset", DataType::Int64, false));
        fields.push(Field::new("timestamp", DataType::Int64, true));
        fields.push(Field::new("headers", DataType::Utf8, true));
    }
    for (name, t) in &config.header_columns {
        fields.push(Field::new(name, t.data_type(), true));
    }
    let mut seen = HashSet::new();
    for f in &fields {
        if !seen.insert(f.name().as_str()) {
            return Err(config_error(
                config,
                format!(
                    "column `{}` would appear twice; rename the key or header column",
                    f.name()
                ),
            ));
        }
    }
    Ok(Arc::new(Schema::new(fields)))
}
