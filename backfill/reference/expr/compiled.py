"""Part: reference engine. The public compiled objects: a scalar, an aggregate, a fold."""
from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from backfill.reference.expr.aggregates import _AggCall
from backfill.reference.expr.base import ExprError, _parse
from backfill.reference.expr.compiler import _CONST, _ORDER_SENSITIVE_NODES, _OUTER, _ROW, Fn, _Compiler
from backfill.reference.expr.values import _NULL, _schema_from

# --------------------------------------------------------------------------------------------
# Public compiled objects
# --------------------------------------------------------------------------------------------


def _with_context(e: BaseException, sql: str) -> ExprError:
    if isinstance(e, ExprError):
        if e.expression is None:
            e.expression = sql
        return e
    return ExprError(f"evaluation failed: {type(e).__name__}: {e}", sql)


class CompiledScalar:
    """A compiled scalar expression; call it with a row mapping."""

    def __init__(self, sql: str, fn: Fn, static_type: Any) -> None:
        self.sql, self._fn, self.static_type = sql, fn, static_type

    def __call__(self, row: Mapping[str, Any]) -> Any:
        try:
            return self._fn(row)
        except (ExprError, TypeError, ArithmeticError, AttributeError) as e:
            raise _with_context(e, self.sql) from (None if isinstance(e, ExprError) else e)

    def __repr__(self) -> str:
        return f"compile_scalar({self.sql!r})"


class CompiledAggregate:
    """A compiled aggregate expression (see :class:`Aggregate`). States are immutable tuples."""

    def __init__(self, sql: str, calls: list[_AggCall], outer: Fn, static_type: Any) -> None:
        self.sql, self._calls, self._outer, self.static_type = sql, calls, outer, static_type
        self.order_sensitive = any(c.acc.order_sensitive for c in calls)

    def init(self) -> tuple:
        return tuple(c.init() for c in self._calls)

    def add(self, state: tuple, row: Mapping[str, Any]) -> tuple:
        try:
            return tuple(c.add(s, row) for c, s in zip(self._calls, state))
        except (ExprError, TypeError, ArithmeticError, AttributeError) as e:
            raise _with_context(e, self.sql) from (None if isinstance(e, ExprError) else e)

    def result(self, state: tuple) -> Any:
        try:
            return self._outer(tuple(c.result(s) for c, s in zip(self._calls, state)))
        except (ExprError, TypeError, ArithmeticError, AttributeError) as e:
            raise _with_context(e, self.sql) from (None if isinstance(e, ExprError) else e)

    def __repr__(self) -> str:
        return f"compile_aggregate({self.sql!r})"


class CompiledFold:
    """Ordered fold: ``state = step(row | {"acc": state})`` starting from ``init``."""

    order_sensitive = True

    def __init__(self, init_sql: str, step_sql: str, init_fn: Fn, step_fn: Fn) -> None:
        self.init_sql, self.step_sql = init_sql, step_sql
        self._init, self._step = init_fn, step_fn

    def init(self) -> Any:
        try:
            return self._init({})
        except (ExprError, TypeError, ArithmeticError, AttributeError) as e:
            raise _with_context(e, self.init_sql) from (None if isinstance(e, ExprError) else e)

    def add(self, state: Any, row: Mapping[str, Any]) -> Any:
        scope = dict(row)
        scope["acc"] = state
        try:
            return self._step(scope)
        except (ExprError, TypeError, ArithmeticError, AttributeError) as e:
            raise _with_context(e, self.step_sql) from (None if isinstance(e, ExprError) else e)

    def result(self, state: Any) -> Any:
        return state

    def __repr__(self) -> str:
        return f"compile_fold({self.init_sql!r}, {self.step_sql!r})"


def compile_scalar(sql: str, *, schema: Any = None) -> Callable[[Mapping[str, Any]], Any]:
    """Compile a scalar (per-row) Spark SQL expression into ``f(row) -> value``."""
    if schema is None and isinstance(sql, str):
        return _compiled_scalar(sql)
    return _compile_scalar(sql, schema)


@functools.lru_cache(maxsize=1024)
def _compiled_scalar(sql: str) -> CompiledScalar:
    """One compiled function per expression text (it holds no state): a conformance run builds a join's
    processors for each of thousands of tasks, and copying and compiling the joiner was half of its time."""
    return _compile_scalar(sql, None)


def _compile_scalar(sql: str, schema: Any) -> CompiledScalar:
    tree = _parse(sql)
    cx = _Compiler(sql, _schema_from(schema))
    c = cx.compile(tree, _ROW)
    return CompiledScalar(sql, c.fn, c.type)


def compile_aggregate(sql: str, *, schema: Any = None) -> CompiledAggregate:
    """Compile an aggregate expression (aggregate calls combined with scalar operators)."""
    tree = _parse(sql)
    cx = _Compiler(sql, _schema_from(schema))
    c = cx.compile(tree, _OUTER)
    return CompiledAggregate(sql, cx.calls, c.fn, c.type)


def compile_fold(init_sql: str, step_sql: str, *, schema: Any = None) -> CompiledFold:
    """Compile an ordered fold (Kafka Streams ``aggregate(initializer, aggregator)``)."""
    st = _schema_from(schema)
    init_tree = _parse(init_sql)
    init_c = _Compiler(init_sql, None).compile(init_tree, _CONST)
    step_tree = _parse(step_sql)
    step_c = _Compiler(step_sql, st, {"acc": init_c.type if init_c.type != _NULL else None}).compile(step_tree, _ROW)
    return CompiledFold(init_sql, step_sql, init_c.fn, step_c.fn)


def is_order_sensitive(sql: str) -> bool:
    """True if the aggregate expression's result depends on the order rows are added
    (first/last/first_value/last_value/any_value/collect_list/array_agg/max_by/min_by).
    ``collect_set`` is not: its content does not depend on the order (compare it as a set)."""
    tree = _parse(sql)
    compile_aggregate(sql)  # validates; raises ExprError for unsupported expressions
    return any(isinstance(n, _ORDER_SENSITIVE_NODES) for n in tree.walk())
