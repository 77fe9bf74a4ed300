"""Part: order. Task order without a sequential merge (DESIGN.md decision 3, kafka-streams.md 2.1).

A task owns partition p of every co-partitioned input. Kafka Streams processes each input partition in
offset order and merges the task's partitions greedily by head-record timestamp. That order equals a
sort by (prefix max timestamp of the record's own partition, source rank, partition, offset): ties
between queues are broken by source rank (declaration order), which Kafka's heap leaves undefined.
"""
from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from backfill.errors import OrderingError

MERGE_KEY = ("_partition_time", "source_rank", "partition", "offset")


def task_window(given_order: bool) -> Window:
    """The per-task processing order: the merge key, or a recorded `seq` (order_by)."""
    keys = ("seq", "source_rank", "offset") if given_order else MERGE_KEY
    return Window.partitionBy("task").orderBy(*keys)


def order_records(df: DataFrame, stream_times: Mapping[str, Column], given_order: bool = False,
                  single_queue: bool = False) -> DataFrame:
    """Add `task`, `seq` (1-based, per task), the partition time with and before the record, and one
    stream time per operator (backfill/columns.py).

    `single_queue`: the job has one source (one topic), so each task has one queue and one sort suffices.

    `stream_times` maps a column name to the predicate of records reaching that operator: its stream
    time is the running max of `ts` over those records in task order, this record included
    (processor-local stream time, kafka-streams.md 0).
    """
    # hash on task alone satisfies both windows below: one shuffle
    df = df.withColumn("task", F.col("partition")).repartition("task")
    if single_queue and not given_order:
        # one input partition per task: the merge order is its offset order, so one sort does it all
        queue = Window.partitionBy("task").orderBy("offset")
    else:
        queue = Window.partitionBy("task", "source", "topic").orderBy("offset")
    # partition time so far (this record included) and before it; unordered ts (null) are ignored by max
    so_far = queue.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    df = df.withColumn("_partition_time", F.max("ts").over(so_far))
    df = df.withColumn("_partition_time_before", F.max("ts").over(queue.rowsBetween(Window.unboundedPreceding, -1)))
    order = queue if single_queue and not given_order else task_window(given_order)
    running = order.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    if given_order:  # the recorded order itself, across tasks (a rules operator's arrival axis)
        df = df.withColumn("_recorded_seq", F.col("seq"))
    # seq counts the records the task processes (dropped ones are never polled), this one included
    df = df.withColumn("seq", F.count(F.when(F.col("_drop").isNull(), 1)).over(running).cast("long"))
    for name, reaches in stream_times.items():
        df = df.withColumn(name, F.max(F.when(reaches, F.col("ts"))).over(running))
    return df


def check_copartitioned(partition_counts: Mapping[str, int], operator: str) -> int:
    """All inputs of one task-spanning operator must have the same partition count (co-partitioning)."""
    counts = set(partition_counts.values())
    if len(counts) > 1:
        shown = ", ".join(f"{src}: {n}" for src, n in partition_counts.items())
        raise OrderingError(f"operators.{operator}: inputs are not co-partitioned ({shown} partitions); "
                            "Kafka Streams requires equal partition counts; repartition one input first "
                            "or declare `partitions:` on the sources if data is missing for some partitions")
    return counts.pop() if counts else 0
