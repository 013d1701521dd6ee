#!/usr/bin/env python3
"""Produces Avro values to a Kafka topic with confluent-kafka's SerializingProducer and
AvroSerializer (schema registered under the subject, Confluent's framing: magic byte 0, 4-byte
schema id, Avro binary). Keys are plain UTF-8 strings. Prints how many were delivered.
Values in --input are JSON objects as fastavro takes them, bytes and fixed as base64 strings.

  produce_avro.py --brokers B --topic T --registry URL --schema user.avsc --input values.jsonl
  produce_avro.py ... --schema user.avsc --count 100 --schema-after 50 user_v2.avsc

--schema-after N FILE: the first N values are written with --schema, the rest with FILE, by the
same producer (no restart), as an application that upgrades its schema mid-stream does."""

import base64
import json
import sys
import uuid
import decimal

from confluent_kafka import SerializingProducer
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import StringSerializer

import common


def generate(schema, i, named=None):
    """A value of Avro schema `schema` (parsed JSON) for message number i."""
    named = {} if named is None else named
    if isinstance(schema, str):
        if schema in named:
            return generate(named[schema], i, named)
        schema = {"type": schema}
    if isinstance(schema, list):
        branches = [b for b in schema if b != "null"] or ["null"]
        return generate(branches[0], i, named)
    kind = schema["type"]
    if isinstance(kind, (list, dict)):
        return generate(kind, i, named)
    if "name" in schema and kind in ("record", "enum", "fixed"):
        named[schema["name"]] = schema
        if schema.get("namespace"):
            named[f"{schema['namespace']}.{schema['name']}"] = schema
    logical = schema.get("logicalType")
    if logical == "decimal":
        return decimal.Decimal(i).scaleb(-schema.get("scale", 0))
    if logical == "uuid":
        return str(uuid.UUID(int=i))
    if kind == "null":
        return None
    if kind == "boolean":
        return i % 2 == 0
    if kind in ("int", "long"):
        return i
    if kind in ("float", "double"):
        return i + 0.5
    if kind == "string":
        return f"v{i}"
    if kind == "bytes":
        return str(i).encode()
    if kind == "fixed":
        return i.to_bytes(schema["size"], "big", signed=False) if i < 256 ** schema["size"] else bytes(schema["size"])
    if kind == "enum":
        return schema["symbols"][i % len(schema["symbols"])]
    if kind == "array":
        return [generate(schema["items"], i, named)]
    if kind == "map":
        return {"k": generate(schema["values"], i, named)}
    if kind == "record":
        return {f["name"]: generate(f["type"], i, named) for f in schema["fields"]}
    sys.exit(f"cannot generate a value of Avro type {kind!r}")


def from_json(schema, value, named=None):
    """`value` read from JSON made fit for Avro schema `schema`: bytes and fixed are given as
    base64 strings (what consume_avro.py prints); everything else is taken as it is."""
    named = {} if named is None else named
    if isinstance(schema, str):
        return from_json(named.get(schema, {"type": schema}), value, named)
    if isinstance(schema, list):
        if value is None:
            return None
        branches = [b for b in schema if b != "null"]
        if isinstance(value, str) and "string" in branches:
            return value
        return from_json(branches[0], value, named) if len(branches) == 1 else value
    kind = schema["type"]
    if isinstance(kind, (list, dict)):
        return from_json(kind, value, named)
    if "name" in schema and kind in ("record", "enum", "fixed"):
        named[schema["name"]] = schema
        if schema.get("namespace"):
            named[f"{schema['namespace']}.{schema['name']}"] = schema
    if kind in ("bytes", "fixed") and isinstance(value, str) and schema.get("logicalType") != "decimal":
        return base64.b64decode(value)
    if kind == "record" and isinstance(value, dict):
        fields = {f["name"]: f["type"] for f in schema["fields"]}
        return {k: from_json(fields[k], v, named) if k in fields else v for k, v in value.items()}
    if kind == "array" and isinstance(value, list):
        return [from_json(schema["items"], v, named) for v in value]
    if kind == "map" and isinstance(value, dict):
        return {k: from_json(schema["values"], v, named) for k, v in value.items()}
    return value


def main():
    p = common.arguments(__doc__.splitlines()[0], produce=True)
    p.add_argument("--schema", required=True, help="the .avsc file")
    p.add_argument("--schema-after", nargs=2, metavar=("N", "FILE"),
                   help="switch to the schema in FILE after N messages")
    args = p.parse_args()
    common.check(args, produce=True)

    registry = common.registry_client(args)
    serializer_conf = {"subject.name.strategy": common.STRATEGIES[args.subject_strategy]}
    if args.no_auto_register:
        serializer_conf.update({"auto.register.schemas": False, "use.latest.version": True})

    def serializer(path):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        return AvroSerializer(registry, text, conf=serializer_conf), json.loads(text)

    schemas = [serializer(args.schema)]
    switch_at = None
    if args.schema_after:
        switch_at = int(args.schema_after[0])
        schemas.append(serializer(args.schema_after[1]))

    class Current:
        """The value serializer the producer calls: the first schema's, then the second's."""
        index = 0

        def __call__(self, value, ctx):
            return schemas[self.index][0](value, ctx)

    current = Current()
    conf = common.kafka_conf(args, **{
        "key.serializer": StringSerializer("utf_8"),
        "value.serializer": current,
        "enable.idempotence": True,
    })
    if args.transactional_id:
        conf["transactional.id"] = args.transactional_id
    producer = SerializingProducer(conf)
    if args.transactional_id:
        producer.init_transactions()
        producer.begin_transaction()
    produced = {"ok": 0, "failed": []}
    values = common.read_values(args.input) if args.input is not None else None
    total = len(values) if values is not None else args.count
    for i in range(total):
        if switch_at is not None and i == switch_at:
            current.index = 1
        schema = schemas[current.index][1]
        value = from_json(schema, values[i]) if values is not None else generate(schema, i)
        producer.produce(args.topic, key=common.key_of(value, i, args.key_field), value=value,
                         on_delivery=common.on_delivery(produced))
        producer.poll(0)
    if args.transactional_id:
        producer.commit_transaction(60)
    common.deliver_all(producer, produced)
    print(produced["ok"])


if __name__ == "__main__":
    main()
