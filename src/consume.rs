//! `riffle consume`: read a results topic to its end, as a downstream reader of an exactly-once
//! run would (commit and fence markers applied), or raw.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message as _};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use riffle_connectors::kafka::committed::{Committed, Message};

use crate::cli::ConsumeArgs;

pub fn consume_command(args: ConsumeArgs) -> Result<()> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &args.brokers)
        .set("group.id", "riffle-consume")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        // Smaller fetches: a slow broker (tansu on sqlite serves ~1 ms per message) answers
        // each sooner.
        .set("max.partition.fetch.bytes", "262144")
        .create()
        .context("creating a Kafka consumer")?;
    let timeout = Duration::from_secs(10);
    let metadata = consumer
        .fetch_metadata(Some(&args.topic), timeout)
        .with_context(|| format!("reading topic `{}` on {}", args.topic, args.brokers))?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    if partitions.is_empty() {
        bail!(
            "topic `{}` has no partitions on {}",
            args.topic,
            args.brokers
        );
    }
    let mut ends = BTreeMap::new();
    let mut list = TopicPartitionList::new();
    for p in &partitions {
        let (_, high) = consumer.fetch_watermarks(&args.topic, *p, timeout)?;
        ends.insert(*p, high);
        list.add_partition_offset(&args.topic, *p, Offset::Beginning)?;
    }
    consumer.assign(&list)?;
    let mut next: BTreeMap<i32, i64> = partitions.iter().map(|p| (*p, 0)).collect();
    let mut view = Committed::default();
    let mut out = std::io::stdout().lock();
    let (mut read, mut shown) = (0u64, 0u64);
    let mut last_progress = Instant::now();
    while next.iter().any(|(p, n)| *n < ends[p]) {
        let Some(message) = consumer.poll(Duration::from_millis(200)) else {
            if last_progress.elapsed() > Duration::from_secs(120) {
                bail!(
                    "no progress for 120 s reading `{}`: at {next:?} of {ends:?}",
                    args.topic
                );
            }
            continue;
        };
        let message = match message {
            Ok(m) => m,
            // The broker says a partition ends here (its high watermark may be read differently
            // by list-offsets and fetch): take that as its end.
            Err(rdkafka::error::KafkaError::PartitionEOF(p)) => {
                if let Some(end) = ends.get(&p).copied() {
                    next.insert(p, end);
                }
                last_progress = Instant::now();
                continue;
            }
            Err(e) => {
                eprintln!("consume: {e}");
                continue;
            }
        };
        last_progress = Instant::now();
        next.insert(message.partition(), message.offset() + 1);
        read += 1;
        let kind = message.headers().map_or(Message::Plain, |h| {
            Message::from_headers(h.iter().map(|h| (h.key, h.value.unwrap_or_default())))
        });
        let payload = message.payload().unwrap_or_default().to_vec();
        let visible = if args.raw {
            match kind {
                Message::Commit { .. } | Message::Fence { .. } => Vec::new(),
                _ => vec![payload],
            }
        } else {
            view.push(message.partition(), kind, payload)
        };
        for value in visible {
            out.write_all(&value)?;
            out.write_all(b"\n")?;
            shown += 1;
        }
    }
    out.flush()?;
    eprintln!(
        "{shown} result(s) of {read} message(s){}",
        if args.raw {
            String::new()
        } else {
            format!("; {} uncommitted, held back", view.uncommitted())
        }
    );
    Ok(())
}
