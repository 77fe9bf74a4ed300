"""A hot key costs the pairs it emits: the range join is an equi-join on (task, key, time bucket) plus bounds."""
from __future__ import annotations

import re

import pytest
from pyspark.sql import functions as F

from backfill.ops.join import _pair_join, bucketed
from backfill.ops.windows import LEFT, RIGHT, JoinWindows
from tests.golden.harness import join_job, run_job

pytestmark = [pytest.mark.spark, pytest.mark.slow]
N = 10_000  # records per side, all of one key, 10 ms apart: each left row matches 4 right rows


def _timeline() -> dict[str, list[dict]]:
    return {side: [{"topic": side, "partition": 0, "offset": i, "key": "hot", "value": f"{side[0]}{i}",
                    "timestamp": 10 * i + (side == "right")} for i in range(N)] for side in ("left", "right")}


def test_hot_key_evaluates_about_the_pairs_it_emits(tmp_path, spark):
    got = run_job(tmp_path, join_job("inner", "{before: 20ms, after: 20ms, grace: 5ms}", key_format="string",
                                     order_by=""), _timeline())
    assert got.code == 0, got.stderr
    emitted = len(got.outputs["j"])
    # r(j) joins l(i) iff |10j + 1 - 10i| <= 20, j in i-2..i+1; rows at both ends have fewer partners
    assert emitted == 4 * N - 4
    rows = [(0, "hot", i, t["timestamp"], LEFT if side == "left" else RIGHT, 0)
            for side, recs in _timeline().items() for i, t in enumerate(recs)]
    recs = spark.createDataFrame(rows, "task int, key string, seq long, ts long, _side int, _sst_other long")
    w = JoinWindows(before=20, after=20, grace=5)
    lrows, rrows, equi = bucketed(recs, recs, w)
    candidates = lrows.join(rrows, equi).count()
    assert candidates <= 2.5 * emitted < N * N / 1000
    plan = _pair_join(recs.withColumn("value", F.lit("v")), recs, w, "both", wide=False)._jdf.queryExecution() \
        .executedPlan().toString()
    assert "l_bucket" in plan and "Join" in plan
    assert "CartesianProduct" not in plan and "NestedLoopJoin" not in plan


def test_the_records_are_shuffled_once_for_pairs_flags_and_order(spark):
    """One exchange by (task, key): the range join, the per-record flags and the pairs' ordering window reuse it
    (session.py ENGINE_CONF); with Spark's default each of them shuffles again and this test fails. (A left
    or outer join stores the range join's result between them, ops/join.py; an inner join runs this plan.)"""
    from backfill.ops.join import _joined_rows, _outer_flags, _pair_values

    rows = [(t, k, i, 10 * i, side, 0, f"v{i}", 10 * i, "x", t, i, 10 * i, 10 * i, k)
            for t in range(2) for k in ("a", "b") for i in range(20) for side in (LEFT, RIGHT)]
    recs = spark.createDataFrame(rows, "task int, key string, seq long, ts long, _side int, _sst_other long, "
                                 "value string, timestamp long, topic string, partition int, offset long, "
                                 "_stj long, _to long, _korder string")
    joinable = recs.repartition("task", "key")
    w = JoinWindows(before=20, after=20, grace=5)
    previous = spark.conf.get("spark.sql.autoBroadcastJoinThreshold")
    spark.conf.set("spark.sql.autoBroadcastJoinThreshold", "-1")  # as with inputs too large to broadcast
    try:
        candidates = _pair_values(_pair_join(joinable, joinable, w, "both", wide=True, how="left"), "left.value")
        frame = _joined_rows(candidates.where(F.col("r_seq").isNotNull())).unionByName(
            _outer_flags(candidates, joinable, LEFT, w).select(
                "task", "key", F.lit("f").alias("value"), "ts", F.col("seq").alias("_out_seq"),
                F.lit(0).alias("_phase"), F.lit(0).cast("long").alias("_idx")))
        plan = frame._jdf.queryExecution().executedPlan().toString()
    finally:
        spark.conf.set("spark.sql.autoBroadcastJoinThreshold", previous)
    exchanges = [line for line in plan.splitlines() if "Exchange" in line]
    assert exchanges, plan
    assert all(re.search(r"Exchange hashpartitioning\(task#\d+, key#\d+, \d+\), REPARTITION_BY_COL", line)
               for line in exchanges), plan
