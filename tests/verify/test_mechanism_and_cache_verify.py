"""Verify names what the job's settings explain: a stream emitted by the other final mechanism
(`close_mechanism_differs`, docs/semantics.md 4.5) and an update stream written through the record cache
(`cache_coalesced`, section 14); what they do not explain stays unexplained."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from backfill.cli import app
from tests.conftest import write_jsonl
from tests.golden.test_final_mechanisms import SESSION, SESSION_ROWS, SLIDING, SLIDING_ROWS

pytestmark = [pytest.mark.spark, pytest.mark.slow]

FINAL_JOB = """
name: verify-mechanisms
sources:
  s: {format: jsonl, path: inputs/s.jsonl, value: {format: string}, timestamp: {extractor: record}}
  w: {format: jsonl, path: inputs/w.jsonl, value: {format: string}, timestamp: {extractor: record}}
operators:
  - name: sessions
    aggregate:
      input: s
      window: SESSION
      aggregations: {n: count(), f: {fold: {init: "''", step: "concat(acc, value)", merge: "concat(a, b)"}}}
      emit: final
  - name: sliding
    aggregate:
      input: w
      window: SLIDING
      aggregations: {n: count(), f: {fold: {init: "''", step: "concat(acc, value)"}}}
      emit: final
      close: suppress
sinks:
  sessions: {format: jsonl, path: out/sessions.jsonl}
  sliding: {format: jsonl, path: out/sliding.jsonl}
  _ledger: {format: jsonl, path: out/ledger.jsonl}
  _runs: {format: jsonl, path: out/runs.jsonl}
""".replace("SESSION", SESSION[0]).replace("SLIDING", SLIDING[0])

CACHE_JOB = """
name: verify-cache
sources:
  s: {format: jsonl, path: inputs/s.jsonl, value: {format: string}, timestamp: {extractor: record}}
operators:
  - name: agg
    aggregate:
      input: s
      window: {type: tumbling, size: 10s, grace: 0ms}
      aggregations: {n: count(), f: {fold: {init: "''", step: "concat(acc, value)"}}}
      emit: updates
      cache: CACHE
sinks:
  agg: {format: jsonl, path: out/agg.jsonl}
  _ledger: {format: jsonl, path: out/ledger.jsonl}
  _runs: {format: jsonl, path: out/runs.jsonl}
"""
# window [0, 10s) of each key: a x y z, b p q, c r s, d u, e m n
CACHE_INPUT = [("a", "x", 1000), ("a", "y", 2000), ("a", "z", 3000), ("b", "p", 4000), ("b", "q", 5000),
               ("c", "r", 6000), ("c", "s", 7000), ("d", "u", 8000), ("e", "m", 8500), ("e", "n", 9000),
               ("f", "o", 25000)]  # closes them (a window still open could be a range boundary)


def _records(rows: list[tuple]) -> list[dict[str, Any]]:
    return [{"topic": "t", "partition": 0, "offset": i, "key": k, "value": v, "timestamp": t}
            for i, (k, v, t) in enumerate(rows)]


def _stream(rows: list[tuple]) -> list[dict[str, Any]]:
    return [{"key": k, "window_start": s, "window_end": e, "n": n, "f": f, "ts": ts, "partition": 0, "offset": i}
            for i, (k, s, e, n, f, ts) in enumerate(rows)]


def _verify(job: Path, operator: str, rows: list[dict[str, Any]], tmp: Path) -> tuple[int, dict[str, Any]]:
    stream = write_jsonl(tmp / "stream" / f"{operator}-{job.stem}.jsonl", rows)
    result = CliRunner().invoke(app, ["verify", str(job), "--json", "--against", f"{operator}={stream}",
                                      "--report", str(tmp / f"report-{operator}-{job.stem}")])
    assert result.exit_code in (0, 1), result.stderr
    return result.exit_code, json.loads(result.stdout)


def _run(tmp: Path, job: str, inputs: dict[str, list[tuple]], name: str = "job") -> Path:
    for source, rows in inputs.items():
        write_jsonl(tmp / "inputs" / f"{source}.jsonl", _records(rows))
    path = tmp / f"{name}.yaml"
    path.write_text(job)
    result = CliRunner().invoke(app, ["run", str(path), "--json"])
    assert result.exit_code == 0, result.stderr
    return path


def _causes(section: dict[str, Any]) -> dict[str, int]:
    return {c: n for c, n in section["causes"].items() if n}


def test_a_stream_of_the_other_final_mechanism_is_named(tmp_path: Path) -> None:
    job = _run(tmp_path, FINAL_JOB, {"s": SESSION[1], "w": SLIDING[1]})
    # the job says on_window_close for sessions; the application suppressed, and b's value is simply wrong
    rows = [r if r[0] != "b" else (*r[:3], 7, *r[4:]) for r in SESSION_ROWS["suppress"]]
    code, report = _verify(job, "sessions", _stream(rows), tmp_path)
    [section] = report["sections"]
    # a@[47600, 47600] released twice (the backfill holds one row, the second), c@[51300, 51700] at 54200
    assert section["counts"] == {"match": 0, "mismatch": 1, "missing_in_stream": 0, "extra_in_stream": 1,
                                 "duplicate_in_stream": 1}
    assert _causes(section) == {"close_mechanism_differs": 2, "unexplained": 1}
    named = [s for s in section["samples"] if s.get("cause") == "close_mechanism_differs"]
    assert {(s["key"], s["window_start"], s["window_end"]) for s in named} == {("a", 47600, 47600),
                                                                             ("c", 51300, 51700)}
    assert all("close: suppress" in s["detail"] for s in named)
    assert code == 1 and report["verdict"] == "differences"  # b's wrong value stays unexplained
    # the job says suppress for sliding windows; the application emitted on window close
    code, report = _verify(job, "sliding", _stream(SLIDING_ROWS["on_window_close"]), tmp_path)
    [section] = report["sections"]
    # a@[9000, 10000]: the backfill released it twice, its last row matches; d@[10100, 11100] released at 11600
    assert section["counts"]["missing_in_stream"] == 1
    assert _causes(section) == {"close_mechanism_differs": 1}
    assert code == 0 and report["verdict"] == "explained"


def test_a_cached_update_stream_is_coalesced_and_what_is_not_stays_unexplained(tmp_path: Path) -> None:
    job = _run(tmp_path, CACHE_JOB.replace("CACHE", "on"), {"s": CACHE_INPUT})
    w = (0, 10_000)
    stream = _stream([("a", *w, 1, "x", 1000), ("b", *w, 2, "pq", 5000), ("a", *w, 3, "xyz", 3000),  # coalesced
                      ("c", *w, 1, "r", 6000), ("c", *w, 9, "rx", 6500), ("c", *w, 2, "rs", 7000),  # rx: never produced
                      ("d", *w, 1, "u", 8000),                                                     # every update
                      ("e", *w, 1, "m", 8500), ("e", *w, 2, "mm", 9000),                           # wrong last value
                      ("f", 20_000, 30_000, 1, "o", 25000)])
    code, report = _verify(job, "agg", stream, tmp_path)
    [section] = report["sections"]
    assert section["counts"] == {"match": 2, "mismatch": 4, "missing_in_stream": 0, "extra_in_stream": 0,
                                 "duplicate_in_stream": 0}
    assert _causes(section) == {"cache_coalesced": 2, "unexplained": 2}
    by_key = {s["key"]: s for s in section["samples"] if s["category"] == "mismatch"}
    assert by_key["a"]["cause"] == by_key["b"]["cause"] == "cache_coalesced"
    assert by_key["a"]["diff_columns"] == ["updates"] and "2 of the backfill's 3 updates" in by_key["a"]["detail"]
    assert by_key["c"]["cause"] == "unexplained" and "not a subsequence" in by_key["c"]["detail"]
    assert by_key["e"]["cause"] == "unexplained" and by_key["e"]["diff_columns"] == ["f"]
    assert code == 1 and report["verdict"] == "differences"
    # without cache: on, only the last value of each window is compared, as before
    off = tmp_path / "off.yaml"
    off.write_text(CACHE_JOB.replace("CACHE", "off"))
    code, report = _verify(off, "agg", stream, tmp_path)
    assert report["sections"][0]["counts"]["match"] == 5 and _causes(report["sections"][0]) == {"unexplained": 1}
