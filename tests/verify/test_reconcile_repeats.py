"""Reconciliation of two outputs by key: the last row per key, exact repeats, categories (verify/reconcile.py).

Only keys that can repeat a value are counted row by row (more than one right row, and with `emit: updates`
a multiset of values unlike the left's); these cases pin the rule where that shortcut could go wrong: the
left repeating a value itself, a stream that duplicated one update and lost another (same row count), a
key only in the stream, and positions whose partition outranks a huge offset.
"""
from __future__ import annotations

from typing import Any

from backfill.verify.reconcile import Comparison, reconcile

LEFT = "key string, window_start long, v long, emit_seq long"
RIGHT = "key string, window_start long, v long, partition int, offset long"


def _run(spark: Any, left: list[tuple], right: list[tuple], updates: bool) -> dict[str, dict[str, Any]]:
    cmp = Comparison(keys=("key", "window_start"), columns=("v",), left_order=("emit_seq",),
                     right_order=("partition", "offset"), updates=updates)
    result, counts = reconcile(spark.createDataFrame(left, LEFT), spark.createDataFrame(right, RIGHT), cmp)
    try:
        rows = {r["key"]: r.asDict() for r in result.collect()}
    finally:
        result.unpersist()
    assert sum(counts.values()) == len(rows)
    for r in rows.values():
        assert counts[r["category"]] >= 1
    return rows


def _updates(key: str, values: list[int], partition: int = 0) -> tuple[list[tuple], list[tuple]]:
    left = [(key, 0, v, i) for i, v in enumerate(values)]
    right = [(key, 0, v, partition, i) for i, v in enumerate(values)]
    return left, right


def test_update_streams_count_only_repeats_beyond_the_backfills_own(spark: Any) -> None:
    left, right = [], []
    # the backfill itself emitted 2 twice (e.g. a max that did not move): the same in the stream is no copy
    same_l, same_r = _updates("same", [1, 2, 2, 3])
    left += same_l
    right += same_r
    # the stream lost update 3 and repeated update 2: as many rows as the backfill, one exact copy
    left += [("lost", 0, v, i) for i, v in enumerate([1, 2, 3])]
    right += [("lost", 0, v, 0, i) for i, v in enumerate([1, 2, 2])]
    # at-least-once: the last update written again
    left += [("again", 0, v, i) for i, v in enumerate([1, 2, 3])]
    right += [("again", 0, v, 0, i) for i, v in enumerate([1, 2, 3, 3])]
    # only in the stream, twice
    right += [("theirs", 0, 5, 1, 0), ("theirs", 0, 5, 1, 1)]
    # the last position is partition 1 offset 0, after partition 0 offset 2^62
    left += [("big", 0, 7, 0)]
    right += [("big", 0, 9, 0, 2**62), ("big", 0, 7, 1, 0)]
    rows = _run(spark, left, right, updates=True)
    assert {k: (r["category"], r["l_v"], r["r_v"], r["_rows"], r["_lrows"], r["_copies"], r["_extra"])
            for k, r in rows.items()} == {
        "same": ("match", 3, 3, 4, 4, 0, 0),
        "lost": ("mismatch", 3, 2, 3, 3, 1, 1),
        "again": ("duplicate_in_stream", 3, 3, 4, 3, 1, 1),
        "theirs": ("extra_in_stream", None, 5, 2, None, 1, 1),
        "big": ("match", 7, 7, 2, 1, 0, 0),
    }


def test_final_results_count_every_repeat_and_every_extra_row(spark: Any) -> None:
    left = [("once", 0, 1, 0), ("twice", 0, 1, 0), ("three", 0, 2, 0), ("mine", 0, 4, 0)]
    right = [("once", 0, 1, 0, 0),
             ("twice", 0, 1, 0, 0), ("twice", 0, 1, 0, 5),
             ("three", 0, 1, 0, 0), ("three", 0, 1, 0, 1), ("three", 0, 2, 0, 2)]
    rows = _run(spark, left, right, updates=False)
    assert {k: (r["category"], r["_rows"], r["_copies"], r["_extra"]) for k, r in rows.items()} == {
        "once": ("match", 1, 0, 0),
        "twice": ("duplicate_in_stream", 2, 1, 1),
        "three": ("duplicate_in_stream", 3, 1, 2),  # last by offset is 2: equal values, two rows too many
        "mine": ("missing_in_stream", 0, 0, 0),
    }
