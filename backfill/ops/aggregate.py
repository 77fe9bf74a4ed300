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
from backfill.spec.models import OperatorSpec

FOLD_FIELDS = ("seq", "key", "value", "ts", "timestamp", "topic", "partition", "offset", "headers")


@dataclass(frozen=True)
class AggregateResult:
    """What one aggregate operator produced (all lazy DataFrames)."""

    output: DataFrame
    ledger: DataFrame
    incomplete: DataFrame | None
    pairs: DataFrame


def reaches(op: OperatorSpec) -> Column:
    """Records that reach the window aggregate: its input, key not null (4.1 step 1)."""
    assert op.aggregate is not None
    return (F.col("source") == op.aggregate.input) & F.col("key").isNotNull() & F.col("_drop").isNull()


def aggregate(op: OperatorSpec, ordered: DataFrame, st: str) -> AggregateResult:
    """Run one aggregate operator over task-ordered records; `st` names its stream-time column."""
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
    mine = ordered.where((F.col("source") == spec.input) & F.col("_drop").isNull())
    null_keys = ledger_rows(mine.where(F.col("key").isNull()), reason=NULL_KEY, operator=op.name,
                            stream_time=F.col(st), range_time=F.col("ts"))
    pairs = (mine.where(F.col("key").isNotNull())
             .select("*", F.posexplode(windows.starts("ts")).alias("widx", "window_start"))
             .withColumn("window_end", F.col("window_start") + F.lit(windows.size))
             # kept while end > ST - G (kafka-streams.md 4.1 step 5)
             .withColumn("_accepted", F.col("window_end") > F.col(st) - F.lit(windows.grace)))
    late = ledger_rows(pairs.where(~F.col("_accepted")), reason=LATE, operator=op.name,
                       stream_time=F.col(st), window_start=F.col("window_start"),
                       window_end=F.col("window_end"), range_time=F.col("window_start"))
    accepted = pairs.where("_accepted")
    if spec.emit == "updates":
        output, incomplete = _updates(accepted, aggs, windows), None
    else:
        output, incomplete = _final(accepted, aggs, windows, st)
    return AggregateResult(output=output, ledger=null_keys.unionByName(late), incomplete=incomplete, pairs=pairs)


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
           st: str) -> tuple[DataFrame, DataFrame]:
    """One row per window closed by the end of the data; open windows are reported, not emitted."""
    close_st = accepted.groupBy("task").agg(F.max(st).alias("_task_st"))
    if any(a.order_sensitive and not a.is_fold for a in aggs):
        last = _updates(accepted, aggs, w)
        names = [a.name for a in aggs] + ["ts", "window_end"]
        windows = (last.groupBy("task", "key", "window_start")
                   .agg(F.max_by(F.struct(*names), "emit_seq").alias("_last"), F.count(F.lit(1)).alias("_n"))
                   .select("task", "key", "window_start", *[F.col(f"_last.{n}").alias(n) for n in names], "_n"))
    else:
        windows = accepted.groupBy("task", "key", "window_start").agg(
            *[_final_column(a) for a in aggs], F.max("ts").alias("ts"), F.count(F.lit(1)).alias("_n"),
            F.first("window_end").alias("window_end"))
    windows = windows.join(F.broadcast(close_st), "task")
    # final once ST >= end + G (4.1 "equivalently", 7 untilWindowCloses)
    closed = F.col("_task_st") >= F.col("window_end") + F.lit(w.grace)
    cols = ["key", "window_start", "window_end", *[a.name for a in aggs], "ts"]
    output = windows.where(closed).select(*cols)
    incomplete = windows.where(~closed).select(*cols, F.col("_task_st").alias("stream_time"), "task")
    return output, incomplete


def _final_column(agg: CompiledAggregation) -> Column:
    if not agg.is_fold:
        return agg.aggregate().alias(agg.name)
    # fold in processing order: sort the window's records by seq, then aggregate (Kafka Streams aggregate)
    fields = ", ".join(FOLD_FIELDS)
    by_seq = "(l, r) -> CASE WHEN l.seq < r.seq THEN -1 WHEN l.seq > r.seq THEN 1 ELSE 0 END"
    ordered = f"array_sort(collect_list(struct({fields})), {by_seq})"
    return agg.fold_over(ordered).alias(agg.name)
