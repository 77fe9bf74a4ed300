"""Golden timelines for sliding windows (docs/semantics.md §10) via `backfill run`.

The cases of kafka-streams-examples.json (their tests compare, per window start, the set of (value, ts)
emitted, so these do too), plus the rules they do not reach; both engines must give exactly these.
"""
from __future__ import annotations

from collections import defaultdict

import pytest

from tests.conftest import examples
from tests.golden.harness import aggregate_job, run_job, timeline

pytestmark = pytest.mark.spark
ENGINES = ["spark", "reference"]
CASES = examples()
CONCAT = "{v: {fold: {init: \"'0'\", step: \"concat(acc, '+', value)\"}}}"
# reduce: the first value is the aggregate itself (no initializer)
REDUCE = "{v: {fold: {init: \"cast(null as string)\", step: \"if(acc is null, value, concat(acc, '+', value))\"}}}"


def _inputs(case_id: str) -> list[dict]:
    return timeline([(r["key"], r["value"], r["ts"]) for r in CASES[case_id]["inputs"]])


def _per_start(rows: list[dict], value: str = "v") -> dict[int, set]:
    out: dict[int, set] = defaultdict(set)
    for r in rows:
        assert r["window_end"] == r["window_start"] + (r["window_end"] - r["window_start"])
        out[r["window_start"]].add((r[value], r["ts"]))
    return dict(out)


def _expected(case_id: str) -> dict[int, set]:
    return _per_start(CASES[case_id]["expected_outputs"], "value")


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("case_id,window,aggs", [
    ("sliding-agg-small-close", "{type: sliding, time_difference: 10ms, grace: 5ms}", CONCAT),
    ("sliding-reduce-small-close", "{type: sliding, time_difference: 10ms, grace: 5ms}", REDUCE),
    ("sliding-no-grace-close", "{type: sliding, time_difference: 50ms, grace: 0ms}", CONCAT),
    ("sliding-early-records-close", "{type: sliding, time_difference: 50ms, grace: 0ms}", CONCAT),
])
def test_final_results_on_window_close(tmp_path, spark, engine, case_id, window, aggs):
    got = run_job(tmp_path, aggregate_job(window, aggs, "final"), {"s": _inputs(case_id)}, engine=engine)
    assert got.code == 0, got.stderr
    assert _per_start(got.outputs["agg"]) == _expected(case_id)
    assert all(r["window_end"] - r["window_start"] == int(window.split("time_difference: ")[1].split("ms")[0])
               for r in got.outputs["agg"])


@pytest.mark.parametrize("engine", ENGINES)
def test_early_records_share_the_window_from_zero_every_update(tmp_path, spark, engine):
    case_id = "sliding-early-records-update"
    got = run_job(tmp_path, aggregate_job("{type: sliding, time_difference: 50ms, grace: 0ms}", CONCAT, "updates"),
                  {"s": _inputs(case_id)}, engine=engine)
    assert got.code == 0, got.stderr
    assert _per_start(got.outputs["agg"]) == _expected(case_id)
    assert len(got.outputs["agg"]) == len(CASES[case_id]["expected_outputs"])


@pytest.mark.parametrize("engine", ENGINES)
def test_suppress_final_sliding_windows_raw_and_suppressed(tmp_path, spark, engine):
    case = CASES["suppress-final-sliding-windows"]
    inputs = _inputs(case["id"])

    def key(o: dict) -> tuple:
        k, span = o["key"][1:-1].split("@")
        return (k, int(span.split("/")[0]), int(span.split("/")[1]), o["value"], o["ts"])

    raw = sorted(key(o) for o in case["expected_outputs"] if o["topic"] == "output-raw-sorted")
    final = sorted(key(o) for o in case["expected_outputs"] if o["topic"] == "output-suppressed")
    window = "{type: sliding, time_difference: 5ms, grace: 15ms}"
    updates = run_job(tmp_path / "u", aggregate_job(window, "{v: count()}", "updates"), {"s": inputs}, engine=engine)
    assert updates.code == 0, updates.stderr
    rows = [(r["key"], r["window_start"], r["window_end"], r["v"], r["ts"]) for r in updates.outputs["agg"]]
    assert sorted(rows) == raw
    # the vector's topology suppresses (docs/semantics.md 4.5)
    suppressed = aggregate_job(window, "{v: count()}", "final\n      close: suppress")
    closed = run_job(tmp_path / "f", suppressed, {"s": inputs}, engine=engine)
    assert closed.code == 0, closed.stderr
    assert sorted((r["key"], r["window_start"], r["window_end"], r["v"], r["ts"])
                  for r in closed.outputs["agg"]) == final
    # k1@5 and k1@7 (stream time 24, close 9) update [5,10] but their own left windows [0,5] and [2,7] end
    # before the close time: one `late` row per refused window (the code's "Skipping record for expired window")
    for got in (updates, closed):
        assert sorted((d["timestamp"], d["window_start"], d["window_end"], d["stream_time"], d["reason"])
                      for d in got.ledger) == [(5, 0, 5, 24, "late"), (7, 2, 7, 24, "late")]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_record_whose_right_window_would_have_ended_is_dropped(tmp_path, spark, engine):
    # D 10, grace 0: at stream time 30 a record at 19 is dropped (19 + 1 + 10 <= 30): one late row, for the
    # window [19, 29] Kafka Streams' skipped-record log names (§10.2); one at 20 is kept: it updates [20, 30] and
    # makes its right window [21, 31] (a copy without it), though its own left window [10, 20] has ended (a late
    # row for that window)
    inputs = timeline([("k", "a", 30), ("k", "b", 19), ("k", "c", 20)])
    got = run_job(tmp_path, aggregate_job("{type: sliding, time_difference: 10ms, grace: 0ms}", CONCAT, "updates"),
                  {"s": inputs}, engine=engine)
    assert got.code == 0, got.stderr
    assert sorted((d["timestamp"], d["window_start"], d["window_end"]) for d in got.ledger) == [
        (19, 19, 29), (20, 10, 20)]
    rows = sorted((r["window_start"], r["window_end"], r["v"], r["ts"]) for r in got.outputs["agg"])
    assert rows == [(20, 30, "0+a", 30), (20, 30, "0+a+c", 30), (21, 31, "0+a", 30)]


@pytest.mark.parametrize("engine", ENGINES)
def test_null_values_are_dropped_by_sliding_windows(tmp_path, spark, engine):
    inputs = timeline([("k", None, 5), (None, "x", 6), ("k", "a", 7)])
    got = run_job(tmp_path, aggregate_job("{type: sliding, time_difference: 10ms, grace: 0ms}", "{n: count()}",
                                          "updates"), {"s": inputs}, engine=engine)
    assert got.code == 0, got.stderr
    assert sorted(d["reason"] for d in got.ledger) == ["null_key", "null_value"]
    assert [(r["window_start"], r["n"]) for r in got.outputs["agg"]] == [(0, 1)]


def test_sliding_windows_have_no_legacy_grace(tmp_path, spark):
    got = run_job(tmp_path, aggregate_job("{type: sliding, time_difference: 10ms, grace: legacy}", "{n: count()}",
                                          "updates"), {"s": timeline([("k", "a", 1)])})
    assert got.code == 2 and "grace: sliding windows have no legacy default" in got.stderr
