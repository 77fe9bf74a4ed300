"""Golden timelines for the two final mechanisms (docs/semantics.md 4.5, 10.4, 11.5) on a 100 ms grid, where
stream time lands exactly on a window's end + grace (+ gap).

Each timeline runs through one job with two operators, `close: suppress` and `close: on_window_close`, in both
engines; the same timelines are replayed through Kafka Streams itself (TopologyTestDriver, jvm/harness) with
`suppress(untilWindowCloses)` and `emitStrategy(onWindowClose())`, so the expected rows are the real engine's.
Rows are (key, start, end, count, fold, ts); suppress's rows of sliding and session windows come in release
order (`emit_seq`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from backfill.conformance import harness
from tests.golden.harness import run_job, timeline

# the Spark engine's runs are slow (a job each); the reference engine's stay in the fast subset
ENGINES = [pytest.param("spark", marks=pytest.mark.slow), "reference"]
VERSIONS = ["4.4.0", "3.4.1"]  # the newest and the oldest line measured

# time windows (tumbling 1 s, grace 500 ms): stream time 1500 reaches [0, 1000)'s end + grace, and both
# mechanisms close it there; a@900 then comes late
TUMBLING = ("{type: tumbling, size: 1s, grace: 500ms}",
            [("a", "x", 200), ("b", "y", 1500), ("a", "z", 900), ("c", "w", 2600)])
TUMBLING_ROWS = [("a", 0, 1000, 1, "x", 200), ("b", 1000, 2000, 1, "y", 1500)]  # both mechanisms

# sessions (gap 1.5 s, grace 1 s): b@50100 brings stream time to a's end + 2500 (suppress releases [47600,
# 47600], emit-on-close holds it); a@47600 again is not late (its end is not before 50100 - 2500) but no longer
# sees the old session (the store keeps ends after 50100 - 2500): a new [47600, 47600] replaces it, and suppress
# releases it at once, a second row; d@54200 lands on c's [51300, 51700] end + 2500
SESSION = ("{type: session, gap: 1500ms, grace: 1s}",
           [("a", "x", 47600), ("b", "y", 50100), ("a", "z", 47600), ("c", "p", 51300), ("c", "q", 51700),
            ("d", "r", 54200)])
SESSION_ROWS = {
    "suppress": [("a", 47600, 47600, 1, "x", 47600), ("a", 47600, 47600, 1, "z", 47600),
                 ("b", 50100, 50100, 1, "y", 50100), ("c", 51300, 51700, 2, "pq", 51700)],
    "on_window_close": [("a", 47600, 47600, 1, "z", 47600), ("b", 50100, 50100, 1, "y", 50100)],
}

# sliding windows (time difference 1 s, grace 500 ms): b@10500 lands on a's [9000, 10000] end + grace
# (suppress releases it); a@9500 still updates it (its end is not before 10500 - 500), so suppress releases it
# again, while a@9500's own left window [8500, 9500] refuses it (late); d@11100 then c@11600 land on d's
# [10100, 11100] end + grace
SLIDING = ("{type: sliding, time_difference: 1s, grace: 500ms}",
           [("a", "x", 10000), ("b", "y", 10500), ("a", "z", 9500), ("d", "v", 11100), ("c", "w", 11600)])
SLIDING_ROWS = {
    "suppress": [("a", 9000, 10000, 1, "x", 10000), ("a", 9000, 10000, 2, "xz", 10000),
                 ("b", 9500, 10500, 1, "y", 10500), ("a", 9501, 10501, 1, "x", 10000),
                 ("d", 10100, 11100, 1, "v", 11100)],
    "on_window_close": [("a", 9000, 10000, 2, "xz", 10000), ("b", 9500, 10500, 1, "y", 10500),
                        ("a", 9501, 10501, 1, "x", 10000)],
}
LATE_A9500 = [(2, "late", 8500, 9500, 10500)]


def _job(window: str) -> str:
    merge = ", merge: \"concat(a, b)\"" if "session" in window else ""
    ops, sinks = [], []
    for close in ("suppress", "on_window_close"):
        ops.append(f"""  - name: {close}
    aggregate:
      input: s
      window: {window}
      aggregations: {{n: count(), f: {{fold: {{init: "''", step: "concat(acc, value)"{merge}}}}}}}
      emit: final
      close: {close}""")
        sinks.append(f"  {close}: {{format: jsonl, path: out/{close}.jsonl}}")
    return ("name: golden-final\nsources:\n  s: {format: jsonl, path: inputs/s.jsonl, value: {format: string}}\n"
            "operators:\n" + "\n".join(ops) + "\nsinks:\n" + "\n".join(sinks)
            + "\n  _ledger: {format: jsonl, path: out/ledger.jsonl}\n  _runs: {format: jsonl, path: out/runs.jsonl}\n")


def _rows(rows: list[dict[str, Any]]) -> list[tuple]:
    if rows and "emit_seq" in rows[0]:  # released more than once: in release order
        rows = sorted(rows, key=lambda r: (r["task"], r["emit_seq"]))
    else:
        rows = sorted(rows, key=lambda r: (r["window_start"], r["key"]))
    return [(r["key"], r["window_start"], r["window_end"], r["n"], r["f"], r["ts"]) for r in rows]


def _run(tmp_path: Path, case: tuple[str, list[tuple]], engine: str) -> Any:
    window, records = case
    got = run_job(tmp_path, _job(window), {"s": timeline(records)}, engine=engine)
    assert got.code == 0, got.stderr
    return got


def _late(got: Any, close: str) -> list[tuple]:
    return sorted((r["offset"], r["reason"], r["window_start"], r["window_end"], r["stream_time"])
                  for r in got.ledger if r["operator"] == close)


@pytest.mark.spark
@pytest.mark.parametrize("engine", ENGINES)
def test_time_windows_close_alike_when_stream_time_reaches_end_plus_grace(tmp_path, spark, engine):
    got = _run(tmp_path, TUMBLING, engine)
    for close in ("suppress", "on_window_close"):
        assert _rows(got.outputs[close]) == TUMBLING_ROWS, close
        assert _late(got, close) == [(2, "late", 0, 1000, 1500)]
        assert "emit_seq" not in got.outputs[close][0]  # a time window is released once


@pytest.mark.spark
@pytest.mark.parametrize("engine", ENGINES)
def test_suppress_releases_a_session_at_end_plus_gap_plus_grace_and_again_when_replaced(tmp_path, spark, engine):
    got = _run(tmp_path, SESSION, engine)
    for close, rows in SESSION_ROWS.items():
        assert _rows(got.outputs[close]) == rows, close
        assert _late(got, close) == []


@pytest.mark.spark
@pytest.mark.parametrize("engine", ENGINES)
def test_suppress_releases_a_sliding_window_at_end_plus_grace_and_again_when_updated(tmp_path, spark, engine):
    got = _run(tmp_path, SLIDING, engine)
    for close, rows in SLIDING_ROWS.items():
        assert _rows(got.outputs[close]) == rows, close
        assert _late(got, close) == LATE_A9500


def _replayed(kind: str, width: str, grace: int, emit: str, records: list[tuple], version: str) -> list[tuple]:
    """The timeline through Kafka Streams: rows in emission order, as (key, start, end, count, fold, ts)."""
    header = {"agg": f"S\t0\tagg\t{width}\t{width}\t{grace}\t{emit}", "sess": f"S\t0\tsess\t{width}\t{grace}\t{emit}",
              "slide": f"S\t0\tslide\t{width}\t{grace}\t{emit}"}[kind]
    if emit == "close":  # a window store that keeps every window (docs/semantics.md 4.5)
        header += "\tours\t86400000" if kind == "agg" else "\t86400000" if kind == "slide" else ""
    lines = [header, "T\t0", *[f"R\t-\t{k}\t1,{v}\t{t}" for k, v, t in records], "E"]
    reported, results = harness.replay("\n".join(lines) + "\n", [0], version)
    assert reported == version and results[0].error is None, results[0].error
    out = []
    for key, (start, end), value, ts in results[0].rows:
        count, _, fold = value.split("|")
        out.append((key, start, end, int(count), fold, ts))
    return out


@pytest.mark.jvm
@pytest.mark.parametrize("version", VERSIONS)
def test_the_timelines_are_what_kafka_streams_emits(version):
    for close, emit in (("suppress", "final"), ("on_window_close", "close")):
        tumbling = _replayed("agg", "1000", 500, emit, TUMBLING[1], version)
        assert sorted(tumbling, key=lambda r: (r[1], r[0])) == TUMBLING_ROWS, close
        assert _replayed("sess", "1500", 1000, emit, SESSION[1], version) == SESSION_ROWS[close], close
        sliding = _replayed("slide", "1000", 500, emit, SLIDING[1], version)
        # emit-on-close emits in window order, suppress in release order
        assert (sliding if close == "suppress" else sorted(sliding, key=lambda r: (r[1], r[0]))) == \
            (SLIDING_ROWS[close] if close == "suppress" else sorted(SLIDING_ROWS[close], key=lambda r: (r[1], r[0])))
