"""late_drop_differs for session and sliding windows (docs/semantics.md §10.2, §11.2): a window whose stream value
is the backfill's recomputed with the records it dropped as late added is explained, with those records as its
evidence; the same kind of wrong value with no late drop to explain it stays unexplained."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from typer.testing import CliRunner

from backfill.cli import app
from tests.conftest import write_jsonl
from tests.verify.conftest import ran_job

pytestmark = [pytest.mark.spark, pytest.mark.slow]

JOB = """
name: late-windows
sources:
  s: {format: jsonl, path: inputs/s.jsonl, value: {format: string}, timestamp: {extractor: record}}
operators:
  - name: sessions
    aggregate: {input: s, window: {type: session, gap: 5s, grace: 1s}, aggregations: {n: count()}, emit: final}
  - name: sliding
    aggregate: {input: s, window: {type: sliding, time_difference: 5s, grace: 1s}, aggregations: {n: count()},
                emit: final}
sinks:
  sessions: {format: delta, path: out/sessions}
  sliding: {format: delta, path: out/sliding}
  _ledger: {format: delta, path: out/ledger}
  _runs: {format: jsonl, path: out/runs.jsonl}
"""
# one partition, in this order: k@10.5s (offset 5) comes when stream time is 20 s: late for k's session
# [10s, 11s] (its end is before 20 - 1 - 5) and dropped at once by the sliding windows (its right window would
# end at 15.501 <= 20 - 1). A stream that took it (another order, a restart with a lower stream time) has it in
# the session and in k's sliding windows [6s, 11s] and [10.001s, 15.001s].
INPUT = [("m", 1000), ("m", 2000), ("k", 10_000), ("k", 11_000), ("x", 20_000), ("k", 10_500), ("y", 22_000)]


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ran_job(tmp_path_factory.mktemp("late"), JOB, [(k, "v", 0, t) for k, t in INPUT])


def _stream(job: Path, operator: str, planted: dict[tuple[str, int], int], tmp: Path) -> Path:
    """The backfill's own output, with the values `planted` per (key, window_start)."""
    rows = DeltaTable(str(job.parent / "out" / operator)).to_pyarrow_table().to_pylist()
    assert all(any((r["key"], r["window_start"]) == kw for r in rows) for kw in planted), rows
    out = [{**r, "n": planted.get((r["key"], r["window_start"]), r["n"]), "partition": 0, "offset": i}
           for i, r in enumerate(sorted(rows, key=lambda r: (r["window_end"], r["key"])))]
    return write_jsonl(tmp / f"{operator}.jsonl", out)


def _verify(job: Path, operator: str, stream: Path, tmp: Path, *args: str) -> dict[str, Any]:
    result = CliRunner().invoke(app, ["verify", str(job), "--json", "--against", f"{operator}={stream}",
                                      "--report", str(tmp / f"report-{operator}"), *args])
    assert result.exit_code in (0, 1), result.stderr
    [section] = json.loads(result.stdout)["sections"]
    return section


@pytest.mark.parametrize("operator,planted,late", [
    ("sessions", {("k", 10_000): 3, ("m", 1000): 4}, [("k", 10_000)]),
    ("sliding", {("k", 6000): 3, ("k", 10_001): 2, ("m", 0): 4}, [("k", 6000), ("k", 10_001)]),
])
def test_a_late_drop_the_stream_took_is_explained_and_a_value_nothing_explains_is_not(
        job: Path, tmp_path: Path, operator: str, planted: dict[tuple[str, int], int],
        late: list[tuple[str, int]]) -> None:
    fixes = tmp_path / "corrections"
    section = _verify(job, operator, _stream(job, operator, planted, tmp_path), tmp_path, "--corrections", str(fixes))
    assert section["counts"]["mismatch"] == len(planted)
    assert {c: n for c, n in section["causes"].items() if n} == {"late_drop_differs": len(late), "unexplained": 1}
    explained = {(s["key"], s["window_start"]): s for s in section["samples"] if s.get("cause") == "late_drop_differs"}
    assert sorted(explained) == late
    for sample in explained.values():
        assert sample["detail"] == "the stream accepted 1 record(s) the backfill dropped as late"
        assert [(r["offset"], r["ts"], r["st"], r["status"]) for r in sample["records"]] == [(5, 10_500, 20_000,
                                                                                            "late")]
    [alone] = [s for s in section["samples"] if s.get("cause") == "unexplained"]
    assert (alone["key"], alone["records"]) == ("m", None)
    # the explained windows are corrected with the backfill's values; the unexplained one is not touched
    ours = {(r["key"], r["window_start"]): r["n"]
            for r in DeltaTable(str(job.parent / "out" / operator)).to_pyarrow_table().to_pylist()}
    fixed = DeltaTable(str(fixes / operator)).to_pyarrow_table().to_pylist()
    assert sorted((r["key"], r["window_start"], r["n"], r["correction"]) for r in fixed) == [
        (k, w, ours[(k, w)], "replace") for k, w in late]


REKEYED = """
name: tied-windows
sources:
  s: {format: jsonl, path: inputs/s.jsonl, value: {format: string}, timestamp: {extractor: record}}
operators:
  - name: sliding
    aggregate:
      input: s
      group_by: {key: 'substr(key, 1, 1)', partitions: 1}
      window: {type: sliding, time_difference: 5s, grace: 1s}
      aggregations: {n: count(), last_v: last(value)}
      emit: final
sinks:
  sliding: {format: jsonl, path: out/sliding.jsonl}
  _ledger: {format: jsonl, path: out/ledger.jsonl}
  _runs: {format: jsonl, path: out/runs.jsonl}
"""


def test_a_rekeyed_window_whose_tied_records_came_in_another_order_is_tie_order(tmp_path: Path) -> None:
    # a1 (partition 0) and a2 (partition 1) both become key a through one repartition partition; at 3 s each
    # partition has a record: their interleaving there is modelled, not known. b's records never tie.
    job = ran_job(tmp_path, REKEYED, [("a1", "x", 0, 3000), ("a2", "y", 1, 3000), ("b1", "p", 0, 4000),
                                      ("b1", "q", 0, 4500), ("z1", "-", 0, 12_000), ("z2", "-", 1, 12_000)])
    ours = [json.loads(line) for line in (tmp_path / "out" / "sliding.jsonl").read_text().splitlines()]
    flipped = {"x": "y", "y": "x", "q": "p"}
    stream = [{**r, "last_v": flipped.get(r["last_v"], r["last_v"]) if r["key"] in ("a", "b") and r["n"] > 1
               else r["last_v"], "partition": 0, "offset": i} for i, r in enumerate(ours)]
    assert sum(r["last_v"] != s["last_v"] for r, s in zip(ours, stream)) == 2  # [0, 5s] of a and of b
    section = _verify(job, "sliding", write_jsonl(tmp_path / "stream.jsonl", stream), tmp_path)
    assert {c: n for c, n in section["causes"].items() if n} == {"tie_order": 1, "unexplained": 1}
    [tied] = [s for s in section["samples"] if s.get("cause") == "tie_order"]
    assert tied["key"] == "a" and "last_v" in tied["detail"]


FOLDED = """
name: folded-sessions
sources:
  s: {format: jsonl, path: inputs/s.jsonl, value: {format: string}, timestamp: {extractor: record}}
operators:
  - name: sessions
    aggregate:
      input: s
      window: {type: session, gap: 5s, grace: 10s}
      aggregations: {trail: {fold: {init: "''", step: "concat(acc, value)", merge: "concat(a, b)"}}}
      emit: final
sinks:
  sessions: {format: jsonl, path: out/sessions.jsonl}
  _ledger: {format: jsonl, path: out/ledger.jsonl}
  _runs: {format: jsonl, path: out/runs.jsonl}
"""


def test_a_window_the_recomputation_does_not_reproduce_is_not_put_down_to_a_late_drop(tmp_path: Path) -> None:
    # k@9 s (a) and k@1 s (b, within the grace) are two sessions until k@5 s (c) bridges them: the fold merges the stored sessions by
    # end, "b" then "a", then steps "c": "bac". A recomputation in offset order gives "abc", not the backfill's
    # value, so it cannot stand for the operator: a stream value that it reproduces with the late k@6 s (d, after
    # x@30 s closed the session) added, "abcd", proves nothing and stays unexplained.
    job = ran_job(tmp_path, FOLDED, [("k", "a", 0, 9000), ("k", "b", 0, 1000), ("k", "c", 0, 5000),
                                     ("x", "-", 0, 30_000), ("k", "d", 0, 6000), ("y", "-", 0, 40_000)])
    ours = [json.loads(line) for line in (tmp_path / "out" / "sessions.jsonl").read_text().splitlines()]
    assert [(r["key"], r["window_start"], r["window_end"], r["trail"]) for r in ours if r["key"] == "k"] == [
        ("k", 1000, 9000, "bac")]
    stream = [{**r, "trail": "abcd" if r["key"] == "k" else r["trail"], "partition": 0, "offset": i}
              for i, r in enumerate(ours)]
    section = _verify(job, "sessions", write_jsonl(tmp_path / "stream.jsonl", stream), tmp_path)
    assert section["counts"]["mismatch"] == 1
    assert {c: n for c, n in section["causes"].items() if n} == {"unexplained": 1}
