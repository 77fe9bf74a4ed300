"""Part: plan. What a run says about its inputs' offsets (docs/semantics.md §7.2): identical copies read once
(`duplicates`), offsets missing inside a partition (`gaps`), and copies that differ (ledgered, or the run stops).

The ordering finds them (order/offsets.py: `_copies`, `_gap`, and `_drop` conflicting_offset) in its one pass
over each queue in offset order. Here the run keeps what is a gap (an offset a read_committed consumer never
sees is none: io/archive.py `committed_spans`), counts them per source and partition, with the first ranges,
and applies the source's `on_error` to conflicting copies.
"""
from __future__ import annotations

import functools
from collections.abc import Iterable
from operator import or_
from typing import TYPE_CHECKING, Any

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from backfill.errors import SourceError
from backfill.io.archive import committed_spans
from backfill.ledger import CONFLICTING_OFFSET
from backfill.session import release

if TYPE_CHECKING:
    from backfill.plan.definition import Plan

RANGES = 10  # gap ranges a run records per partition, the first in offset order
COLUMNS = ("_copies", "_gap", "_gap_ts")  # the columns of a record that the report reads


def not_checked(bound: int) -> str:
    """Why a source read from a warm-up bound has no gaps reported."""
    return (f"records before the warm-up bound ({bound}) are not read, so an offset missing in what was read "
            "may be one of them: a run without --start checks the whole input")


def checked(plan: Plan, ordered: DataFrame, unchecked: Iterable[str]) -> DataFrame:
    """The ordered records with the gaps the run reports: none where a read_committed consumer explains the
    offsets missing (transaction markers, aborted records) nor in the `unchecked` sources; `_gap_ts` (the
    partition time before the gap) where there is one. `_copy` has done its work (it is dropped)."""
    excused = _excused(plan, set(unchecked))
    gap = F.col("_gap") if excused is None else F.when(~excused, F.col("_gap"))
    return ordered.withColumns({"_gap": gap, "_gap_ts": F.when(gap.isNotNull(), F.col("_partition_time_before"))}) \
        .drop("_copy")


def _excused(plan: Plan, unchecked: set[str]) -> Column | None:
    """Records whose `_gap` is no gap: every one of an unchecked source, and those whose missing offsets lie
    inside a range its source read as committed."""
    start, end = F.col("offset") - F.col("_gap"), F.col("offset")  # the missing offsets: [start, end)
    conditions: list[Column] = []
    for sp in plan.sources:
        mine = F.col("source") == sp.name
        if sp.name in unchecked:
            conditions.append(mine)
            continue
        spans = committed_spans(sp.spec, sp.location) if sp.spec is not None else None
        for partition, ranges in (spans or {}).items():
            inside = functools.reduce(or_, [(start >= F.lit(a)) & (end <= F.lit(b)) for a, b in ranges], F.lit(False))
            where = mine if partition is None else mine & (F.col("partition") == F.lit(partition))
            conditions.append(where & inside)
    return functools.reduce(or_, conditions) if conditions else None


def stat_columns(live: Column) -> list[Column]:
    """The counting pass's share (plan/evaluator.py stat_columns): whether any record has copies left out or a
    gap before it, and any past the cool-down (`~live`), so that the report below runs only then."""
    marked = F.col("_copies").isNotNull() | F.col("_gap").isNotNull()
    return [F.sum("_copies").alias("copies"), F.count("_gap").alias("gaps"),
            F.count(F.when(~live & marked, 1)).alias("copies_or_gaps_beyond")]


def found(rows: Iterable[Any], beyond: bool = False) -> bool:
    """Whether the counting pass's rows saw copies or gaps (`beyond`: in records past the cool-down)."""
    names = ("copies_or_gaps_beyond",) if beyond else ("copies", "gaps")
    return any(sum(_get(r, n) or 0 for n in names) for r in rows)


def _get(row: Any, name: str) -> Any:
    try:
        return row[name]
    except (KeyError, ValueError):  # a row of the one pass that does not count them (plan/fused.py)
        return None


def report(plan: Plan, frames: Iterable[DataFrame], summary: Any) -> None:
    """Per source and partition of `frames` (records of the plan's sources, each once: `_copies`, `_gap`,
    `_gap_ts`, `ts`), the copies left out (`summary.duplicates`) and the gaps with their first ranges
    (`summary.gaps`)."""
    names = [sp.name for sp in plan.sources]
    wanted = functools.reduce(DataFrame.unionByName, [
        f.where(F.col("source").isin(names) & (F.col("_copies").isNotNull() | F.col("_gap").isNotNull()))
        .select("source", "partition", "offset", "ts", *COLUMNS) for f in frames]).localCheckpoint()
    try:
        for r in wanted.groupBy("source", "partition").agg(
                F.sum("_copies").alias("copies"), F.count("_gap").alias("gaps"), F.sum("_gap").alias("missing"),
        ).collect():
            if r["copies"]:
                summary.duplicates.setdefault(r["source"], {})[str(r["partition"])] = int(r["copies"])
            if r["gaps"]:
                summary.gaps.setdefault(r["source"], {})[str(r["partition"])] = {
                    "gaps": int(r["gaps"]), "offsets": int(r["missing"]), "ranges": []}
        first = Window.partitionBy("source", "partition").orderBy("offset")
        ranges = (wanted.where(F.col("_gap").isNotNull()).withColumn("_n", F.row_number().over(first))
                  .where(F.col("_n") <= RANGES).orderBy("source", "partition", "offset").collect())
        for r in ranges:
            summary.gaps[r["source"]][str(r["partition"])]["ranges"].append(
                {"from": r["offset"] - r["_gap"], "to": r["offset"] - 1, "ts_before": r["_gap_ts"],
                 "ts_after": r["ts"]})
    finally:
        release(wanted)


def fail_on_conflicts(plan: Plan, rows: Iterable[Any], ordered: DataFrame) -> None:
    """`on_error: fail`: a source with copies of an offset that differ stops the run, naming the first."""
    failing = {r["source"] for r in rows if r["_drop"] == CONFLICTING_OFFSET and (r["n"] or 0) > 0
               and plan.job.spec.sources.get(r["source"]) is not None
               and plan.job.spec.sources[r["source"]].on_error == "fail"}
    if not failing:
        return
    first = (ordered.where(F.col("source").isin(*failing) & (F.col("_drop") == CONFLICTING_OFFSET))
             .orderBy("source_rank", "partition", "offset").select("source", "topic", "partition", "offset",
                                                                  "_problem").first())
    assert first is not None
    raise SourceError(f"sources.{first['source']}: offset {first['offset']} of {first['topic']}/{first['partition']} "
                      f"is in the input more than once and {first['_problem']}; Kafka holds one record per offset: "
                      f"fix the input, or set on_error: skip to send every copy to the ledger as {CONFLICTING_OFFSET}")
