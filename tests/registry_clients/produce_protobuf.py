#!/usr/bin/env python3
"""Produces Protobuf values to a Kafka topic with confluent-kafka's SerializingProducer and
ProtobufSerializer (schema registered under the subject, Confluent's framing: magic byte 0,
4-byte schema id, message indexes, Protobuf binary). The message class is built from a .proto
file at run time (protoc from grpcio-tools). Keys are plain UTF-8 strings. Prints how many were
delivered.

  produce_protobuf.py --brokers B --topic T --registry URL --proto user.proto --input values.jsonl
  produce_protobuf.py ... --proto user.proto --message riffle.test.User --count 100 \\
      --schema-after 50 user_v2.proto

Values in --input are the messages in Protobuf's JSON mapping (json_format). --message names
the message (full name; default: the file's first). --schema-after N FILE [--message-after M]:
the values after the first N use FILE's message, by the same producer (no restart)."""

from confluent_kafka import SerializingProducer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import StringSerializer
from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor

import common


def generate(cls, i, depth=0):
    """A message of class `cls` with every field set from message number i (the first field
    of each oneof only; nested messages to depth 3)."""
    msg = cls()
    fill(msg, i, depth)
    return msg


def fill(msg, i, depth):
    seen_oneofs = set()
    for field in msg.DESCRIPTOR.fields:
        oneof = field.containing_oneof
        if oneof is not None:
            if oneof.name in seen_oneofs:
                continue
            seen_oneofs.add(oneof.name)
        repeated = field.is_repeated
        if field.cpp_type == FieldDescriptor.CPPTYPE_MESSAGE:
            if depth >= 3:
                continue
            if field.message_type.GetOptions().map_entry:
                key_field = field.message_type.fields_by_name["key"]
                value_field = field.message_type.fields_by_name["value"]
                target = getattr(msg, field.name)
                key = scalar(key_field, i)
                if value_field.cpp_type == FieldDescriptor.CPPTYPE_MESSAGE:
                    fill(target[key], i, depth + 1)
                else:
                    target[key] = scalar(value_field, i)
            elif repeated:
                fill(getattr(msg, field.name).add(), i, depth + 1)
            else:
                fill(getattr(msg, field.name), i, depth + 1)
        elif repeated:
            getattr(msg, field.name).append(scalar(field, i))
        else:
            setattr(msg, field.name, scalar(field, i))


def scalar(field, i):
    t = field.cpp_type
    if t in (FieldDescriptor.CPPTYPE_INT32, FieldDescriptor.CPPTYPE_INT64,
             FieldDescriptor.CPPTYPE_UINT32, FieldDescriptor.CPPTYPE_UINT64):
        return i
    if t in (FieldDescriptor.CPPTYPE_FLOAT, FieldDescriptor.CPPTYPE_DOUBLE):
        return i + 0.5
    if t == FieldDescriptor.CPPTYPE_BOOL:
        return i % 2 == 0
    if t == FieldDescriptor.CPPTYPE_ENUM:
        values = field.enum_type.values
        return values[i % len(values)].number
    if t == FieldDescriptor.CPPTYPE_STRING:
        return str(i).encode() if field.type == FieldDescriptor.TYPE_BYTES else f"v{i}"
    raise SystemExit(f"cannot generate field {field.full_name}")


def main():
    p = common.arguments(__doc__.splitlines()[0], produce=True)
    p.add_argument("--proto", required=True, help="the .proto file")
    p.add_argument("--message", help="full name of the message (default: the file's first)")
    p.add_argument("--schema-after", nargs=2, metavar=("N", "FILE"),
                   help="switch to the message in .proto FILE after N messages")
    p.add_argument("--message-after", help="the message of --schema-after's file (default: its first)")
    args = p.parse_args()
    common.check(args, produce=True)

    registry = common.registry_client(args)
    serializer_conf = {"subject.name.strategy": common.STRATEGIES[args.subject_strategy]}
    if args.no_auto_register:
        serializer_conf.update({"auto.register.schemas": False, "use.latest.version": True})

    def serializer(path, message):
        cls = common.message_class(path, message)
        return ProtobufSerializer(cls, registry, serializer_conf), cls

    schemas = [serializer(args.proto, args.message)]
    switch_at = None
    if args.schema_after:
        switch_at = int(args.schema_after[0])
        schemas.append(serializer(args.schema_after[1], args.message_after))

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
        cls = schemas[current.index][1]
        if values is not None:
            raw = values[i]
            msg = json_format.ParseDict(raw, cls())
        else:
            msg = generate(cls, i)
            raw = json_format.MessageToDict(msg, preserving_proto_field_name=True)
        producer.produce(args.topic, key=common.key_of(raw, i, args.key_field), value=msg,
                         on_delivery=common.on_delivery(produced))
        producer.poll(0)
    if args.transactional_id:
        producer.commit_transaction(60)
    common.deliver_all(producer, produced)
    print(produced["ok"])


if __name__ == "__main__":
    main()
