//! Prometheus metrics of the Kafka source and sink, created once per process.
//!
//! Names carry no `riffle_` prefix: the process registry adds it, so they are exposed as
//! `riffle_kafka_records_in_total` and so on.

use std::sync::OnceLock;

use prometheus::core::Collector;
use prometheus::{IntCounterVec, IntGaugeVec, Opts};
use riffle_dataflow::observe::registry::Metrics;
use riffle_dataflow::{DataflowError, DataflowResult};

/// Every Kafka metric, shared by all sources and sinks of the process.
pub(crate) struct KafkaMetrics {
    pub records_in: IntCounterVec,
    pub bytes_in: IntCounterVec,
    pub consumer_lag: IntGaugeVec,
    pub records_out: IntCounterVec,
    pub bytes_out: IntCounterVec,
    pub produce_errors: IntCounterVec,
}

impl KafkaMetrics {
    fn create() -> prometheus::Result<Self> {
        let counter =
            |name: &str, help: &str| IntCounterVec::new(Opts::new(name, help), &["topic"]);
        Ok(KafkaMetrics {
            records_in: counter("kafka_records_in_total", "Messages read from Kafka")?,
            bytes_in: counter(
                "kafka_bytes_in_total",
                "Bytes (key and value) read from Kafka",
            )?,
            consumer_lag: IntGaugeVec::new(
                Opts::new(
                    "kafka_consumer_lag",
                    "Messages between a partition's high watermark and the next offset read",
                ),
                &["topic", "partition"],
            )?,
            records_out: counter(
                "kafka_records_out_total",
                "Messages delivered to Kafka (acknowledged)",
            )?,
            bytes_out: counter(
                "kafka_bytes_out_total",
                "Bytes (key and value) delivered to Kafka",
            )?,
            produce_errors: counter(
                "kafka_produce_errors_total",
                "Messages Kafka failed to deliver",
            )?,
        })
    }

    fn collectors(&self) -> Vec<Box<dyn Collector>> {
        vec![
            Box::new(self.records_in.clone()),
            Box::new(self.bytes_in.clone()),
            Box::new(self.consumer_lag.clone()),
            Box::new(self.records_out.clone()),
            Box::new(self.bytes_out.clone()),
            Box::new(self.produce_errors.clone()),
        ]
    }
}

/// The process-wide Kafka metrics.
pub(crate) fn kafka_metrics() -> DataflowResult<&'static KafkaMetrics> {
    static METRICS: OnceLock<Result<KafkaMetrics, String>> = OnceLock::new();
    METRICS
        .get_or_init(|| KafkaMetrics::create().map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| DataflowError::Config(format!("kafka metrics: {e}")))
}

/// Registers the Kafka metrics with the process's registry (from the factories'
/// `attach_metrics`): served on `/metrics` and listed in the end-of-run summary. Registering
/// again (a source and a sink, or two sources) is not an error.
pub(crate) fn attach(metrics: &Metrics) -> DataflowResult<()> {
    for collector in kafka_metrics()?.collectors() {
        metrics.register(collector)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attach_is_idempotent_and_names_are_prefixed() {
        let metrics = Metrics::new().unwrap();
        attach(&metrics).unwrap();
        attach(&metrics).unwrap();
        kafka_metrics()
            .unwrap()
            .records_in
            .with_label_values(&["metrics-test"])
            .inc_by(3);
        let text = metrics.render_prometheus().unwrap();
        assert!(
            text.contains("riffle_kafka_records_in_total{topic=\"metrics-test\"} 3"),
            "{text}"
        );
        let listed = metrics.summary(std::time::Duration::ZERO).connectors;
        assert!(
            listed.contains(&(
                "riffle_kafka_records_in_total{topic=metrics-test}".to_string(),
                3.0
            )),
            "{listed:?}"
        );
    }
}
