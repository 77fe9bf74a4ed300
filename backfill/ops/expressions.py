"""Part: operators. Aggregation expressions of a job, as Spark columns (job-spec.md: count(), sum, ..., ordered fold)."""
from __future__ import annotations

import re
from dataclasses import dataclass

import sqlglot
from pyspark.sql import Column
from pyspark.sql import functions as F
from sqlglot import exp

from backfill.errors import SpecError
from backfill.jobspec.models import Aggregation, FoldAggregation
from backfill.jobspec.fields import JOINER_FIELDS, RECORD_FIELDS
from backfill.sqldialect import SparkSQL, normalize_count

_ORDER_SENSITIVE = re.compile(
    r"\b(first|last|first_value|last_value|collect_list|array_agg|listagg|string_agg|max_by|min_by|any_value|"
    r"nth_value|try_reduce)\s*\(", re.IGNORECASE)
# the aggregates whose values over parts of a window merge into its value, and how
_PANE_MERGES = {exp.Count: "sum", exp.Sum: "sum", exp.Min: "min", exp.Max: "max"}
# what stops a split: per-row modifiers, and calls sqlglot does not know as aggregates but Spark may
# (any(x) is Spark's bool_or; an unknown name may be a user's aggregate)
_NO_SPLIT = (exp.Anonymous, exp.Any, exp.All, exp.Window, exp.Filter, exp.Distinct)


@dataclass(frozen=True)
class CompiledAggregation:
    """One output column: a Spark aggregate expression, or an ordered fold."""

    name: str
    sql: str | None = None
    init: str | None = None
    step: str | None = None
    merge: str | None = None  # session windows: the Merger, an expression of a and b

    @property
    def is_fold(self) -> bool:
        """True for {fold: {init, step}}."""
        return self.step is not None

    @property
    def order_sensitive(self) -> bool:
        """True when the result depends on processing order (fold, first, last, collect_list, ...)."""
        return self.is_fold or bool(_ORDER_SENSITIVE.search(self.sql or ""))

    @property
    def reads_only_value(self) -> bool:
        """True for an aggregation whose SQL reads no record column but `value` (count() reads none)."""
        if self.sql is None:
            return False
        tree = sqlglot.parse_one(self.sql, read=SparkSQL)
        lambdas = {p.name for lam in tree.find_all(exp.Lambda) for p in lam.expressions}
        return all(c.parts[0].name.lower() == "value" or c.parts[0].name in lambdas for c in tree.find_all(exp.Column))

    def aggregate(self) -> Column:
        """The aggregate column (for groupBy or a window); folds use fold_over()."""
        assert self.sql is not None
        return F.expr(self.sql)

    def split(self, prefix: str) -> tuple[list[tuple[str, str]], str] | None:
        """The aggregation in two steps, or None: its aggregate calls as (SQL, merge function), to compute over
        parts of a window (panes), and the expression over their merged values, named `<prefix><i>`.

        Only count, sum, min and max merge (without DISTINCT or FILTER), in any expression around them:
        `round(sum(value.a) / count(1), 2)` splits into sum(value.a) and count(1), merged by sum each.
        """
        if self.sql is None:
            return None
        tree = sqlglot.parse_one(self.sql, read=SparkSQL)
        if any(isinstance(node, _NO_SPLIT) for node in tree.walk()):
            return None
        calls = list(tree.find_all(exp.AggFunc))
        if not calls or any(type(c) not in _PANE_MERGES or c.expressions
                            or any(isinstance(n, exp.AggFunc) for n in c.walk() if n is not c) for c in calls):
            return None
        parts = [(c.sql(dialect="spark"), _PANE_MERGES[type(c)]) for c in calls]
        for i, call in enumerate(calls):
            merged = call.replace(exp.column(f"{prefix}{i}"))
            if call is tree:
                tree = merged
        return parts, tree.sql(dialect="spark")

    def fold_over(self, records_sql: str) -> Column:
        """Fold over an SQL array of record structs already in processing order."""
        return F.expr(f"aggregate({records_sql}, {self.init}, (acc, __r) -> {self.step})")


def compile_aggregations(aggs: dict[str, Aggregation], where: str, session: bool = False
                         ) -> list[CompiledAggregation]:
    """Validate and compile the `aggregations:` mapping of one operator (`session`: of session windows)."""
    out = []
    for name, agg in aggs.items():
        path = f"{where}.aggregations.{name}"
        if isinstance(agg, FoldAggregation):
            if agg.fold.merge is not None and not session:
                raise SpecError(f"{path}.fold.merge: only session windows take a merge expression")
            if agg.fold.merge is None and session:
                raise SpecError(f"{path}.fold.merge: a fold on session windows needs a merge expression of a and b "
                                "(the running value and a merged-away session's value), e.g. merge: \"a + b\"")
            merge = merge_scope(agg.fold.merge, f"{path}.fold.merge") if agg.fold.merge is not None else None
            out.append(CompiledAggregation(name, init=_parse(agg.fold.init, f"{path}.fold.init"),
                                           step=record_scope(agg.fold.step, f"{path}.fold.step"), merge=merge))
        else:
            out.append(CompiledAggregation(name, sql=_parse(normalize_count(agg), path)))
    return out


def _parse(sql: str, path: str) -> str:
    try:
        sqlglot.parse_one(sql, read=SparkSQL)
    except sqlglot.errors.SqlglotError as exc:
        first = str(exc).splitlines()[0]
        raise SpecError(f"{path}: {sql!r} is not a Spark SQL expression ({first})") from None
    return sql


def record_scope(step: str, path: str) -> str:
    """Rewrite a fold step so record columns read from the lambda variable `__r` (acc stays acc)."""
    try:
        tree = sqlglot.parse_one(step, read=SparkSQL)
    except sqlglot.errors.SqlglotError as exc:
        raise SpecError(f"{path}: {step!r} is not a Spark SQL expression ({str(exc).splitlines()[0]})") from None

    def scoped(node: exp.Expression) -> exp.Expression:
        if not isinstance(node, exp.Column):
            return node
        parts = [p.name for p in node.parts]
        if parts[0] == "acc":
            return node
        if parts[0] not in RECORD_FIELDS:
            raise SpecError(f"{path}: {parts[0]!r} is not in scope; a fold step sees acc and "
                            f"{', '.join(RECORD_FIELDS)}")
        return exp.Dot.build([exp.column("__r"), *[exp.to_identifier(p) for p in parts]])

    return tree.transform(scoped).sql(dialect="spark")


def merge_scope(merge: str, path: str) -> str:
    """Check that a session fold's merge expression reads only `a` and `b` (and its own lambda variables)."""
    try:
        tree = sqlglot.parse_one(merge, read=SparkSQL)
    except sqlglot.errors.SqlglotError as exc:
        raise SpecError(f"{path}: {merge!r} is not a Spark SQL expression ({str(exc).splitlines()[0]})") from None
    lambdas = {p.name for lam in tree.find_all(exp.Lambda) for p in lam.expressions}
    for col in tree.find_all(exp.Column):
        first = col.parts[0].name
        if first not in ("a", "b") and first not in lambdas:
            raise SpecError(f"{path}: {first!r} is not in scope; a merge reads a (the running value) and b "
                            "(a merged-away session's value)")
    return tree.sql(dialect="spark")


def joiner_sql(sql: str, where: str) -> str:
    """Check that the joiner only reads key, left.* and right.* (the two records, null when unmatched)."""
    try:
        tree = sqlglot.parse_one(sql, read="spark")
    except sqlglot.errors.SqlglotError as exc:
        raise SpecError(f"{where}: {sql!r} is not a Spark SQL expression ({str(exc).splitlines()[0]})") from None
    lambdas = {p.name for lam in tree.find_all(exp.Lambda) for p in lam.expressions}
    for col in tree.find_all(exp.Column):
        parts = [p.name for p in col.parts]
        if parts[0] in lambdas:
            continue
        ok = parts[0] == "key" and len(parts) == 1 or parts[0] in ("left", "right") and (
            len(parts) == 1 or parts[1] in JOINER_FIELDS)
        if not ok:
            raise SpecError(f"{where}: {'.'.join(parts)!r} is not in scope; a joiner reads key, left.<f> and "
                            f"right.<f> with <f> one of {', '.join(JOINER_FIELDS)}")
    return sql
