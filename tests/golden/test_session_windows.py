"""Golden timelines for session windows (docs/semantics.md §11) via `backfill run`.

The cases of kafka-streams-examples.json, plus the rules they do not reach (late record accepted by a still
open session, store visibility, tombstone order, folds with merge); both engines must give exactly these.
"""
from __future__ import annotations

import pytest

from tests.conftest import examples
from tests.golden.harness import aggregate_job, run_job, timeline

pytestmark = pytest.mark.spark
ENGINES = ["spark", "reference"]
CASES = examples()
TRAIL = "{v: {fold: {init: \"''\", step: \"concat(acc, value)\", merge: \"concat(a, b)\"}}}"


def _sessions(rows: list[dict], value: str = "v") -> list[tuple]:
    return [(r["key"], r["window_start"], r["window_end"], r[value], r["ts"]) for r in rows]


def _in_order(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: (r["task"], r["emit_seq"]))


def _bracketed(o: dict) -> tuple:
    k, span = o["key"][1:-1].split("@")
    return (k, int(span.split("/")[0]), int(span.split("/")[1]), o["value"], o["ts"])


@pytest.mark.parametrize("engine", ENGINES)
def test_merge_forwards_a_tombstone_before_the_merged_session(tmp_path, spark, engine):
    case = CASES["session-forward-removed-on-merge"]
    inputs = timeline([(r["key"], r["value"], r["ts"]) for r in case["inputs"]])
    got = run_job(tmp_path, aggregate_job("{type: session, gap: 300000ms, grace: 0ms}", "{v: count()}", "updates"),
                  {"s": inputs}, engine=engine)
    assert got.code == 0, got.stderr
    expected = [(o["key"], o["window_start"], o["window_end"], o["value"], o["ts"]) for o in case["expected_outputs"]]
    assert _sessions(_in_order(got.outputs["agg"])) == expected


@pytest.mark.parametrize("engine", ENGINES)
def test_final_emits_sessions_closed_by_stream_time_shared_across_keys(tmp_path, spark, engine):
    case = CASES["session-multi-merge-close"]
    inputs = timeline([(r["key"], r["value"], r["ts"]) for r in case["inputs"]])
    got = run_job(tmp_path, aggregate_job("{type: session, gap: 300000ms, grace: 0ms}", "{v: count()}", "final"),
                  {"s": inputs}, engine=engine)
    assert got.code == 0, got.stderr
    expected = [(o["key"], o["window_start"], o["window_end"], o["value"], o["ts"]) for o in case["expected_outputs"]]
    assert sorted(_sessions(got.outputs["agg"])) == sorted(expected)
    assert got.ledger == []
    # a@[300001,450001], b@[300001,300001], c@[450001,450001] are still open at stream time 450001
    incomplete = got.summary["operators"]["agg"]["incomplete_windows"] if engine == "spark" else \
        len(got.summary["incomplete"]["agg"])
    assert incomplete == 3


@pytest.mark.parametrize("engine", ENGINES)
def test_suppress_final_session_windows_raw_and_suppressed(tmp_path, spark, engine):
    case = CASES["suppress-final-session-windows"]
    inputs = timeline([(r["key"], r["value"], r["ts"]) for r in case["inputs"]])
    raw = [_bracketed(o) for o in case["expected_outputs"] if o["topic"] == "output-raw"]
    final = [_bracketed(o) for o in case["expected_outputs"] if o["topic"] == "output-suppressed"]
    window = "{type: session, gap: 5ms, grace: 0ms}"
    updates = run_job(tmp_path / "u", aggregate_job(window, "{v: count()}", "updates"), {"s": inputs}, engine=engine)
    assert updates.code == 0, updates.stderr
    assert _sessions(_in_order(updates.outputs["agg"])) == raw
    # the vector's topology suppresses (docs/semantics.md 4.5)
    suppressed = aggregate_job(window, "{v: count()}", "final\n      close: suppress")
    closed = run_job(tmp_path / "f", suppressed, {"s": inputs}, engine=engine)
    assert closed.code == 0, closed.stderr
    assert sorted(_sessions(closed.outputs["agg"])) == sorted(final)
    # k1@5 (offset 4) at stream time 11: [0,5] is no longer visible (end 5 <= 11 - 5), so its merged window is
    # [5,5], which ends before the close time 11 - 0 - 5 = 6: late, in both modes
    for got in (updates, closed):
        assert [(d["offset"], d["timestamp"], d["reason"], d["window_start"], d["window_end"], d["stream_time"])
                for d in got.ledger] == [(4, 5, "late", 5, 5, 11)]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("stream_time,late", [(11, True), (10, False)])
def test_late_rule_tests_the_merged_end_at_the_zero_grace_boundary(tmp_path, spark, engine, stream_time, late):
    # gap 10, grace 0: a record at 0 is late once ST - 10 > 0 (docs/semantics.md §11.2, session-late-zero-grace)
    inputs = timeline([("other", "x", stream_time), ("k", "a", 0)])
    got = run_job(tmp_path, aggregate_job("{type: session, gap: 10ms, grace: 0ms}", "{v: count()}", "updates"),
                  {"s": inputs}, engine=engine)
    assert got.code == 0, got.stderr
    assert [(d["key"], d["reason"]) for d in got.ledger] == ([("k", "late")] if late else [])
    assert ("k", 0, 0, 1, 0) in _sessions(got.outputs["agg"]) or late


@pytest.mark.parametrize("engine", ENGINES)
def test_a_late_record_inside_a_still_open_session_is_accepted(tmp_path, spark, engine):
    # gap 10, grace 0: the session [20,30] is still open at ST 35 (close 25); a record at 21 is behind the close
    # time, but its merged window [20,30] ends after it, so it is aggregated (the merged end is tested)
    inputs = timeline([("k", "a", 20), ("k", "b", 30), ("other", "x", 35), ("k", "c", 21)])
    got = run_job(tmp_path, aggregate_job("{type: session, gap: 10ms, grace: 0ms}", TRAIL, "updates"),
                  {"s": inputs}, engine=engine)
    assert got.code == 0, got.stderr
    assert _sessions(_in_order(got.outputs["agg"])) == [
        ("k", 20, 20, "a", 20), ("k", 20, 20, None, 20), ("k", 20, 30, "ab", 30), ("other", 35, 35, "x", 35),
        ("k", 20, 30, None, 30), ("k", 20, 30, "abc", 30)]
    assert got.ledger == []


@pytest.mark.parametrize("engine", ENGINES)
def test_a_bridging_record_merges_two_sessions_with_the_merger(tmp_path, spark, engine):
    # sessions [0,0] and [20,25]; 10 finds both (end >= 0, start <= 20): two tombstones in store order, then
    # [0,25] with merge(merge(init, [0,0]), [20,25]) stepped with the record
    inputs = timeline([("k", "a", 0), ("k", "b", 20), ("k", "c", 25), ("k", "d", 10)])
    fold = "{v: {fold: {init: \"'<'\", step: \"concat(acc, value)\", merge: \"concat(a, '|', b)\"}}, n: count()}"
    got = run_job(tmp_path, aggregate_job("{type: session, gap: 10ms, grace: 100ms}", fold, "updates"),
                  {"s": inputs}, engine=engine)
    assert got.code == 0, got.stderr
    rows = [(r["window_start"], r["window_end"], r["v"], r["n"], r["ts"]) for r in _in_order(got.outputs["agg"])]
    assert rows == [(0, 0, "<a", 1, 0), (20, 20, "<b", 1, 20), (20, 20, None, None, 20), (20, 25, "<|<bc", 2, 25),
                    (0, 0, None, None, 0), (20, 25, None, None, 25), (0, 25, "<|<a|<|<bcd", 4, 25)]


@pytest.mark.parametrize("engine", ENGINES)
def test_final_values_of_merged_sessions_and_incomplete_ones(tmp_path, spark, engine):
    inputs = timeline([("k", "a", 0), ("k", "b", 20), ("k", "c", 25), ("k", "d", 10), ("k", "e", 100),
                       ("j", "f", 60), ("j", "g", 200)])
    fold = "{v: {fold: {init: \"'<'\", step: \"concat(acc, value)\", merge: \"concat(a, '|', b)\"}}, " \
           "n: count(), last: last(value)}"
    got = run_job(tmp_path, aggregate_job("{type: session, gap: 10ms, grace: 50ms}", fold, "final"),
                  {"s": inputs}, engine=engine)
    assert got.code == 0, got.stderr
    rows = sorted((r["key"], r["window_start"], r["window_end"], r["v"], r["n"], r["last"], r["ts"])
                  for r in got.outputs["agg"])
    # ST 200, close 140: [0,25], [100,100] and [60,60] are final; [200,200] is still open
    assert rows == [("j", 60, 60, "<f", 1, "f", 60), ("k", 0, 25, "<|<a|<|<bcd", 4, "d", 25),
                    ("k", 100, 100, "<e", 1, "e", 100)]


def test_a_fold_on_session_windows_needs_a_merge(tmp_path, spark):
    job = aggregate_job("{type: session, gap: 10ms, grace: 0ms}",
                        "{v: {fold: {init: \"''\", step: \"concat(acc, value)\"}}}", "updates")
    got = run_job(tmp_path, job, {"s": timeline([("k", "a", 0)])})
    assert got.code == 2
    assert "aggregations.v.fold.merge" in got.stderr and "a + b" in got.stderr


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("emit", ["updates", "final"])
def test_a_session_the_store_hides_is_replaced_by_a_new_one_with_the_same_bounds(tmp_path, spark, engine, emit):
    # gap 10, grace 0: at stream time 10 the session [0,0] is hidden (end 0 <= 10 - 10) but a record at 0 is not
    # late (close time 0): it starts a new [0,0], which the store keeps under the same (key, end, start)
    inputs = timeline([("k", "a", 0), ("other", "x", 10), ("k", "b", 0), ("other", "y", 11)])
    got = run_job(tmp_path, aggregate_job("{type: session, gap: 10ms, grace: 0ms}", TRAIL, emit),
                  {"s": inputs}, engine=engine)
    assert got.code == 0, got.stderr
    if emit == "updates":  # no tombstone for the hidden [0,0]: the record found nothing
        assert _sessions(_in_order(got.outputs["agg"])) == [
            ("k", 0, 0, "a", 0), ("other", 10, 10, "x", 10), ("k", 0, 0, "b", 0), ("other", 10, 10, None, 10),
            ("other", 10, 11, "xy", 11)]
    else:  # one session [0,0] for k, the one the store holds
        assert _sessions(got.outputs["agg"]) == [("k", 0, 0, "b", 0)]
    assert got.ledger == []


@pytest.mark.parametrize("engine", ENGINES)
def test_emit_on_close_never_emits_a_session_whose_segment_its_closing_record_dropped(tmp_path, spark, engine):
    # gap 30 s, grace 10 s: retention 40 s, segments of max(20 s, 60 s) = 60 s by session end (§4.8, §11.5).
    # a@91,400 is closed by b@131,500 (close 91,500), whose put drops the segments before that of 91,500: a's
    # (60,000-119,999) is live, a is emitted. c@230,000 closes b (close 190,000) and drops every segment before
    # 180,000: b's (120,000-179,999) is gone, b is never emitted. e@275,000 closes c (close 235,000), whose
    # segment (180,000-239,999) is live. d and e stay open. Kafka Streams' judge draws such sessions too.
    inputs = timeline([("a", "1", 91_400), ("b", "2", 131_500), ("c", "3", 230_000), ("d", "4", 235_000),
                       ("e", "5", 275_000)])
    got = run_job(tmp_path, aggregate_job("{type: session, gap: 30s, grace: 10s}", "{v: count()}", "final"),
                  {"s": inputs}, engine=engine)
    assert got.code == 0, got.stderr
    assert sorted(_sessions(got.outputs["agg"])) == [("a", 91_400, 91_400, 1, 91_400), ("c", 230_000, 230_000, 1,
                                                                                          230_000)]
    assert got.ledger == []
    incomplete = got.summary["operators"]["agg"]["incomplete_windows"] if engine == "spark" else \
        len(got.summary["incomplete"]["agg"])
    assert incomplete == 2  # d and e; b is neither output nor open
