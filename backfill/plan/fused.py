"""Part: plan. The one pass: counts, ledger rows and output of a job whose only operator can take it, in ONE
aggregation over the ordered records, storing its groups (a few rows per window) instead of the records.

The general path (plan/evaluator.py) stores the ordered records and reads them three times: the counting
pass, the ledger candidates and the operator. Here each record is exploded into the rows of the operator's
`fused_rows` (ops/aggregate.py), each tagged with what it is (`_g`):

- CHECKED, one per record: grouped by (source, drop, fatal, task) they give exactly the counting pass's rows
  (evaluator.stat_columns, restricted to these rows);
- RECORD, one per record that may give a ledger row of its own (dropped by its source, null key);
- WINDOW, one per accepted (record, window): grouped by (key, window start), the output;
- LATE, one per refused (record, window): a `late` ledger row.

The group columns of a row are null except those of its kind, and the kind is part of the group, so a group
only ever holds rows of one kind: a window group aggregates its records, a ledger group copies of one record
(`_n` of them: a source may hold duplicates). The value is hidden from the rows that are not windows, so the
output aggregations (which read nothing but the value, `fuses()`) compute nothing on the other groups.

Measured at 10M records (benchmarks/README.md): the stored records, the three scans of them and the garbage
they make cost more than the aggregation itself.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from backfill.ops.aggregate import CHECKED, LATE_PAIR, RECORD, WINDOW, WindowAggregate, repeated
from backfill.ops.base import OperatorCounts, OperatorResult

if TYPE_CHECKING:
    from backfill.plan.definition import Plan

# group columns per kind of row; every other group column of a row is null
_STATS = ("source", "_drop", "_fatal", "task")
_LEDGER = ("source", "topic", "partition", "offset", "key", "ts")
_RECORD_ONLY = ("_drop", "_problem", "_where", "_raw_ts", "_partition_time")


def fusable(plan: Plan) -> WindowAggregate | None:
    """The plan's operator when the one pass can run it: one operator that `fuses()`, in the merge order."""
    if plan.given_order or len(plan.operators) != 1:
        return None
    op = plan.operators[0]
    return op if isinstance(op, WindowAggregate) and op.fuses() else None


def one_pass(plan: Plan, op: WindowAggregate, ordered: DataFrame, live: Column,
             stat_columns: list[Column]) -> DataFrame:
    """The groups of the one pass (not yet computed): `_g`, the group columns, `_n`, the operator's
    aggregations and the counting columns (over CHECKED rows only, `stat_columns`)."""
    record_row = F.col("_drop").isNotNull() | F.col("key").isNull()
    rows = op.fused_rows(ordered, live, record_row)
    kind = F.col("_g")
    # a ledger row's record, one column: a window row's group has one null there instead of a dozen
    fields = [c for c in (*_LEDGER, op.stream_time, *_RECORD_ONLY) if c in rows.columns]
    fields = list(dict.fromkeys(fields))
    groups = {"_group_key": F.when(kind == WINDOW, F.col("key")),
              "_group_window_start": F.when(kind.isin(WINDOW, LATE_PAIR), F.col("_mark")),
              "_group_record": F.when(kind.isin(RECORD, LATE_PAIR), F.struct(*fields)),
              **{f"_group_{c}": F.when(kind == CHECKED, F.col(c)) for c in _STATS}}
    keyed = rows.select(
        *[c for c in rows.columns if c != "value"],
        F.when(kind == WINDOW, F.col("value")).alias("value"),  # the output aggregations read only the value
        *[value.alias(name) for name, value in groups.items()])
    out = keyed.groupBy("_g", *groups).agg(F.count(F.lit(1)).alias("_n"), *op.fused_aggregations(), *stat_columns)
    record = F.col("_group_record")
    named = {"key": F.coalesce(F.col("_group_key"), record["key"]), "window_start": F.col("_group_window_start"),
             **{c: F.coalesce(F.col(f"_group_{c}"), record[c]) if c in fields else F.col(f"_group_{c}")
                for c in _STATS},
             **{c: record[c] for c in fields if c not in ("key", *_STATS)}}
    return out.select("_g", *[value.alias(name) for name, value in named.items()],
                      *[c for c in out.columns if c != "_g" and c not in groups])


def stat_rows(groups: DataFrame) -> list[Any]:
    """The counting pass's rows (one per source, drop, fatal and task)."""
    return groups.where(F.col("_g") == CHECKED).collect()


def results(op: WindowAggregate, groups: DataFrame, counts: OperatorCounts
            ) -> tuple[dict[str, OperatorResult], DataFrame]:
    """The operator's result and the records that may give ledger rows (for the source drops)."""
    records = repeated(groups.where(F.col("_g") == RECORD))
    return {op.name: op.fused_result(groups, records, counts)}, records

