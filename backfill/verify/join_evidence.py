"""Part: verify. What verify reads as evidence of why a join row differs, apart from how it attributes causes
(verify/joins.py): the join's input records as the run read them, with each record's join stream time at
arrival, the input's offset gaps per task, and, for the rows that differ, the pairs of records that could have
made them, the records alone, and the records of a side that came after them (docs/semantics.md §5)."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from backfill.jobspec.fields import JOINER_FIELDS
from backfill.io.sources import read_source
from backfill.jobspec.models import OperatorSpec
from backfill.ops.expressions import joiner_sql
from backfill.ops.join import bucketed
from backfill.ops.windows import LEFT, JoinWindows
from backfill.plan.definition import Plan
from backfill.time.extract import extract
from backfill.verify.tables import recorded_gaps, source_committed_ranges, without_committed_gaps

NULL_KEY = "\u0000"  # stands for a null key in equi-joins (a join forwards null keys in 3.7+)


def value_text(value: Column, vtype: T.DataType, reparse: bool = False) -> Column:
    """The joiner's value as canonical text: JSON in the backfill's field order for a struct, else the text.

    `reparse`: the value is a struct of another field order or types (the joiner's own, where the published
    output was read back from JSON): matched to `vtype` by field name."""
    if isinstance(vtype, T.StructType):
        if reparse:
            value = F.from_json(F.to_json(value), vtype)
        return F.to_json(value, {"ignoreNullFields": "false"})
    return value.cast("string")


@dataclass(frozen=True)
class JoinEvidence:
    """The join's input records as the run processed them, and what the causes need to know of the spec."""

    records: DataFrame  # ops/join.py as_processed, plus `k` (the key as text)
    windows: JoinWindows
    joiner: str  # Spark SQL of the joiner over `left` and `right`
    vtype: T.DataType  # the published value's type
    gaps: DataFrame | None = None  # offset gaps of a co-partitioned join's inputs: task, topic, gap_from, gap_to,
    # ts_before, ts_after (every record read counts, a dropped one too: only what the archive lacks is a gap)
    declared: tuple[int | None, int | None] = (None, None)  # the run's range (--start, --end)
    # both outputs as read (backfill_rows, stream_rows), before the range cuts them: where the stream evidently went
    outputs: tuple[DataFrame, DataFrame] | None = None


def evidence(plan: Plan, op: OperatorSpec, vtype: T.DataType, spark: SparkSession,
             run: dict[str, Any] | None = None, outputs: tuple[DataFrame, DataFrame] | None = None) -> JoinEvidence:
    """The join's records as the run processed them (same reading, order and cut as `backfill run`); `run`: the
    manifest of the run over this range, whose gap record (docs/semantics.md §7.4) is used where it stands;
    `outputs`: both outputs before the range cuts them (JoinEvidence.outputs)."""
    from backfill.plan.evaluator import join_records  # the evaluator imports this package's users

    assert op.join is not None
    records = join_records(plan, spark, op.name)
    records = records.withColumn("k", F.col("key").cast("string"))
    gaps = None if op.join.group_by is not None else _input_gaps(spark, plan, op, run)  # a task is a partition
    return JoinEvidence(records=records, windows=JoinWindows.of(op.join),
                        joiner=joiner_sql(op.join.value, f"operators.{op.name}.join.value"), vtype=vtype, gaps=gaps,
                        declared=(plan.start, plan.end), outputs=outputs)


def _input_gaps(spark: SparkSession, plan: Plan, op: OperatorSpec, run: dict[str, Any] | None = None) -> DataFrame:
    """Where a join input's archive skips offsets (docs/semantics.md §7.4): per partition (the task of a
    co-partitioned join), the offsets missing and the timestamps of the records around them: as the run that
    published the output recorded them, where that record stands for the input, else found again."""
    frames = []
    for source in op.inputs:
        spec = plan.job.spec.sources[source]
        recorded = recorded_gaps(spark, plan, source, run)
        if recorded is not None:
            topic = spec.kafka.topic if spec.kafka is not None else spec.topic or source
            frames.append(recorded.select(F.col("partition").alias("task"), F.lit(topic).alias("topic"), "gap_from",
                                          "gap_to", "ts_before", "ts_after"))
            continue
        read = read_source(spark, plan.job, source, plan.source(source).rank, headers=False)
        df = extract(read.records, spec.timestamp, source).select("topic", "partition", "offset", "ts")
        order = Window.partitionBy("topic", "partition").orderBy("offset")
        gaps = df.select(F.col("partition").alias("task"), "topic", (F.lag("offset").over(order) + 1).alias(
            "gap_from"), (F.col("offset") - 1).alias("gap_to"), F.lag("ts").over(order).alias("ts_before"),
            F.col("ts").alias("ts_after")).where(F.col("gap_to") >= F.col("gap_from"))
        committed = source_committed_ranges(spark, plan, source)
        # transaction markers and aborted records: offsets the application never saw either
        frames.append(gaps if committed is None else without_committed_gaps(gaps, committed, "task"))
    return functools.reduce(DataFrame.unionByName, frames)


def _struct(prefix: str) -> Column:
    return F.struct(*[F.col(f"{prefix}{c}").alias(c) for c in JOINER_FIELDS])


def pairs(ev: JoinEvidence, keys: DataFrame) -> DataFrame:
    """Every pair of the keys' records inside the join window, whatever the stores held: the row it would
    give, both records, and whether the later one (in the run's task order) found the earlier."""
    w, c = ev.windows, F.col
    recs = ev.records.join(keys, "k", "left_semi").where(c("key").isNotNull() & c("value").isNotNull())
    lrows, rrows, equi = bucketed(recs, recs, w, wide=True, extra=("k",))
    inside = c("r_ts").between(F.greatest(F.lit(0), c("l_ts") - w.before), F.greatest(F.lit(0), c("l_ts") + w.after))
    pairs = lrows.join(rrows, equi & inside).dropDuplicates(["l_task", "l_seq", "r_seq"])
    left_later = c("l_seq") > c("r_seq")
    seen = F.when(left_later, c("r_ts") > c("l__sst_other") - w.retention).otherwise(
        c("l_ts") > c("r__sst_other") - w.retention)
    pairs = pairs.select(
        F.col("l_task").alias("task"), F.col("l_k").alias("k"), F.greatest("l_ts", "r_ts").alias("ts"),
        _struct("l_").alias("left"), _struct("r_").alias("right"),
        "l_seq", "r_seq", "l_ts", "r_ts", "l_partition", "l_offset", "r_partition", "r_offset", "l_topic",
        "r_topic", seen.alias("visible"), F.when(left_later, c("l__sst_other")).otherwise(
            c("r__sst_other")).alias("store_time"))
    return pairs.withColumn("v", value_text(F.expr(ev.joiner), ev.vtype, reparse=True)).drop("left", "right")


def singles(ev: JoinEvidence, keys: DataFrame) -> DataFrame:
    """The non-joined row of each outer-side record of the keys (null keys included)."""
    c = F.col
    recs = ev.records.join(keys, F.coalesce(ev.records["k"], F.lit(NULL_KEY)) == keys["k"], "left_semi") \
        .where(c("_outer") & c("value").isNotNull())
    this = F.struct(*[F.col(f).alias(f) for f in JOINER_FIELDS])
    none = F.lit(None).cast(recs.select(this.alias("s")).schema["s"].dataType)
    side = c("_side") == LEFT
    rows = recs.select("*", F.when(side, this).otherwise(none).alias("left"),
                       F.when(side, none).otherwise(this).alias("right"))
    value = F.expr(ev.joiner)
    return rows.select("task", "k", "ts", value_text(value, ev.vtype, reparse=True).alias("v"), "seq", "_side",
                       F.col("topic").alias("_x_topic"), F.col("partition").alias("_x_partition"),
                       F.col("offset").alias("_x_offset"))


def records_after(ev: JoinEvidence, probes: DataFrame) -> DataFrame:
    """For each probe (_pid, task, _side, seq): the first record of that side of the task processed after seq
    (`_next`: ts, topic, partition, offset, value), null when none. One record moved ahead of one record of
    another partition is the smallest change of interleaving there is: the evidence a cause may name."""
    rec = F.struct(F.col("ts"), F.col("topic"), F.col("partition"), F.col("offset"),
                   F.col("value").cast("string").alias("value"))
    recs = ev.records.where(F.col("key").isNotNull()).select(
        "task", "_side", "seq", F.lit(None).cast("long").alias("_pid"), rec.alias("_next"))
    mixed = recs.unionByName(probes.select("task", "_side", "seq", "_pid", F.lit(None).cast(
        recs.schema["_next"].dataType).alias("_next")))
    # newest first, a probe before the record of its own seq: the last record seen before a probe is the first
    # one processed after it (a running frame: one pass, where "the rows that follow" would rescan them all)
    ahead = Window.partitionBy("task", "_side").orderBy(F.desc("seq"), F.asc_nulls_last("_pid")).rowsBetween(
        Window.unboundedPreceding, -1)
    return mixed.withColumn("_next", F.last("_next", ignorenulls=True).over(ahead)) \
        .where(F.col("_pid").isNotNull()).select("_pid", "_next")
