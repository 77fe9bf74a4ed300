"""Part: order. Each task's processing order and its running values (docs/semantics.md §2, §3).

A task owns partition p of every co-partitioned input. Kafka Streams processes each input partition in
offset order and takes the next record from the queue whose head has the smallest timestamp, as a
`java.util.PriorityQueue` of the task's queues gives it (§2.2-§2.5). A task of one queue is its offset
order. A task of several is merged by backfill's operator (jvm/ops `MergedQueues`), which replays that heap
in two streamed passes, or, in a session without the operator's jar, by the same rule in Python per task
(order/merge.py).
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from operator import or_
from typing import Any

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from backfill.errors import OrderingError
from backfill.order.offsets import one_copy_per_offset
from backfill.session import is_connect, jvm_operator

CHECKED = ("_copies", "_gap")  # order/offsets.py: what the check of one record per offset adds
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


# the ways order_records orders a task's records: the same values every way (docs/semantics.md §2-§3)
STREAMED = "streamed"  # one queue per task: one sorted pass by backfill's JVM operator (RunningValues)
MERGED = "merged"  # several queues, or a recorded order: backfill's JVM operator (MergedQueues), streamed
MERGED_BY_TASK = "merged_by_task"  # several queues, no operator: the heap per task in Python, then Spark windows
CHUNKS = "chunks"  # one queue, no operator, a large input: Spark windows chunk by chunk, each chunk stored
WINDOWS = "windows"  # Spark's windows over whole tasks
ORDERINGS = {
    STREAMED: "each task's records in one sorted pass by backfill's JVM operator (RunningValues); no task is "
              "buffered",
    MERGED: "each task's queues merged as Kafka Streams' heap takes them, by backfill's JVM operator (MergedQueues) "
            "in two sorted passes; only a run of tied heads is buffered",
    MERGED_BY_TASK: "each task's queues merged as Kafka Streams' heap takes them, in Python per task "
                    "(order/merge.py), then Spark's windows over the task: each task is buffered whole",
    CHUNKS: "Spark's windows over chunks of a task's offsets, each chunk stored once (a large input without "
            "backfill's JVM operator)",
    WINDOWS: "Spark's windows over whole tasks: each task is buffered whole",
}


def ordering(single_queue: bool, given_order: bool, operator: bool, large: Callable[[], bool],
             chunkable: bool = True, queues: bool = True) -> str:
    """How order_records orders the records: the one rule `run` follows and `plan` prints (plan/strategy.py).
    `operator`: backfill's JVM operator is reachable; `large()`: the input is above CHUNKED_ABOVE (asked only
    where it decides); `chunkable`: the caller can keep a chunked order; `queues`: the task's queues are known."""
    if not single_queue and not given_order:
        return MERGED if operator else MERGED_BY_TASK
    if given_order:
        return MERGED if operator and queues else WINDOWS
    if operator and not CHUNKED_PARTITIONS:
        return STREAMED
    if chunkable and (CHUNKED_PARTITIONS or large()):
        return CHUNKS
    return WINDOWS


def recorded_order() -> Window:
    """A recorded processing order (order_by: the source's `seq`), per task."""
    return Window.partitionBy("task").orderBy("seq", "source_rank", "offset")


def order_records(df: DataFrame, stream_times: Mapping[str, Column], given_order: bool = False,
                  single_queue: bool = False, stored: list[DataFrame] | None = None,
                  constants: Mapping[str, Any] | None = None, queues: Queues | None = None,
                  taken: list[str] | None = None) -> DataFrame:
    """Add `task`, `seq` (1-based, per task), the partition time with and before the record, and one
    stream time per operator (backfill/columns.py).

    `single_queue`: the job has one source (one topic), so each task has one queue and one sort suffices.

    `stored`: where a large one-queue input is ordered chunk by chunk (_one_queue_in_chunks), the stored
    frame it returns is built on is appended (the caller releases it); None: never chunked.

    `stream_times` maps a column name to the predicate of records reaching that operator: its stream
    time is the running max of `ts` over those records in task order, this record included
    (processor-local stream time, docs/semantics.md §3.1).

    `constants`: columns with this one value in every record (a one-source plan's `source` and `source_rank`).
    Where the ordering streams, they are not carried through its shuffle and sort but put back after it.

    `queues`: for several queues per task, the sources in declaration order, their sub-topologies and
    read bounds (the merge's rule: order/merge.py); None: one sub-topology, no bounds, sources by rank.

    `taken`: where the way it orders them (`ordering`) is appended, for the run to report.
    """
    partitions = functools.cache(lambda: CHUNKED_PARTITIONS or ordering_partitions(df))
    how = ordering(single_queue, given_order, running_values_operator(df) is not None,
                   lambda: partitions() is not None, chunkable=stored is not None, queues=queues is not None)
    if taken is not None:
        taken.append(how)
    if how in (MERGED, MERGED_BY_TASK) and not given_order:
        return _several_queues(df, stream_times, queues)
    if how == MERGED:
        assert queues is not None
        return _recorded_streamed(df, stream_times, queues)
    if how == STREAMED:
        return _one_queue_streamed(df, stream_times, running_values_operator(df), constants or {})
    if how == CHUNKS:
        n = partitions()
        assert stored is not None and n
        return _one_queue_in_chunks(df, stream_times, n, stored)
    # hash on task alone satisfies both windows below: one shuffle
    df = df.withColumn("task", F.col("partition")).repartition("task")
    # a source is one topic: a record without a topic of its own is in its partition's queue (docs/semantics.md §7.2)
    queue_columns = ["task"] if single_queue and not given_order else ["task", "source"]
    df = one_copy_per_offset(df, queue_columns)
    # an unreadable record after the readable copies of its offset, as in the streamed passes (_unchecked_last)
    unreadable = F.coalesce(F.col("_drop").startswith("unreadable"), F.lit(False))
    if single_queue and not given_order:
        # one input partition per task: the merge order is its offset order, so one sort does it all
        queue = Window.partitionBy("task").orderBy("offset", unreadable)
    else:
        queue = Window.partitionBy("task", "source").orderBy("offset", unreadable)
    # partition time so far (this record included) and before it; unordered ts (null) are ignored by max
    so_far = queue.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    order = queue if single_queue and not given_order else recorded_order()
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
    # a recorded order over several queues is another window: the partition times are computed first
    steps = [{**times, **running_values}] if order is queue else [times, running_values]
    for added in steps:
        df = df.select(*[c for c in df.columns if c not in added], *[v.alias(k) for k, v in added.items()])
    return df


def running_values_operator(df: DataFrame) -> Any | None:
    """backfill's own operator (jvm/ops: RunningValues), or None where its jar is not loaded (a session built
    without it: the ordering then uses Spark's windows, same values)."""
    return _operator(df, "RunningValues")


def merged_queues_operator(df: DataFrame) -> Any | None:
    """backfill's merge of several queues (jvm/ops: MergedQueues), or None where its jar is not loaded."""
    return _operator(df, "MergedQueues")


def _operator(df: DataFrame, name: str) -> Any | None:
    return jvm_operator(df.sparkSession, name) if USE_OPERATOR else None  # None over Spark Connect


@dataclass(frozen=True)
class Queues:
    """What the merge of a task's queues needs to know of them (docs/semantics.md §2.3-§2.5)."""

    names: tuple[str, ...]  # the sources (the `source` column) in declaration order
    groups: Mapping[str, int] = field(default_factory=dict)  # each source's sub-topology (default 0)
    until: Mapping[str, int | None] = field(default_factory=dict)  # each source's cool-down bound, if any

    def index(self) -> Column:
        """The queue's number in `names` (null: a source the list does not name)."""
        return _lookup({n: i for i, n in enumerate(self.names)})

    def group(self) -> Column:
        return F.coalesce(_lookup({n: self.groups.get(n, 0) for n in self.names}), F.lit(0))

    def bounds(self) -> list[int | None]:
        return [self.until.get(n) for n in self.names]


def _lookup(values: Mapping[str, int]) -> Column:
    pairs = [x for name, v in values.items() for x in (F.lit(name), F.lit(v))]
    return F.create_map(*pairs)[F.col("source")].cast("int") if pairs else F.lit(None).cast("int")


class _Narrow:
    """Records made as narrow as they go for a shuffle and sort, and put back whole after it: `constants`
    are left out, `partition` is `task`, and the RARE columns, null but for a few records, travel as one
    struct that is null for the others (`_raw_ts` is carried only where a policy made it differ from `ts`)."""

    def __init__(self, df: DataFrame, constants: Mapping[str, Any]) -> None:
        self.types = {f.name: f.dataType for f in df.schema.fields}
        self.kept = {name: value for name, value in constants.items() if name in self.types}
        self.rare = [c for c in RARE if c in self.types]

    def pack(self, prepared: DataFrame) -> DataFrame:
        unusual = [F.col(c).isNotNull() for c in self.rare if c != "_raw_ts"]
        if "_raw_ts" in self.rare:
            unusual.append(~F.col("_raw_ts").eqNullSafe(F.col("ts")))
        packed = {_RARE: F.when(functools.reduce(or_, unusual, F.lit(False)), F.struct(*self.rare))} \
            if self.rare else {}
        return prepared.withColumns(packed).drop(*self.kept, *self.rare, "partition")

    def restore(self, out: DataFrame, columns: list[str], added: list[str]) -> DataFrame:
        """`columns` in their place with their types, then `added`."""
        types, rare = self.types, self.rare
        back = {**{c: F.lit(v).cast(types[c]) for c, v in self.kept.items()},
                **{c: F.col(f"{_RARE}.{c}") for c in rare}, "partition": F.col("task")}
        if "_raw_ts" in rare:
            back["_raw_ts"] = F.when(F.col(_RARE).isNull(), F.col("ts")).otherwise(F.col(f"{_RARE}._raw_ts"))
        return out.select(*[back[c].alias(c) if c in back else c for c in columns], *added)


def _one_queue_streamed(df: DataFrame, stream_times: Mapping[str, Column], operator: Any,
                        constants: Mapping[str, Any]) -> DataFrame:
    """order_records for a task with one queue: its merge order is its offset order, so one sort by (task,
    offset) within Spark partitions spread by task, and one pass over each sorted partition computes every
    running value as the records stream by (RunningValues: constant memory, where a Spark window buffers a
    whole task). Same values as the windows of order_records (tests/test_order_chunks.py compares them).
    The shuffle and the sort (which spills at 100M records) carry each record as narrow as it goes
    (`_Narrow`); the stream times' predicates are computed before (they may read any column)."""
    added = ("seq", "_partition_time", "_partition_time_before", *stream_times)
    flags = {f"_reaches{i}": F.coalesce(reaches, F.lit(False)) for i, reaches in enumerate(stream_times.values())}
    partitions = _shuffle_partitions(df)
    narrow = _Narrow(df, constants)
    prepared = df.withColumn("task", F.col("partition")).drop(*[c for c in added if c in df.columns])
    columns = prepared.columns
    prepared = narrow.pack(prepared.withColumns({"_counted": F.col("_drop").isNull(), **flags})) \
        .repartition(partitions, "task").sortWithinPartitions("task", "offset", *_unchecked_last(prepared))
    prepared = one_copy_per_offset(prepared, ["task"], streamed=True, clear=["_counted", *flags])
    jdf = operator.apply(prepared._jdf, "task", "ts", "_counted", list(flags), list(stream_times), partitions)
    out = DataFrame(jdf, df.sparkSession)
    values = [c for c in out.columns if c not in {*columns, *flags, "_counted", _RARE}]  # the running values
    return narrow.restore(out, columns, values)


def _unchecked_last(df: DataFrame) -> list[Column]:
    """The copies of an offset side by side for its check (order/offsets.py), the records it does not check
    (unreadable ones) after them."""
    return [F.col("_copy").isNull()] if "_copy" in df.columns else []


def _shuffle_partitions(df: DataFrame) -> int:
    return int(df.sparkSession.conf.get("spark.sql.shuffle.partitions") or 200)


def _streamed_heads(df: DataFrame, stream_times: Mapping[str, Column], queues: Queues, operator: Any
                    ) -> tuple[DataFrame, _Narrow, list[str], dict[str, Column], int]:
    """The first pass of MergedQueues: the records narrowed, spread by task, sorted by (task, queue, offset),
    each with its queue's running values (partition time, merge key, next head) and each queue's marker."""
    added = ("seq", "_partition_time", "_partition_time_before", *stream_times)
    flags = {f"_reaches{i}": F.coalesce(reaches, F.lit(False)) for i, reaches in enumerate(stream_times.values())}
    partitions = _shuffle_partitions(df)
    narrow = _Narrow(df, {})
    prepared = df.withColumn("task", F.col("partition")).drop(*[c for c in added if c in df.columns])
    columns = prepared.columns
    prepared = narrow.pack(prepared.withColumns({"_counted": F.col("_drop").isNull(), "_queue": queues.index(),
                                                 "_group": queues.group(), **flags})) \
        .repartition(partitions, "task").sortWithinPartitions("task", "_queue", "offset", *_unchecked_last(prepared))
    prepared = one_copy_per_offset(prepared, ["task", "_queue"], streamed=True, clear=["_counted", *flags])
    heads = DataFrame(operator.heads(prepared._jdf, "task", "_queue", "ts", "_counted", queues.bounds(), partitions),
                      df.sparkSession)
    return heads, narrow, columns, flags, partitions


def _several_queues(df: DataFrame, stream_times: Mapping[str, Column], queues: Queues | None) -> DataFrame:
    """order_records for tasks of several queues: merged as Kafka Streams' heap takes them (§2.2-§2.5), by
    backfill's operator where its jar is loaded, else by the same rule in Python per task."""
    if queues is None:
        raise OrderingError("internal error: the queues of a task of several were not given")
    operator = merged_queues_operator(df)
    if operator is None:
        return _several_queues_by_task(df, stream_times, queues)
    heads, narrow, columns, flags, partitions = _streamed_heads(df, stream_times, queues, operator)
    # a greedy merge by head timestamp takes rows in non-decreasing merge key: only ties change places
    heads = heads.sortWithinPartitions("task", F.col("_merge_key").asc_nulls_first(), "_group", "_queue", "offset")
    jdf = operator.merge(heads._jdf, "task", "_queue", "_group", "topic", "ts", "_counted", list(flags),
                         list(stream_times), len(queues.names), partitions)
    return narrow.restore(DataFrame(jdf, df.sparkSession), columns,
                          ["seq", "_partition_time", "_partition_time_before", *stream_times,
                           *[c for c in CHECKED if c not in columns]])


def _recorded_streamed(df: DataFrame, stream_times: Mapping[str, Column], queues: Queues) -> DataFrame:
    """order_records for a recorded order (order_by): each queue's partition time in offset order, then the
    running values in the recorded order (seq, source rank, offset), both streamed (MergedQueues); the
    source's own `seq` is kept as `_recorded_seq`."""
    operator = merged_queues_operator(df)
    recorded = df.withColumn("_recorded_seq", F.col("seq"))
    heads, narrow, columns, flags, partitions = _streamed_heads(recorded, stream_times, queues, operator)
    heads = heads.sortWithinPartitions("task", "_recorded_seq", "source_rank", "offset")
    jdf = operator.merge(heads._jdf, "task", "_queue", "_group", "topic", "ts", "_counted", list(flags),
                         list(stream_times), max(len(queues.names), 1), partitions, True)
    return narrow.restore(DataFrame(jdf, df.sparkSession), columns,
                          ["seq", "_partition_time", "_partition_time_before", *stream_times,
                           *[c for c in CHECKED if c not in columns]])


def _several_queues_by_task(df: DataFrame, stream_times: Mapping[str, Column], queues: Queues) -> DataFrame:
    """_several_queues without the operator: each task's merge positions in Python (order/merge.py) over the
    few columns it reads, joined back; the running values are windows over the task in that order."""
    task_df = df.withColumn("task", F.col("partition")).withColumn("_queue", queues.index()).repartition("task")
    task_df = one_copy_per_offset(task_df, ["task", "_queue"])
    queue = Window.partitionBy("task", "_queue").orderBy("offset")
    task_df = task_df.withColumns({
        "_partition_time": F.max("ts").over(queue.rowsBetween(Window.unboundedPreceding, Window.currentRow)),
        "_partition_time_before": F.max("ts").over(queue.rowsBetween(Window.unboundedPreceding, -1))})
    bounds = queues.bounds()
    narrow = task_df.select("task", "_queue", queues.group().alias("_group"), "topic", "offset", "ts",
                            F.col("_drop").isNull().alias("_counted"))
    schema = "task int, _queue int, offset long, _merge_pos long"

    def positions(rows: Any) -> Any:
        import pandas as pd

        from backfill.order.merge import task_order

        records = [{"queue": None if pd.isna(q) else int(q), "group": int(g), "topic": t, "offset": int(o),
                    "ts": None if pd.isna(ts) else int(ts), "counted": bool(c)}
                   for q, g, t, o, ts, c in zip(rows["_queue"], rows["_group"], rows["topic"], rows["offset"],
                                                rows["ts"], rows["_counted"])]
        return pd.DataFrame({"task": rows["task"], "_queue": rows["_queue"], "offset": rows["offset"],
                             "_merge_pos": task_order(records, bounds)})

    merged = narrow.groupBy("task").applyInPandas(positions, schema) \
        .select(*[F.col(c).alias(f"_m{c}") for c in ("task", "_queue", "offset")], "_merge_pos")
    on = (F.col("task").eqNullSafe(F.col("_mtask")) & F.col("_queue").eqNullSafe(F.col("_m_queue"))
          & (F.col("offset") == F.col("_moffset")))
    task_df = task_df.join(merged, on, "left").drop("_mtask", "_m_queue", "_moffset")
    order = Window.partitionBy("task").orderBy("_merge_pos").rowsBetween(Window.unboundedPreceding, Window.currentRow)
    running = {"seq": F.count(F.when(F.col("_drop").isNull(), 1)).over(order).cast("long"),
               **{name: F.max(F.when(reaches, F.col("ts"))).over(order) for name, reaches in stream_times.items()}}
    return task_df.select(*[c for c in task_df.columns if c not in running], *[v.alias(k) for k, v in running.items()]) \
        .drop("_queue", "_merge_pos")


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
        size = _connect_size(df) if is_connect(df.sparkSession) else \
            int(str(df._jdf.queryExecution().optimizedPlan().stats().sizeInBytes()))
    except Exception:  # noqa: BLE001 - an estimate only
        return None
    return None if size >= 1 << 50 else size  # no estimate: Spark's is Long.MaxValue


_SIZE_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "PiB": 2**50, "EiB": 2**60}


def _connect_size(df: DataFrame) -> int:
    """The same estimate over Spark Connect (no JVM on the client): the optimized plan's root statistics, read
    from the cost-mode explain the server renders (`Statistics(sizeInBytes=1234.5 KiB)`)."""
    import re

    text = df._explain_string(mode="cost")  # type: ignore[attr-defined]
    found = re.search(r"Statistics\(sizeInBytes=([0-9.E+]+)\s*([KMGTPE]iB|B)", text)
    if found is None:
        raise ValueError("no statistics in the plan")
    return int(float(found.group(1)) * _SIZE_UNITS[found.group(2)])


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
