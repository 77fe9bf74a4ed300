"""Golden timelines for stream-stream joins (docs/semantics.md §5) via `backfill run`.

The cases come from kafka-streams-examples.json (TopologyTestDriver runs: each input is processed as it
is piped, so the job takes the processing order from `seq`), plus a few timelines for rules the vectors
do not show. All cases run through ONE job file per engine: each case has its own partition number, so
it is its own task (no state or stream time crosses tasks), and each join configuration is one operator.
Every test reads one case: its operator's rows of its task, in emission order (emit_seq).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from backfill.ops.join import STRIDE
from tests.conftest import examples
from tests.golden.harness import JOINER, Outcome, run_job, sided_timeline

pytestmark = pytest.mark.spark
CASES = examples()
NULL_KEYS = [{"side": "left", "key": None, "value": "L", "ts": 5},
             {"side": "right", "key": None, "value": "R", "ts": 6},
             {"side": "left", "key": 1, "value": None, "ts": 7}]
REFUSED = [{"side": "right", "key": 1, "value": "r0", "ts": 100}, {"side": "left", "key": 1, "value": "l0", "ts": 50},
           {"side": "right", "key": 1, "value": "r1", "ts": 60}, {"side": "right", "key": 2, "value": "r2", "ts": 20}]
# case -> (inputs, how, (before, after, grace), eager); the example's window unless the case says otherwise
GOLDEN: dict[str, tuple[list[dict[str, Any]], str, tuple[int, int, int], bool]] = {
    "join-inner-asymmetric-after": (CASES["join-inner-asymmetric-after"]["inputs"], "inner", (0, 100, 0), False),
    "join-null-value-skip": (CASES["join-null-value-skip"]["inputs"], "inner", (100, 100, 0), False),
    "join-outer-throttle-wallclock": (CASES["join-outer-throttle-wallclock"]["inputs"], "outer", (1000, 1000, 0),
                                      False),
    "leftjoin-asymmetric-before-zero": (CASES["leftjoin-asymmetric-before-zero"]["inputs"], "left", (0, 100, 0),
                                        False),
    "leftjoin-expired-emitted-by-left": (CASES["leftjoin-expired-emitted-by-left"]["inputs"], "left", (100, 100, 0),
                                         False),
    "leftjoin-grace": (CASES["leftjoin-grace"]["inputs"], "left", (100, 100, 10), False),
    "leftjoin-windowing": (CASES["leftjoin-windowing"]["inputs"], "left", (100, 100, 0), False),
    "outerjoin-asymmetric-after-zero": (CASES["outerjoin-asymmetric-after-zero"]["inputs"], "outer", (100, 0, 0),
                                        False),
    "outerjoin-duplicates": (CASES["outerjoin-duplicates"]["inputs"], "outer", (100, 100, 10), False),
    "outerjoin-ordering": (CASES["outerjoin-ordering"]["inputs"], "outer", (100, 100, 0), False),
    "eager-left-on-outerjoin-ordering": (CASES["outerjoin-ordering"]["inputs"], "left", (100, 100, 86_399_800), True),
    "null-keys-left": (NULL_KEYS, "left", (10, 10, 0), False),
    "refused-write-inner": (REFUSED, "inner", (10, 10, 5), False),
}
TASK = {case: i for i, case in enumerate(GOLDEN)}


def _operator(case: str) -> str:
    _, how, (before, after, grace), eager = GOLDEN[case]
    return f"{how}_{before}_{after}_{grace}{'_eager' if eager else ''}"


def _job() -> str:
    ops = {_operator(case): spec for case, spec in GOLDEN.items()}
    lines = []
    for name, (_, how, (before, after, grace), eager) in ops.items():
        window = f"{{before: {before}ms, after: {after}ms" + ("}" if eager else f", grace: {grace}ms}}")
        lines.append(f"  - {{name: {name}, join: {{left: left, right: right, how: {how}, eager: {str(eager).lower()}, "
                     f"window: {window}, value: \"{JOINER}\"}}}}")
    sinks = "".join(f"  {name}: {{format: jsonl, path: out/{name}.jsonl}}\n" for name in ops)
    sources = "".join(f"  {side}: {{format: jsonl, path: inputs/{side}.jsonl, order_by: seq, "
                      f"partitions: {len(TASK)}}}\n" for side in ("left", "right"))
    return (f"name: golden-join\nsources:\n{sources}operators:\n" + "\n".join(lines) + f"\nsinks:\n{sinks}"
            "  _ledger: {format: jsonl, path: out/ledger.jsonl}\n  _runs: {format: jsonl, path: out/runs.jsonl}\n")


def _inputs() -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {"left": [], "right": []}
    for case, (inputs, *_) in GOLDEN.items():
        for side, rows in sided_timeline(inputs, partition=TASK[case]).items():
            out[side] += rows
    return out


@pytest.fixture(scope="module", params=["spark", "reference"])
def golden(request: Any, tmp_path_factory: Any, spark_module: Any) -> tuple[str, Outcome]:
    """One run of every golden timeline, per engine."""
    got = run_job(Path(tmp_path_factory.mktemp("golden-join")), _job(), _inputs(), engine=request.param)
    assert got.code == 0, got.stderr
    return request.param, got


def _emitted(golden: tuple[str, Outcome], case: str) -> list[tuple]:
    rows = [r for r in golden[1].outputs.get(_operator(case), []) if r["task"] == TASK[case]]
    return [(r["key"], r["value"], r["ts"]) for r in sorted(rows, key=lambda r: r["emit_seq"])]


def _expected(case: str) -> list[tuple]:
    return [(None if o["key"] is None else str(o["key"]), o["value"], o["ts"])
            for o in CASES[case]["expected_outputs"]]


def _ledger(golden: tuple[str, Outcome], case: str) -> list[dict[str, Any]]:
    return [d for d in golden[1].ledger if d["operator"] == _operator(case) and d["partition"] == TASK[case]]


def test_inner_join_bounds_are_inclusive_and_asymmetric(golden):
    """join-inner-asymmetric-after: before 0, after 100: a right row at 999 never joins A0@1000."""
    assert _emitted(golden, "join-inner-asymmetric-after") == _expected("join-inner-asymmetric-after")
    assert _ledger(golden, "join-inner-asymmetric-after") == []


def test_inner_join_skips_a_null_value_into_the_ledger(golden):
    assert _emitted(golden, "join-null-value-skip") == []
    assert [(d["reason"], d["topic"], d["offset"]) for d in _ledger(golden, "join-null-value-skip")] == [
        ("null_value", "left", 0)]


def test_left_join_row_closes_by_after_not_before(golden):
    """leftjoin-asymmetric-before-zero: A1@1 is open at 100 (1 + 100 >= 100), emitted at 102."""
    assert _emitted(golden, "leftjoin-asymmetric-before-zero") == _expected("leftjoin-asymmetric-before-zero")


def test_left_join_non_joined_rows_keep_their_own_timestamp(golden):
    assert _emitted(golden, "leftjoin-expired-emitted-by-left") == _expected("leftjoin-expired-emitted-by-left")


def test_left_join_grace_holds_non_joined_rows(golden):
    """leftjoin-grace: open at 101 (0 + 100 + 10 >= 101); the jump to 1201 emits both."""
    assert _emitted(golden, "leftjoin-grace") == _expected("leftjoin-grace")


def test_left_join_windowing_immediate_and_batched_null_results(golden):
    """leftjoin-windowing: the batch at 1405 in (ts, right before left, key) order; rows arriving with
    ts + after < ST_j and no partner come out at once; a late left row still joins a retained right row."""
    assert _emitted(golden, "leftjoin-windowing") == _expected("leftjoin-windowing")


def test_outer_join_right_row_closes_at_ts_plus_before(golden):
    """outerjoin-asymmetric-after-zero: 12@101 closes at 101 + 100 + 0 = 201, not at 201: it joins A2."""
    assert _emitted(golden, "outerjoin-asymmetric-after-zero") == _expected("outerjoin-asymmetric-after-zero")


def test_outer_join_duplicates_and_right_before_left_at_equal_ts(golden):
    assert _emitted(golden, "outerjoin-duplicates") == _expected("outerjoin-duplicates")


def test_outer_join_pending_rows_before_the_trigger_own_result(golden):
    assert _emitted(golden, "outerjoin-ordering") == _expected("outerjoin-ordering")


def test_outer_join_emission_without_the_wall_clock_throttle(golden):
    """join-outer-throttle-wallclock: emit interval 0 (TopologyTestDriver) instead of 1 s of wall clock.

    Same final state as the test (after key4 one row waits: key4); the throttle held key2 back while
    key3 was processed (store size 2 there); with interval 0 it comes out at once (docs/semantics.md §5.6).
    """
    case = "join-outer-throttle-wallclock"
    rows = sorted((r for r in golden[1].outputs[_operator(case)] if r["task"] == TASK[case]),
                  key=lambda r: r["emit_seq"])
    # (value, ts, seq of the record whose processing emitted it): key1 at key2, key2 at key3, key3 at key4
    assert [(r["value"], r["ts"], r["emit_seq"] // STRIDE) for r in rows] == [
        ("null+value1", 10000, 2), ("null+value2", 13000, 3), ("null+value3", 15000, 4)]
    # the left side is empty: each right record is emitted or still waits in the outer store
    inputs = [r for r in CASES[case]["inputs"] if "side" in r]
    assert len(inputs) - len(rows) == CASES[case]["expected_outputs"][1]["size"]


def test_eager_left_join_emits_null_results_at_once_and_contradicts_them(golden):
    """Fix disabled (JoinWindows.of, 10.6) on the outerjoin-ordering timeline: no outer store, A1+null is
    forwarded immediately and the later match A1+11 follows it."""
    case = "eager-left-on-outerjoin-ordering"
    assert _emitted(golden, case) == [("0", "A0+null", 0), ("1", "A1+null", 100), ("1", "A1+11", 110)]


def test_outer_side_null_key_is_forwarded_and_the_other_side_ledgered(golden):
    """3.7+ (KIP-962, 10.2 step 2): a left join forwards a left null key at once; a right one is dropped;
    join stream time advances before the null checks (the ledger's stream_time)."""
    assert _emitted(golden, "null-keys-left") == [(None, "L+null", 5)]
    assert sorted((d["reason"], d["topic"], d["stream_time"]) for d in _ledger(golden, "null-keys-left")) == [
        ("null_key", "right", 6), ("null_value", "left", 7)]


def test_inner_join_write_refused_by_retention_is_ledgered_as_expired(golden):
    """A right row written with ts <= storeST - (before + after + G) is dropped by its store (9) and,
    having joined nothing, is `expired`; a late row that still finds a partner (r1) is not."""
    assert _emitted(golden, "refused-write-inner") == [("1", "l0+r1", 60)]
    assert [(d["reason"], d["offset"], d["stream_time"]) for d in _ledger(golden, "refused-write-inner")] == [
        ("expired", 2, 100)]


def test_eager_grace_defaults_like_deprecated_join_windows_of(tmp_path):
    """jw-deprecated-default-grace: JoinWindows.of(d) has grace max(24h - 2d, 0); the new API needs grace."""
    from backfill.errors import SpecError
    from backfill.ops.windows import JoinWindows
    from backfill.jobspec.load import load_job
    from tests.golden.harness import join_job

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
