"""Verify: `range_boundary` only with evidence of a bound of the stream's output (verify/bounds.py).

One partition (one task), keys a, b, c, tumbling 10 s with grace 2 s, `emit: final` and `emit: updates`, and
sessions (gap 5 s, grace 1 s). Each test hands verify a streaming output that lost some windows and states
which of them straddle a bound the evidence shows (range_boundary) and which the stream evidently covered or
lost without a bound (unexplained).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from backfill.cli import app
from tests.conftest import write_jsonl

pytestmark = [pytest.mark.spark, pytest.mark.slow]

JOB = """
name: range-evidence
sources:
  s: {format: jsonl, path: inputs/s.jsonl, value: {format: string}, timestamp: {extractor: record}}
operators:
  - name: counts
    aggregate: {input: s, window: {type: tumbling, size: 10s, grace: 2s}, aggregations: {n: count()}, emit: final}
  - name: updates
    aggregate: {input: s, window: {type: tumbling, size: 10s, grace: 2s}, aggregations: {n: count()},
                emit: updates}
  - name: sessions
    aggregate: {input: s, window: {type: session, gap: 5s, grace: 1s}, aggregations: {n: count()}, emit: final}
sinks:
  counts: {format: jsonl, path: out/counts.jsonl}
  updates: {format: jsonl, path: out/updates.jsonl}
  sessions: {format: jsonl, path: out/sessions.jsonl}
  _ledger: {format: jsonl, path: out/ledger.jsonl}
  _runs: {format: jsonl, path: out/runs.jsonl}
"""

# (offset, key, ts), partition 0: stream time ends at 33 s, so [30 s, 40 s) is still open (final: not emitted)
INPUT = [(0, "a", 1000), (1, "b", 2000), (2, "c", 3000),
         (3, "a", 11_000), (4, "b", 12_000), (5, "c", 13_000), (6, "a", 14_000), (7, "b", 15_000),
         (8, "a", 21_000), (9, "b", 22_000), (10, "c", 23_000),
         (11, "a", 31_000), (12, "b", 32_000), (13, "c", 33_000)]


def _w(key: str, start: int, n: int, ts: int) -> dict[str, Any]:
    return {"key": key, "window_start": start, "window_end": start + 10_000, "n": n, "ts": ts}


def _s(key: str, start: int, end: int, n: int) -> dict[str, Any]:
    return {"key": key, "window_start": start, "window_end": end, "n": n, "ts": end}


# what the backfill emits (emit: final); updates adds [30 s, 40 s) of each key (last value per window)
FINAL = [_w("a", 0, 1, 1000), _w("b", 0, 1, 2000), _w("c", 0, 1, 3000),
         _w("a", 10_000, 2, 14_000), _w("b", 10_000, 2, 15_000), _w("c", 10_000, 1, 13_000),
         _w("a", 20_000, 1, 21_000), _w("b", 20_000, 1, 22_000), _w("c", 20_000, 1, 23_000)]
OPEN = [_w("a", 30_000, 1, 31_000), _w("b", 30_000, 1, 32_000), _w("c", 30_000, 1, 33_000)]


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("range-evidence")
    write_jsonl(tmp / "inputs" / "s.jsonl", [{"topic": "t", "partition": 0, "offset": o, "key": k, "value": "x",
                                              "timestamp": t} for o, k, t in INPUT])
    path = tmp / "job.yaml"
    path.write_text(JOB)
    result = CliRunner().invoke(app, ["run", str(path), "--json"])
    assert result.exit_code == 0, result.stderr
    return path


def _verify(job: Path, operator: str, rows: list[dict[str, Any]], tmp: Path, *args: str) -> dict[str, Any]:
    stream = write_jsonl(tmp / f"{operator}.jsonl", [{**r, "partition": 0, "offset": i} for i, r in enumerate(rows)])
    result = CliRunner().invoke(app, ["verify", str(job), "--json", "--against", f"{operator}={stream}",
                                      "--report", str(tmp / "report"), *args])
    assert result.exit_code in (0, 1), result.stderr
    return json.loads(result.stdout)


def _differences(report: dict[str, Any]) -> dict[tuple[str, int], tuple[str, str]]:
    """(key, window_start) -> (category, cause) of the sampled differences."""
    return {(s["key"], s["window_start"]): (s["category"], s["cause"])
            for s in report["sections"][0]["samples"] if s["category"] != "match"}


def _named(report: dict[str, Any]) -> dict[str, int]:
    return {c: n for c, n in report["causes"].items() if n}


def test_windows_straddling_the_observed_start_of_the_stream_are_range_boundary(job: Path, tmp_path: Path) -> None:
    """(a) The stream began at offset 6 (ts 14 s): its first window [10 s, 20 s) holds a14 and b15 only, and c13
    came before it; the windows before its output are lost without a bound (nothing shows where it began)."""
    stream = [_w("a", 10_000, 1, 14_000), _w("b", 10_000, 1, 15_000), *FINAL[6:]]
    report = _verify(job, "counts", stream, tmp_path)
    assert _differences(report) == {
        ("a", 10_000): ("mismatch", "range_boundary"), ("b", 10_000): ("mismatch", "range_boundary"),
        ("c", 10_000): ("missing_in_stream", "range_boundary"),
        ("a", 0): ("missing_in_stream", "unexplained"), ("b", 0): ("missing_in_stream", "unexplained"),
        ("c", 0): ("missing_in_stream", "unexplained")}
    detail = next(s["detail"] for s in report["sections"][0]["samples"] if (s["key"], s["window_start"]) == ("c", 10_000))
    assert detail == "the stream's output of task 0 starts at 10000, inside this window; the backfill's at 0"


def test_a_window_of_the_last_window_start_lost_for_one_key_is_not_range_boundary(job: Path, tmp_path: Path) -> None:
    """(b) emit: updates: [30 s, 40 s) is still open at the end of the data read, and the stream lacks it for c
    only: it wrote that window start for a and b of the same task, so it had processed that time."""
    stream = [*FINAL, *OPEN[:2]]
    report = _verify(job, "updates", stream, tmp_path)
    assert _differences(report) == {("c", 30_000): ("missing_in_stream", "unexplained")}
    assert report["verdict"] == "differences"


def test_a_window_written_for_other_keys_where_the_stream_output_ends_is_not_range_boundary(
        job: Path, tmp_path: Path) -> None:
    """(b) emit: updates: the stream's output ends at [20 s, 30 s) (the backfill's goes on to [30 s, 40 s)), and
    it lacks that last window start for c only: it wrote it for a and b of the same task, so it had processed
    that time; the lost [30 s, 40 s) of every key has no bound either."""
    report = _verify(job, "updates", FINAL[:8], tmp_path)
    assert _named(report) == {"unexplained": 4}  # c's [20 s, 30 s) and [30 s, 40 s) of a, b, c
    assert _differences(report)[("c", 20_000)] == ("missing_in_stream", "unexplained")  # 3 samples per cause


def test_a_closed_window_lost_for_one_key_is_not_range_boundary(job: Path, tmp_path: Path) -> None:
    """(b) emit: final: the stream lacks c's [20 s, 30 s), its last window start, which it closed for a and b."""
    report = _verify(job, "counts", FINAL[:8], tmp_path)
    assert _differences(report) == {("c", 20_000): ("missing_in_stream", "unexplained")}


def test_a_lost_tail_without_a_declared_range_is_unexplained(job: Path, tmp_path: Path) -> None:
    """(c) The stream's output ends after [0 s, 10 s): [10 s, 20 s) and [20 s, 30 s) of every key are missing,
    and nothing shows where the stream stopped (a stream that lost its tail looks the same)."""
    report = _verify(job, "counts", FINAL[:3], tmp_path)
    assert _named(report) == {"unexplained": 6}
    assert set(_differences(report).values()) == {("missing_in_stream", "unexplained")}
    assert report["verdict"] == "differences"


def test_a_lost_tail_with_a_declared_range_is_range_boundary_where_it_straddles(job: Path, tmp_path: Path) -> None:
    """(d) The same stream, the run's range declared to end at 25 s: [20 s, 30 s) closes at 32 s, after it
    (range_boundary); [10 s, 20 s) closed at 22 s, inside it, so the stream lacks it without a bound."""
    report = _verify(job, "counts", FINAL[:3], tmp_path, "--end", "25000")
    assert _named(report) == {"range_boundary": 3, "unexplained": 3}
    got = _differences(report)
    assert {w for (_, w), (_, cause) in got.items() if cause == "range_boundary"} == {20_000}
    assert {w for (_, w), (_, cause) in got.items() if cause == "unexplained"} == {10_000}
    detail = next(s["detail"] for s in report["sections"][0]["samples"] if s["cause"] == "range_boundary")
    assert detail == "the run's range ends at 25000, before this window closes (32000); the stream wrote nothing " \
                     "of task 0 past it"


def test_a_session_lost_after_the_stream_output_ends_is_unexplained(job: Path, tmp_path: Path) -> None:
    """Sessions: the closed sessions end with a [21 s], b [22 s], c [23 s]; the stream lacks c's, the last, and
    nothing shows a bound there."""
    sessions = [_s(k, s, e, n) for k, s, e, n in (
        ("a", 1000, 1000, 1), ("b", 2000, 2000, 1), ("c", 3000, 3000, 1), ("a", 11_000, 14_000, 2),
        ("b", 12_000, 15_000, 2), ("c", 13_000, 13_000, 1), ("a", 21_000, 21_000, 1), ("b", 22_000, 22_000, 1))]
    report = _verify(job, "sessions", sessions, tmp_path)
    assert _differences(report) == {("c", 23_000): ("missing_in_stream", "unexplained")}
