//! The clients a transactional sink creates besides its producer's, and whether the brokers
//! have transactions at all.

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerGroupMetadata};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::producer::{BaseProducer, Producer};
use riffle_dataflow::DataflowResult;

use super::error;
use crate::kafka::client::{client_config, Role};
use crate::kafka::config::{KafkaSinkConfig, TRANSACTION_TIMEOUT_OPTION};

/// The group's metadata for `send_offsets_to_transaction`, from a client that does not join
/// it: offsets commit without member checks, as the transactional producer is not a member.
pub(super) fn group_metadata(
    config: &KafkaSinkConfig,
    group: &str,
) -> DataflowResult<ConsumerGroupMetadata> {
    let mut c = client_config(&config.brokers, &config.options, Role::Admin);
    c.set("group.id", group);
    let consumer: BaseConsumer = c
        .create()
        .map_err(|e| error(config, format!("creating a client of group `{group}`: {e}")))?;
    consumer
        .group_metadata()
        .ok_or_else(|| error(config, format!("no metadata for group `{group}`")))
}

pub(super) fn transactional_config(config: &KafkaSinkConfig, id: &str) -> rdkafka::ClientConfig {
    let mut c = client_config(&config.brokers, &config.options, Role::SinkProducer);
    c.set("transactional.id", id).set(
        TRANSACTION_TIMEOUT_OPTION,
        config.transaction_timeout_ms.to_string(),
    );
    c
}

/// Whether the brokers support transactions: a producer with a throw-away transactional id
/// initialises (brokers before 0.11, and Kafka-protocol brokers without transactions, refuse).
pub fn brokers_support_transactions(config: &KafkaSinkConfig, id: &str) -> DataflowResult<bool> {
    let probe: BaseProducer = transactional_config(config, &format!("{id}.probe"))
        .create()
        .map_err(|e| error(config, format!("creating a producer: {e}")))?;
    match probe.init_transactions(Duration::from_millis(config.delivery_timeout_ms)) {
        Ok(()) => Ok(true),
        Err(e) if unsupported(e.rdkafka_error_code()) => Ok(false),
        Err(e) => Err(error(config, format!("checking for transactions: {e}"))),
    }
}

/// Error codes that mean "this broker has no transactions".
pub(super) fn unsupported(code: Option<RDKafkaErrorCode>) -> bool {
    matches!(
        code,
        Some(
            RDKafkaErrorCode::UnsupportedFeature
                | RDKafkaErrorCode::UnsupportedVersion
                | RDKafkaErrorCode::UnsupportedForMessageFormat
                | RDKafkaErrorCode::InvalidRequest
        )
    )
}
