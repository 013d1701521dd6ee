"""Shared parts of the registry client scripts: command-line options, the Schema Registry
client, Kafka settings, reading a topic to its end, and .proto files compiled at run time.

These scripts are the independent side of Riffle's schema-registry tests: they use only
confluent-kafka's own SchemaRegistryClient and Avro/Protobuf serializers (PyPI
confluent-kafka 2.16.1, installed by `scripts/registry.sh clients`)."""

import argparse
import base64
import datetime
import decimal
import json
import os
import sys
import tempfile
import time
import uuid

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.schema_registry import (
    SchemaRegistryClient,
    record_subject_name_strategy,
    topic_record_subject_name_strategy,
    topic_subject_name_strategy,
)

STRATEGIES = {
    "topic": topic_subject_name_strategy,
    "record": record_subject_name_strategy,
    "topic_record": topic_record_subject_name_strategy,
}


def arguments(description, produce):
    """The options every script takes; `produce` adds the producer's."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--brokers", required=True, help="bootstrap servers, host:port[,...]")
    p.add_argument("--topic", required=True)
    p.add_argument("--registry", default=os.environ.get("RIFFLE_REGISTRY_URL"),
                   help="schema registry URL (default $RIFFLE_REGISTRY_URL)")
    p.add_argument("--registry-user", help="basic auth user for the registry")
    p.add_argument("--registry-password", help="basic auth password for the registry")
    p.add_argument("--registry-ca", help="CA file to verify the registry's TLS certificate")
    p.add_argument("--kafka", action="append", default=[], metavar="KEY=VALUE",
                   help="extra librdkafka setting (repeatable), e.g. security.protocol=SASL_SSL")
    if produce:
        p.add_argument("--input", help="JSON lines file, one value a line")
        p.add_argument("--count", type=int, help="generate this many values from the schema")
        p.add_argument("--key-field", help="the key is this field's value (as a string); "
                       "default: the message's number 0, 1, ... as a string")
        p.add_argument("--subject-strategy", choices=sorted(STRATEGIES), default="topic")
        p.add_argument("--no-auto-register", action="store_true",
                       help="use the subject's latest registered schema instead of registering")
        p.add_argument("--transactional-id", help="produce inside one transaction, committed at the end")
    else:
        p.add_argument("--timeout", type=float, default=30.0,
                       help="seconds to wait for the end of every partition")
    return p


def check(args, produce):
    if not args.registry:
        sys.exit("--registry or RIFFLE_REGISTRY_URL is needed")
    if produce and (args.input is None) == (args.count is None):
        sys.exit("give exactly one of --input FILE and --count N")


def registry_client(args):
    conf = {"url": args.registry}
    if args.registry_user is not None:
        conf["basic.auth.user.info"] = f"{args.registry_user}:{args.registry_password or ''}"
    if args.registry_ca:
        conf["ssl.ca.location"] = args.registry_ca
    return SchemaRegistryClient(conf)


def kafka_conf(args, **base):
    conf = {"bootstrap.servers": args.brokers, **base}
    for item in args.kafka:
        key, sep, value = item.partition("=")
        if not sep:
            sys.exit(f"--kafka {item!r}: expected KEY=VALUE")
        conf[key] = value
    return conf


def read_values(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def key_of(value, number, key_field):
    if key_field is None:
        return str(number)
    if not isinstance(value, dict) or key_field not in value:
        sys.exit(f"--key-field {key_field!r}: value {number} has no such field")
    return str(value[key_field])


def deliver_all(producer, produced):
    """Flushes and fails unless every message was acknowledged."""
    remaining = producer.flush(60)
    if remaining:
        sys.exit(f"{remaining} messages were not delivered within 60 s")
    if produced["failed"]:
        sys.exit(f"delivery failed: {produced['failed'][0]}")


def on_delivery(produced):
    def report(err, _msg):
        if err is not None:
            produced["failed"].append(str(err))
        else:
            produced["ok"] += 1
    return report


def read_to_end(args, deserialize):
    """Every message of the topic, partition by partition in offset order, read from the
    beginning to each partition's end (read_committed: aborted and open transactions are not
    returned). `deserialize(value_bytes, ctx)` turns a value into a JSON-able object."""
    from confluent_kafka.serialization import MessageField, SerializationContext

    consumer = Consumer(kafka_conf(
        args,
        **{
            "group.id": f"riffle-registry-clients-{uuid.uuid4()}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
        },
    ))
    try:
        metadata = consumer.list_topics(args.topic, timeout=10)
        topic = metadata.topics.get(args.topic)
        if topic is None or topic.error is not None:
            sys.exit(f"topic {args.topic}: {topic.error if topic else 'missing'}")
        partitions = sorted(topic.partitions)
        consumer.assign([TopicPartition(args.topic, p, 0) for p in partitions])
        pending = set(partitions)
        rows = []
        deadline = time.monotonic() + args.timeout
        while pending:
            if time.monotonic() > deadline:
                sys.exit(f"partitions {sorted(pending)} did not reach their end within {args.timeout} s")
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    pending.discard(msg.partition())
                    continue
                raise KafkaException(msg.error())
            value = msg.value()
            ctx = SerializationContext(args.topic, MessageField.VALUE, msg.headers())
            rows.append({
                "partition": msg.partition(),
                "offset": msg.offset(),
                "key": msg.key().decode("utf-8", "replace") if msg.key() is not None else None,
                "schema_id": int.from_bytes(value[1:5], "big") if value and len(value) >= 5 and value[0] == 0 else None,
                "value": deserialize(value, ctx) if value is not None else None,
            })
        rows.sort(key=lambda r: (r["partition"], r["offset"]))
        return rows
    finally:
        consumer.close()


def to_json(value):
    """JSON for what Avro hands back: bytes as base64, decimals as strings, times as ISO 8601."""
    def default(o):
        if isinstance(o, (bytes, bytearray)):
            return base64.b64encode(bytes(o)).decode("ascii")
        if isinstance(o, decimal.Decimal):
            return str(o)
        if isinstance(o, (datetime.datetime, datetime.date, datetime.time)):
            return o.isoformat()
        if isinstance(o, uuid.UUID):
            return str(o)
        raise TypeError(f"{type(o).__name__} is not JSON serializable")
    return json.dumps(value, default=default, sort_keys=True)


def compile_proto(path):
    """The messages of a .proto file as a descriptor pool, compiled with protoc in-process
    (grpcio-tools): the protobuf runtime cannot read .proto text. Imports are looked up next to
    the file and among Google's well-known types."""
    import importlib.resources

    from google.protobuf import descriptor_pb2, descriptor_pool
    from grpc_tools import protoc

    path = os.path.abspath(path)
    include = str(importlib.resources.files("grpc_tools") / "_proto")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "set.pb")
        rc = protoc.main([
            "protoc", f"-I{os.path.dirname(path)}", f"-I{include}", "--include_imports",
            f"--descriptor_set_out={out}", os.path.basename(path),
        ])
        if rc != 0:
            sys.exit(f"protoc could not compile {path} (exit {rc})")
        with open(out, "rb") as f:
            files = descriptor_pb2.FileDescriptorSet.FromString(f.read())
    pool = descriptor_pool.DescriptorPool()
    for file in files.file:
        pool.Add(file)
    # --include_imports lists dependencies first: the file itself comes last.
    return pool, files.file[-1]


def message_class(proto_path, message_name=None):
    """The message class `message_name` (full name, e.g. riffle.test.User) of a .proto file,
    by default its first message."""
    from google.protobuf import message_factory

    pool, file = compile_proto(proto_path)
    if message_name is None:
        if not file.message_type:
            sys.exit(f"{proto_path} defines no message")
        first = file.message_type[0].name
        message_name = f"{file.package}.{first}" if file.package else first
    try:
        descriptor = pool.FindMessageTypeByName(message_name)
    except KeyError:
        sys.exit(f"{proto_path} has no message {message_name!r}")
    return message_factory.GetMessageClass(descriptor)
