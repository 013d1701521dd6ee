#!/usr/bin/env python3
"""Reads a Kafka topic from the beginning to its end (isolation.level=read_committed) and
decodes each value with confluent-kafka's ProtobufDeserializer into the message class built
from a .proto file (the deserializer also fetches the writer's schema from the registry by the
id in the message, and checks the message indexes against it). Prints one JSON object a line,
in partition and offset order: {"partition", "offset", "key", "schema_id", "value"}, the value
in Protobuf's JSON mapping with the .proto field names, default values included.

  consume_protobuf.py --brokers B --topic T --registry URL --proto user.proto [--message M]"""

from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer
from google.protobuf import json_format

import common


def main():
    p = common.arguments(__doc__.splitlines()[0], produce=False)
    p.add_argument("--proto", required=True, help="the .proto file")
    p.add_argument("--message", help="full name of the message (default: the file's first)")
    args = p.parse_args()
    common.check(args, produce=False)
    cls = common.message_class(args.proto, args.message)
    deserializer = ProtobufDeserializer(cls, {}, common.registry_client(args))

    def decode(value, ctx):
        msg = deserializer(value, ctx)
        return json_format.MessageToDict(msg, preserving_proto_field_name=True,
                                         always_print_fields_with_no_presence=True)

    for row in common.read_to_end(args, decode):
        print(common.to_json(row))


if __name__ == "__main__":
    main()
