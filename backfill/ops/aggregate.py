"""Time-windowed aggregation (kafka-streams.md 4, 7, 11) on records already in task order.

Per record reaching the operator (key not null; null values are aggregated), for each window of
windowsFor(ts) in ascending start: accepted iff window end > ST - G, with ST the operator's own stream
time including this record (4.1); else a `late` ledger row for that window. State is per task.
`updates` emits every accepted update (cache off, 4.3); `final` emits each window once it is closed
(ST >= end + G at the end of the data: suppress untilWindowCloses / ON_WINDOW_CLOSE, 4.4 and 7).
"""
from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from backfill.errors import NotImplementedYet
from backfill.ledger import LATE, NULL_KEY, ledger_rows
from backfill.ops.expressions import CompiledAggregation, compile_aggregations
from backfill.ops.windows import TimeWindows
from backfill.jobspec.models import OperatorSpec

FOLD_FIELDS = ("seq", "key", "value", "ts", "timestamp", "topic", "partition", "offset", "headers")


@dataclass(frozen=True)
class AggregateResult:
    """What one aggregate operator produced (all lazy DataFrames)."""

    output: DataFrame
    ledger: DataFrame
    incomplete: DataFrame | None
    cached: tuple[DataFrame, ...] = ()
    # emit: final: every window with `_closed` and `_split`; publish writes the closed ones (`output`)
    # and counts the open and split ones in the same pass
    windows: DataFrame | None = None


def reaches(op: OperatorSpec) -> Column:
    """Records that reach the window aggregate: its input, key not null (4.1 step 1)."""
    assert op.aggregate is not None
    return (F.col("source") == op.aggregate.input) & F.col("key").isNotNull() & F.col("_drop").isNull()


def late_windows(windows: TimeWindows, st: str) -> dict[str, Column]:
    """Per record, without exploding: how many of its windows are late, and whether any is accepted."""
    first, last = windows.first_start("ts"), windows.last_start("ts")
    threshold = F.col(st) - F.lit(windows.grace + windows.size)  # a window is late iff start <= ST - G - S
    late = F.when(threshold < first, F.lit(0)).otherwise(
        F.floor((F.least(last, threshold) - first) / F.lit(windows.advance)) + 1)
    return {"late": late, "contributing": last > threshold}


def aggregate(op: OperatorSpec, ordered: DataFrame, st: str, final_st: dict[int, int] | None = None,
              dropped: DataFrame | None = None) -> AggregateResult:
    """Run one aggregate operator over task-ordered records; `st` names its stream-time column.

    `final_st` maps each task to its stream time at the end of the data (needed by emit: final).
    `dropped`, if given, is a subset of `ordered` holding at least every record with a null key or a
    late window: the ledger rows are built from it (one small cached frame instead of two scans).
    """
    spec = op.aggregate
    assert spec is not None
    if spec.group_by:
        raise NotImplementedYet(f"operators.{op.name}.aggregate.group_by: re-keying (a repartition) is not "
                                "implemented yet; it comes with the Kafka source issue. Aggregate by the record key")
    if spec.window.type not in ("tumbling", "hopping"):
        raise NotImplementedYet(f"operators.{op.name}.aggregate.window.type: {spec.window.type} windows are not "
                                "implemented yet; use tumbling or hopping")
    windows = TimeWindows.of(spec.window)
    aggs = compile_aggregations(spec.aggregations, f"operators.{op.name}.aggregate")
    reaching = (F.col("source") == spec.input) & F.col("_drop").isNull()
    mine = ordered.where(reaching)
    ledger_input = mine if dropped is None else dropped.where(reaching)
    null_keys = ledger_rows(ledger_input.where(F.col("key").isNull()), reason=NULL_KEY, operator=op.name,
                            stream_time=F.col(st), range_time=F.col("ts"))
    keyed = mine.where(F.col("key").isNotNull())
    # only records with a late window are exploded for the ledger (a few percent, not all)
    late_records = ledger_input.where(F.col("key").isNotNull() & (late_windows(windows, st)["late"] > 0))
    late = ledger_rows(_pairs(late_records, windows, st).where(~F.col("_accepted")), reason=LATE, operator=op.name,
                       stream_time=F.col(st), window_start=F.col("window_start"),
                       window_end=F.col("window_end"), range_time=F.col("window_start"))
    accepted = _pairs(keyed, windows, st).where("_accepted")
    if spec.emit == "updates":
        return AggregateResult(output=_updates(accepted, aggs, windows), ledger=null_keys.unionByName(late),
                               incomplete=None)
    all_windows = _final(accepted, aggs, windows, final_st or {})
    return AggregateResult(output=all_windows.where("_closed").select(*final_columns(all_windows)),
                           ledger=null_keys.unionByName(late), incomplete=None, windows=all_windows)


def _pairs(records: DataFrame, windows: TimeWindows, st: str) -> DataFrame:
    """(record, window) pairs of windowsFor(ts), each marked accepted or late against the stream time."""
    return (records.select("*", F.posexplode(windows.starts("ts")).alias("widx", "window_start"))
            .withColumn("window_end", F.col("window_start") + F.lit(windows.size))
            # kept while end > ST - G (kafka-streams.md 4.1 step 5)
            .withColumn("_accepted", F.col("window_end") > F.col(st) - F.lit(windows.grace)))


def _record_struct() -> Column:
    return F.struct(*[F.col(c) for c in FOLD_FIELDS])


def _updates(accepted: DataFrame, aggs: list[CompiledAggregation], w: TimeWindows) -> DataFrame:
    """One row per accepted (record, window), emitted in processing order (4.3, cache off)."""
    state = (Window.partitionBy("task", "key", "window_start").orderBy("seq")
             .rowsBetween(Window.unboundedPreceding, Window.currentRow))
    cols, folds = [], []
    for agg in aggs:
        if agg.is_fold:  # the records so far, in order; folded in a second projection
            cols.append(F.collect_list(_record_struct()).over(state).alias(f"_trail_{agg.name}"))
            folds.append(agg)
        else:
            cols.append(agg.aggregate().over(state).alias(agg.name))
    # emission order within a task: by record, then ascending window start
    emit_seq = F.col("seq") * F.lit(w.per_record) + F.col("widx")
    rows = accepted.select(
        "key", "window_start", "window_end", *cols, F.max("ts").over(state).alias("ts"),
        emit_seq.cast("long").alias("emit_seq"), F.col("task"))
    for agg in folds:
        rows = rows.withColumn(agg.name, agg.fold_over(f"_trail_{agg.name}")).drop(f"_trail_{agg.name}")
    return rows.select("key", "window_start", "window_end", *[a.name for a in aggs], "ts", "emit_seq", "task")


def _final(accepted: DataFrame, aggs: list[CompiledAggregation], w: TimeWindows,
           final_st: dict[int, int]) -> DataFrame:
    """Every window with `_closed` (closed by the end of the data: emitted) and `_split` (kept by two
    tasks). Nothing is cached: the publish step reads it once, writing the closed windows and
    counting the open ones, which are reported, never emitted.
    """
    # final once the task's stream time >= end + G (4.1 "equivalently", 7 untilWindowCloses)
    task_st = F.element_at(F.create_map(*[F.lit(x) for kv in final_st.items() for x in kv]), F.col("task")) \
        if final_st else F.lit(None).cast("long")
    windows = _windows(accepted, aggs, w).withColumn(
        "_closed", F.coalesce(task_st >= F.col("window_end") + F.lit(w.grace), F.lit(False)))
    cols = ["key", "window_start", "window_end", *[a.name for a in aggs], "ts"]
    return windows.select(*cols, "task", "_closed", "_split")


def final_columns(windows: DataFrame) -> list[str]:
    """The output columns of an `emit: final` windows frame (without `task`, `_closed`, `_split`)."""
    return [c for c in windows.columns if c not in ("task", "_closed", "_split")]


def _windows(accepted: DataFrame, aggs: list[CompiledAggregation], w: TimeWindows) -> DataFrame:
    """One row per (key, window): its aggregates over the records it accepted, ts = their max.

    Grouped by (key, window_start), so the output is unique by construction; `task` is the task that
    kept the window and `_split` marks a window kept by several tasks (a key in several partitions),
    which the publish step refuses (checked in the pass that writes the output).
    """
    if any(a.order_sensitive and not a.is_fold for a in aggs):
        last = _updates(accepted, aggs, w)
        names = [a.name for a in aggs] + ["ts", "window_end"]
        return (last.groupBy("key", "window_start")
                .agg(F.max_by(F.struct(*names), "emit_seq").alias("_last"), *_task_span())
                .select("key", "window_start", *[F.col(f"_last.{n}").alias(n) for n in names], "task", "_split"))
    return accepted.groupBy("key", "window_start").agg(
        *[_final_column(a) for a in aggs], F.max("ts").alias("ts"), *_task_span()).withColumn(
        "window_end", F.col("window_start") + F.lit(w.size))


def _task_span() -> list[Column]:
    return [F.min("task").alias("task"), (F.min("task") != F.max("task")).alias("_split")]


def _final_column(agg: CompiledAggregation) -> Column:
    if not agg.is_fold:
        return agg.aggregate().alias(agg.name)
    # fold in processing order: sort the window's records by seq, then aggregate (Kafka Streams aggregate)
    fields = ", ".join(FOLD_FIELDS)
    by_seq = "(l, r) -> CASE WHEN l.seq < r.seq THEN -1 WHEN l.seq > r.seq THEN 1 ELSE 0 END"
    ordered = f"array_sort(collect_list(struct({fields})), {by_seq})"
    return agg.fold_over(ordered).alias(agg.name)
