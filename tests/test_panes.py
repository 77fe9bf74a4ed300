"""Which aggregations the one pass may compute by pane (ops/expressions.py `split`), and into what; and how
windows kept by several tasks are found once the one pass groups its windows by task."""
from __future__ import annotations

import pytest

from backfill.ops.expressions import CompiledAggregation


def split(sql: str):
    return CompiledAggregation("x", sql=sql).split("_p_")


@pytest.mark.parametrize(("sql", "parts", "merged"), [
    ("count(1)", [("COUNT(1)", "sum")], "_p_0"),
    ("count(value.n)", [("COUNT(value.n)", "sum")], "_p_0"),
    ("sum(value.amount)", [("SUM(value.amount)", "sum")], "_p_0"),
    ("round(sum(value.a) / count(1), 2)", [("SUM(value.a)", "sum"), ("COUNT(1)", "sum")], "ROUND(_p_0 / _p_1, 2)"),
    ("max(value.a) - min(value.a)", [("MAX(value.a)", "max"), ("MIN(value.a)", "min")], "_p_0 - _p_1"),
    ("coalesce(sum(value.a * 2), 0)", [("SUM(value.a * 2)", "sum")], "COALESCE(_p_0, 0)"),
])
def test_count_sum_min_max_split_in_any_expression(sql: str, parts: list, merged: str) -> None:
    assert split(sql) == (parts, merged)


@pytest.mark.parametrize("sql", [
    "avg(value.a)",                             # not a merge of averages
    "count(DISTINCT value.a)",                  # two panes may hold the same value
    "sum(value.a) FILTER (WHERE value.a > 1)",  # the filter would be lost
    "any(value.flag)",                          # Spark's bool_or, which sqlglot does not see as an aggregate
    "my_aggregate(value.a)",                    # a name nobody knows may be an aggregate
    "max(value.a, 1)",
    "sum(max(value.a))",
    "sum(value.a) OVER ()",
    "percentile_approx(value.a, 0.5)",
])
def test_what_does_not_merge_is_not_split(sql: str) -> None:
    assert split(sql) is None


def test_a_window_kept_by_two_tasks_is_found_and_a_key_of_two_tasks_alone_is_not(spark) -> None:
    """The one pass groups windows by task too: a key in two partitions gives two rows of one window only
    where both tasks kept that window (those are refused); other windows of such a key are unique."""
    from backfill.ops.aggregate import split_windows

    schema = "task int, key string, window_start long"
    none = spark.createDataFrame([(0, "a", 0), (1, "a", 60), (0, "b", 0), (0, "b", 60)], schema)
    assert split_windows(none) == (0, None)
    two = spark.createDataFrame([(0, "a", 0), (1, "a", 60), (0, "b", 0), (1, "b", 0), (1, "b", 60), (0, "b", 60),
                                 (2, "c", 0)], schema)
    assert split_windows(two) == (2, "b")
