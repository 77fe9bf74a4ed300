"""Golden timelines for `where` (KStream#filter before an operator, docs/semantics.md §15) via `backfill run`."""
from __future__ import annotations

import pytest

from tests.golden.harness import run_job, timeline

pytestmark = pytest.mark.spark
ENGINES = ["spark", "reference"]


def _job(where: str = "", window: str = "{type: hopping, size: 10ms, advance: 5ms, grace: 0ms}") -> str:
    line = f"\n      where: \"{where}\"" if where else ""
    return f"""
name: golden-filter
sources:
  s: {{format: jsonl, path: inputs/s.jsonl, value: {{format: string}}}}
operators:
  - name: agg
    aggregate:
      input: s{line}
      window: {window}
      aggregations: {{n: count()}}
      emit: updates
sinks:
  agg: {{format: jsonl, path: out/agg.jsonl}}
  _ledger: {{format: jsonl, path: out/ledger.jsonl}}
  _runs: {{format: jsonl, path: out/runs.jsonl}}
"""


# b@30 moves stream time to 30, so a@8 is late for both its windows; filtered out, b never reaches the window
RECORDS = timeline([("a", "keep", 1), ("b", "drop", 30), ("a", "keep", 8)])


def _rows(got) -> list[tuple]:
    rows = sorted(got.outputs["agg"], key=lambda r: r["emit_seq"])
    return [(r["key"], r["window_start"], r["n"], r["ts"]) for r in rows]


def _filtered(got, engine: str, op: str = "agg") -> int:
    return got.summary["filtered"][op] if engine == "reference" else got.summary["operators"][op]["filtered"]


@pytest.mark.parametrize("engine", ENGINES)
def test_filtered_record_does_not_advance_stream_time_so_a_late_record_is_on_time(tmp_path, spark, engine):
    plain = run_job(tmp_path / "plain", _job(), {"s": RECORDS}, engine=engine)
    assert plain.code == 0, plain.stderr
    assert _rows(plain) == [("a", 0, 1, 1), ("b", 25, 1, 30), ("b", 30, 1, 30)]
    assert sorted((d["offset"], d["reason"], d["window_start"], d["stream_time"]) for d in plain.ledger) == [
        (2, "late", 0, 30), (2, "late", 5, 30)]
    kept = run_job(tmp_path / "kept", _job("value != 'drop'"), {"s": RECORDS}, engine=engine)
    assert kept.code == 0, kept.stderr
    # the difference is exactly b's windows and a@8's two late windows, now accepted
    assert _rows(kept) == [("a", 0, 1, 1), ("a", 0, 2, 8), ("a", 5, 1, 8)]
    assert kept.ledger == []  # a filtered record is no ledger row
    assert _filtered(kept, engine) == 1
    if engine == "spark":
        counts = kept.summary["operators"]["agg"]
        assert (counts["records_in"], counts["contributing"], counts["filtered"]) == (3, 2, 1)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_null_condition_filters_the_record(tmp_path, spark, engine):
    """`value.page = 'x'` of a null value is null: not true, so the record is filtered (as SQL's WHERE)."""
    rows = [{"topic": "t", "partition": 0, "offset": 0, "key": "a", "value": {"page": "x"}, "timestamp": 1},
            {"topic": "t", "partition": 0, "offset": 1, "key": "a", "value": None, "timestamp": 2},
            {"topic": "t", "partition": 0, "offset": 2, "key": None, "value": {"page": "x"}, "timestamp": 3}]
    job = _job("value.page = 'x'", "{type: tumbling, size: 10ms, grace: 0ms}").replace(
        "value: {format: string}", "value: {format: json}")
    got = run_job(tmp_path, job, {"s": rows}, engine=engine)
    assert got.code == 0, got.stderr
    assert _rows(got) == [("a", 0, 1, 1)]
    assert [(d["offset"], d["reason"]) for d in got.ledger] == [(2, "null_key")]  # filtered before: not reaching
    assert _filtered(got, engine) == 1


@pytest.mark.parametrize("engine", ENGINES)
def test_a_condition_that_is_not_boolean_is_refused_naming_the_operator(tmp_path, spark, engine):
    got = run_job(tmp_path, _job("concat(value, 'x')"), {"s": RECORDS}, engine=engine)
    assert got.code == 2
    assert "operators.agg.aggregate.where" in got.stderr and "not a condition" in got.stderr
    assert len(got.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("engine", ENGINES)
def test_a_string_field_is_not_a_condition(tmp_path, spark, engine):
    rows = [{"topic": "t", "partition": 0, "offset": 0, "key": "a", "value": {"page": "x"}, "timestamp": 1}]
    job = _job("value.page", "{type: tumbling, size: 10ms, grace: 0ms}").replace(
        "value: {format: string}", "value: {format: json}")
    got = run_job(tmp_path, job, {"s": rows}, engine=engine)
    assert got.code == 2 and "operators.agg.aggregate.where" in got.stderr and "not a boolean" in got.stderr
    assert len(got.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("engine", ENGINES)
def test_a_filter_before_a_rekey_keeps_the_record_out_of_the_repartition_topic(tmp_path, spark, engine):
    """The filter runs in the upstream task: a dropped record is never re-keyed (no null_key row either)."""
    rows = [{"topic": "t", "partition": p, "offset": o, "key": f"k{p}{o}", "value": v, "timestamp": ts}
            for p, o, v, ts in [(0, 0, {"user": "u", "ok": True}, 1), (1, 0, {"user": None, "ok": False}, 2),
                                (1, 1, {"user": "u", "ok": False}, 40), (0, 1, {"user": "u", "ok": True}, 3)]]
    job = _job("value.ok", "{type: tumbling, size: 10ms, grace: 0ms}").replace(
        "value: {format: string}", "value: {format: json}").replace(
        "      window:", "      group_by: value.user\n      window:")
    got = run_job(tmp_path, job, {"s": rows}, engine=engine)
    assert got.code == 0, got.stderr
    # u@40 was filtered: u@3 is on time; the null new key was filtered before the re-key: no ledger row
    assert [(r["key"], r["window_start"], r["n"]) for r in sorted(got.outputs["agg"], key=lambda r: r["emit_seq"])] \
        == [("u", 0, 1), ("u", 0, 2)]
    assert got.ledger == []
    assert _filtered(got, engine) == 2


JOIN = """
name: golden-filter-join
sources:
  l: {format: jsonl, path: inputs/l.jsonl, value: {format: string}}
  r: {format: jsonl, path: inputs/r.jsonl, value: {format: string}}
operators:
  - name: j
    join:
      left: l
      right: r
      how: left
      window: {before: 5ms, after: 5ms, grace: 0ms}
      where: {left: "value != 'x'", right: "value != 'y'"}
      value: "concat(left.value, '+', coalesce(right.value, 'null'))"
sinks:
  j: {format: jsonl, path: out/j.jsonl}
  _ledger: {format: jsonl, path: out/ledger.jsonl}
  _runs: {format: jsonl, path: out/runs.jsonl}
"""


@pytest.mark.parametrize("engine", ENGINES)
def test_join_filters_each_side_and_a_filtered_record_moves_no_join_time(tmp_path, spark, engine):
    left = timeline([("a", "l1", 1), ("a", "x", 100), ("a", "l2", 3)], topic="l")
    right = timeline([("a", "y", 2), ("a", "r1", 4)], topic="r")
    got = run_job(tmp_path, JOIN, {"l": left, "r": right}, engine=engine)
    assert got.code == 0, got.stderr
    # r1@4 joins l1@1 and l2@3; x@100 never reached the join, so nothing closes l1/l2's windows early
    rows = sorted((r["value"], r["ts"]) for r in got.outputs["j"])
    assert rows == [("l1+r1", 4), ("l2+r1", 4)]
    assert _filtered(got, engine, "j") == 2
