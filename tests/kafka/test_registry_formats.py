"""Topics in the schema registry's wire format, written by confluent-kafka's own serializers against a real
registry (Apicurio Registry) and a real broker: the same outputs as the JSON run, through the registry and
through an offline schema folder."""
from __future__ import annotations

import json
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from backfill.cli import app
from backfill.io.kafka import create_topic, produce
from backfill.io.registry import serializer_client
from tests.conftest import read_jsonl
from tests.formats.clicks import CLICK_V1, CLICK_V2, demo_job, demo_records, outputs, versioned, write_jsonl

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.slow]


def _run(job: Path) -> None:
    result = CliRunner().invoke(app, ["run", str(job), "--json"])
    assert result.exit_code == 0, result.stderr


def _strip(rows: dict[str, list[str]]) -> dict[str, list[str]]:
    return {n: sorted(json.dumps({k: v for k, v in json.loads(t).items() if k not in ("run_id", "detail")},
                                 sort_keys=True) for t in texts) for n, texts in rows.items()}


def _serialized(registry: Any, topic: str, values: list[tuple[Any, Any]], kind: str) -> list[bytes]:
    """Each (schema, value) through confluent-kafka's serializer of `kind` (it registers the schema)."""
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.schema_registry.json_schema import JSONSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    client, conf = serializer_client(registry.url)
    ctx = SerializationContext(topic, MessageField.VALUE)
    cache: dict[str, Any] = {}
    out = []
    for schema, value in values:
        text = json.dumps(schema)
        if text not in cache:
            cache[text] = (AvroSerializer(client, text, conf=conf) if kind == "avro"
                           else JSONSerializer(text, client, conf=conf))
        out.append(cache[text](value, ctx))
    return out


def test_demo_clicks_produced_as_avro_in_two_versions_give_the_json_runs_outputs(tmp_path, kafka_broker,
                                                                                 schema_registry, spark):
    topic = f"clicks{uuid.uuid4().hex[:6]}"
    records = [{**r, "topic": topic} for r in demo_records(3000)]
    values = _serialized(schema_registry, topic, [(CLICK_V1 if v == 1 else CLICK_V2, value)
                                                   for v, value in versioned(records)], "avro")
    ids = sorted({int.from_bytes(v[1:5], "big") for v in values})
    assert len(ids) == 2  # two writer versions in one topic
    create_topic(kafka_broker.bootstrap, topic, 2)
    produce(kafka_broker.bootstrap, topic, [{"partition": r["partition"], "key": r["key"], "value": v,
                                             "timestamp": r["timestamp"]} for r, v in zip(records, values)])
    write_jsonl(tmp_path / "json.jsonl", records)
    _run(demo_job(tmp_path / "json.yaml", {"format": "jsonl", "path": "json.jsonl"}, "out-json"))
    kafka = {"bootstrap": kafka_broker.bootstrap, "topic": topic}
    _run(demo_job(tmp_path / "reg.yaml", {"format": "kafka", "kafka": kafka, "value": {
        "format": "avro", "registry": {"url": schema_registry.url}}}, "out-reg"))
    # offline: the writer schemas saved by id (what `GET /schemas/ids/N` answers), no registry needed
    folder = tmp_path / "schemas"
    folder.mkdir()
    for i in ids:
        with urllib.request.urlopen(f"{schema_registry.url}/schemas/ids/{i}") as resp:
            (folder / f"{i}.avsc").write_text(json.loads(resp.read())["schema"])
    (tmp_path / "v2.avsc").write_text(json.dumps(CLICK_V2))
    _run(demo_job(tmp_path / "off.yaml", {"format": "kafka", "kafka": kafka, "value": {
        "format": "avro", "registry": {"schemas": "schemas"}, "reader_schema": "v2.avsc"}}, "out-off"))
    expected = _strip(outputs(tmp_path / "out-json"))
    assert expected["clicks_per_user_1m"] and expected["ledger"]
    assert _strip(outputs(tmp_path / "out-reg")) == expected
    assert _strip(outputs(tmp_path / "out-off")) == expected


def test_json_schema_values_through_the_registry(tmp_path, kafka_broker, schema_registry, spark):
    schema = {"type": "object", "properties": {"user": {"type": "string"}, "amount": {"type": "number"},
                                                "n": {"type": "integer"}}}
    topic = f"js{uuid.uuid4().hex[:6]}"
    rows = [{"user": "a", "amount": 1.5, "n": 1}, {"user": "a", "amount": 2, "n": 2}]
    values = _serialized(schema_registry, topic, [(schema, r) for r in rows], "json")
    values.append(values[0][:5] + b'{"user": "a", "n": "not a number"}')  # a payload of the wrong type
    create_topic(kafka_broker.bootstrap, topic, 1)
    produce(kafka_broker.bootstrap, topic, [{"partition": 0, "key": "a", "value": v, "timestamp": 1000 + i}
                                            for i, v in enumerate(values)])
    job = tmp_path / "js.yaml"
    job.write_text(f"""
name: js
sources:
  s: {{format: kafka, kafka: {{bootstrap: '{kafka_broker.bootstrap}', topic: {topic}}}, key: {{format: string}},
      value: {{format: json_schema, registry: {{url: '{schema_registry.url}'}}}}, on_error: skip}}
operators:
  - name: c
    aggregate: {{input: s, window: {{type: tumbling, size: 1h, grace: 0ms}}, emit: updates,
                aggregations: {{amount: sum(value.amount), n: sum(value.n)}}}}
sinks:
  c: {{format: jsonl, path: out/c.jsonl}}
  _ledger: {{format: jsonl, path: out/ledger.jsonl}}
""")
    _run(job)
    assert [(r["amount"], r["n"]) for r in read_jsonl(tmp_path / "out/c.jsonl")] == [(1.5, 1), (3.5, 3)]
    [bad] = read_jsonl(tmp_path / "out/ledger.jsonl")
    assert bad["offset"] == 2 and bad["detail"].startswith("unreadable value: the payload does not decode as json_schema")


def test_protobuf_values_through_the_registry(tmp_path, kafka_broker, schema_registry, spark):
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    proto = descriptor_pb2.FileDescriptorProto(name="click.proto", package="demo", syntax="proto3")
    msg = proto.message_type.add(name="Click")
    msg.field.add(name="user", number=1, type=9, label=1)
    msg.field.add(name="amount", number=2, type=1, label=1)
    msg.field.add(name="tags", number=3, type=9, label=3)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    click = message_factory.GetMessageClass(pool.FindMessageTypeByName("demo.Click"))
    topic = f"pb{uuid.uuid4().hex[:6]}"
    client, conf = serializer_client(schema_registry.url)
    serializer = ProtobufSerializer(click, client, {"use.deprecated.format": False, **conf})
    ctx = SerializationContext(topic, MessageField.VALUE)
    values = [serializer(click(user="a", amount=a, tags=["x"] * i), ctx) for i, a in enumerate((1.5, 2.0))]
    values.append(values[0][:6] + b"\xff\xff")  # a payload that does not decode
    create_topic(kafka_broker.bootstrap, topic, 1)
    produce(kafka_broker.bootstrap, topic, [{"partition": 0, "key": "a", "value": v, "timestamp": 1000 + i}
                                            for i, v in enumerate(values)])
    job = tmp_path / "pb.yaml"
    job.write_text(f"""
name: pb
sources:
  s: {{format: kafka, kafka: {{bootstrap: '{kafka_broker.bootstrap}', topic: {topic}}}, key: {{format: string}},
      value: {{format: protobuf, registry: {{url: '{schema_registry.url}'}}, message: demo.Click}}, on_error: skip}}
operators:
  - name: c
    aggregate: {{input: s, window: {{type: tumbling, size: 1h, grace: 0ms}}, emit: updates,
                aggregations: {{amount: sum(value.amount), tags: sum(size(value.tags))}}}}
sinks:
  c: {{format: jsonl, path: out/c.jsonl}}
  _ledger: {{format: jsonl, path: out/ledger.jsonl}}
""")
    _run(job)
    assert [(r["amount"], r["tags"]) for r in read_jsonl(tmp_path / "out/c.jsonl")] == [(1.5, 0), (3.5, 1)]
    [bad] = read_jsonl(tmp_path / "out/ledger.jsonl")
    assert bad["offset"] == 2 and bad["detail"].startswith("unreadable value: the payload does not decode as protobuf")
