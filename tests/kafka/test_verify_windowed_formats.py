"""`verify --against OP=kafka://...` on output topics of time and session windows, with Avro inner keys and Avro
values in the registry's wire format (schemas from an offline folder)."""
from __future__ import annotations

import json
import struct
import uuid

import pytest
from typer.testing import CliRunner

from backfill.cli import app
from backfill.io.kafka import create_topic, produce
from tests.conftest import read_jsonl, write_jsonl
from tests.formats.clicks import avro_bytes

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.slow]
KEY_ID, VALUE_ID = 11, 12
BASE = 1_700_000_040_000  # a minute boundary
VALUE = {"type": "record", "name": "Agg", "fields": [{"name": "n", "type": "long"},
                                                     {"name": "amount", "type": ["null", "double"]}]}


def _header(i: int) -> bytes:
    return b"\x00" + struct.pack(">I", i)


def test_time_and_session_windowed_output_topics_with_avro_keys_and_values_match(tmp_path, kafka_broker, spark):
    write_jsonl(tmp_path / "in.jsonl", [{"topic": "t", "partition": 0, "offset": i, "key": f"u{i % 3}",
                                         "value": {"amount": float(i)}, "timestamp": BASE + 10_000 * i} for i in range(40)])
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / f"{KEY_ID}.avsc").write_text(json.dumps("string"))
    (tmp_path / "schemas" / f"{VALUE_ID}.avsc").write_text(json.dumps(VALUE))
    fmt = "{format: avro, registry: {schemas: schemas}}"
    job = tmp_path / "job.yaml"
    job.write_text(f"""
name: wverify
sources:
  s: {{format: jsonl, path: in.jsonl, key: {{format: string}}, value: {{format: json}}}}
operators:
  - name: tw
    aggregate: {{input: s, window: {{type: tumbling, size: 1m, grace: 0ms}}, emit: final,
                aggregations: {{n: count(), amount: sum(value.amount)}}}}
  - name: sw
    aggregate: {{input: s, window: {{type: session, gap: 25s, grace: 0ms}}, emit: final,
                aggregations: {{n: count(), amount: sum(value.amount)}}}}
sinks:
  tw: {{format: jsonl, path: out/tw.jsonl}}
  sw: {{format: jsonl, path: out/sw.jsonl}}
  _ledger: {{format: jsonl, path: out/ledger.jsonl}}
verify:
  tw: {{key: {fmt}, value: {fmt}}}
  sw: {{key: {fmt}, value: {fmt}}}
""")
    result = CliRunner().invoke(app, ["run", str(job), "--json"])
    assert result.exit_code == 0, result.stderr
    topics = {}
    for op, session in (("tw", False), ("sw", True)):
        rows = read_jsonl(tmp_path / f"out/{op}.jsonl")
        assert rows
        topic = topics[op] = f"{op}{uuid.uuid4().hex[:6]}"
        create_topic(kafka_broker.bootstrap, topic, 1)
        records = []
        for r in rows:
            inner = _header(KEY_ID) + avro_bytes("string", r["key"], None)  # type: ignore[arg-type]
            window = struct.pack(">qq", r["window_end"], r["window_start"]) if session else \
                struct.pack(">q", r["window_start"])
            records.append({"partition": 0, "key": inner + window, "timestamp": r["ts"],
                            "value": _header(VALUE_ID) + avro_bytes(VALUE, {"n": r["n"], "amount": r["amount"]}, None)})
        produce(kafka_broker.bootstrap, topic, records)
    for op, topic in topics.items():
        done = CliRunner().invoke(app, ["verify", str(job), "--against", f"{op}=kafka://{kafka_broker.bootstrap}/{topic}",
                                        "--json", "--report", str(tmp_path / f"report-{op}")])
        assert done.exit_code == 0, done.stderr
        report = json.loads(done.stdout)
        section = report["operators"][op] if "operators" in report else report
        assert report["verdict"] == "match", section
    # a value in another format than declared: one line, exit 2
    bad = f"bad{uuid.uuid4().hex[:6]}"
    create_topic(kafka_broker.bootstrap, bad, 1)
    produce(kafka_broker.bootstrap, bad, [{"partition": 0, "key": _header(KEY_ID) + b"\x04u0" + struct.pack(">q", 0),
                                           "value": b'{"n": 1}', "timestamp": 1}])
    done = CliRunner().invoke(app, ["verify", str(job), "--against", f"tw=kafka://{kafka_broker.bootstrap}/{bad}",
                                    "--json"])
    assert done.exit_code == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "offset 0 is unreadable (unreadable value: no schema registry header" in done.stderr
