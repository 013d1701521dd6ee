"""Reads a whole topic as a standard Kafka consumer (kafka-python, not librdkafka) with
isolation.level=read_committed and prints each message's value on one line.

    read_committed.py BROKERS TOPIC

Exits 2 when a message has an empty value (a marker record a standard consumer would choke on).
"""
import sys

from kafka import KafkaConsumer, TopicPartition

brokers, topic = sys.argv[1], sys.argv[2]
consumer = KafkaConsumer(
    bootstrap_servers=brokers.split(","),
    isolation_level="read_committed",
    enable_auto_commit=False,
    group_id=None,
)
partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or [])]
if not partitions:
    sys.exit(f"topic {topic} not found")
consumer.assign(partitions)
consumer.seek_to_beginning(*partitions)
# Under read_committed, the end offsets are the last stable offsets.
end = consumer.end_offsets(partitions)
empty = 0
while any(consumer.position(tp) < end[tp] for tp in partitions):
    for records in consumer.poll(timeout_ms=1000).values():
        for record in records:
            if not record.value:
                empty += 1
                continue
            sys.stdout.write(record.value.decode() + "\n")
consumer.close()
if empty:
    sys.exit(2)
