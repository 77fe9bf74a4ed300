"""Join specs and plans: what is refused up front, with one clear line naming the field."""
from __future__ import annotations

import pytest

from backfill.errors import SpecError
from backfill.ops.expressions import joiner_sql
from backfill.plan.builder import build_plan
from backfill.jobspec.load import load_job
from tests.golden.harness import join_job, run_job


def _plan(tmp_path, text: str):
    (tmp_path / "inputs").mkdir(exist_ok=True)
    for side in ("left", "right"):  # a plan checks that its inputs exist (it reads nothing else)
        (tmp_path / "inputs" / f"{side}.jsonl").touch()
    (tmp_path / "job.yaml").write_text(text)
    return build_plan(load_job(tmp_path / "job.yaml"))


def test_join_plan_has_warm_up_from_the_window_and_no_cool_down_cut(tmp_path):
    plan = _plan(tmp_path, join_job("left", "{before: 10s, after: 1m, grace: 5s}"))
    assert plan.operators[0].implemented and plan.operators[0].warmup_ms == 60_000 + 75_000
    ranged = build_plan(plan.job, 1_000_000, 2_000_000)
    assert {s.read_from for s in ranged.sources} == {1_000_000 - 135_000}
    assert {s.read_until for s in ranged.sources} == {None}  # a late record can still join: read to the end


def test_self_join_is_planned_as_not_implemented(tmp_path):
    job = join_job("inner", "{before: 1s, after: 1s, grace: 0ms}").replace("right: right", "right: left")
    plan = _plan(tmp_path, job)
    assert not plan.operators[0].implemented and "self-join" in plan.operators[0].not_implemented_reason


def test_join_inputs_need_one_key_format(tmp_path):
    job = join_job("inner", "{before: 1s, after: 1s, grace: 0ms}").replace(
        "right: {format: jsonl, path: inputs/right.jsonl, key: {format: long}",
        "right: {format: jsonl, path: inputs/right.jsonl, key: {format: string}")
    with pytest.raises(SpecError, match="key formats differ .*left: long, right: string"):
        _plan(tmp_path, job)


@pytest.mark.parametrize("window,field", [("{before: -5ms, after: 2ms, grace: 0ms}", "before"),
                                          ("{before: 5ms, after: 5ms, grace: -1ms}", "grace"),
                                          ("{before: 5ms, after: 5ms}", "grace")])
def test_join_window_validation_names_the_field(tmp_path, window, field):
    with pytest.raises(SpecError, match=rf"operators\[0\]\.join\.window\.{field}"):
        _plan(tmp_path, join_job("left", window))


def test_negative_side_is_allowed_when_the_window_is_not_empty(tmp_path):
    assert _plan(tmp_path, join_job("left", "{before: -5ms, after: 8ms, grace: 0ms}")).operators[0].implemented


def test_joiner_reads_only_key_left_and_right():
    assert joiner_sql("concat(left.value, transform(array(1), x -> x)[0], key)", "v")
    with pytest.raises(SpecError, match="'value' is not in scope"):
        joiner_sql("concat(value, right.value)", "operators.j.join.value")
    with pytest.raises(SpecError, match="'left.seq' is not in scope"):
        joiner_sql("left.seq", "operators.j.join.value")


@pytest.mark.spark
@pytest.mark.parametrize("engine", ["spark", "reference"])
def test_inputs_with_different_partition_counts_are_refused(tmp_path, spark, engine):
    """Observed counts (max partition + 1) differ: Kafka Streams refuses to join such inputs."""
    rows = {"left": [{"topic": "left", "partition": p, "offset": 0, "key": 1, "value": "a", "timestamp": 1,
                      "seq": p} for p in (0, 1)],
            "right": [{"topic": "right", "partition": 0, "offset": 0, "key": 1, "value": "b", "timestamp": 1,
                       "seq": 5}]}
    job = join_job("inner", "{before: 1s, after: 1s, grace: 0ms}").replace(", partitions: 1", "")
    got = run_job(tmp_path, job, rows, engine=engine)
    assert got.code == 2 and "not co-partitioned (left: 2, right: 1 partitions)" in got.stderr
