"""Verify: streaming outputs with each defect kind get the exact category and cause, row by row.

One input timeline (tumbling 10 s, grace 2 s, emit final) run through `backfill run`, then a
hand-written "streaming output" with one defect per window, checked with `backfill verify`.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from backfill.cli import app
from backfill.verify.catalogue import CAUSES
from tests.conftest import write_jsonl

pytestmark = [pytest.mark.spark, pytest.mark.slow]

JOB = """
name: verify-defects
sources:
  s: {format: jsonl, path: inputs/s.jsonl, value: {format: string}, timestamp: {extractor: record}}
operators:
  - name: agg
    aggregate:
      input: s
      window: {type: tumbling, size: 10s, grace: 2s}
      aggregations:
        n: count()
        trail: {fold: {init: "''", step: "concat(acc, value)"}}
      emit: EMIT
sinks:
  agg: {format: delta, path: out/agg}
  _ledger: {format: delta, path: out/ledger}
  _runs: {format: jsonl, path: out/runs.jsonl}
"""

# (partition, offset, key, value, ts): partition 0 in offset order, partition 1 has a gap (offsets 2-4),
# partition 2 was archived from offset 100 on
INPUT = [
    (0, 0, "a", "a1", 1000), (0, 1, "b", "b1", 2000), (0, 2, "c", "c1", 3000), (0, 3, "c", "c2", 3000),
    (0, 4, "d", "d1", 4000), (0, 5, "a", "a2", 12000),
    (0, 6, "b", "b2", 9000),    # stream time 12000: late for [0, 10s) (end + grace <= 12000)
    (0, 7, "e", "e1", 15000),
    (0, 8, "e", "e2", 11000),   # accepted, but behind stream time (15000)
    (0, 9, "f", "f1", 21000), (0, 10, "a", "a3", 33000),
    (0, 11, "g", "g1", 35000),  # [30s, 40s) is still open at the end (stream time 35000 < 42000)
    (1, 0, "k", "k1", 1000), (1, 1, "k", "k2", 2000), (1, 5, "m", "m1", 5000), (1, 6, "k", "k3", 13000),
    (1, 7, "m", "m2", 30000),
    (2, 100, "q", "q1", 500), (2, 101, "q", "q2", 25000),
]


def _row(key: str, start: int, n: int, trail: str, ts: int) -> dict[str, Any]:
    return {"key": key, "window_start": start, "window_end": start + 10_000, "n": n, "trail": trail, "ts": ts}


# the live application's output: (row, expected category, expected cause)
STREAM = [
    (_row("a", 0, 1, "a1", 1000), "match", None),
    (_row("b", 0, 2, "b1b2", 9000), "mismatch", "late_drop_differs"),       # the stream accepted b2
    # c1, c2 share ts 3000, but one partition's records are taken in offset order: no tie explains c2 first
    (_row("c", 0, 2, "c2c1", 3000), "mismatch", "unexplained"),
    (_row("d", 0, 1, "d1", 4000), "duplicate_in_stream", "duplicate_delivery"),
    (_row("a", 10_000, 5, "a2", 12000), "mismatch", "unexplained"),         # nothing explains 5
    (_row("e", 10_000, 1, "e1", 15000), "mismatch", "late_drop_differs"),   # the stream dropped e2
    (_row("g", 30_000, 1, "g1", 35000), "extra_in_stream", "range_boundary"),
    (_row("h", 10_000, 1, "h1", 11000), "extra_in_stream", "unexplained"),  # a key never read
    (_row("k", 0, 3, "k1k2kx", 4000), "mismatch", "missing_input"),         # a record of the gap
    (_row("m", 0, 1, "m1", 5000), "match", None),
    (_row("k", 10_000, 1, "k3", 13000), "match", None),
    (_row("q", 0, 3, "q0q0q1", 500), "mismatch", "range_boundary"),         # records before offset 100
]
MISSING = [("f", 20_000, "missing_in_stream", "unexplained")]  # the stream never wrote [20s, 30s) of f


def _setup(tmp: Path, emit: str = "final") -> Path:
    write_jsonl(tmp / "inputs" / "s.jsonl", [{"topic": "t", "partition": p, "offset": o, "key": k, "value": v,
                                              "timestamp": t} for p, o, k, v, t in INPUT])
    job = tmp / "job.yaml"
    job.write_text(JOB.replace("EMIT", emit))
    result = CliRunner().invoke(app, ["run", str(job), "--json"])
    assert result.exit_code == 0, result.stderr
    return job


def _stream_file(tmp: Path) -> Path:
    rows, offsets = [], {}
    for row, category, _ in STREAM:
        for _ in range(2 if category == "duplicate_in_stream" else 1):
            part = 0 if row["key"] in "abcdefgh" else 1
            offsets[part] = offsets.get(part, -1) + 1
            rows.append({**row, "partition": part, "offset": offsets[part]})
    return write_jsonl(tmp / "stream" / "agg.jsonl", rows)


def _verify(job: Path, *args: str) -> tuple[int, dict[str, Any]]:
    result = CliRunner().invoke(app, ["verify", str(job), "--json", *args])
    assert result.exit_code in (0, 1), result.stderr
    return result.exit_code, json.loads(result.stdout)


def verify_defects(tmp: Path) -> tuple[Path, int, dict[str, Any]]:
    """Run the defects job and verify it against the defective stream (the `verified` fixture, conftest.py)."""
    job = _setup(tmp)
    code, report = _verify(job, "--against", f"agg={_stream_file(tmp)}", "--report", str(tmp / "report"),
                           "--junit", str(tmp / "report" / "junit.xml"))
    return tmp / "report", code, report


def test_each_defect_gets_its_category_and_cause(verified: tuple[Path, int, dict[str, Any]]) -> None:
    _, _, report = verified
    samples = report["sections"][0]["samples"]
    got = {(s["key"], s["window_start"]): (s["category"], s["cause"]) for s in samples}
    expected = {(r["key"], r["window_start"]): (cat, cause) for r, cat, cause in STREAM}
    expected.update({(k, w): (cat, cause) for k, w, cat, cause in MISSING})
    # at most 3 samples per (category, cause): every non-match here is its own sample
    assert {k: v for k, v in got.items() if v[0] != "match"} == {k: v for k, v in expected.items() if v[0] != "match"}
    assert report["counts"] == {"match": 3, "mismatch": 6, "missing_in_stream": 1, "extra_in_stream": 2,
                                "duplicate_in_stream": 1}
    # every cause of the catalogue is counted, the ones not found as 0
    assert report["causes"] == {**{c: 0 for c in CAUSES}, "late_drop_differs": 2, "range_boundary": 2,
                                "duplicate_delivery": 1, "missing_input": 1, "unexplained": 4}
    # the windows still open at the end of the data are judged by the stream times the run recorded
    assert any(n.startswith("each task's stream time at the end of the data: recorded by run ")
               for n in report["sections"][0]["notes"])


def test_unexplained_differences_give_verdict_differences_and_exit_1(
        verified: tuple[Path, int, dict[str, Any]]) -> None:
    folder, code, report = verified
    assert (code, report["verdict"], report["exit_code"]) == (1, "differences", 1)
    on_disk = json.loads((folder / "report.json").read_text())
    assert on_disk["verdict"] == "differences" and on_disk["counts"] == report["counts"]


def test_the_report_leads_with_what_needs_a_person(verified: tuple[Path, int, dict[str, Any]]) -> None:
    """Differences before matches, unexplained first; the timeline split by cause; true input counts."""
    from backfill.verify.report import _inputs

    _, _, report = verified
    section = report["sections"][0]
    order = [(s["category"], s["cause"]) for s in section["samples"]]
    assert order[0][1] == "unexplained" and all(c == "match" for c, _ in order[-3:])
    assert order.index(("match", None)) == len([o for o in order if o[0] != "match"])
    for bucket in section["timeline"]:
        assert sum(bucket["causes"].values()) == bucket["differ"]
    assert sum(b["causes"].get("unexplained", 0) for b in section["timeline"]) == report["causes"]["unexplained"]
    assert all(s["inputs_total"] == len(s["inputs"]) for s in section["samples"])  # windows of a few records
    row = {"inputs": [{"partition": 0, "offset": i, "ts": i, "status": "accepted", "value": "{}"} for i in range(12)],
           "inputs_total": 59}
    assert "input records behind this window (59; the first 12 shown)" in _inputs(row)


def test_junit_xml_fails_the_operator_with_unexplained_differences(
        verified: tuple[Path, int, dict[str, Any]]) -> None:
    import xml.etree.ElementTree as ET

    folder, _, _ = verified
    suite = ET.parse(folder / "junit.xml").getroot()
    assert (suite.tag, suite.get("tests"), suite.get("failures")) == ("testsuite", "1", "1")
    [case] = suite.findall("testcase")
    assert case.get("name") == "agg" and case.get("classname") == "backfill verify verify-defects"
    failure = case.find("failure")
    assert failure is not None and failure.get("message") == "4 windows differ with no explanation"
    assert "late_drop_differs 2" in (failure.text or "")


def test_late_drop_evidence_shows_the_records(verified: tuple[Path, int, dict[str, Any]]) -> None:
    _, _, report = verified
    by_key = {(s["key"], s["window_start"]): s for s in report["sections"][0]["samples"]}
    accepted_by_stream = by_key[("b", 0)]
    assert [(r["partition"], r["offset"], r["status"]) for r in accepted_by_stream["records"]] == [(0, 6, "late")]
    assert accepted_by_stream["detail"] == "the stream accepted 1 record(s) the backfill dropped as late"
    dropped_by_stream = by_key[("e", 10_000)]
    assert [(r["offset"], r["ts"], r["st"]) for r in dropped_by_stream["records"]] == [(8, 11000, 15000)]
    # the input records behind a sample are listed with their status in the backfill
    assert [(r["offset"], r["status"]) for r in accepted_by_stream["inputs"]] == [(1, "accepted"), (6, "late")]
    assert "offsets 2-4" in by_key[("k", 0)]["detail"]


def test_stream_expectations_run_and_show_in_the_report(verified: tuple[Path, int, dict[str, Any]]) -> None:
    folder, _, report = verified
    suite, unique = report["sections"][0]["expectations"]
    assert suite["name"] == "agg.stream" and suite["success"]
    assert [e["says"] for e in suite["expectations"]][-1] == "ts inside [window_start, window_end)"
    assert unique["name"] == "agg.stream.unique" and unique["success"]
    assert [e["says"] for e in unique["expectations"]] == ["(partition, offset) unique"]
    # rendered in the report itself, nothing that needs the internet linked (GX's Data Docs do)
    page = (folder / "index.html").read_text()
    assert "agg.stream.unique" in page and "(partition, offset) unique" in page
    assert suite["docs"] is None and not (folder / "gx").exists() and "Data Docs" not in page


def test_update_stream_last_value_by_offset_and_replayed_updates(tmp_path: Path, spark: Any) -> None:
    """emit updates: intermediate updates may be missing (cache), a replay re-sends some: not differences."""
    from deltalake import DeltaTable

    job = _setup(tmp_path, emit="updates")
    updates = sorted(DeltaTable(str(tmp_path / "out" / "agg")).to_pyarrow_table().to_pylist(),
                     key=lambda r: r["emit_seq"])
    rows = []
    for r in updates:
        if (r["key"], r["window_start"]) == ("e", 10_000) and r["n"] == 1:
            continue  # collapsed by the cache: only the last update of the window was flushed
        rows.append(r)
        if (r["key"], r["window_start"]) == ("c", 0):
            rows.append(r)  # at-least-once: re-sent after a crash, same value
    stream = [{"k": r["key"], "start": r["window_start"], "n": r["n"], "trail": r["trail"], "ts": r["ts"],
               "partition": r["task"], "offset": i} for i, r in enumerate(rows)]
    path = write_jsonl(tmp_path / "stream.jsonl", stream)
    code, report = _verify(job, "--against", f"agg={path}", "--map", "key=k", "--map", "window_start=start",
                           "--report", str(tmp_path / "report"))
    assert report["counts"]["duplicate_in_stream"] == 1  # both updates of (c, 0) were re-sent: one window
    assert report["counts"]["mismatch"] == report["counts"]["missing_in_stream"] == 0
    assert report["counts"]["extra_in_stream"] == 0 and report["causes"]["duplicate_delivery"] == 1
    dup = next(s for s in report["sections"][0]["samples"] if s["category"] == "duplicate_in_stream")
    assert (dup["key"], dup["_rows"], dup["_copies"]) == ("c", 4, 2)
    assert (code, report["verdict"]) == (0, "explained")


def test_verify_needs_a_published_output(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "inputs" / "s.jsonl", [])
    job = tmp_path / "job.yaml"
    job.write_text(JOB.replace("EMIT", "final"))
    result = CliRunner().invoke(app, ["verify", str(job), "--against", f"agg={job}"])
    assert result.exit_code == 2
    assert "does not exist; run `backfill run" in result.stderr
