"""`group_by` with `{key, format: avro, schema_id: N}`: the repartition partition is Kafka's partitioner over the key
serialized in the registry's wire format, header included (checked against a real producer's partitioner)."""
from __future__ import annotations

import io
import struct
import uuid

import pytest
from typer.testing import CliRunner

from backfill.cli import app
from backfill.io.kafka import create_topic
from backfill.jobspec.load import load_job
from backfill.reference.engine import run_reference
from tests.conftest import read_jsonl, write_jsonl

pytestmark = [pytest.mark.kafka, pytest.mark.spark]
USERS = [f"user-{i}" for i in range(12)]


def _avro_string(schema_id: int, text: str) -> bytes:
    import fastavro

    out = io.BytesIO()
    fastavro.schemaless_writer(out, "string", text)
    return b"\x00" + struct.pack(">I", schema_id) + out.getvalue()


def _producer_partitions(bootstrap: str, keys: dict[str, bytes], partitions: int) -> dict[str, int]:
    """Where a Java-compatible producer (librdkafka's murmur2 partitioner) puts each key."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    topic = f"rk{uuid.uuid4().hex[:6]}"
    create_topic(bootstrap, topic, partitions)
    producer = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random", "log_level": 0})
    for name, key in keys.items():
        producer.produce(topic, key=key, value=name.encode())
    producer.flush(30)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": topic, "log_level": 0})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out: dict[str, int] = {}
    while len(out) < len(keys):
        msg = consumer.poll(10)
        assert msg is not None and msg.error() is None
        out[msg.value().decode()] = msg.partition()
    consumer.close()
    return out


def test_an_avro_group_by_key_lands_where_kafkas_partitioner_puts_its_wire_bytes(tmp_path, kafka_broker, spark):
    write_jsonl(tmp_path / "in.jsonl", [{"topic": "t", "partition": 0, "offset": i, "key": "k",
                                         "value": {"user": USERS[i % len(USERS)]}, "timestamp": 1000 * i}
                                        for i in range(48)])
    job = tmp_path / "job.yaml"
    job.write_text("""
name: rekey-avro
sources:
  s: {format: jsonl, path: in.jsonl, key: {format: string}, value: {format: json}}
operators:
  - name: per_user
    aggregate: {input: s, group_by: {key: value.user, format: avro, schema_id: 7, partitions: 3},
                window: {type: tumbling, size: 1h, grace: 0ms}, emit: updates, aggregations: {n: count()}}
sinks:
  per_user: {format: jsonl, path: out/per_user.jsonl}
  _ledger: {format: jsonl, path: out/ledger.jsonl}
""")
    plan = CliRunner().invoke(app, ["plan", str(job)])
    assert plan.exit_code == 0 and "assuming schema id 7" in plan.stdout.replace("\n", " ")
    ran = CliRunner().invoke(app, ["run", str(job), "--json"])
    assert ran.exit_code == 0, ran.stderr
    tasks = {r["key"]: r["task"] for r in read_jsonl(tmp_path / "out/per_user.jsonl")}
    expected = _producer_partitions(kafka_broker.bootstrap, {u: _avro_string(7, u) for u in USERS}, 3)
    assert tasks == expected and len(set(tasks.values())) > 1
    plain = _producer_partitions(kafka_broker.bootstrap, {u: u.encode() for u in USERS}, 3)
    assert plain != expected  # the header and the length prefix move keys: a string serde would be wrong
    ref = run_reference(load_job(job))
    assert {r["key"]: r["task"] for r in ref.outputs["per_user"]} == expected


def test_an_avro_group_by_needs_its_schema_id(tmp_path):
    write_jsonl(tmp_path / "in.jsonl", [])
    job = tmp_path / "job.yaml"
    job.write_text("""
name: rekey-avro
sources:
  s: {format: jsonl, path: in.jsonl, value: {format: json}}
operators:
  - name: c
    aggregate: {input: s, group_by: {key: value.user, format: avro}, window: {type: tumbling, size: 1h, grace: 0ms},
                aggregations: {n: count()}}
sinks:
  c: {format: none}
""")
    done = CliRunner().invoke(app, ["plan", str(job)])
    assert done.exit_code == 2 and "schema_id: format: avro hashes the registry's wire format" in done.stderr
