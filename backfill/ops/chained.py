"""Part: operators. Chains (docs/semantics.md §18): the rows an operator forwarded, as the records of a derived
source named after it, which the operators that read it run over (jobspec/topology.py says who reads whom).

Kafka Streams forwards depth-first: each row goes through the downstream processor right after the upstream
record that produced it, in the same task, so the downstream sees the upstream's emission order per task (its
`emit_seq`) and keeps its own stream time over what reaches it. A derived record therefore has `partition` =
the upstream's task, `offset` = its place in that task's emission order, `ts` and `timestamp` = the row's
output timestamp; it is ordered per task like a one-queue source and, re-keyed, written to a repartition topic
as a source's record is (ops/repartition.py).
"""
from __future__ import annotations

import functools

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from backfill.io.sources import HEADERS_TYPE, WHERE_TYPE
from backfill.jobspec.models import OperatorSpec
from backfill.jobspec.topology import tombstones
from backfill.ops.join import key_order
from backfill.ops.table_join import TABLE_VALUE


def forwarded(up: OperatorSpec, output: DataFrame, stride: int | None = None) -> DataFrame:
    """The rows `up` forwarded (all of them: a chain reads everything, §18.4) as records of source `up.name`;
    with `stride` (of `up`'s emit_seq: the record's seq times it, plus the row's position), with `task` and
    `seq` already: the forwarding task and the place there of the record that made each row (§18.7-§18.8)."""
    emission = Window.partitionBy("task").orderBy("emit_seq")
    nothing = F.lit(None).cast("string")
    return output.select(
        F.lit(up.name).alias("source"), F.lit(0).alias("source_rank"), F.lit(up.name).alias("topic"),
        F.col("task").cast("int").alias("partition"), (F.row_number().over(emission) - 1).cast("long").alias("offset"),
        F.col("key"), value_of(up).alias("value"), F.col("ts").cast("long").alias("timestamp"),
        F.lit(None).cast(HEADERS_TYPE).alias("headers"),
        F.col("ts").cast("long").alias("ts"), F.col("ts").cast("long").alias("_raw_ts"), nothing.alias("_problem"),
        F.lit(None).cast(WHERE_TYPE).alias("_where"), nothing.alias("_drop"), nothing.alias("_fatal"),
        *([F.col("task").cast("int").alias("task"), F.expr(f"emit_seq div {stride}").cast("long").alias("seq")]
          if stride is not None else []))


def as_table(up: OperatorSpec, output: DataFrame, value_type: str) -> DataFrame:
    """The rows a table aggregate forwarded as a join's table records, in the task that forwarded them
    (docs/semantics.md §18.7): `seq` the place of the record that made the row in that task's order (its
    `emit_seq`), the value in `_table_value` (`value` is null, of the stream's type `value_type`)."""
    return forwarded(up, output, stride=1).withColumn(TABLE_VALUE, F.col("value")) \
        .withColumn("value", F.lit(None).cast(value_type))


def value_of(up: OperatorSpec) -> Column:
    """What the downstream reads as `value` (§18.2): a join's result as it is; an aggregate's window bounds and
    aggregation columns (`value.<name>`), null for a tombstone (a session merged away, a fold that deleted its key)."""
    if up.aggregate is None:
        return F.col("value")
    names = list(up.aggregate.aggregations)
    bounds = ["window_start", "window_end"] if up.aggregate.window is not None else []
    value = F.struct(*[F.col(c) for c in bounds + names])
    if not tombstones(up):
        return value
    return F.when(functools.reduce(lambda a, b: a & b, [F.col(n).isNull() for n in names]), F.lit(None)) \
        .otherwise(value)


def release_order(closed: DataFrame, by: tuple[str, ...] = ("window_start",)) -> DataFrame:
    """Final windows emitted on close (time windows by either mechanism), numbered per task as the aggregate
    forwards them (docs/semantics.md §4.5, §10.4, §11.5, §18.2): each goes at the record that brings its task's
    stream time past (time windows: to) its close, those of one record in store order: by start, then serialized
    key (time and sliding windows), by end, then start, then key (sessions: `by` = window_end, window_start).
    Stream time only grows and a window's close is its start (sessions: its end) plus a constant, so that is the
    order of `by`, then the key, per task."""
    number = Window.partitionBy("task").orderBy(*by, key_order(closed))
    return closed.withColumn("emit_seq", (F.row_number().over(number) - 1).cast("long"))
