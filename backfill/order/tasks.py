"""Part: order. Task order without a sequential merge (DESIGN.md decision 3, kafka-streams.md 2.1).

A task owns partition p of every co-partitioned input. Kafka Streams processes each input partition in
offset order and merges the task's partitions greedily by head-record timestamp. That order equals a
sort by (prefix max timestamp of the record's own partition, source rank, partition, offset): ties
between queues are broken by source rank (declaration order), which Kafka's heap leaves undefined.
"""
from __future__ import annotations

import functools
from operator import or_
from collections.abc import Mapping
from typing import Any

from py4j.java_gateway import JavaClass

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from backfill.errors import OrderingError
from backfill.order.offsets import one_copy_per_offset

MERGE_KEY = ("_partition_time", "source_rank", "partition", "offset")
CHUNK_OFFSETS = 1 << 20  # a task's records are ordered in chunks of this many offsets (see _one_queue_in_chunks)
CHUNKED_PARTITIONS: int | None = None  # tests: order every one-queue input in chunks, over this many partitions
SHUFFLE_BYTES = 16 << 20  # input bytes per ordering partition, as Spark estimates them (parquet, Delta)
# inputs Spark estimates above this are ordered in chunks: the benchmark's 100M records (4.4 GB) are, its 10M
# (0.44 GB, where chunks measured 48 s against 43 s whole: one more pass and a join) are not
CHUNKED_ABOVE = 2 << 30
SPREAD_BYTES = 128 << 20  # input bytes per Spark partition where a large input's pane groups are merged
USE_OPERATOR = True  # tests: False orders with Spark's windows alone, to compare both
# columns null (or, `_raw_ts`, equal to `ts`) but for the few records that go to the ledger or fail the run
RARE = ("_problem", "_where", "_raw_ts", "_fatal")
_RARE = "_rare"


def task_window(given_order: bool) -> Window:
    """The per-task processing order: the merge key, or a recorded `seq` (order_by)."""
    keys = ("seq", "source_rank", "offset") if given_order else MERGE_KEY
    return Window.partitionBy("task").orderBy(*keys)


def order_records(df: DataFrame, stream_times: Mapping[str, Column], given_order: bool = False,
                  single_queue: bool = False, stored: list[DataFrame] | None = None,
                  constants: Mapping[str, Any] | None = None) -> DataFrame:
    """Add `task`, `seq` (1-based, per task), the partition time with and before the record, and one
    stream time per operator (backfill/columns.py).

    `single_queue`: the job has one source (one topic), so each task has one queue and one sort suffices.

    `stored`: where a large one-queue input is ordered chunk by chunk (_one_queue_in_chunks), the stored
    frame it returns is built on is appended (the caller releases it); None: never chunked.

    `stream_times` maps a column name to the predicate of records reaching that operator: its stream
    time is the running max of `ts` over those records in task order, this record included
    (processor-local stream time, kafka-streams.md 0).

    `constants`: columns with this one value in every record (a one-source plan's `source` and `source_rank`).
    Where the ordering streams, they are not carried through its shuffle and sort but put back after it.
    """
    if single_queue and not given_order:
        streamed = running_values_operator(df)
        if streamed is not None and not CHUNKED_PARTITIONS:
            return _one_queue_streamed(df, stream_times, streamed, constants or {})
    if single_queue and not given_order and stored is not None:
        partitions = CHUNKED_PARTITIONS or ordering_partitions(df)
        if partitions:
            return _one_queue_in_chunks(df, stream_times, partitions, stored)
    # hash on task alone satisfies both windows below: one shuffle
    df = df.withColumn("task", F.col("partition")).repartition("task")
    queue_columns = ["task"] if single_queue and not given_order else ["task", "source", "topic"]
    df = one_copy_per_offset(df, queue_columns)
    if single_queue and not given_order:
        # one input partition per task: the merge order is its offset order, so one sort does it all
        queue = Window.partitionBy("task").orderBy("offset")
    else:
        queue = Window.partitionBy("task", "source", "topic").orderBy("offset")
    # partition time so far (this record included) and before it; unordered ts (null) are ignored by max
    so_far = queue.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    order = queue if single_queue and not given_order else task_window(given_order)
    running = order.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    if given_order:  # the recorded order itself, across tasks (a rules operator's arrival axis)
        df = df.withColumn("_recorded_seq", F.col("seq"))
    times = {"_partition_time": F.max("ts").over(so_far),
             "_partition_time_before": F.max("ts").over(queue.rowsBetween(Window.unboundedPreceding, -1))}
    # seq counts the records the task processes (dropped ones are never polled), this one included
    running_values = {"seq": F.count(F.when(F.col("_drop").isNull(), 1)).over(running).cast("long"),
                      **{name: F.max(F.when(reaches, F.col("ts"))).over(running)
                         for name, reaches in stream_times.items()}}
    # the window columns of one order in one select: Spark computes them in one pass over the sorted task (a
    # column added on its own, over a column computed for it, is a second pass that buffers the task again).
    # Several queues are merged by partition time: it is computed first
    steps = [{**times, **running_values}] if order is queue else [times, running_values]
    for added in steps:
        df = df.select(*[c for c in df.columns if c not in added], *[v.alias(k) for k, v in added.items()])
    return df


def running_values_operator(df: DataFrame) -> Any | None:
    """backfill's own operator (jvm/ops: RunningValues), or None where its jar is not loaded (a session built
    without it: the ordering then uses Spark's windows, same values)."""
    if not USE_OPERATOR:
        return None
    try:
        found = df.sparkSession._jvm.io.backfill.spark.RunningValues  # type: ignore[union-attr]
    except Exception:  # noqa: BLE001 - a remote session has no JVM gateway
        return None
    return found if isinstance(found, JavaClass) else None


def _one_queue_streamed(df: DataFrame, stream_times: Mapping[str, Column], operator: Any,
                        constants: Mapping[str, Any]) -> DataFrame:
    """order_records for a task with one queue: its merge order is its offset order, so one sort by (task,
    offset) within Spark partitions spread by task, and one pass over each sorted partition computes every
    running value as the records stream by (RunningValues: constant memory, where a Spark window buffers a
    whole task). Same values as the windows of order_records (tests/test_order_chunks.py compares them).
    The shuffle and the sort (which spills at 100M records) carry each record as narrow as it goes: the
    `constants` are put back after the operator, `partition` is `task` again, and the RARE columns, null
    but for a few records, travel as one struct that is null for the others. Each comes back in its place;
    the stream times' predicates are computed before (they may read any of them)."""
    added = ("seq", "_partition_time", "_partition_time_before", *stream_times)
    flags = {f"_reaches{i}": F.coalesce(reaches, F.lit(False)) for i, reaches in enumerate(stream_times.values())}
    partitions = int(df.sparkSession.conf.get("spark.sql.shuffle.partitions") or 200)
    types = {f.name: f.dataType for f in df.schema.fields}
    kept = {name: value for name, value in constants.items() if name in types}
    rare = [c for c in RARE if c in types]
    prepared = df.withColumn("task", F.col("partition")).drop(*[c for c in added if c in df.columns])
    columns = prepared.columns
    # `_raw_ts` is the record's `ts` but where a policy changed it: carried only then
    unusual = [F.col(c).isNotNull() for c in rare if c != "_raw_ts"]
    if "_raw_ts" in rare:
        unusual.append(~F.col("_raw_ts").eqNullSafe(F.col("ts")))
    packed = {_RARE: F.when(functools.reduce(or_, unusual, F.lit(False)), F.struct(*rare))} if rare else {}
    prepared = prepared.withColumns({"_counted": F.col("_drop").isNull(), **flags, **packed}) \
        .drop(*kept, *rare, "partition") \
        .repartition(partitions, "task").sortWithinPartitions("task", "offset")
    prepared = one_copy_per_offset(prepared, ["task"], streamed=True, clear=["_counted", *flags])
    jdf = operator.apply(prepared._jdf, "task", "ts", "_counted", list(flags), list(stream_times), partitions)
    out = DataFrame(jdf, df.sparkSession)
    values = [c for c in out.columns if c not in {*columns, *flags, "_counted", _RARE}]  # the running values
    back = {**{c: F.lit(v).cast(types[c]) for c, v in kept.items()}, **{c: F.col(f"{_RARE}.{c}") for c in rare},
            "partition": F.col("task")}
    if "_raw_ts" in rare:
        back["_raw_ts"] = F.when(F.col(_RARE).isNull(), F.col("ts")).otherwise(F.col(f"{_RARE}._raw_ts"))
    return out.select(*[back[c].alias(c) if c in back else c for c in columns], *values)


def check_copartitioned(partition_counts: Mapping[str, int], operator: str) -> int:
    """All inputs of one task-spanning operator must have the same partition count (co-partitioning)."""
    counts = set(partition_counts.values())
    if len(counts) > 1:
        shown = ", ".join(f"{src}: {n}" for src, n in partition_counts.items())
        raise OrderingError(f"operators.{operator}: inputs are not co-partitioned ({shown} partitions); "
                            "Kafka Streams requires equal partition counts; repartition one input first "
                            "or declare `partitions:` on the sources if data is missing for some partitions")
    return counts.pop() if counts else 0


def _one_queue_in_chunks(df: DataFrame, stream_times: Mapping[str, Column], partitions: int,
                         stored: list[DataFrame]) -> DataFrame:
    """order_records for a task with one queue, when the input is large: offset order, chunk by chunk.

    A running max or count over a whole task is one Spark window partition: Spark buffers it whole (a Kafka
    partition's every record in one task's memory; at 100M records over 4 partitions that ran out of memory)
    and uses no more cores than the topic has partitions. Here each chunk of CHUNK_OFFSETS offsets of a task
    is a window partition of its own. The running values within each chunk are stored (a local checkpoint,
    appended to `stored`); one pass over them gives each chunk's totals (its count of processed records and
    max timestamp per column), a few rows per chunk, from which the driver sums what each chunk's earlier
    chunks carry. Broadcast back, carry + running value within the chunk = the value over the whole task.
    """
    df = df.withColumn("task", F.col("partition")).withColumn("_chunk", F.expr(f"offset div {CHUNK_OFFSETS}L"))
    chunk = Window.partitionBy("task", "_chunk").orderBy("offset")
    so_far = chunk.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    processed = F.when(F.col("_drop").isNull(), 1)  # seq counts what the task processes (dropped: never polled)
    maxima = {"_partition_time": F.col("ts"), **{name: F.when(reaches, F.col("ts"))
                                                for name, reaches in stream_times.items()}}
    names = {name: f"_c{i}" for i, name in enumerate(maxima)}  # one carried max per running max
    # one record per offset: an offset's copies are in its chunk; a chunk's first gap is found with the carries
    spread = one_copy_per_offset(df.repartition(partitions, "task", "_chunk"), ["task", "_chunk"])
    local = spread.select(
        "*", F.max("ts").over(chunk.rowsBetween(Window.unboundedPreceding, -1)).alias("_lb"),
        F.row_number().over(chunk).alias("_lr"),
        F.count(processed).over(so_far).alias("_ln"),
        *[F.max(v).over(so_far).alias(f"_l{names[k]}") for k, v in maxima.items()]).localCheckpoint(eager=False)
    stored.append(local)
    totals = local.groupBy("task", "_chunk").agg(F.max("_ln").alias("n"), F.max("offset").alias("_hi"),
                                                 *[F.max(f"_l{c}").alias(c) for c in names.values()]).collect()
    carry = []
    for task in {r["task"] for r in totals}:
        n, top, last = 0, {c: None for c in names.values()}, None
        for r in sorted((r for r in totals if r["task"] == task), key=lambda r: (r["_chunk"] is not None, r["_chunk"])):
            carry.append((task, r["_chunk"], n, last, *top.values()))
            n += r["n"] or 0
            last = r["_hi"] if r["_hi"] is not None else last  # the task's last offset before the next chunk
            top = {c: max((v for v in (top[c], r[c]) if v is not None), default=None) for c in top}
    schema = T.StructType([T.StructField("_ct", local.schema["task"].dataType), T.StructField("_cc", T.LongType()),
                           T.StructField("_cn", T.LongType()), T.StructField("_co", T.LongType()),
                           *[T.StructField(c, T.LongType()) for c in names.values()]])
    carried = df.sparkSession.createDataFrame(carry, schema)
    # null-safe and left: a record whose task or chunk is null keeps its running values (nothing carried)
    on = F.col("task").eqNullSafe(F.col("_ct")) & F.col("_chunk").eqNullSafe(F.col("_cc"))
    out = local.join(F.broadcast(carried), on, "left")
    out = out.withColumn("_partition_time_before", F.greatest(F.col(names["_partition_time"]), F.col("_lb"))) \
        .withColumn("seq", (F.coalesce(F.col("_cn"), F.lit(0)) + F.col("_ln")).cast("long"))
    first_gap = F.when((F.col("_lr") == 1) & (F.col("offset") - F.col("_co") > 1), F.col("offset") - F.col("_co") - 1)
    out = out.withColumn("_gap", F.coalesce(F.col("_gap"), first_gap))
    for name, c in names.items():  # greatest skips nulls: an empty side changes nothing
        out = out.withColumn(name, F.greatest(F.col(c), F.col(f"_l{c}")))
    # `_chunk` stays: the rows are spread by (task, _chunk), which the one pass groups by (plan/fused.py)
    return out.drop("_ct", "_cc", "_cn", "_co", "_lb", "_ln", "_lr", *names.values(),
                    *[f"_l{c}" for c in names.values()])


def input_bytes(df: DataFrame) -> int | None:
    """Spark's size estimate of `df` (file sources: the files' bytes), or None when it has none."""
    try:
        size = int(str(df._jdf.queryExecution().optimizedPlan().stats().sizeInBytes()))
    except Exception:  # noqa: BLE001 - an estimate only
        return None
    return None if size >= 1 << 50 else size  # no estimate: Spark's is Long.MaxValue


def spread_partitions(df: DataFrame) -> int | None:
    """Spark partitions to spread a large input's per-task groups over by (task, key) before they are merged
    again (plan/fused.py: panes into windows), or None for an input Spark estimates at most CHUNKED_ABOVE:
    one per SPREAD_BYTES of input, at least `spark.sql.shuffle.partitions`."""
    size = input_bytes(df)
    if size is None or size <= CHUNKED_ABOVE:
        return None
    return max(int(df.sparkSession.conf.get("spark.sql.shuffle.partitions") or 200), -(-size // SPREAD_BYTES))


def ordering_partitions(df: DataFrame) -> int | None:
    """Spark partitions for ordering a large `df` one chunk at a time, or None to order it whole: when Spark's
    size estimate of the input (file sources) is above CHUNKED_ABOVE, one per SHUFFLE_BYTES of it (bounded
    window partitions and stored blocks: 274 for the benchmark's 100M records)."""
    size = input_bytes(df)
    if size is None or size <= CHUNKED_ABOVE:  # no estimate, or small enough
        return None
    return min(10_000, -(-size // SHUFFLE_BYTES))
