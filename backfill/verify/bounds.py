"""Part: verify. Where the stream's output starts and ends, and which differing rows straddle such a bound
(`range_boundary` from the stream's side, docs/semantics.md §8). One rule for every operator kind.

A bound is known only from evidence, per task (the input partition a key's records come from):

- declared: the range of the run (`--start` / `--end`), stated to be the range the stream's output covers;
- observed: the first and the last position (window start, a join row's ts) the stream wrote for the task,
  where the backfill's output of the task starts earlier, or ends later: the stream's output evidently starts
  later, or ends earlier, than the data.

A row straddles a start bound when the bound lies inside the span of its records' timestamps; an end bound
when the bound lies after its position and no later than its close (the stream time up to which a record can
still change it: window end + grace, + gap for a session).

The stream evidently went past a row when it wrote a later position of the task, or the same position for
another key of the task (a window closes for every key of a task at once); a row it went past is at no end
bound. It evidently started before a row when it wrote an earlier position of the task. A row beyond all the
stream wrote, with nothing declared, is no evidence: a stream that lost its head or its tail looks the same.

The data read's own bounds (a window not closed by its end, or starting before the first record read of a
partition read from a later offset) explain only a row the stream has (`in_data_read`).
"""
from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

BOUND = "_bound"  # the column `straddled` adds: the evidenced bound a row straddles (its text), else null


@dataclass(frozen=True)
class Written:
    """The positions both outputs wrote, before the verified range cuts them, and the run's declared range."""

    stream: DataFrame  # key, at: every row of the streaming output
    backfill: DataFrame  # key, at: every row of the backfill's output
    tasks: DataFrame  # key, task: the keys whose records come from one task
    declared: tuple[int | None, int | None] = (None, None)


def tasks_of(records: DataFrame, column: str = "partition") -> DataFrame:
    """key, task: the keys of `records` that all come from one partition (the others have no task)."""
    return (records.groupBy("key").agg(F.min(column).alias("task"), F.max(column).alias("_last"))
            .where(F.col("task") == F.col("_last")).select("key", F.col("task").cast("int").alias("task")))


def straddled(rows: DataFrame, written: Written, at: Column, span: tuple[Column, Column], close: Column
              ) -> DataFrame:
    """`rows` (with `key` and `_task`) plus BOUND: the evidenced start or end of the stream's output the row
    straddles, as text; null when no evidence shows one (module docstring). `at`: the row's position (as in
    `written`), `span`: [from, to) of its records' timestamps, `close`: the stream time that completes it."""
    marked = (rows.withColumn("_b_at", at).withColumn("_b_from", span[0]).withColumn("_b_end", span[1])
              .withColumn("_b_close", close))
    wanted = marked.where(F.col("_task").isNotNull()).select(F.col("_task").alias("task")).distinct()
    wanted = F.broadcast(wanted)  # the tasks of a few differing rows
    stream = written.stream.join(written.tasks, "key").join(wanted, "task", "left_semi")
    backfill = written.backfill.join(written.tasks, "key").join(wanted, "task", "left_semi")
    own = stream.groupBy("task").agg(F.min("at").alias("_b_lo"), F.max("at").alias("_b_hi"))
    theirs = backfill.groupBy("task").agg(F.min("at").alias("_b_blo"), F.max("at").alias("_b_bhi"))
    marked = (marked.join(own.withColumnRenamed("task", "_task"), "_task", "left")
              .join(theirs.withColumnRenamed("task", "_task"), "_task", "left"))
    marked = marked.join(_others(marked, stream), ["_task", "_b_at", "key"], "left")
    return marked.withColumn(BOUND, _bound(written.declared)).drop(
        "_b_at", "_b_from", "_b_end", "_b_close", "_b_lo", "_b_hi", "_b_blo", "_b_bhi", "_b_others")


def _others(rows: DataFrame, stream: DataFrame) -> DataFrame:
    """_task, _b_at, key, _b_others: the rows whose position the stream wrote for another key of their task."""
    probe = rows.where(F.col("_task").isNotNull()).select("_task", "_b_at", F.col("key").alias("_b_key")).distinct()
    hit = (F.col("task") == F.col("_task")) & (F.col("at") == F.col("_b_at")) & (F.col("key") != F.col("_b_key"))
    return (probe.join(stream, hit, "left_semi").select("_task", "_b_at", F.col("_b_key").alias("key"))
            .withColumn("_b_others", F.lit(True)))


def _bound(declared: tuple[int | None, int | None]) -> Column:
    """The first evidenced bound the row straddles, as text (over the columns `straddled` adds)."""
    c = F.col
    past = F.coalesce(c("_b_hi") > c("_b_at"), F.lit(False)) | F.coalesce(c("_b_others"), F.lit(False))
    before = F.coalesce(c("_b_lo") < c("_b_at"), F.lit(False))
    start, end = declared
    found = [_observed_end(past), _observed_start(before)]
    if end is not None:
        found.insert(0, F.when((c("_b_at") < F.lit(end)) & (F.lit(end) <= c("_b_close")) & ~past, F.format_string(
            "the run's range ends at %d, before this window closes (%d); the stream wrote nothing of task %s "
            "past it", F.lit(end), c("_b_close"), F.coalesce(c("_task").cast("string"), F.lit("?")))))
    if start is not None:
        found.insert(0, F.when((c("_b_from") < F.lit(start)) & (F.lit(start) < c("_b_end")) & ~before,
                               F.format_string("the run's range starts at %d, inside this window; the stream wrote "
                                               "nothing of task %s before it", F.lit(start),
                                               F.coalesce(c("_task").cast("string"), F.lit("?")))))
    return F.coalesce(*found)


def _observed_end(past: Column) -> Column:
    """The stream's output of the task ends at this row (its last position, no other key there) while the
    backfill's goes on."""
    c = F.col
    at_end = (c("_b_at") <= c("_b_hi")) & (c("_b_hi") < c("_b_close")) & ~past & (c("_b_bhi") > c("_b_hi"))
    return F.when(at_end, F.format_string(
        "the stream's output of task %d ends at %d, inside this window, for no other key; the backfill's goes on to "
        "%d", c("_task"), c("_b_hi"), c("_b_bhi")))


def _observed_start(before: Column) -> Column:
    """The stream's output of the task starts inside this row's span (nothing earlier) while the backfill's
    starts before."""
    c = F.col
    at_start = (c("_b_from") <= c("_b_lo")) & (c("_b_lo") < c("_b_end")) & ~before & (c("_b_blo") < c("_b_lo"))
    return F.when(at_start, F.format_string(
        "the stream's output of task %d starts at %d, inside this window; the backfill's at %d", c("_task"),
        c("_b_lo"), c("_b_blo")))


def in_data_read(incomplete: Column, category: Column, missing: str) -> Column:
    """A row incomplete in the data read (not closed by its end, or starting before a partition's first record
    read) explains a row the stream has (the stream read on, or from earlier); never one the stream lacks: the
    backfill read those records, so the stream's lacking them is a bound of the stream's output or no bound."""
    return incomplete & (category != F.lit(missing))
