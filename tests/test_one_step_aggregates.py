"""backfill's aggregation rule (jvm/ops OneStepAggregates, loaded by backfill/session.py): a grouping over rows
spread by it already is one aggregation instead of Spark's partial and final ones over the same rows; any
grouping with a shuffle between the two steps keeps them."""
from __future__ import annotations

from collections import defaultdict

from pyspark.sql import functions as F


def _final_plan(df) -> str:
    df.collect()  # the adaptive plan is final once run
    return df._jdf.queryExecution().executedPlan().toString().split("== Initial Plan ==")[0]


def test_a_grouping_on_rows_spread_by_it_is_one_aggregation_with_the_same_result(spark):
    assert "io.backfill.spark.OneStepAggregates" in spark.conf.get("spark.sql.extensions"), \
        "jvm/lib/ops: run scripts/setup.sh"
    rows = spark.range(20_000).selectExpr("cast(id % 5 as int) as task", "id % 97 as k",
                                          "case when id % 11 = 0 then null else id end as v")
    grouped = rows.repartition(4, "task").groupBy("task", "k").agg(
        F.sum("v").alias("total"), F.count(F.lit(1)).alias("n"), F.count("v").alias("values"),
        F.min("v").alias("low"), F.max("v").alias("high"), F.avg("v").alias("mean"),
        F.count(F.when(F.col("v") % 2 == 0, 1)).alias("even"))
    plan = _final_plan(grouped)
    assert plan.count("HashAggregate(") == 1 and "partial_" not in plan, plan
    expected = defaultdict(list)
    for i in range(20_000):
        expected[(i % 5, i % 97)].append(None if i % 11 == 0 else i)
    got = {(r["task"], r["k"]): r for r in grouped.collect()}
    assert set(got) == set(expected)
    for group, values in expected.items():
        present = [v for v in values if v is not None]
        r = got[group]
        assert (r["total"], r["n"], r["values"], r["low"], r["high"], r["even"]) == \
            (sum(present), len(values), len(present), min(present), max(present),
             sum(1 for v in present if v % 2 == 0))
        assert abs(r["mean"] - sum(present) / len(present)) < 1e-9


def test_a_grouping_with_a_shuffle_keeps_both_steps(spark):
    plan = _final_plan(spark.range(1000).selectExpr("id % 7 as k", "id as v").groupBy("k").agg(F.sum("v")))
    assert "partial_sum" in plan and "Exchange" in plan, plan
