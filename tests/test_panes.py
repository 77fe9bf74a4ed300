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


def test_the_windows_per_task_come_with_whether_each_key_is_in_one_task(spark) -> None:
    """The per-task stream time and pairs are counted by key first: exact whether or not a key is in two tasks
    (then counted by task again), and only then is the look for windows kept by two tasks skipped."""
    from backfill.ops.aggregate import LATE_PAIR, WINDOW
    from backfill.plan.fused import window_tasks

    schema = "_g int, task int, key string, _window_ts long, _n long"
    one = spark.createDataFrame([(WINDOW, 0, "a", 10, 2), (WINDOW, 0, "a", 70, 1), (WINDOW, 1, "b", 30, 4),
                                 (WINDOW, 0, "c", 50, 1), (LATE_PAIR, 1, None, 99, 5)], schema)
    found = window_tasks(one)
    assert found.one_task_keys
    assert sorted((r["task"], r["st"], r["pairs"]) for r in found.rows) == [(0, 70, 4), (1, 30, 4)]
    two = spark.createDataFrame([(WINDOW, 0, "a", 10, 2), (WINDOW, 1, "a", 90, 1), (WINDOW, 1, "b", 30, 4),
                                 (WINDOW, 2, "c", 50, 3)], schema)
    found = window_tasks(two)
    assert not found.one_task_keys
    assert sorted((r["task"], r["st"], r["pairs"]) for r in found.rows) == [(0, 10, 2), (1, 90, 5), (2, 50, 3)]
    assert window_tasks(one.where("_g != 0")) == window_tasks(one.limit(0))
