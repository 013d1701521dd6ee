//! The topic's partitions, and where reading starts in each.

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};
use riffle_dataflow::DataflowResult;

use super::{config_error, read_error, METADATA_TIMEOUT};
use crate::kafka::client::{fetch_metadata, Diagnosed};
use crate::kafka::config::{KafkaSourceConfig, StartAt};

/// The topic's partition ids, sorted; fails if the topic is missing, has no partitions, or the
/// configured start offsets name partitions it does not have.
pub(super) fn fetch_partitions(
    consumer: &BaseConsumer<Diagnosed>,
    config: &KafkaSourceConfig,
) -> DataflowResult<Vec<i32>> {
    let metadata = fetch_metadata(consumer, Some(&config.topic), METADATA_TIMEOUT)
        .map_err(|e| config_error(config, format!("cannot read topic metadata: {e}")))?;
    let topic = metadata
        .topics()
        .iter()
        .find(|t| t.name() == config.topic)
        .ok_or_else(|| config_error(config, "the topic does not exist"))?;
    if let Some(err) = topic.error() {
        return Err(config_error(
            config,
            format!(
                "the topic is not available: {}",
                RDKafkaErrorCode::from(err)
            ),
        ));
    }
    let mut partitions: Vec<i32> = topic.partitions().iter().map(|p| p.id()).collect();
    partitions.sort_unstable();
    if partitions.is_empty() {
        return Err(config_error(config, "the topic has no partitions"));
    }
    check_start_offsets(config, &partitions)?;
    Ok(partitions)
}

/// Start offsets may only name the topic's `partitions` (sorted).
pub(super) fn check_start_offsets(
    config: &KafkaSourceConfig,
    partitions: &[i32],
) -> DataflowResult<()> {
    if let StartAt::Offsets(offsets) = &config.start {
        let unknown: Vec<i32> = offsets
            .keys()
            .filter(|p| partitions.binary_search(p).is_err())
            .copied()
            .collect();
        if !unknown.is_empty() {
            return Err(config_error(
                config,
                format!(
                    "start offsets name partitions {unknown:?}, but the topic has {partitions:?}"
                ),
            ));
        }
    }
    Ok(())
}

/// Where reading starts in each of `partitions`, as librdkafka offsets.
pub(super) fn start_offsets<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    config: &KafkaSourceConfig,
    partitions: &[i32],
) -> DataflowResult<Vec<(i32, Offset)>> {
    Ok(match &config.start {
        StartAt::Earliest => partitions.iter().map(|&p| (p, Offset::Beginning)).collect(),
        StartAt::Latest => partitions.iter().map(|&p| (p, Offset::End)).collect(),
        StartAt::Offsets(offsets) => partitions
            .iter()
            .map(|&p| {
                (
                    p,
                    offsets
                        .get(&p)
                        .map_or(Offset::Beginning, |&o| Offset::Offset(o)),
                )
            })
            .collect(),
        StartAt::TimestampMs(ts) => {
            if partitions.is_empty() {
                return Ok(Vec::new());
            }
            let mut query = TopicPartitionList::new();
            for &p in partitions {
                // librdkafka takes the timestamp in the offset field.
                query
                    .add_partition_offset(&config.topic, p, Offset::Offset(*ts))
                    .map_err(|e| read_error(config, format!("partition {p}: {e}")))?;
            }
            let found = consumer
                .offsets_for_times(query, METADATA_TIMEOUT)
                .map_err(|e| read_error(config, format!("looking up offsets at {ts} ms: {e}")))?;
            let mut starts = Vec::with_capacity(partitions.len());
            for &p in partitions {
                let elem = found.find_partition(&config.topic, p).ok_or_else(|| {
                    read_error(config, format!("partition {p}: no offset for time {ts} ms"))
                })?;
                elem.error().map_err(|e| {
                    read_error(
                        config,
                        format!("partition {p}: offset for time {ts} ms: {e}"),
                    )
                })?;
                // No message at or after the time: librdkafka answers the end.
                starts.push((p, elem.offset()));
            }
            starts
        }
    })
}

/// A partition's low and high watermarks.
pub(super) fn watermarks<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    config: &KafkaSourceConfig,
    partition: i32,
) -> DataflowResult<(i64, i64)> {
    consumer
        .fetch_watermarks(&config.topic, partition, METADATA_TIMEOUT)
        .map_err(|e| {
            read_error(
                config,
                format!("partition {partition}: reading watermarks: {e}"),
            )
        })
}
