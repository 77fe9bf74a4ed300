"""Verify session and sliding windows: sessions are keyed (key, window_start, window_end), a session that merged
differently in the stream is `session_merge_differs`, and the causes the outputs alone show are named."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from backfill.cli import app
from tests.conftest import write_jsonl
from tests.verify.conftest import ran_job

pytestmark = [pytest.mark.spark, pytest.mark.slow]

JOB = """
name: verify-windows
sources:
  s: {format: jsonl, path: inputs/s.jsonl, value: {format: string}, timestamp: {extractor: record}}
operators:
  - name: sessions
    aggregate:
      input: s
      window: {type: session, gap: 5s, grace: 1s}
      aggregations: {n: count()}
      emit: final
  - name: sliding
    aggregate:
      input: s
      window: {type: sliding, time_difference: 5s, grace: 1s}
      aggregations: {n: count()}
      emit: final
sinks:
  sessions: {format: delta, path: out/sessions}
  sliding: {format: delta, path: out/sliding}
  _ledger: {format: delta, path: out/ledger}
  _runs: {format: jsonl, path: out/runs.jsonl}
"""
# one partition: a@[1s, 4s] (3 records), b@[2s, 2s], c@[10s, 12s], d@[30s, 30s] (still open: ST 31s)
INPUT = [("a", 1000), ("b", 2000), ("a", 3000), ("a", 4000), ("c", 10_000), ("c", 12_000), ("d", 30_000),
         ("e", 31_000)]


def _verify(job: Path, operator: str, rows: list[dict[str, Any]], tmp: Path) -> tuple[int, dict[str, Any]]:
    stream = write_jsonl(tmp / "stream" / f"{operator}.jsonl",
                         [{**r, "partition": 0, "offset": i} for i, r in enumerate(rows)])
    result = CliRunner().invoke(app, ["verify", str(job), "--json", "--against", f"{operator}={stream}",
                                      "--report", str(tmp / f"report-{operator}")])
    assert result.exit_code in (0, 1), result.stderr
    return result.exit_code, json.loads(result.stdout)


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ran_job(tmp_path_factory.mktemp("windows"), JOB, [(k, "x", 0, t) for k, t in INPUT])


def test_sessions_are_keyed_by_their_bounds_and_merges_are_a_cause(job: Path, tmp_path: Path) -> None:
    session = lambda k, s, e, n: {"key": k, "window_start": s, "window_end": e, "n": n, "ts": e}  # noqa: E731
    stream = [session("a", 1000, 4000, 3),     # match
              session("b", 2000, 2000, 1),     # duplicate delivery (twice)
              session("b", 2000, 2000, 1),
              session("c", 10_000, 10_000, 1),  # the stream did not merge 12s into c's session: two sessions
              session("c", 12_000, 12_000, 1),
              session("d", 30_000, 30_000, 1)]  # the stream had closed it; the backfill's data ends before
    code, report = _verify(job, "sessions", stream, tmp_path)
    [section] = report["sections"]
    assert section["keys"] == ["key", "window_start", "window_end"]
    assert section["counts"] == {"match": 1, "mismatch": 0, "missing_in_stream": 1, "extra_in_stream": 3,
                                 "duplicate_in_stream": 1}
    assert {c: n for c, n in section["causes"].items() if n} == {
        "duplicate_delivery": 1, "session_merge_differs": 3, "range_boundary": 1}
    merged = [s for s in section["samples"] if s.get("cause") == "session_merge_differs"]
    assert any("[10000, 12000]" in s["detail"] for s in merged)
    assert code == 0 and report["verdict"] == "explained"


def test_sliding_windows_are_reconciled_by_start(job: Path, tmp_path: Path) -> None:
    window = lambda k, s, n, ts: {"key": k, "window_start": s, "window_end": s + 5000, "n": n, "ts": ts}  # noqa: E731
    stream = [window("a", 0, 3, 4000), window("a", 1001, 2, 4000), window("a", 3001, 1, 4000),  # a: all match
              # c's later windows [7s, 12s] and [10.001s, 15.001s] are never emitted: the jump in stream time to
              # 30s is more than the store's retention (2 time differences + grace, docs/semantics.md 10.5)
              window("c", 5000, 7, 10_000)]  # a value nothing explains
    code, report = _verify(job, "sliding", stream, tmp_path)
    [section] = report["sections"]
    assert section["keys"] == ["key", "window_start"]
    assert section["counts"]["mismatch"] == 1 and section["causes"]["unexplained"] >= 1
    assert code == 1 and report["verdict"] == "differences"
