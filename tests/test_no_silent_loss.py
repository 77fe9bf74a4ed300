"""Nothing is lost or hidden: destructive jobs refused, ranged writes for every sink, empty inputs and
outputs everywhere, no silent coercion of keys and fields (each test failed on the code before its fix)."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from backfill.cli import app
from tests.conftest import read_jsonl, write_jsonl
from tests.golden.harness import run_job

JOB = """
name: loss
sources:
  s: {{format: jsonl, path: in.jsonl{source}}}
operators:
  - name: agg
    aggregate: {{input: s, window: {{type: tumbling, size: 10s, grace: 0ms}}, aggregations: {{n: count()}}, emit: final}}
sinks:
{sinks}
"""
SINKS = "  agg: {format: jsonl, path: out/agg.jsonl}\n  _ledger: {format: jsonl, path: out/ledger.jsonl}"


def _records(n: int = 30) -> list[dict]:
    return [{"topic": "t", "partition": 0, "offset": i, "key": f"k{i % 3}", "value": "v", "timestamp": 1000 * i}
            for i in range(n)]


def _plan(tmp_path: Path, sinks: str, source: str = "") -> tuple[int, str]:
    write_jsonl(tmp_path / "in.jsonl", _records())
    (tmp_path / "job.yaml").write_text(JOB.format(source=source, sinks=sinks))
    result = CliRunner().invoke(app, ["plan", str(tmp_path / "job.yaml")])
    return result.exit_code, result.stderr


@pytest.mark.parametrize("sinks,named", [
    ("  agg: {format: jsonl, path: in.jsonl}", "sinks.agg.path: .* is also sources.s.path"),
    ("  agg: {format: parquet, path: .}", "sinks.agg.path: .* contains or lies inside sources.s.path"),
    ("  agg: {format: jsonl, path: out/x.jsonl}\n  _ledger: {format: jsonl, path: out/x.jsonl}",
     "sinks.agg.path: .* is also sinks._ledger.path"),
    ("  agg: {format: delta, path: out/t}\n  _runs: {format: delta, path: out/t}", "sinks.agg.path: .* is also "
                                                                                   "sinks._runs.path"),
    ("  agg: {format: delta, path: .backfill/loss/runs/x}", "contains or lies inside the runs table"),
])
def test_plan_refuses_a_sink_that_would_overwrite_an_input_or_another_output(tmp_path, sinks, named):
    code, err = _plan(tmp_path, sinks)
    assert code == 2 and len(err.strip().splitlines()) == 1
    import re

    assert re.search(named, err), err
    assert "docs/job-spec.md#sinks" in err and (Path(__file__).parents[1] / "docs" / "job-spec.md").is_file()


def test_plan_names_an_operator_without_a_sink_and_accepts_format_none(tmp_path):
    code, err = _plan(tmp_path, "  _ledger: {format: jsonl, path: out/ledger.jsonl}")
    assert code == 2 and "sinks.agg: operator 'agg' has no sink" in err and "{format: none}" in err
    code, err = _plan(tmp_path, "  agg: {format: none}")
    assert code == 0, err


@pytest.mark.spark
@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_a_ranged_run_replaces_only_its_range_in_file_sinks(tmp_path, spark, fmt):
    ext = ".jsonl" if fmt == "jsonl" else ""
    sinks = f"  agg: {{format: {fmt}, path: out/agg{ext}}}\n  _ledger: {{format: {fmt}, path: out/ledger{ext}}}"
    write_jsonl(tmp_path / "in.jsonl", _records() + [{"topic": "t", "partition": 0, "offset": 30, "key": "k0",
                                                      "value": "v", "timestamp": 2000}])  # late for [0, 10s)
    (tmp_path / "job.yaml").write_text(JOB.format(source="", sinks=sinks))

    def rows(name: str) -> list[dict]:
        path = tmp_path / "out" / f"{name}{ext}"
        if fmt == "jsonl":
            return read_jsonl(path)
        return pq.read_table(path).to_pylist()

    assert CliRunner().invoke(app, ["run", str(tmp_path / "job.yaml")]).exit_code == 0
    full, ledger = rows("agg"), rows("ledger")
    assert len(full) == 6 and len(ledger) == 1
    result = CliRunner().invoke(app, ["run", str(tmp_path / "job.yaml"), "--start", "10000", "--end", "20000"])
    assert result.exit_code == 0, result.stderr
    key = lambda r: (r["window_start"], r["key"])  # noqa: E731
    assert sorted(rows("agg"), key=key) == sorted(full, key=key)  # the range was rewritten, nothing else moved
    assert rows("ledger") == ledger  # its late row lies outside [10s, 20s): kept


@pytest.mark.spark
def test_verify_works_with_an_empty_jsonl_ledger(tmp_path, spark):
    write_jsonl(tmp_path / "in.jsonl", _records())
    (tmp_path / "job.yaml").write_text(JOB.format(source="", sinks=SINKS))
    assert CliRunner().invoke(app, ["run", str(tmp_path / "job.yaml")]).exit_code == 0
    assert (tmp_path / "out" / "ledger.jsonl").read_text() == ""
    stream = tmp_path / "stream.jsonl"
    stream.write_text((tmp_path / "out" / "agg.jsonl").read_text())
    result = CliRunner().invoke(app, ["verify", str(tmp_path / "job.yaml"), "--against", f"agg={stream}",
                                      "--report", str(tmp_path / "report"), "--json"])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["verdict"] == "match"


@pytest.mark.spark
def test_an_empty_stream_output_reads_as_every_window_missing(tmp_path, spark):
    write_jsonl(tmp_path / "in.jsonl", _records())
    (tmp_path / "job.yaml").write_text(JOB.format(source="", sinks=SINKS))
    assert CliRunner().invoke(app, ["run", str(tmp_path / "job.yaml")]).exit_code == 0
    (tmp_path / "stream.jsonl").write_text("")
    result = CliRunner().invoke(app, ["verify", str(tmp_path / "job.yaml"), "--against",
                                      f"agg={tmp_path / 'stream.jsonl'}", "--report", str(tmp_path / "r"), "--json"])
    assert result.exit_code in (0, 1), result.stderr
    assert json.loads(result.stdout)["counts"]["missing_in_stream"] == 6


@pytest.mark.spark
@pytest.mark.parametrize("engine", ["spark", "reference"])
def test_keys_of_the_wrong_json_type_are_unreadable_with_their_cause(tmp_path, spark, engine):
    rows = [{"topic": "t", "partition": 0, "offset": i, "key": key, "value": "v", "timestamp": 1000 + i}
            for i, key in enumerate(["a", {"user": 1}, 12, ["x"], None, True])]
    job = JOB.format(source=", on_error: skip", sinks=SINKS).replace("path: in.jsonl", "path: inputs/s.jsonl")
    got = run_job(tmp_path, job, {"s": rows}, engine=engine)
    assert got.code == 0, got.stderr
    causes = {r["offset"]: r["detail"] for r in got.ledger if r["reason"] == "unreadable"}
    assert set(causes) == {1, 2, 3, 5}
    assert causes[2].startswith("unreadable key: the key is a JSON integer; key.format: string wants a JSON string")
    assert "JSON object" in causes[1] and "JSON array" in causes[3] and "JSON boolean" in causes[5]


@pytest.mark.spark
@pytest.mark.parametrize("engine", ["spark", "reference"])
def test_json_keys_keep_their_json_text(tmp_path, spark, engine):
    rows = [{"topic": "t", "partition": 0, "offset": i, "key": key, "value": "v", "timestamp": 1000 + i * 20_000}
            for i, key in enumerate([{"b": 1, "a": [2]}, 12, "text", "last"])]  # each closes the window before
    job = JOB.format(source=", key: {format: json}", sinks=SINKS).replace("path: in.jsonl", "path: inputs/s.jsonl")
    got = run_job(tmp_path, job, {"s": rows}, engine=engine)
    assert got.code == 0, got.stderr
    keys = {r["key"] for r in got.outputs["agg"]}
    assert keys == {'{"a":[2],"b":1}', "12", "text"}


@pytest.mark.spark
def test_a_timestamp_that_is_a_string_is_named_with_its_file_and_line(tmp_path, spark):
    rows = _records(3)
    rows[1]["timestamp"] = "yesterday"
    write_jsonl(tmp_path / "in.jsonl", rows)
    (tmp_path / "job.yaml").write_text(JOB.format(source="", sinks=SINKS))
    result = CliRunner().invoke(app, ["run", str(tmp_path / "job.yaml")])
    assert result.exit_code == 2
    assert f"{tmp_path / 'in.jsonl'} line 2" in result.stderr
    assert "timestamp is a JSON string, not epoch milliseconds" in result.stderr


@pytest.mark.spark
@pytest.mark.parametrize("engine", ["spark", "reference"])
def test_an_empty_source_is_reported_with_zero_records_and_a_warning(tmp_path, spark, engine):
    job = JOB.format(source="", sinks=SINKS).replace("path: in.jsonl", "path: inputs/s.jsonl")
    got = run_job(tmp_path, job, {"s": []}, engine=engine)
    assert got.code == 0, got.stderr
    assert got.summary["records_read"] == {"s": 0}
    if engine == "spark":
        assert any("source s has no records" in w for w in got.summary["warnings"])
