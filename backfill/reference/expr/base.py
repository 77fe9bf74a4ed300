"""Part: reference engine. Errors, what is supported, and parsing with the Spark dialect."""
from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

from backfill.errors import SpecError
from backfill.sqldialect import SparkSQL, normalize_count


class ExprError(SpecError, ValueError):
    """Expression cannot be parsed or uses something the reference engine does not support (exit code 2)."""

    def __init__(self, message: str, expression: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.expression = expression

    def __str__(self) -> str:
        if self.expression is None:
            return self.message
        return f"{self.message} (in expression {self.expression!r})"


class ExprRuntimeError(ExprError):
    """Evaluation failed where Spark in ANSI mode (the Spark 4 default) fails at run time:
    division by zero, arithmetic overflow, a malformed or overflowing cast."""


@runtime_checkable
class Aggregate(Protocol):
    def init(self) -> Any: ...

    def add(self, state: Any, row: Mapping[str, Any]) -> Any: ...

    def result(self, state: Any) -> Any: ...


SUPPORTED_FUNCTIONS = (
    "abs", "array", "cardinality", "cast", "char_length", "character_length", "coalesce", "concat",
    "greatest", "if", "ifnull", "isnotnull", "isnull", "lcase", "least", "len", "length", "lower",
    "named_struct", "nullif", "nvl", "nvl2", "round", "size", "struct", "substr", "substring",
    "try_cast", "ucase", "upper",
)
SUPPORTED_AGGREGATES = (
    "any_value", "array_agg", "avg", "bool_and", "bool_or", "collect_list", "collect_set", "count",
    "count_if", "every", "first", "first_value", "last", "last_value", "max", "max_by", "mean",
    "min", "min_by", "some", "sum",
)
SUPPORTED_OPERATORS = (
    "+", "-", "*", "/", "div", "%", "=", "==", "<>", "!=", "<", "<=", ">", ">=", "<=>", "AND", "OR",
    "NOT", "IS [NOT] NULL|TRUE|FALSE", "[NOT] IN (list)", "[NOT] BETWEEN", "CASE", "||",
    "struct.field", "DISTINCT and FILTER (WHERE ...) in aggregates",
)
_CAST_TARGETS = ("string", "bigint", "int", "double", "boolean")


def _supported_text() -> str:
    return (
        "supported functions: " + ", ".join(SUPPORTED_FUNCTIONS)
        + "; aggregates: " + ", ".join(SUPPORTED_AGGREGATES)
        + "; operators: " + ", ".join(SUPPORTED_OPERATORS)
    )


# --------------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------------


def _parse(sql: str) -> exp.Expression:
    """The expression's tree: a copy of the one parsed the first time (a conformance run compiles the same
    joiner for each of thousands of scenarios; parsing was 80% of the reference engine's time there)."""
    if not isinstance(sql, str):
        raise ExprError(f"expression must be a string, got {type(sql).__name__}")
    return _parsed(sql).copy()


@functools.lru_cache(maxsize=1024)
def _parsed(sql: str) -> exp.Expression:
    if not sql.strip():
        raise ExprError("expression is empty")
    text = normalize_count(sql)
    try:
        trees = [t for t in sqlglot.parse(text, read=SparkSQL) if t is not None]
    except SqlglotError as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ExprError(f"cannot parse Spark SQL expression: {first}", sql) from None
    if len(trees) != 1:
        raise ExprError("expected exactly one expression", sql)
    tree = trees[0]
    if isinstance(tree, exp.Alias):  # "sum(x) AS total": the name is irrelevant here
        tree = tree.this
    if isinstance(tree, (exp.Query, exp.Command, exp.DDL, exp.DML)):
        raise ExprError("expected an expression, not a statement", sql)
    return tree
