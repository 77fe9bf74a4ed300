"""Part: operators. Table aggregations (docs/semantics.md §16): an aggregate without a window is Kafka Streams'
`KGroupedStream#aggregate/count/reduce` (`KStreamAggregate`), a table per task keyed by the record key.

Per record reaching it: a null key or a null value is skipped (ledger `null_key`, `null_value`); otherwise the
key's aggregate is updated and every update is emitted (cache off), with `ts` the largest timestamp of the
key's records so far. The store forgets a key whose aggregate becomes null: with one `fold` as its only
aggregation, a step that gives null deletes the key (a tombstone row), and the key's next record starts again
from `init`, its `ts` from that record's. SQL aggregations are never null as a whole (they are one row of
columns), so they never delete.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sqlglot
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from sqlglot import exp

from backfill.jobspec.fields import FOLD_FIELDS
from backfill.jobspec.models import OperatorSpec
from backfill.jobspec.rekeys import rekey_why, rekeys, stream_name
from backfill.ledger import NULL_KEY, ledger_rows
from backfill.ops.base import (Operator, OperatorCounts, OperatorResult, aggregate_expressions, check_null_drops,
                               in_source)
from backfill.ops.expressions import CompiledAggregation, compile_aggregations
from backfill.sqldialect import SparkSQL

if TYPE_CHECKING:
    from backfill.jobspec.load import Job

NULL_VALUE = "null_value"


@dataclass(frozen=True)
class TableAggregate(Operator):
    """KGroupedStream#aggregate: one row per record reaching it, the key's aggregate so far."""

    noun = "table aggregation"

    range_column = "ts"  # an update's range is its timestamp
    reads_all = True  # a key's aggregate holds every record of the key since the beginning

    @classmethod
    def from_job(cls, job: Job, spec: OperatorSpec, index: int, sink: str | None, start: int | None,
                 end: int | None) -> TableAggregate:
        """Compiles the aggregations; every record is read (a table keeps the whole history)."""
        agg = spec.aggregate
        assert agg is not None
        compile_aggregations(agg.aggregations, f"{job.path}: operators.{spec.name}.aggregate")
        why = rekey_why(spec)
        why.append("a table (no window): every record since the beginning is read, whatever the range; every "
                   "update is emitted (cache off), ts = the largest timestamp of the key so far")
        return cls(name=spec.name, kind="aggregate", inputs=(agg.input,), window="none (a table)", emit="updates",
                   sink=sink, spec=spec, index=index, why=tuple(why))

    def stream_time_columns(self) -> dict[str, Column]:
        """A table has no stream time: nothing is late, nothing closes."""
        return {}

    def expressions(self) -> list[str] | None:
        """Its aggregations, re-keys and filters (ops/base.py `aggregate_expressions`)."""
        assert self.spec is not None
        return aggregate_expressions(self.spec)

    def reads(self) -> frozenset[str] | None:
        """`seq` (the order of updates); `timestamp` and `headers` for folds or where named."""
        aggs = self._aggs()
        texts = [t for a in aggs for t in (a.sql, a.init, a.step) if t]
        assert self.spec is not None
        texts += [r.spec.key for r in rekeys(self.spec)]
        return frozenset({"seq", *[c for c in ("timestamp", "headers")
                                   if any(a.is_fold for a in aggs) or any(c in t for t in texts)]})

    def _aggs(self) -> list[CompiledAggregation]:
        assert self.spec is not None and self.spec.aggregate is not None
        return compile_aggregations(self.spec.aggregate.aggregations, f"operators.{self.name}.aggregate")

    def _mine(self) -> Column:
        assert self.spec is not None
        return in_source(stream_name(self.spec))

    def count_columns(self, live: Column, late: dict[str, Column] | None = None) -> list[Column]:
        """Records in, null keys, null values (KStreamAggregate skips both)."""
        mine = self._mine() & live
        return [F.count(F.when(mine, 1)).alias(self.stat("in")),
                F.count(F.when(mine & F.col("key").isNull(), 1)).alias(self.stat("nullkey")),
                F.count(F.when(mine & F.col("key").isNotNull() & F.col("value").isNull(), 1)
                        ).alias(self.stat("nullvalue")),
                F.count(F.when(mine & F.col("key").isNotNull() & F.col("value").isNotNull(), 1)).alias(self.stat("ok"))]

    def counts(self, rows: list[Any]) -> OperatorCounts:
        """Null keys and values are dropped; every other record updates its key."""
        counts = OperatorCounts(dropped={"null_key": 0, "null_value": 0})
        for r in rows:
            counts.records_in += r[self.stat("in")]
            counts.dropped["null_key"] += r[self.stat("nullkey")]
            counts.dropped["null_value"] += r[self.stat("nullvalue")]
            counts.contributing += r[self.stat("ok")]
        return counts

    def run(self, processed: DataFrame, dropped: DataFrame, counts: OperatorCounts) -> OperatorResult:
        """Every update in processing order; null keys and values to the ledger."""
        mine = processed.where(self._mine())
        skipped = dropped.where(self._mine())
        ledger = ledger_rows(skipped.where(F.col("key").isNull()), reason=NULL_KEY, operator=self.name,
                             range_time=F.col("ts")).unionByName(
            ledger_rows(skipped.where(F.col("key").isNotNull() & F.col("value").isNull()), reason=NULL_VALUE,
                        operator=self.name, range_time=F.col("ts")))
        keyed = mine.where(F.col("key").isNotNull() & F.col("value").isNotNull())
        return OperatorResult(output=updates(keyed, self._aggs()), ledger=ledger, range_column="ts")

    def ledger_candidates(self) -> Column | None:
        """Null values (null keys are candidates already)."""
        return self._mine() & F.col("value").isNull()

    def settle(self, counts: OperatorCounts, ledger: Mapping[str, int]) -> None:
        """Every null key and value counted must be in the ledger."""
        check_null_drops(self.name, counts, ledger, ("null_key", "null_value"))


def updates(keyed: DataFrame, aggs: list[CompiledAggregation]) -> DataFrame:
    """One row per record: its key's aggregate over the key's records so far in task order, ts their largest."""
    running = Window.partitionBy("task", "key").orderBy("seq").rowsBetween(Window.unboundedPreceding,
                                                                          Window.currentRow)
    trail = F.collect_list(F.struct(*[F.col(c) for c in FOLD_FIELDS if c in keyed.columns])).over(running)
    if len(aggs) == 1 and aggs[0].is_fold:  # a step giving null deletes the key (module docstring)
        a = aggs[0]
        assert a.init is not None and a.step is not None
        dtype = keyed.select(F.expr(a.init).alias("i")).schema["i"].dataType.simpleString()
        rows = keyed.withColumn("_trail", trail).withColumn("_acc", F.expr(_deleting_fold(a.init, a.step, dtype)))
        rows = rows.withColumn(a.name, F.col("_acc.v")).withColumn("_ts", F.col("_acc.t"))
    else:
        cols = {a.name: (F.lit(None) if a.is_fold else a.aggregate().over(running)) for a in aggs}
        rows = keyed.withColumns(cols).withColumn("_ts", F.max("ts").over(running))
        folds = [a for a in aggs if a.is_fold]
        if folds:
            rows = rows.withColumn("_trail", trail)
            for a in folds:
                rows = rows.withColumn(a.name, a.fold_over("_trail"))
    return rows.select("key", *[a.name for a in aggs], F.col("_ts").alias("ts"),
                       F.col("seq").cast("long").alias("emit_seq"), "task")


def _deleting_fold(init: str, step: str, dtype: str) -> str:
    """The fold over `_trail` with the store's delete: the running value `v` (null: no aggregate, start from
    init) and `t`, the largest timestamp since the key's aggregate was last deleted."""
    def bound(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Column) and node.parts[0].name == "acc":
            start = sqlglot.parse_one(f"coalesce(__a.v, ({init}))", read=SparkSQL)
            rest = node.parts[1:]
            return exp.Dot.build([exp.Paren(this=start), *rest]) if rest else exp.Paren(this=start)
        return node

    stepped = sqlglot.parse_one(step, read=SparkSQL).transform(bound).sql(dialect="spark")
    return (f"aggregate(_trail, named_struct('v', cast(null as {dtype}), 't', cast(null as bigint)), "
            f"(__a, __r) -> named_struct('v', {stepped}, 't', CASE WHEN __a.v IS NULL THEN __r.ts "
            "ELSE greatest(__a.t, __r.ts) END))")
