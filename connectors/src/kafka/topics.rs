//! Topics created by Riffle: a Kafka sink's results topic and commit log, `riffle produce`'s
//! topic. Existing topics are left as they are.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use riffle_dataflow::{DataflowError, DataflowResult};

use super::client::{client_config, Role};

/// A topic to create: `riffle produce`'s flags, or a Kafka sink's `partitions`,
/// `replication_factor` and `topic_config`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicSpec {
    pub name: String,
    pub partitions: i32,
    /// Replicas of each partition; -1: the broker's `default.replication.factor` (needs
    /// CreateTopics v4, Kafka 2.4 or later).
    pub replication_factor: i32,
    /// Topic configs (`retention.ms`, `min.insync.replicas`, `cleanup.policy`, …).
    pub config: BTreeMap<String, String>,
}

impl TopicSpec {
    /// `partitions` partitions, the broker's replication factor, no topic configs.
    pub fn new(name: impl Into<String>, partitions: i32) -> Self {
        TopicSpec {
            name: name.into(),
            partitions,
            replication_factor: -1,
            config: BTreeMap::new(),
        }
    }

    fn check(&self) -> Result<(), String> {
        if self.partitions < 1 {
            return Err(format!(
                "expected at least 1 partition, found {}",
                self.partitions
            ));
        }
        if self.replication_factor < 1 && self.replication_factor != -1 {
            return Err(format!(
                "expected a replication factor ≥ 1, or -1 for the broker's default, found {}",
                self.replication_factor
            ));
        }
        Ok(())
    }

    /// The admin request for this topic.
    fn new_topic(&self) -> NewTopic<'_> {
        self.config.iter().fold(
            NewTopic::new(
                &self.name,
                self.partitions,
                TopicReplication::Fixed(self.replication_factor),
            ),
            |topic, (key, value)| topic.set(key, value),
        )
    }
}

/// Creates `topic` unless it exists (an existing topic is left as it is). `options` are the
/// client's librdkafka options (security settings for SASL/SSL brokers, …).
pub fn ensure_topic(
    brokers: &str,
    options: &BTreeMap<String, String>,
    topic: &TopicSpec,
) -> DataflowResult<()> {
    let name = topic.name.as_str();
    topic.check().map_err(|why| {
        DataflowError::Config(format!("creating topic `{name}` on {brokers}: {why}"))
    })?;
    let admin: AdminClient<DefaultClientContext> = client_config(brokers, options, Role::Admin)
        .create()
        .map_err(|e| kafka_error(brokers, name, e))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| DataflowError::io("starting the admin client's runtime", e))?;
    let new = topic.new_topic();
    let admin_options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let results = runtime
        .block_on(admin.create_topics([&new], &admin_options))
        .map_err(|e| kafka_error(brokers, name, e))?;
    for result in results {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((_, code)) => {
                return Err(DataflowError::Config(format!(
                    "creating topic `{name}` on {brokers}: {code}"
                )))
            }
        }
    }
    Ok(())
}

/// A client error on `topic`, naming the brokers.
pub(crate) fn kafka_error(brokers: &str, topic: &str, e: KafkaError) -> DataflowError {
    DataflowError::Config(format!("kafka {brokers} topic `{topic}`: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_spec_becomes_the_admin_request() {
        let mut spec = TopicSpec::new("t", 3);
        assert_eq!(spec.replication_factor, -1);
        spec.config.insert("retention.ms".into(), "3600000".into());
        spec.config.insert("cleanup.policy".into(), "delete".into());
        let new = spec.new_topic();
        assert_eq!((new.name, new.num_partitions), ("t", 3));
        assert!(matches!(new.replication, TopicReplication::Fixed(-1)));
        assert_eq!(
            new.config,
            vec![("cleanup.policy", "delete"), ("retention.ms", "3600000")]
        );
    }

    #[test]
    fn topic_spec_bounds() {
        assert!(TopicSpec::new("t", 1).check().is_ok());
        assert!(TopicSpec::new("t", 0).check().is_err());
        let mut spec = TopicSpec::new("t", 1);
        for (rf, ok) in [(-1, true), (1, true), (3, true), (0, false), (-2, false)] {
            spec.replication_factor = rf;
            assert_eq!(spec.check().is_ok(), ok, "{rf}");
        }
    }
}
