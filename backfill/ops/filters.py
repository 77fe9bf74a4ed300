"""Part: operators. `where`: KStream#filter before an operator (docs/semantics.md §15), as Spark columns.

A record its filter drops never reaches the operator: it moves none of the operator's stream times, is not
late, gives no ledger row and no output. It is still polled by the task (it keeps its place in the task's
order and moves the partition time), and it is counted as the operator's `filtered`. The evaluator applies
these columns around every operator alike (its stream times, its counts and what it runs over), so no
operator knows of filters.
"""
from __future__ import annotations

import functools

import sqlglot
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T
from sqlglot import exp

from backfill.errors import SpecError
from backfill.jobspec.models import OperatorSpec
from backfill.jobspec.topology import where_field, wheres
from backfill.sqldialect import SparkSQL

# what a condition cannot be: a literal that is not true/false, arithmetic, text
_NOT_BOOLEAN = (exp.Literal, exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Mod, exp.DPipe, exp.Concat)


def passes(op: OperatorSpec) -> Column | None:
    """Column: the record reaches the operator as far as its filters go (True for records of other sources);
    None when it has no filter. A condition that is null (a field of a null value) drops the record, as
    SQL's WHERE does."""
    found = wheres(op)
    if not found:
        return None
    conds = [(F.col("source") != F.lit(src)) | F.coalesce(F.expr(sql), F.lit(False)) for src, sql in found.items()]
    return functools.reduce(lambda a, b: a & b, conds)


def filtered(op: OperatorSpec) -> Column:
    """Column: a record its filter drops (records dropped by their source are not counted here)."""
    conds = [(F.col("source") == F.lit(src)) & F.col("_drop").isNull() & ~F.coalesce(F.expr(sql), F.lit(False))
             for src, sql in wheres(op).items()]
    return functools.reduce(lambda a, b: a | b, conds, F.lit(False))


def check_static(op: OperatorSpec, path: str) -> None:
    """A condition that parses and could be a boolean (checked again on the data's types before a run)."""
    for src, sql in wheres(op).items():
        where = f"{path}: {where_field(op, src)}"
        try:
            tree = sqlglot.parse_one(sql, read=SparkSQL)
        except sqlglot.errors.SqlglotError as exc:
            raise SpecError(f"{where}: {sql!r} is not a Spark SQL expression ({str(exc).splitlines()[0]})") from None
        while isinstance(tree, exp.Paren):
            tree = tree.this
        if isinstance(tree, _NOT_BOOLEAN):
            raise SpecError(f"{where}: {sql!r} is not a condition; write a boolean over the record, e.g. "
                            "value.page is not null or value.amount > 10")


def check_types(op: OperatorSpec, records: DataFrame, path: str) -> None:
    """Each condition is a boolean over the records' columns (Spark's analysis of the job's data)."""
    for src, sql in wheres(op).items():
        where = f"{path}: {where_field(op, src)}"
        try:
            dtype = records.select(F.expr(sql).alias("_w")).schema["_w"].dataType
        except Exception as exc:  # noqa: BLE001 - Spark's analysis errors: an unknown field, a bad call
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise SpecError(f"{where}: {sql!r} is not a condition over the record (key, value.<field>, ts, "
                            f"timestamp, topic, partition, offset, headers): {first}") from None
        if not isinstance(dtype, (T.BooleanType, T.NullType)):
            raise SpecError(f"{where}: {sql!r} is a {dtype.simpleString()}, not a boolean; write a condition, "
                            f"e.g. {sql} is not null")
