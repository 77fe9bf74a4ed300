"""Part: verify. What verify reads as evidence of why a window differs, apart from how it attributes causes
(verify/causes.py): the input records that reach the operator (as the run read them, cut as it cut them), each
task's stream time at the end of the data, the input's offset gaps, each record's stream time at arrival where
a cause needs it (docs/semantics.md §4.2), and the members of the windows that differ with the variants a
late-drop proof tries."""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from backfill.io.sources import decoded, read_source
from backfill.ops.windows import TimeWindows
from backfill.order import cooldown
from backfill.plan.definition import Plan
from backfill.session import release as free
from backfill.jobspec.models import OperatorSpec
from backfill.ledger import UNREADABLE
from backfill.time.extract import extract
from backfill.verify.reconcile import BROADCAST_KEYS
from backfill.verify.tables import recorded_gaps, source_committed_ranges, without_committed_gaps

MAX_VARIANT = 10  # records tried per window and direction (most plausible first)
MAX_GAPS = 10_000
DECODED_ALL = "decoding every input value"  # how verify learnt which records reach the operator
DERIVED_GAPS = "found again in the input's offsets"  # how verify learnt the input's offset gaps


@dataclass(frozen=True)
class RestartEvidence:
    """What shows a restart: the application's committed offsets, or windows of a final output re-emitted
    with another value (key, window_start)."""

    commits: dict[int, int] | None = None
    changed: DataFrame | None = None


@dataclass(frozen=True)
class Evidence:
    """What the attribution looked at (lazy frames, persisted by the caller when reused)."""

    raw: DataFrame  # operator input as read (no ordering): partition, offset, key (text), value, ts, ...
    records: DataFrame  # the same cut as the run cut it; `stream_times` adds st (stream time at arrival) to a few
    partitions: DataFrame  # per partition: first_offset, first_ts, end_st, dense (no offset gap)
    gaps: DataFrame  # per gap: partition, gap_from, gap_to, st_before, ts_after
    late: DataFrame  # ledger late rows of the operator: partition, offset, window_start, stream_time
    ledger_read: bool
    stream_times_from: str = "re-derived from the input"  # or the run whose recorded stream times are used
    held: tuple[DataFrame, ...] = ()  # stored frames the others are built on, freed by `release`
    # `raw` and `records` may hold values as stored (see `input_records`): `decode` turns them into the
    # decoded values, for the few records whose values are read
    decode: Callable[[DataFrame], DataFrame] = decoded
    values_checked_by: str = DECODED_ALL  # or the run whose reading of the input is reused
    gaps_from: str = DERIVED_GAPS  # or the run whose gap record (plan/offsets.py) is used


def release(ev: Evidence) -> None:
    """Free what the evidence stored (the input as read and parsed once)."""
    for frame in ev.held:
        free(frame)


def key_text(df: DataFrame, column: str = "key") -> Column:
    """Keys as text, as the ledger stores them (hex for bytes)."""
    if isinstance(df.schema[column].dataType, T.BinaryType):
        return F.hex(column)
    return F.col(column).cast("string")


RECORD_COLUMNS = ("topic", "partition", "offset", "key", "value", "ts", "timestamp", "headers")


@dataclass(frozen=True)
class Input:
    """The records `gather` attributes with (see `input_records`)."""

    raw: DataFrame  # records reaching the operator
    records: DataFrame  # the same, cut as the run cut them
    offsets: DataFrame  # every offset read: partition, offset, ts, _r (reaches the operator)
    held: tuple[DataFrame, ...] = ()  # the stored frame they are built on
    decode: Callable[[DataFrame], DataFrame] = decoded
    checked_by: str = DECODED_ALL


def input_records(spark: SparkSession, plan: Plan, op: OperatorSpec, store: bool = True,
                  run: dict[str, Any] | None = None) -> Input:
    """The operator's input records. `store`: the input is read several times (causes are attributed), so it
    is read once and stored; otherwise each use reads it. Stream times are not derived here: `stream_times`
    does it for the few records a cause needs, without ordering the whole input.

    Which records reach the operator depends on which values are unreadable, and knowing that means decoding
    every value (most of reading the input). When `run` (the manifest of the run that published the output)
    read this very input and found no unreadable value in it (`reusable_reading`), that decoding is not done
    again: values are stored as read and decoded (`Input.decode`) only for the records whose values a cause
    reads."""
    assert op.aggregate is not None
    if op.aggregate.group_by is not None:
        return _repartitioned_input(spark, plan, op)
    source = op.aggregate.input
    spec = plan.job.spec.sources[source]
    reuse = reusable_reading(plan, source, run)
    read = read_source(spark, plan.job, source, plan.source(source).rank, raw_values=reuse is not None)
    if reuse is not None and read.content != reuse[1]:  # the input changed since: every value is decoded
        reuse, read = None, read_source(spark, plan.job, source, plan.source(source).rank)
    df = extract(read.records, spec.timestamp, source)
    # with `store`, read and parsed once and stored: the offsets, the ordered records and the samples' inputs are
    # built on it (reading and parsing is most of each pass over the input)
    df = df.select(*[key_text(df).alias("key") if c == "key" else c for c in RECORD_COLUMNS],
                   (F.col("key").isNotNull() & F.col("_drop").isNull()).alias("_r"))  # reaches the operator
    held = (df.localCheckpoint(eager=False),) if store else ()
    df = held[0] if held else df
    offsets = df.select("partition", "offset", "ts", "_r")
    if plan.start is not None:  # the run's warm-up bound (evaluator: records with ts >= start)
        df = df.where(F.col("ts").isNull() | (F.col("ts") >= F.lit(plan.start)))
    reaches = F.col("_r")
    raw = df.where(reaches).select(*RECORD_COLUMNS)
    until = plan.source(source).read_until
    if until is not None:  # the run's cool-down cut, without ordering the records
        df = cooldown.up_to_cut(df, until)
    records = df.where(reaches).select(*RECORD_COLUMNS)
    if reuse is None:
        return Input(raw, records, offsets, held)
    return Input(raw, records, offsets, held, read.decode, f"run {reuse[0]} (the input is as it read it, and no "
                 "value in it was unreadable)")


def reusable_reading(plan: Plan, source: str, run: dict[str, Any] | None) -> tuple[str, str] | None:
    """(run id, input fingerprint) of `run` when its reading of `source` can be reused: it found no value
    unreadable, and the fingerprint it recorded (io/sources.py `content_fingerprint`) is what the input must
    have now for that to still hold; else None."""
    spec = plan.job.spec.sources[source]
    if run is None or spec.format not in ("parquet", "delta") or spec.timestamp.extractor != "record":
        return None  # a JSONL line is decoded whole; a timestamp taken from the value needs the value
    try:
        recorded = (json.loads(run.get("inputs") or "{}").get(source) or {}).get("content")
    except (TypeError, ValueError, AttributeError):
        return None
    unreadable = ((run.get("counts") or {}).get("source_drops") or {}).get(source, {}).get(UNREADABLE, 0)
    if not recorded or unreadable:
        return None
    return str(run.get("run_id") or "?"), str(recorded)


STAMP_BLOCK = 256  # offsets per block: stream times before a block come from per-block maxima


def stream_times(ev: Evidence, rows: DataFrame) -> DataFrame:
    """`rows` (records of `ev.records`, possibly repeated, e.g. once per window) with `st`: the record's
    processor-local stream time including itself, the largest timestamp of its partition's records up to its
    offset (4.1 step 3; null keys and dropped records never move it).

    Ordering the whole input by offset for a few records' stream times is most of the cost of attributing
    causes; instead one aggregation gives each block of STAMP_BLOCK offsets its largest timestamp, and only
    the blocks that hold `rows` are ordered. A re-keyed operator's records carry their st already."""
    if "st" in rows.columns:
        return rows
    block = F.floor(F.col("offset") / F.lit(STAMP_BLOCK)).cast("long").alias("_b")
    stamps = ev.records.select("partition", "offset", "ts", block)
    before = (stamps.groupBy("partition", "_b").agg(F.max("ts").alias("_bmax"))
              .withColumn("_before", F.max("_bmax").over(Window.partitionBy("partition").orderBy("_b")
                                                         .rowsBetween(Window.unboundedPreceding, -1)))
              .drop("_bmax"))
    wanted = rows.select("partition", block).distinct()
    upto = Window.partitionBy("partition", "_b").orderBy("offset").rangeBetween(Window.unboundedPreceding, 0)
    within = (stamps.join(F.broadcast(wanted), ["partition", "_b"], "left_semi")
              .withColumn("_within", F.max("ts").over(upto))
              .groupBy("partition", "offset").agg(F.max("_within").alias("_within")))  # one row per offset
    return (rows.withColumn("_b", block).join(within, ["partition", "offset"], "left")
            .join(before, ["partition", "_b"], "left")
            .withColumn("st", F.greatest("_before", "_within")).drop("_b", "_before", "_within"))


def _repartitioned_input(spark: SparkSession, plan: Plan, op: OperatorSpec) -> Input:
    """A re-keyed operator reads its repartition topic: its tasks, offsets and stream times are the modelled
    topic's (ops/repartition.py); ledger rows, which name input records, are mapped onto it in `gather`."""
    from backfill.plan.evaluator import repartitioned_records  # the evaluator imports this package's users

    df = repartitioned_records(plan, spark, op.name)
    reaches = F.col("key").isNotNull()
    columns = [key_text(df).alias("key") if c == "key" else c for c in RECORD_COLUMNS]
    offsets = df.where(reaches).select("partition", "offset", "ts", F.lit(True).alias("_r"))
    kept = df.where(reaches)
    return Input(kept.select(*columns), kept.select(*columns, "st", "_origin"), offsets)


def gather(spark: SparkSession, plan: Plan, op: OperatorSpec, ledger: DataFrame | None,
           run: dict[str, Any] | None = None, store: bool = True) -> Evidence:
    """Read the evidence of one operator: input records, partition facts, offset gaps, late drops.

    `run`: the manifest of the run over this range (io/runs.py `last_run`); each task's stream time at the
    end of the data is then the one the run recorded, not derived again.
    """
    read = input_records(spark, plan, op, store, run)
    raw, records, offsets = read.raw, read.records, read.offsets
    recorded = ((run or {}).get("counts", {}).get("operators", {}).get(op.name) or {}).get("final_stream_time")
    if recorded:
        end_st = spark.createDataFrame([(int(task), int(st)) for task, st in recorded.items()],
                                       "partition int, end_st long")
        origin = f"recorded by run {run['run_id']}" if run else ""
    else:
        end_st = records.groupBy("partition").agg(F.max("ts").alias("end_st"))  # the last record's st
        origin = "re-derived from the input"
    partitions = (offsets.groupBy("partition").agg(
        F.min("offset").alias("first_offset"), F.min_by("ts", "offset").alias("first_ts"),
        (F.max("offset") - F.min("offset") + 1 == F.count(F.lit(1))).alias("dense"))
        .join(end_st, "partition", "left"))
    gaps, gaps_from = _gaps(spark, plan, op, offsets, run)
    late_schema = "partition int, offset long, window_start long, stream_time long"
    if ledger is None:
        late = spark.createDataFrame([], late_schema)
    else:
        late = (ledger.where((F.col("operator") == op.name) & (F.col("reason") == "late"))
                .select(F.col("partition").cast("int"), F.col("offset").cast("long"),
                        F.col("window_start").cast("long"), F.col("stream_time").cast("long")))
        if "_origin" in records.columns:  # a re-keyed operator: the input record's place in its repartition topic
            places = records.select(F.col("_origin.partition").alias("_p"), F.col("_origin.offset").alias("_o"),
                                    "partition", "offset")
            late = (late.withColumnRenamed("partition", "_p").withColumnRenamed("offset", "_o")
                    .join(places, ["_p", "_o"]).select("partition", "offset", "window_start", "stream_time"))
    return Evidence(raw=raw, records=records, partitions=partitions, gaps=gaps, late=late,
                    ledger_read=ledger is not None, stream_times_from=origin, held=read.held, decode=read.decode,
                    values_checked_by=read.checked_by, gaps_from=gaps_from)


def _gaps(spark: SparkSession, plan: Plan, op: OperatorSpec, offsets: DataFrame, run: dict[str, Any] | None
          ) -> tuple[DataFrame, str]:
    """The operator's input's offset gaps (partition, gap_from, gap_to, st_before, ts_after) and where they come
    from: the gap record of the run that published the output, when it stands for the input as it is; else
    found again in every offset read (what a read_committed consumer never sees left out, as the run does)."""
    assert op.aggregate is not None
    if op.aggregate.group_by is None:
        recorded = recorded_gaps(spark, plan, op.aggregate.input, run)
        if recorded is not None:
            return (recorded.withColumnRenamed("ts_before", "st_before"),
                    f"recorded by run {(run or {}).get('run_id', '?')}")
    order = Window.partitionBy("partition").orderBy("offset")
    gaps = (offsets.withColumn("_prev", F.lag("offset").over(order))
            .withColumn("st_before", F.max(F.when(F.col("_r"), F.col("ts"))).over(
                order.rowsBetween(Window.unboundedPreceding, -1)))
            .where(F.col("offset") - F.col("_prev") > 1)
            .select("partition", (F.col("_prev") + 1).alias("gap_from"), (F.col("offset") - 1).alias("gap_to"),
                    "st_before", F.col("ts").alias("ts_after")))
    committed = None if op.aggregate.group_by is not None else source_committed_ranges(spark, plan, op.aggregate.input)
    if committed is not None:  # transaction markers and aborted records: offsets no consumer of the topic saw
        gaps = without_committed_gaps(gaps, committed)
    return gaps.limit(MAX_GAPS), DERIVED_GAPS


def sample_members(ev: Evidence, windows: TimeWindows, wanted: DataFrame, limit: int) -> DataFrame:
    """Input records behind a few windows (no ordering pass): the first `limit` of each, accepted or late per
    the ledger, with `total`: how many the window has."""
    keys = wanted.select("key").distinct()
    rows = (ev.decode(ev.raw.join(F.broadcast(keys), "key", "left_semi"))
            .select("*", F.explode(windows.starts("ts")).alias("window_start"))
            .join(F.broadcast(wanted.select("key", "window_start")), ["key", "window_start"]))
    late = ev.late.select("partition", "offset", "window_start", F.lit("late").alias("status"))
    rows = rows.join(late, ["partition", "offset", "window_start"], "left").fillna("accepted", ["status"])
    per_window = Window.partitionBy("key", "window_start")
    ranked = (rows.withColumn("_n", F.row_number().over(per_window.orderBy("partition", "offset")))
              .withColumn("total", F.count(F.lit(1)).over(per_window)))
    return ranked.where(F.col("_n") <= limit).drop("_n")


def few(df: DataFrame, n: int) -> DataFrame:
    """`df` marked for broadcast when it has at most BROADCAST_KEYS rows (`n`: a bound on them): the input
    is then filtered by it where it is read, not shuffled to meet it."""
    return F.broadcast(df) if n <= BROADCAST_KEYS else df


def distinct_keys(df: DataFrame) -> DataFrame:
    """The distinct keys of `df`, stored (they are few, and read again), marked for broadcast when few."""
    keys = df.select("key").distinct().localCheckpoint()
    return few(keys, keys.count())


def members(ev: Evidence, windows: TimeWindows, wanted: DataFrame, n: int) -> DataFrame:
    """Input records of the `wanted` (key, window_start) windows (at most `n`), `accepted` or `late` per the
    ledger."""
    keys = few(wanted.select("key").distinct(), n)
    exploded = stream_times(ev, ev.decode(ev.records.join(keys, "key", "left_semi"))
                            .select("*", F.explode(windows.starts("ts")).alias("window_start"))
                            .join(few(wanted.select("key", "window_start"), n), ["key", "window_start"], "inner"))
    if ev.ledger_read:
        late = ev.late.select("partition", "offset", "window_start", F.lit(True).alias("_late"))
        flagged = exploded.join(late, ["partition", "offset", "window_start"], "left")
        is_late = F.coalesce(F.col("_late"), F.lit(False))
    else:  # no ledger sink: the engine's rule (docs/semantics.md §4.2)
        flagged = exploded
        is_late = windows.closed(F.col("window_start"), F.col("st"))
    return flagged.withColumn("status", F.when(is_late, F.lit("late")).otherwise(F.lit("accepted"))).drop("_late")


def bounded_members(ev: Evidence, wanted: DataFrame, n: int, session: bool) -> DataFrame:
    """Input records of the `wanted` (key, window_start, window_end) sliding or session windows (at most `n`):
    the key's records whose timestamp lies in [start, end] (both ends inclusive, docs/semantics.md §10.1, §11.1),
    with their stream time, `accepted` or `late` per the ledger: a sliding window's own late rows (a record can
    be refused by one window and counted in another); for a session, the record's (a late record joins no
    session). A sliding window never holds a null value (§10.2). Needs the ledger (`ev.ledger_read`)."""
    keys = few(wanted.select("key").distinct(), n)
    windows = few(wanted.select(F.col("key").alias("_k"), "window_start", "window_end"), n)
    records = ev.decode(ev.records.join(keys, "key", "left_semi"))
    if not session:
        records = records.where(F.col("value").isNotNull())
    inside = records.join(windows, (F.col("key") == F.col("_k")) & F.col("ts").between(
        F.col("window_start"), F.col("window_end"))).drop("_k")
    if session:
        late = ev.late.select("partition", "offset", F.lit(True).alias("_late")).distinct()
        flagged = stream_times(ev, inside).join(late, ["partition", "offset"], "left")
    else:  # refused by this window, or dropped at once (one row, for the window [t, t + D], §10.2)
        late = ev.late.select("partition", "offset", "window_start", F.lit(True).alias("_late")).distinct()
        at_once = ev.late.select("partition", "offset", F.col("window_start").alias("ts"),
                                 F.lit(True).alias("_at_once")).distinct()
        flagged = (stream_times(ev, inside).join(late, ["partition", "offset", "window_start"], "left")
                   .join(at_once, ["partition", "offset", "ts"], "left")
                   .withColumn("_late", F.col("_late") | F.col("_at_once")).drop("_at_once"))
    return flagged.withColumn("status", F.when(F.coalesce(F.col("_late"), F.lit(False)), F.lit("late"))
                              .otherwise(F.lit("accepted"))).drop("_late")


def variants(mem: DataFrame) -> DataFrame:
    """Explode each member into the variants it belongs to: +k = k least-late drops added, -k = k most
    exposed behind-stream-time acceptances removed (k <= MAX_VARIANT)."""
    per_window = Window.partitionBy("key", "window_start")
    behind = (F.col("status") == "accepted") & (F.col("st") > F.col("ts"))
    m = (mem.withColumn("_behind", behind)
         .withColumn("_rank_late", F.when(F.col("status") == "late", F.row_number().over(
             per_window.orderBy(F.col("status").desc(), "st", "offset"))))
         .withColumn("_rank_behind", F.when(F.col("_behind"), F.row_number().over(
             per_window.orderBy(F.col("_behind").desc(), F.col("st").desc(), F.col("offset").desc())))))
    m = (m.withColumn("_n_late", F.least(F.count("_rank_late").over(per_window), F.lit(MAX_VARIANT)))
         .withColumn("_n_behind", F.least(F.count("_rank_behind").over(per_window), F.lit(MAX_VARIANT))))
    late_ids = F.when(F.col("_n_late") >= 1, F.sequence(F.lit(1), F.col("_n_late").cast("int")))
    drop_ids = F.when(F.col("_n_behind") >= 1, F.sequence(-F.col("_n_behind").cast("int"), F.lit(-1)))
    empty = F.array().cast("array<int>")
    accepted_ids = F.concat(F.coalesce(late_ids, empty), F.coalesce(
        F.when(F.col("_behind") & (F.col("_rank_behind") <= F.lit(MAX_VARIANT)),
               # a behind record stays in the removal variants that remove fewer than its rank
               F.when(F.col("_rank_behind") > 1, F.sequence(-(F.col("_rank_behind") - 1).cast("int"), F.lit(-1))))
        .when(~F.col("_behind") | (F.col("_rank_behind") > F.lit(MAX_VARIANT)), drop_ids), empty))
    late_in = F.when(F.col("_rank_late") <= F.col("_n_late"),
                     F.sequence(F.col("_rank_late").cast("int"), F.col("_n_late").cast("int")))
    ids = F.when(F.col("status") == "accepted", accepted_ids).otherwise(F.coalesce(late_in, empty))
    return m.select("*", F.explode(ids).alias("variant"))
