//! The one place Kafka clients are configured: the source's consumers, the sink's producers,
//! topic creation, `riffle produce` and `riffle consume` all start from [`client_config`].

use std::collections::BTreeMap;

use rdkafka::ClientConfig;

/// What a client is created for; each role sets the librdkafka options it depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role<'a> {
    /// A source consumer of `topic` (metadata, sampling or reading). It joins no group:
    /// offsets belong to Riffle's checkpoints.
    SourceConsumer {
        topic: &'a str,
        /// Report the end of each partition (`enable.partition.eof`).
        partition_eof: bool,
        /// Emit statistics every second (they carry each partition's high watermark).
        statistics: bool,
    },
    /// The sink's producers (results and commit markers): idempotent, acknowledged by all
    /// replicas.
    SinkProducer,
    /// `riffle produce`'s producer: idempotent, batching for a few milliseconds.
    ReplayProducer,
    /// Topic creation and metadata look-ups: only the brokers.
    Admin,
    /// A reader of a whole results topic to its end (`riffle consume`).
    ResultsReader,
}

/// The configuration of a client of `brokers` for `role`; `options` (the pipeline's
/// `options:` map, passed through to librdkafka) are applied last, so they override Riffle's
/// settings.
pub fn client_config(
    brokers: &str,
    options: &BTreeMap<String, String>,
    role: Role<'_>,
) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", brokers);
    match role {
        Role::SourceConsumer {
            topic,
            partition_eof,
            statistics,
        } => {
            // Offsets belong to Riffle; the group only receives advisory commits for lag tools.
            c.set("group.id", format!("riffle-{topic}"))
                .set("enable.auto.commit", "false")
                .set("enable.auto.offset.store", "false")
                // An explicit start offset that has been deleted by retention restarts at the
                // oldest message rather than skipping to the end.
                .set("auto.offset.reset", "earliest");
            if statistics {
                c.set("statistics.interval.ms", "1000");
            }
            if partition_eof {
                c.set("enable.partition.eof", "true");
            }
        }
        Role::SinkProducer => {
            // No duplicates or reordering on retries, and a write counts once all replicas
            // have it.
            c.set("enable.idempotence", "true").set("acks", "all");
        }
        Role::ReplayProducer => {
            c.set("enable.idempotence", "true").set("linger.ms", "5");
        }
        Role::Admin => {}
        Role::ResultsReader => {
            // Transactional output counts once committed; aborted attempts are skipped.
            c.set("group.id", "riffle-consume")
                .set("isolation.level", "read_committed")
                .set("enable.auto.commit", "false")
                .set("enable.partition.eof", "true")
                // Smaller fetches: a slow broker (tansu on sqlite serves ~1 ms per message)
                // answers each sooner.
                .set("max.partition.fetch.bytes", "262144");
        }
    }
    for (key, value) in options {
        c.set(key, value);
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_override_the_role_settings() {
        let options = BTreeMap::from([("acks".to_string(), "1".to_string())]);
        let c = client_config("b:9092", &options, Role::SinkProducer);
        assert_eq!(c.get("bootstrap.servers"), Some("b:9092"));
        assert_eq!(c.get("acks"), Some("1"));
        assert_eq!(c.get("enable.idempotence"), Some("true"));
        let c = client_config(
            "b:9092",
            &BTreeMap::new(),
            Role::SourceConsumer {
                topic: "t",
                partition_eof: true,
                statistics: false,
            },
        );
        assert_eq!(c.get("group.id"), Some("riffle-t"));
        assert_eq!(c.get("enable.partition.eof"), Some("true"));
        assert_eq!(c.get("statistics.interval.ms"), None);
    }
}
