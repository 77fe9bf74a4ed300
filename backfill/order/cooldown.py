"""Part: order. The cool-down cut (docs/semantics.md §6.2), the one rule in its two forms.

A run with an end processes each partition of a source up to and including its first record (in offset order)
whose timestamp is at or after the source's bound (`read_until`: the close time of the last window in range):
a record is past the cut exactly when a record before it in its partition had such a timestamp, i.e. when the
partition time before it has reached the bound. A record without a valid timestamp moves no partition time,
and a partition's first record is never past it.

The ordering computes the partition time before each record, so the evaluator and the jar-less merge test that
(`beyond`, `beyond_record`); verify reads the input without ordering it and keeps each partition's offsets up
to the first one at or after the bound (`up_to_cut`): the same records (tests/test_cooldown.py)."""
from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F


def beyond_record(before: int | None, until: int | None) -> bool:
    """A record whose partition's time before it is `before` is past a source's cut at `until` (None: no cut)."""
    return until is not None and before is not None and before >= until


def beyond(before: Column, until: int) -> Column:
    """Column: the record is past the cut at `until`; `before` is the partition time before it (null for a
    partition's first record, and while only invalid timestamps came before)."""
    return F.coalesce(before >= F.lit(until), F.lit(False))


def up_to_cut(records: DataFrame, until: int, ts: str = "ts") -> DataFrame:
    """The records of one source not past the cut: in each partition, offsets up to and including the first
    record with `ts` at or after `until` (one aggregation, no ordering)."""
    cut = records.where(F.col(ts) >= F.lit(until)).groupBy("partition").agg(F.min("offset").alias("_cut"))
    return records.join(F.broadcast(cut), "partition", "left").where(
        F.col("_cut").isNull() | (F.col("offset") <= F.col("_cut"))).drop("_cut")
