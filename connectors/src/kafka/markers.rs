//! Commit and fence markers in a results topic, for brokers without transactions: the sink
//! writes them (`MarkerWriter`), an exactly-once reader ([`super::committed`]) applies them.

use std::time::Duration;

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use riffle_dataflow::sink::Committer;
use riffle_dataflow::DataflowResult;

use super::client::{drain, sink_producer_config};
use super::config::KafkaSinkConfig;

/// Header naming the generation (run) that wrote a result, in exactly-once runs.
pub const GENERATION_HEADER: &str = "riffle.generation";
/// Header naming the epoch of a result.
pub const EPOCH_HEADER: &str = "riffle.epoch";
/// Header of a commit marker: `generation:epoch`, everything of that generation up to that
/// epoch is final.
pub const COMMIT_HEADER: &str = "riffle.commit";
/// Header of a fence marker: a generation; results of older generations not committed before
/// it are void.
pub const FENCE_HEADER: &str = "riffle.fence";

/// Writes commit and fence markers to every partition of the results topic, after the results
/// they cover are acknowledged (a checkpoint waits for that), so each partition's reader sees
/// a marker after the results it covers.
pub(super) struct MarkerWriter {
    config: KafkaSinkConfig,
    producer: BaseProducer,
    partitions: Vec<i32>,
}

impl MarkerWriter {
    pub(super) fn open(config: &KafkaSinkConfig) -> DataflowResult<Self> {
        let producer: BaseProducer = sink_producer_config(config)
            .create()
            .map_err(|e| config.config_error(format!("creating a marker producer: {e}")))?;
        let timeout = Duration::from_millis(config.delivery_timeout_ms);
        let metadata = producer
            .client()
            .fetch_metadata(Some(&config.topic), timeout)
            .map_err(|e| config.config_error(format!("reading the topic's partitions: {e}")))?;
        let partitions: Vec<i32> = metadata
            .topics()
            .iter()
            .flat_map(|t| t.partitions().iter().map(|p| p.id()))
            .collect();
        if partitions.is_empty() {
            return Err(config.config_error("the topic has no partitions"));
        }
        Ok(MarkerWriter {
            config: config.clone(),
            producer,
            partitions,
        })
    }

    fn mark(&mut self, header: &str, value: &str) -> DataflowResult<()> {
        for &partition in &self.partitions {
            let headers = OwnedHeaders::new().insert(Header {
                key: header,
                value: Some(value.as_bytes()),
            });
            let record = BaseRecord::<[u8], [u8]>::to(&self.config.topic)
                .partition(partition)
                .payload(&[][..])
                .headers(headers);
            self.producer.send(record).map_err(|(e, _)| {
                self.config
                    .sink_error(format!("writing a {header} marker: {e}"))
            })?;
        }
        let timeout = Duration::from_millis(self.config.delivery_timeout_ms);
        if drain(&self.producer, timeout) {
            Ok(())
        } else {
            Err(self.config.sink_error(format!(
                "{header} markers undelivered after {} ms",
                timeout.as_millis()
            )))
        }
    }
}

impl Committer for MarkerWriter {
    fn commit(&mut self, generation: u64, through: riffle_dataflow::Epoch) -> DataflowResult<()> {
        self.mark(COMMIT_HEADER, &format!("{generation}:{through}"))
    }

    fn fence(&mut self, generation: u64) -> DataflowResult<()> {
        self.mark(FENCE_HEADER, &generation.to_string())
    }
}
