//! Finding the partitions where a transaction was left open (see
//! `Transaction::abort_left_open`).

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use riffle_dataflow::DataflowResult;

use super::error;
use crate::kafka::client::{client_config, Diagnosed, Role};
use crate::kafka::config::KafkaSinkConfig;

/// Header of the record that a restarted sink writes and aborts to close a transaction a
/// partition was left holding (never seen by `read_committed` readers).
pub const CLEAN_UP_HEADER: &str = "riffle-clean-up";

/// A partition whose last stable offset is behind its end: a transaction is open on it.
#[derive(Debug)]
pub(super) struct OpenPartition {
    pub topic: String,
    pub partition: i32,
    pub stable: i64,
    pub end: i64,
}

/// The partitions of `topics` with a transaction open (missing topics have none).
pub(super) fn open_partitions(
    config: &KafkaSinkConfig,
    topics: &[&str],
) -> DataflowResult<Vec<OpenPartition>> {
    let timeout = Duration::from_millis(config.delivery_timeout_ms);
    let committed = watermark_reader(config, "read_committed")?;
    let uncommitted = watermark_reader(config, "read_uncommitted")?;
    let mut open = Vec::new();
    for topic in topics {
        let metadata = committed
            .fetch_metadata(Some(topic), timeout)
            .map_err(|e| error(config, format!("reading `{topic}`'s metadata: {e}")))?;
        let Some(t) = metadata
            .topics()
            .iter()
            .find(|t| t.name() == *topic && t.error().is_none())
        else {
            continue;
        };
        for partition in t.partitions().iter().map(|p| p.id()) {
            let watermark = |c: &BaseConsumer<Diagnosed>| {
                c.fetch_watermarks(topic, partition, timeout)
                    .map(|(_, high)| high)
                    .map_err(|e| {
                        error(
                            config,
                            format!("reading `{topic}` [{partition}]'s end: {e}"),
                        )
                    })
            };
            // A transaction that opens or closes between the two reads may look open: that
            // costs a clean-up that finds nothing of ours, never a missed one.
            let stable = watermark(&committed)?;
            let end = watermark(&uncommitted)?;
            if stable < end {
                open.push(OpenPartition {
                    topic: topic.to_string(),
                    partition,
                    stable,
                    end,
                });
            }
        }
    }
    Ok(open)
}

/// A client that reads partitions' ends with `isolation` (`read_committed`: the last stable
/// offset).
fn watermark_reader(
    config: &KafkaSinkConfig,
    isolation: &str,
) -> DataflowResult<BaseConsumer<Diagnosed>> {
    let mut c = client_config(&config.brokers, &config.options, Role::Admin);
    c.set("isolation.level", isolation);
    c.create_with_context(Diagnosed::default())
        .map_err(|e| error(config, format!("creating a client: {e}")))
}
