"""Part: foundation. Topologies as the job declares them: the filters (`where`) before each operator, which
operators are table aggregations and stream-table joins (docs/semantics.md §15-§17). Pure: the Spark engine and
the reference engine share it, as they share rekeys.py.
"""
from __future__ import annotations

from backfill.jobspec.models import OperatorSpec


def wheres(op: OperatorSpec) -> dict[str, str]:
    """The filters before the operator: input source -> a Spark SQL boolean over its records (KStream#filter).

    An aggregate's or a rules operator's `where` filters its input (before a re-key); a join's `where.left`
    and `where.right` filter each side (the right side of a stream-table join is its table)."""
    if op.aggregate is not None:
        return {op.aggregate.input: op.aggregate.where} if op.aggregate.where else {}
    if op.rules is not None:
        return {op.rules.input: op.rules.where} if op.rules.where else {}
    assert op.join is not None
    where = op.join.where
    if where is None:
        return {}
    sides = ((op.join.left, where.left), (op.join.other, where.right))
    return {source: text for source, text in sides if text}


def where_field(op: OperatorSpec, source: str) -> str:
    """The job field of the filter on `source`, for messages."""
    if op.join is not None:
        side = "left" if source == op.join.left else "right"
        return f"operators.{op.name}.join.where.{side}"
    return f"operators.{op.name}.{op.kind}.where"


def is_table_aggregate(op: OperatorSpec) -> bool:
    """An aggregate without a window: KGroupedStream#aggregate, a table (docs/semantics.md §16)."""
    return op.aggregate is not None and op.aggregate.window is None


def is_table_join(op: OperatorSpec) -> bool:
    """A KStream-KTable join (docs/semantics.md §17)."""
    return op.join is not None and op.join.table is not None


def is_stream_join(op: OperatorSpec) -> bool:
    """A KStream-KStream join (docs/semantics.md §5)."""
    return op.join is not None and op.join.table is None
