"""Avro values in the schema registry's wire format (and plain Avro) from files: the same outputs as JSON."""
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
from tests.formats.clicks import (CLICK_V1, CLICK_V2, avro_bytes, demo_job, demo_records, outputs, schema_folder,
                                  versioned, write_jsonl)

pytestmark = [pytest.mark.spark]


def _run(job: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["run", str(job), "--json", *args])
    return result.exit_code, result.stderr


def _strip(rows: dict[str, list[str]]) -> dict[str, list[str]]:
    out = {}
    for name, texts in rows.items():
        docs = [json.loads(t) for t in texts]
        for d in docs:
            d.pop("run_id", None)
        out[name] = sorted(json.dumps(d, sort_keys=True) for d in docs)
    return out


@pytest.mark.slow
def test_demo_clicks_as_two_avro_versions_give_the_json_runs_outputs(tmp_path, spark):
    records = demo_records(3000)
    write_jsonl(tmp_path / "json.jsonl", records)
    values = [avro_bytes(CLICK_V1 if v == 1 else CLICK_V2, value, v) for v, value in versioned(records)]
    write_jsonl(tmp_path / "avro.jsonl", records, values)
    schema_folder(tmp_path / "schemas", {1: CLICK_V1, 2: CLICK_V2})
    as_json = demo_job(tmp_path / "json.yaml", {"format": "jsonl", "path": "json.jsonl"}, "out-json")
    as_avro = demo_job(tmp_path / "avro.yaml", {"format": "jsonl", "path": "avro.jsonl", "value": {
        "format": "avro", "registry": {"schemas": "schemas"}}}, "out-avro")
    for job in (as_json, as_avro):
        code, err = _run(job)
        assert code == 0, err
    expected = _strip(outputs(tmp_path / "out-json"))
    assert expected["clicks_per_user_1m"] and expected["ledger"]  # windows and drops (late, null keys) alike
    assert _strip(outputs(tmp_path / "out-avro")) == expected
    # the reference engine decodes the same records with its own code (fastavro) to the same rows
    ref_json, ref_avro = (run_reference(load_job(j)) for j in (as_json, as_avro))
    for op in ref_json.outputs:
        assert ref_avro.outputs[op] == ref_json.outputs[op]
    assert ref_avro.ledger == ref_json.ledger


def _one_per_case(tmp_path: Path) -> tuple[Path, list[dict]]:
    """Four good records (v1, v2, a reader schema) and one of each unreadable case, offsets 0-7."""
    good = [avro_bytes(CLICK_V1, {"user": "u", "page": "/a", "amount": 1.0, "ts": 1}, 1),
            avro_bytes(CLICK_V2, {"user": "u", "page": "/b", "amount": None, "ts": 2, "device": "app"}, 2)]
    bad = [b"\x01" + good[0][1:],                      # a wrong magic byte
           b"\x00\x00",                                 # too short for a header
           b"\x00" + struct.pack(">I", 9) + good[0][5:],  # an unknown schema id
           good[0][:5] + b"\xff"]                       # a payload that does not decode
    values = [*good, *bad, good[0], good[1]]
    records = [{"topic": "clicks", "partition": 0, "offset": i, "key": "u", "timestamp": 1000 * i}
               for i in range(len(values))]
    return write_jsonl(tmp_path / "in.jsonl", [{**r, "value": None} for r in records], values), records


def _job(tmp_path: Path, value: str, on_error: str = "skip") -> Path:
    job = tmp_path / f"j-{on_error}.yaml"
    job.write_text(f"""
name: avro-cases
sources:
  clicks: {{format: jsonl, path: in.jsonl, key: {{format: string}}, value: {value}, on_error: {on_error}}}
operators:
  - name: c
    aggregate: {{input: clicks, window: {{type: tumbling, size: 1h, grace: 0ms}}, emit: updates,
                aggregations: {{n: count(), pages: {{fold: {{init: "''", step: "concat(acc, value.page)"}}}},
                               devices: "max(value.device)"}}}}
sinks:
  c: {{format: jsonl, path: out-{on_error}/c.jsonl}}
  _ledger: {{format: jsonl, path: out-{on_error}/ledger.jsonl}}
""")
    return job


CAUSES = {2: "unreadable value: no schema registry header (magic byte 0x01",
          3: "unreadable value: no schema registry header (magic byte 0x00",
          4: "unreadable value: schema id 9 is not in the registry",
          5: "unreadable value: the payload does not decode as avro with schema id 1"}


def test_unreadable_avro_records_are_ledgered_with_their_cause_by_both_engines(tmp_path, spark):
    _one_per_case(tmp_path)
    schema_folder(tmp_path / "schemas", {1: CLICK_V1, 2: CLICK_V2})
    (tmp_path / "reader.avsc").write_text(json.dumps(CLICK_V2))
    job = _job(tmp_path, "{format: avro, registry: {schemas: schemas}, reader_schema: reader.avsc}")
    code, err = _run(job)
    assert code == 0, err
    ledger = {r["offset"]: r for r in read_jsonl(tmp_path / "out-skip/ledger.jsonl")}
    assert sorted(ledger) == sorted(CAUSES)
    for offset, cause in CAUSES.items():
        assert ledger[offset]["reason"] == "unreadable" and ledger[offset]["detail"].startswith(cause)
    last = read_jsonl(tmp_path / "out-skip/c.jsonl")[-1]
    # v1 records read as v2 take the default `web`; v2's own `app` is kept
    assert (last["n"], last["pages"], last["devices"]) == (4, "/a/b/a/b", "web")
    ref = run_reference(load_job(job))
    assert {r["offset"]: r["detail"][:len(CAUSES[r["offset"]])] for r in ref.ledger} == CAUSES
    assert [(r["n"], r["pages"]) for r in ref.outputs["c"]][-1] == (4, "/a/b/a/b")


def test_an_unreadable_avro_record_under_on_error_fail_stops_naming_its_place(tmp_path, spark):
    path, _ = _one_per_case(tmp_path)
    before = path.read_bytes()
    schema_folder(tmp_path / "schemas", {1: CLICK_V1, 2: CLICK_V2})
    code, err = _run(_job(tmp_path, "{format: avro, registry: {schemas: schemas}}", "fail"))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "clicks/0@2" in err and "magic byte 0x01" in err
    assert path.read_bytes() == before and not list((tmp_path / "out-fail").glob("*.jsonl"))  # nothing published


def test_plain_avro_without_a_header_reads_with_schema_file(tmp_path, spark):
    values = [avro_bytes(CLICK_V1, {"user": "u", "page": p, "amount": None, "ts": i}, None)
              for i, p in enumerate(["/x", "/y"])] + [b"\xff"]
    write_jsonl(tmp_path / "in.jsonl", [{"topic": "clicks", "partition": 0, "offset": i, "key": "u", "timestamp": i,
                                         "value": None} for i in range(3)], values)
    (tmp_path / "click.avsc").write_text(json.dumps(CLICK_V1))
    (tmp_path / "reader.avsc").write_text(json.dumps(CLICK_V2))
    job = _job(tmp_path, "{format: avro, schema: click.avsc, reader_schema: reader.avsc}")
    code, err = _run(job)
    assert code == 0, err
    assert [(r["pages"], r["devices"]) for r in read_jsonl(tmp_path / "out-skip/c.jsonl")] == [("/x", "web"),
                                                                                              ("/x/y", "web")]
    [bad] = read_jsonl(tmp_path / "out-skip/ledger.jsonl")
    assert bad["detail"] == "unreadable value: the payload does not decode as the Avro schema click.avsc"
    ref = run_reference(load_job(job))
    assert [r["pages"] for r in ref.outputs["c"]] == ["/x", "/x/y"] and ref.ledger[0]["detail"] == bad["detail"]


def test_an_unreachable_registry_is_one_line_exit_2(tmp_path):
    from backfill.io.broker import free_port

    path, _ = _one_per_case(tmp_path)
    before = path.read_bytes()
    code, err = _run(_job(tmp_path, f"{{format: avro, registry: {{url: 'http://127.0.0.1:{free_port()}'}}}}"))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "sources.clicks.value.registry.url: no schema registry answered at http://127.0.0.1:" in err
    assert path.read_bytes() == before


@pytest.mark.parametrize("value, message", [
    ("{format: avro}", "registry: format: avro reads the registry's wire format"),
    ("{format: json, reader_schema: r.avsc}", "reader_schema: is only allowed with format: avro, protobuf or json_schema"),
    ("{format: avro, schema: a.avsc, registry: {schemas: s}}", "plain Avro (schema: FILE) has no header"),
    ("{format: protobuf, registry: {url: 'ftp://x'}}", "is not an http(s) URL"),
    ("{format: avro, registry: {url: 'http://x', schemas: s}}", "give exactly one of url"),
    ("{format: json_schema, registry: {schemas: s}, message: a.B}", "message: names a protobuf message type"),
])
def test_bad_format_settings_are_refused_with_one_line(tmp_path, value, message):
    write_jsonl(tmp_path / "in.jsonl", [])
    result = CliRunner().invoke(app, ["plan", str(_job(tmp_path, value))])
    assert result.exit_code == 2 and message in result.stderr and len(result.stderr.strip().splitlines()) == 1
