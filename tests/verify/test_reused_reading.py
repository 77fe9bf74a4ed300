"""Verify reuses the run's reading of its input: when the input is as the run read it and the run found no
unreadable value in it, values are decoded only for the records a cause reads, and the report is the one
decoding every value gives. Any change to the input (a file touched, another value schema) decodes them all."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from backfill.cli import app
from backfill.jobspec.load import load_job
from backfill.plan.builder import build_plan
from backfill.verify.evidence import DECODED_ALL, reusable_reading
from tests.verify.test_reconcile_causes import INPUT, MISSING, STREAM, _stream_file
from tests.verify.test_reconcile_causes import JOB as DEFECTS_JOB

pytestmark = [pytest.mark.spark, pytest.mark.slow]

# the defects job of test_reconcile_causes.py, reading parquet with JSON values ({"v": ..., "extra": 1})
JOB = (DEFECTS_JOB.replace("name: verify-defects", "name: verify-reused").replace("EMIT", "final")
       .replace("{format: jsonl, path: inputs/s.jsonl, value: {format: string}",
                "{format: parquet, path: inputs/s.parquet, value: {format: json, schema: value.json}")
       .replace("concat(acc, value)", "concat(acc, value.v)"))
SCHEMA = {"type": "object", "properties": {"v": {"type": "string"}, "extra": {"type": "integer"}}}
REUSED = "which input records reached the operator: run "
DECODED = f"which input records reached the operator: {DECODED_ALL}"


def _setup(tmp: Path) -> Path:
    (tmp / "inputs").mkdir(parents=True)
    pq.write_table(pa.table({
        "topic": ["t"] * len(INPUT), "partition": [p for p, *_ in INPUT], "offset": [o for _, o, *_ in INPUT],
        "key": [k for _, _, k, _, _ in INPUT], "value": [json.dumps({"v": v, "extra": 1}) for *_, v, _ in INPUT],
        "timestamp": [t for *_, t in INPUT]}), tmp / "inputs" / "s.parquet")
    (tmp / "value.json").write_text(json.dumps(SCHEMA))
    job = tmp / "job.yaml"
    assert "inputs/s.parquet" in JOB and "value.v" in JOB
    job.write_text(JOB)
    result = CliRunner().invoke(app, ["run", str(job), "--json"])
    assert result.exit_code == 0, result.stderr
    return job


def _verify(job: Path, tmp: Path) -> dict[str, Any]:
    result = CliRunner().invoke(app, ["verify", str(job), "--json", "--against", f"agg={_stream_file(tmp)}",
                                      "--report", str(tmp / "report")])
    assert result.exit_code == 1, result.stderr  # the defects include unexplained ones
    return json.loads(result.stdout)


def _outcome(report: dict[str, Any]) -> tuple[Any, ...]:
    section = report["sections"][0]
    # with each sample, the records its cause names and the first input records (their decoded values)
    rows = {(s["key"], s["window_start"], s["category"], s["cause"],
             json.dumps([s["records"], s["inputs"], s["inputs_total"]], sort_keys=True, default=str))
            for s in section["samples"]}
    return report["counts"], report["causes"], sorted(rows)


def test_the_runs_reading_is_reused_only_while_the_input_is_unchanged(tmp_path: Path) -> None:
    job = _setup(tmp_path)
    reused = _verify(job, tmp_path)
    assert any(n.startswith(REUSED) for n in reused["sections"][0]["notes"]), reused["sections"][0]["notes"]
    # the defects timeline's categories and causes, as with every value decoded (test_reconcile_causes.py)
    got = {(s["key"], s["window_start"]): (s["category"], s["cause"]) for s in reused["sections"][0]["samples"]}
    expected = {(r["key"], r["window_start"]): (cat, cause) for r, cat, cause in STREAM if cat != "match"}
    expected.update({(k, w): (cat, cause) for k, w, cat, cause in MISSING})
    assert {k: v for k, v in got.items() if v[0] != "match"} == expected
    assert reused["causes"]["late_drop_differs"] == 2 and reused["causes"]["unexplained"] == 4

    # the same bytes, touched: the input may have changed, so every value is decoded again, to the same report
    parquet = tmp_path / "inputs" / "s.parquet"
    st = parquet.stat()
    os.utime(parquet, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    decoded = _verify(job, tmp_path)
    assert DECODED in decoded["sections"][0]["notes"]
    assert _outcome(decoded) == _outcome(reused)


def _manifest(job: Path) -> dict[str, Any]:
    row = json.loads((job.parent / "out" / "runs.jsonl").read_text().splitlines()[-1])
    return {**row, "counts": json.loads(row["counts"])}


def test_a_run_that_found_unreadable_values_or_another_schema_is_not_reused(tmp_path: Path) -> None:
    job = _setup(tmp_path)
    plan = build_plan(load_job(job))
    run = _manifest(job)
    content = json.loads(run["inputs"])["s"]["content"]
    assert reusable_reading(plan, "s", run) == (run["run_id"], content)
    unreadable = {**run, "counts": {**run["counts"], "source_drops": {"s": {"unreadable": 1}}}}
    assert reusable_reading(plan, "s", unreadable) is None  # which records were unreadable: decode them all
    assert reusable_reading(plan, "s", {**run, "inputs": "{}"}) is None  # a manifest from before fingerprints
    assert reusable_reading(plan, "s", None) is None

    from backfill.io.sources import content_fingerprint

    location = str(tmp_path / "inputs" / "s.parquet")
    assert content_fingerprint(plan.job, "s", location, None) == content
    (tmp_path / "value.json").write_text(json.dumps({**SCHEMA, "properties": {"v": {"type": "integer"}}}))
    assert content_fingerprint(load_job(job), "s", location, None) != content  # a value may now be unreadable
