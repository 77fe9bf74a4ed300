"""Golden timelines for stream-stream joins (kafka-streams.md 3.4, 9, 10, 11) via `backfill run`.

Each case comes from kafka-streams-examples.json (TopologyTestDriver runs: each input is processed as it
is piped, so the jobs take the processing order from `seq`). Both engines must produce exactly the
expected records, in emission order (task, emit_seq).
"""
from __future__ import annotations

from typing import Any

import pytest

from backfill.ops.join import STRIDE
from tests.conftest import examples
from tests.golden.harness import Outcome, join_job, run_job, sided_timeline

pytestmark = pytest.mark.spark
ENGINES = ["spark", "reference"]
CASES = examples()


def _window(case: dict[str, Any]) -> str:
    cfg = case["config"]
    if "before_ms" in cfg:
        return f"{{before: {cfg['before_ms']}ms, after: {cfg['after_ms']}ms, grace: {cfg['grace_ms']}ms}}"
    assert cfg["windows"] == "JoinWindows.ofTimeDifferenceWithNoGrace(100ms)"
    return "{before: 100ms, after: 100ms, grace: 0ms}"


def _run(tmp, case_id: str, how: str, engine: str, **job: Any) -> Outcome:
    case = CASES[case_id]
    got = run_job(tmp, join_job(how, job.pop("window", _window(case)), **job), sided_timeline(case["inputs"]),
                  engine=engine)
    assert got.code == 0, got.stderr
    return got


def _emitted(got: Outcome) -> list[tuple]:
    rows = sorted(got.outputs.get("j", []), key=lambda r: (r["task"], r["emit_seq"]))
    return [(r["key"], r["value"], r["ts"]) for r in rows]


def _expected(case_id: str) -> list[tuple]:
    return [(o["key"], o["value"], o["ts"]) for o in CASES[case_id]["expected_outputs"]]


def _pending(got: Outcome, engine: str) -> int:
    if engine == "spark":
        return got.summary["operators"]["j"]["incomplete_windows"]
    return len(got.summary["incomplete"]["j"])


@pytest.mark.parametrize("engine", ENGINES)
def test_inner_join_bounds_are_inclusive_and_asymmetric(tmp_path, spark, engine):
    """join-inner-asymmetric-after: before 0, after 100: a right row at 999 never joins A0@1000."""
    got = _run(tmp_path, "join-inner-asymmetric-after", "inner", engine)
    assert _emitted(got) == _expected("join-inner-asymmetric-after")
    assert got.ledger == []


@pytest.mark.parametrize("engine", ENGINES)
def test_inner_join_skips_a_null_value_into_the_ledger(tmp_path, spark, engine):
    got = _run(tmp_path, "join-null-value-skip", "inner", engine, key_format="string")
    assert _emitted(got) == []
    assert [(d["reason"], d["operator"], d["topic"], d["partition"], d["offset"]) for d in got.ledger] == [
        ("null_value", "j", "left", 0, 0)]


@pytest.mark.parametrize("engine", ENGINES)
def test_left_join_row_closes_by_after_not_before(tmp_path, spark, engine):
    """leftjoin-asymmetric-before-zero: A1@1 is open at 100 (1 + 100 >= 100), emitted at 102."""
    got = _run(tmp_path, "leftjoin-asymmetric-before-zero", "left", engine)
    assert _emitted(got) == _expected("leftjoin-asymmetric-before-zero")


@pytest.mark.parametrize("engine", ENGINES)
def test_left_join_non_joined_rows_keep_their_own_timestamp(tmp_path, spark, engine):
    got = _run(tmp_path, "leftjoin-expired-emitted-by-left", "left", engine)
    assert _emitted(got) == _expected("leftjoin-expired-emitted-by-left")
    assert _pending(got, engine) == 0


@pytest.mark.parametrize("engine", ENGINES)
def test_left_join_grace_holds_non_joined_rows(tmp_path, spark, engine):
    """leftjoin-grace: open at 101 (0 + 100 + 10 >= 101); the jump to 1201 emits both."""
    got = _run(tmp_path, "leftjoin-grace", "left", engine)
    assert _emitted(got) == _expected("leftjoin-grace")


@pytest.mark.parametrize("engine", ENGINES)
def test_left_join_windowing_immediate_and_batched_null_results(tmp_path, spark, engine):
    """leftjoin-windowing: the batch at 1405 in (ts, right before left, key) order; rows arriving with
    ts + after < ST_j and no partner come out at once; a late left row still joins a retained right row."""
    got = _run(tmp_path, "leftjoin-windowing", "left", engine)
    assert _emitted(got) == _expected("leftjoin-windowing")


@pytest.mark.parametrize("engine", ENGINES)
def test_outer_join_right_row_closes_at_ts_plus_before(tmp_path, spark, engine):
    """outerjoin-asymmetric-after-zero: 12@101 closes at 101 + 100 + 0 = 201, not at 201: it joins A2."""
    got = _run(tmp_path, "outerjoin-asymmetric-after-zero", "outer", engine)
    assert _emitted(got) == _expected("outerjoin-asymmetric-after-zero")


@pytest.mark.parametrize("engine", ENGINES)
def test_outer_join_duplicates_and_right_before_left_at_equal_ts(tmp_path, spark, engine):
    got = _run(tmp_path, "outerjoin-duplicates", "outer", engine)
    assert _emitted(got) == _expected("outerjoin-duplicates")


@pytest.mark.parametrize("engine", ENGINES)
def test_outer_join_pending_rows_before_the_trigger_own_result(tmp_path, spark, engine):
    got = _run(tmp_path, "outerjoin-ordering", "outer", engine)
    assert _emitted(got) == _expected("outerjoin-ordering")


@pytest.mark.parametrize("engine", ENGINES)
def test_outer_join_emission_without_the_wall_clock_throttle(tmp_path, spark, engine):
    """join-outer-throttle-wallclock: emit interval 0 (TopologyTestDriver) instead of 1 s of wall clock.

    Same final state as the test (after key4 one row waits: key4); the throttle held key2 back while
    key3 was processed (store size 2 there); with interval 0 it comes out at once (kafka-streams.md 14.2).
    """
    got = _run(tmp_path, "join-outer-throttle-wallclock", "outer", engine, key_format="string")
    rows = sorted(got.outputs["j"], key=lambda r: r["emit_seq"])
    # (value, ts, seq of the record whose processing emitted it): key1 at key2, key2 at key3, key3 at key4
    assert [(r["value"], r["ts"], r["emit_seq"] // STRIDE) for r in rows] == [
        ("null+value1", 10000, 2), ("null+value2", 13000, 3), ("null+value3", 15000, 4)]
    assert _pending(got, engine) == CASES["join-outer-throttle-wallclock"]["expected_outputs"][1]["size"]


@pytest.mark.parametrize("engine", ENGINES)
def test_eager_left_join_emits_null_results_at_once_and_contradicts_them(tmp_path, spark, engine):
    """Fix disabled (JoinWindows.of, 10.6) on the outerjoin-ordering timeline: no outer store, A1+null is
    forwarded immediately and the later match A1+11 follows it."""
    got = _run(tmp_path, "outerjoin-ordering", "left", engine, eager=True)
    assert _emitted(got) == [(0, "A0+null", 0), (1, "A1+null", 100), (1, "A1+11", 110)]
    assert _pending(got, engine) == 0


@pytest.mark.parametrize("engine", ENGINES)
def test_outer_null_key_is_forwarded_and_inner_side_null_key_is_ledgered(tmp_path, spark, engine):
    """3.7+ (KIP-962, 10.2 step 2): a left join forwards a left null key at once; a right one is dropped."""
    inputs = [{"side": "left", "key": None, "value": "L", "ts": 5},
              {"side": "right", "key": None, "value": "R", "ts": 6},
              {"side": "left", "key": 1, "value": None, "ts": 7}]
    got = run_job(tmp_path, join_job("left", "{before: 10ms, after: 10ms, grace: 0ms}"), sided_timeline(inputs),
                  engine=engine)
    assert got.code == 0, got.stderr
    assert _emitted(got) == [(None, "L+null", 5)]
    assert sorted((d["reason"], d["topic"], d["stream_time"]) for d in got.ledger) == [
        ("null_key", "right", 6), ("null_value", "left", 7)]


@pytest.mark.parametrize("engine", ENGINES)
def test_inner_join_write_refused_by_retention_is_ledgered_as_expired(tmp_path, spark, engine):
    """A right row written with ts <= storeST - (before + after + G) is dropped by its store (9) and,
    having joined nothing, is `expired`; a late row that still finds a partner is not."""
    inputs = [{"side": "right", "key": 1, "value": "r0", "ts": 100},
              {"side": "left", "key": 1, "value": "l0", "ts": 50},
              {"side": "right", "key": 1, "value": "r1", "ts": 60},
              {"side": "right", "key": 2, "value": "r2", "ts": 20}]
    got = run_job(tmp_path, join_job("inner", "{before: 10ms, after: 10ms, grace: 5ms}"), sided_timeline(inputs),
                  engine=engine)
    assert got.code == 0, got.stderr
    assert _emitted(got) == [(1, "l0+r1", 60)]
    assert [(d["reason"], d["offset"], d["stream_time"]) for d in got.ledger] == [("expired", 2, 100)]


def test_eager_grace_defaults_like_deprecated_join_windows_of(tmp_path):
    """jw-deprecated-default-grace: JoinWindows.of(d) has grace max(24h - 2d, 0); the new API needs grace."""
    from backfill.errors import SpecError
    from backfill.ops.windows import JoinWindows
    from backfill.spec import load_job

    case = CASES["jw-deprecated-default-grace"]
    for call, expected in zip(case["inputs"], case["expected_outputs"], strict=True):
        d = int(call["call"].split("(")[1].rstrip(")"))
        eager = call["call"].startswith("JoinWindows.of(")
        window = f"{{before: {d}ms, after: {d}ms}}" if eager else f"{{before: {d}ms, after: {d}ms, grace: 0ms}}"
        (tmp_path / "job.yaml").write_text(join_job("left", window, eager=eager))
        spec = load_job(tmp_path / "job.yaml").spec.operators[0].join
        assert JoinWindows.of(spec).grace == expected["gracePeriodMs"]
    (tmp_path / "job.yaml").write_text(join_job("left", "{before: 3ms, after: 3ms}"))
    with pytest.raises(SpecError, match="grace"):
        load_job(tmp_path / "job.yaml")
