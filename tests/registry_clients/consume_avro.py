#!/usr/bin/env python3
"""Reads a Kafka topic from the beginning to its end (isolation.level=read_committed) and
decodes each value with confluent-kafka's AvroDeserializer, which fetches the writer's schema
from the registry by the id in the message. Prints one JSON object a line, in partition and
offset order: {"partition", "offset", "key", "schema_id", "value"} (Avro bytes as base64,
decimals as strings, dates and times in ISO 8601).

  consume_avro.py --brokers B --topic T --registry URL [--reader-schema user.avsc]"""

from confluent_kafka.schema_registry.avro import AvroDeserializer

import common


def main():
    p = common.arguments(__doc__.splitlines()[0], produce=False)
    p.add_argument("--reader-schema", help="an .avsc to read with (default: the writer's schema)")
    args = p.parse_args()
    common.check(args, produce=False)
    reader = None
    if args.reader_schema:
        with open(args.reader_schema, encoding="utf-8") as f:
            reader = f.read()
    deserializer = AvroDeserializer(common.registry_client(args), reader)
    for row in common.read_to_end(args, deserializer):
        print(common.to_json(row))


if __name__ == "__main__":
    main()
