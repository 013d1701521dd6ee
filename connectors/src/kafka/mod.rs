//! Kafka in and out (rdkafka, bundled librdkafka).
//!
//! The source assigns partitions to workers itself (partition p → worker p mod workers, across
//! all processes) instead of joining a consumer group: offsets belong to Riffle's checkpoints,
//! as in Flink and Arroyo, and are committed back to Kafka only as advisory, for lag tools.
//!
//! Message values are decoded by [`crate::formats`] (shared with the file sources); every
//! client (source, sink, topic creation, `riffle produce`, `riffle consume`) is configured by
//! [`client::client_config`].

pub mod client;
pub mod committed;
mod config;
mod metrics;
pub mod replay;
mod sink;
mod source;
pub mod transactions;

pub use crate::formats::{ColumnType, MessageFormat};
pub use config::{ExactlyOnce, KafkaSinkConfig, KafkaSourceConfig, SinkFormat, StartAt};
pub use sink::KafkaSinkFactory;
pub use source::KafkaSourceFactory;
