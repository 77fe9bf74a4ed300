"""Protobuf and JSON Schema values, and Avro keys, from files with an offline schema folder: both engines."""
from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from typer.testing import CliRunner

from backfill.cli import app
from backfill.jobspec.load import load_job
from backfill.reference.engine import run_reference
from tests.conftest import read_jsonl
from tests.formats.clicks import avro_bytes

pytestmark = [pytest.mark.spark]


def _jsonl(path: Path, keys: list[bytes | str], values: list[bytes]) -> None:
    import base64

    rows = []
    for i, (k, v) in enumerate(zip(keys, values)):
        row = {"topic": "t", "partition": 0, "offset": i, "timestamp": 1000 * i,
               "value_b64": base64.b64encode(v).decode()}
        row.update({"key_b64": base64.b64encode(k).decode()} if isinstance(k, bytes) else {"key": k})
        rows.append(json.dumps(row) + "\n")
    path.write_text("".join(rows))


def _job(tmp_path: Path, key: str, value: str, aggs: str) -> Path:
    job = tmp_path / "job.yaml"
    job.write_text(f"""
name: wire
sources:
  s: {{format: jsonl, path: in.jsonl, key: {key}, value: {value}, on_error: skip}}
operators:
  - name: c
    aggregate: {{input: s, window: {{type: tumbling, size: 1h, grace: 0ms}}, emit: updates, aggregations: {aggs}}}
sinks:
  c: {{format: jsonl, path: out/c.jsonl}}
  _ledger: {{format: jsonl, path: out/ledger.jsonl}}
""")
    return job


def _both(job: Path) -> tuple[list[dict], list[dict], list[dict], list[dict]]:
    result = CliRunner().invoke(app, ["run", str(job), "--json"])
    assert result.exit_code == 0, result.stderr
    ref = run_reference(load_job(job))
    return (read_jsonl(job.parent / "out/c.jsonl"), read_jsonl(job.parent / "out/ledger.jsonl"), ref.outputs["c"],
            ref.ledger)


def _header(schema_id: int) -> bytes:
    return b"\x00" + struct.pack(">I", schema_id)


def test_protobuf_values_from_a_descriptor_set_and_avro_record_keys(tmp_path, spark):
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    proto = descriptor_pb2.FileDescriptorProto(name="click.proto", package="demo", syntax="proto3")
    msg = proto.message_type.add(name="Click")
    msg.field.add(name="page", number=1, type=9, label=1)
    msg.field.add(name="amount", number=2, type=1, label=1, proto3_optional=True, oneof_index=0)
    msg.oneof_decl.add(name="_amount")
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "7.desc").write_bytes(descriptor_pb2.FileDescriptorSet(file=[proto]).SerializeToString())
    key_schema = {"type": "record", "name": "K", "fields": [{"name": "user", "type": "string"},
                                                              {"name": "region", "type": ["null", "string"]}]}
    (tmp_path / "schemas" / "3.avsc").write_text(json.dumps(key_schema))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    click = message_factory.GetMessageClass(pool.FindMessageTypeByName("demo.Click"))
    values = [_header(7) + b"\x00" + click(page="/a", amount=2.5).SerializeToString(),
              _header(7) + b"\x00" + click(page="/b").SerializeToString(),  # amount unset: null
              _header(7) + b"\x00" + b"\x0a\x05/c",  # a truncated field: does not decode
              _header(8) + b"\x00"]  # an unknown schema id
    keys = [_header(3) + avro_bytes(key_schema, {"user": "u", "region": None}, None)[0:] for _ in range(2)]
    keys += [keys[0], keys[0]]
    _jsonl(tmp_path / "in.jsonl", keys, values)
    job = _job(tmp_path, "{format: avro, registry: {schemas: schemas}}",
               "{format: protobuf, registry: {schemas: schemas}, message: demo.Click}",
               "{pages: {fold: {init: \"''\", step: \"concat(acc, value.page)\"}}, amount: sum(value.amount), "
               "n: count(value.amount)}")
    rows, ledger, ref_rows, ref_ledger = _both(job)
    assert [(r["key"], r["pages"], r["amount"], r["n"]) for r in rows] == [
        ('{"user":"u"}', "/a", 2.5, 1), ('{"user":"u"}', "/a/b", 2.5, 1)]
    assert [(r["key"], r["pages"], r["amount"], r["n"]) for r in ref_rows] == [
        (r["key"], r["pages"], r["amount"], r["n"]) for r in rows]
    causes = {2: "unreadable value: the payload does not decode as protobuf with schema id 7",
              3: "unreadable value: schema id 8 is not in the registry (schemas)"}
    assert {r["offset"]: r["detail"] for r in ledger} == causes
    assert {r["offset"]: r["detail"] for r in ref_ledger} == causes


def test_json_schema_values_and_string_avro_keys_from_files(tmp_path, spark):
    schema = {"type": "object", "properties": {"page": {"type": "string"}, "amount": {"type": ["number", "null"]}}}
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "1.json").write_text(json.dumps(schema))
    (tmp_path / "schemas" / "2.avsc").write_text(json.dumps("string"))
    values = [_header(1) + json.dumps(v).encode() for v in (
        {"page": "/a", "amount": 1}, {"page": "/b", "amount": None}, {"page": "/c", "amount": "x"})]
    values.append(b"\x05" + values[0][1:])  # a wrong magic byte
    keys = [_header(2) + avro_bytes("string", "u1", None)] * 4  # type: ignore[arg-type]
    _jsonl(tmp_path / "in.jsonl", keys, values)
    job = _job(tmp_path, "{format: avro, registry: {schemas: schemas}}",
               "{format: json_schema, registry: {schemas: schemas}}",
               "{pages: {fold: {init: \"''\", step: \"concat(acc, value.page)\"}}, amount: sum(value.amount)}")
    rows, ledger, ref_rows, ref_ledger = _both(job)
    assert [(r["key"], r["pages"], r["amount"]) for r in rows] == [("u1", "/a", 1.0), ("u1", "/a/b", 1.0)]
    assert [(r["key"], r["pages"], r["amount"]) for r in ref_rows] == [("u1", "/a", 1.0), ("u1", "/a/b", 1.0)]
    assert {r["offset"]: r["detail"][:60] for r in ledger} == {r["offset"]: r["detail"][:60] for r in ref_ledger}
    assert sorted(r["offset"] for r in ledger) == [2, 3]
