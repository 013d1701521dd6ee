//! Kafka in and out (rdkafka, bundled librdkafka).
//!
//! By default the source assigns partitions to workers itself (partition p → worker p mod
//! workers, across all processes) instead of joining a consumer group: offsets belong to
//! Riffle's checkpoints, as in Flink and Arroyo, and are committed back to Kafka only as
//! advisory, for lag tools. With `group_id` it joins a group instead, and the group's offsets
//! are committed in the sink's transactions ([`transactions`]).
//!
//! Message values are decoded by [`crate::formats`] (shared with the file sources); every
//! client (source, sink, topic creation, `riffle produce`, `riffle consume`) is configured by
//! [`client::client_config`].

pub mod client;
pub mod committed;
mod config;
mod delivery;
pub mod markers;
mod metrics;
pub mod replay;
mod sink;
mod source;
pub mod topics;
pub mod transactions;
mod writer;

pub use crate::formats::{ColumnType, MessageFormat};
pub use config::{
    ExactlyOnce, KafkaSinkConfig, KafkaSourceConfig, SinkFormat, SourceGroup, StartAt,
};
pub use sink::KafkaSinkFactory;

pub use source::KafkaSourceFactory;
