"""Part: reference engine. The compiler: a sqlglot AST into closures, one handler per node kind."""
from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from sqlglot import exp

from backfill.reference.expr.aggregates import (
    _Acc,
    _AggCall,
    _Avg,
    _BoolAgg,
    _CollectList,
    _CollectSet,
    _Count,
    _CountIf,
    _FirstLast,
    _MaxBy,
    _MinMax,
    _Sum,
)
from backfill.reference.expr.base import _CAST_TARGETS, ExprError, ExprRuntimeError, _supported_text
from backfill.reference.expr.values import (
    _BOOL,
    _CASTS,
    _DOUBLE,
    _DT,
    _INT_MAX,
    _LONG,
    _LONG_MAX,
    _LONG_MIN,
    _NULL,
    _NUMERIC,
    _STRING,
    _STRING_DT,
    _abs,
    _add,
    _ArrayT,
    _check_bool,
    _cmp,
    _common_type,
    _compare,
    _div,
    _intdiv,
    _is_long,
    _kind,
    _mod,
    _mul,
    _neg,
    _round,
    _scalar_text,
    _StructT,
    _sub,
    _substring,
    _to_str,
)

# --------------------------------------------------------------------------------------------
# Compiler: sqlglot AST -> closures
# --------------------------------------------------------------------------------------------

Fn = Callable[[Any], Any]


@dataclass
class _C:
    fn: Fn
    type: Any = None
    const: bool = False  # no column or aggregate reference (Spark: "foldable")


def _const(v: Any, t: Any) -> _C:
    return _C(lambda r: v, t, True)


_ROW, _OUTER, _CONST = "row", "outer", "const"

_AGG_NODES = (
    exp.Count, exp.Sum, exp.Avg, exp.Min, exp.Max, exp.First, exp.Last, exp.FirstValue,
    exp.LastValue, exp.AnyValue, exp.ArrayAgg, exp.ArrayUniqueAgg, exp.ArgMax, exp.ArgMin,
    exp.CountIf, exp.LogicalAnd, exp.LogicalOr,
)
_AGG_ANON = {"mean", "every", "some", "bool_and", "bool_or"}
_ORDER_SENSITIVE_NODES = (
    exp.First, exp.Last, exp.FirstValue, exp.LastValue, exp.AnyValue, exp.ArrayAgg, exp.ArgMax, exp.ArgMin,
)


_CALL_NAME = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*\(")


def _fn_name(node: exp.Expression) -> str:
    """The Spark name of a function call, e.g. max_by (sqlglot's class is ArgMax)."""
    if isinstance(node, exp.Anonymous):
        return str(node.name).lower()
    m = _CALL_NAME.match(node.sql(dialect="spark"))
    if m:
        return m.group(1).lower()
    if isinstance(node, exp.Func):
        return node.sql_name().lower()
    return type(node).__name__


def _is_agg_node(node: exp.Expression) -> bool:
    inner = node
    while isinstance(inner, (exp.IgnoreNulls, exp.RespectNulls, exp.Filter)):
        inner = inner.this
    return isinstance(inner, _AGG_NODES) or (
        isinstance(inner, exp.Anonymous) and str(inner.name).lower() in _AGG_ANON)


class _Compiler:
    def __init__(self, sql: str, schema: _StructT | None, extra: dict[str, Any] | None = None) -> None:
        self.sql = sql
        self.schema = schema
        self.extra = extra or {}  # names added to the row scope (the fold's acc) -> static type
        self.calls: list[_AggCall] = []

    # -- entry points --------------------------------------------------------------------

    def compile(self, node: exp.Expression, scope: str, agg: str | None = None) -> _C:
        handler = _HANDLERS.get(type(node))
        if handler is None and _is_agg_node(node):
            return self._aggregate(node, scope, agg)
        if handler is None and isinstance(node, exp.Anonymous):
            handler = _ANON_HANDLERS.get(str(node.name).lower())
        if handler is None:
            self._unsupported(node)
        return handler(self, node, scope, agg)

    def error(self, message: str, node: exp.Expression | None = None) -> ExprError:
        if node is not None:
            message = f"{message}: {node.sql(dialect='spark')}"
        return ExprError(message, self.sql)

    def _unsupported(self, node: exp.Expression) -> NoReturn:
        if isinstance(node, exp.Window):
            raise self.error("window functions (OVER) are not supported", node)
        if isinstance(node, (exp.Func, exp.Anonymous)):
            raise self.error(
                f"unsupported function {_fn_name(node)}() in {node.sql(dialect='spark')!r}; "
                + _supported_text())
        raise self.error(
            f"unsupported construct {type(node).__name__} in {node.sql(dialect='spark')!r}; "
            + _supported_text())

    def args(self, node: exp.Expression, scope: str, agg: str | None) -> list[_C]:
        parts = [] if isinstance(node, exp.Anonymous) or node.this is None else [node.this]
        parts += list(node.expressions)
        return [self.compile(p, scope, agg) for p in parts]

    # -- columns -------------------------------------------------------------------------

    def column_path(self, parts: list[str], node: exp.Expression, scope: str) -> _C:
        if scope == _CONST:
            raise self.error("column references are not allowed in a fold initializer", node)
        if scope == _OUTER:
            raise self.error(
                f"column {'.'.join(parts)!r} must be inside an aggregate function "
                "(an aggregate expression has no grouping columns)", node)
        names = list(parts)
        extra = [k for k in self.extra if k == parts[0]] or [
            k for k in self.extra if k.lower() == parts[0].lower()]
        if extra:
            names[0], t = extra[0], self.extra[extra[0]]
        elif self.schema is not None:
            hit = self.schema.field(parts[0])
            if hit is None:
                raise self.error(
                    f"unknown column {parts[0]!r}; columns are {[f for f, _ in self.schema.fields]}", node)
            names[0], t = hit
        else:
            return _C(_path_getter(names, None), None)
        for i in range(1, len(parts)):
            if t is None:  # below an untyped column: resolved at run time
                break
            if not isinstance(t, _StructT):
                raise self.error(
                    f"cannot access field {parts[i]!r} of non-struct column {'.'.join(parts[:i])!r}", node)
            hit = t.field(parts[i])
            if hit is None:
                raise self.error(
                    f"no field {parts[i]!r} in struct {'.'.join(parts[:i])!r}; fields are "
                    f"{[f for f, _ in t.fields]}", node)
            names[i], t = hit
        return _C(_path_getter(names, t), t)

    def field_access(self, base: _C, name: str, node: exp.Expression) -> _C:
        t = None
        if isinstance(base.type, _StructT):
            hit = base.type.field(name)
            if hit is None:
                raise self.error(f"no field {name!r} in struct", node)
            name, t = hit
        bfn = base.fn

        def get(r: Any) -> Any:
            v = bfn(r)
            if v is None:
                return None
            return _lookup(v, name, "struct field")

        return _C(_widen_fn(get) if t == _DOUBLE else get, t, base.const)

    # -- aggregates ----------------------------------------------------------------------

    def _aggregate(self, node: exp.Expression, scope: str, agg: str | None) -> _C:
        ignore_nulls, filter_node = False, None
        inner = node
        while isinstance(inner, (exp.IgnoreNulls, exp.RespectNulls, exp.Filter)):
            if isinstance(inner, exp.IgnoreNulls):
                ignore_nulls = True
            elif isinstance(inner, exp.Filter):
                where = inner.expression
                filter_node = where.this if isinstance(where, exp.Where) else where
            inner = inner.this
        name = _fn_name(inner)
        if agg is not None:
            raise self.error(
                f"aggregate function {name}() cannot be nested inside aggregate function {agg}()", node)
        if scope != _OUTER:
            raise self.error(f"aggregate function {name}() is not allowed in a scalar expression", node)

        distinct = False
        arg_nodes: list[exp.Expression]
        if isinstance(inner, exp.Anonymous):
            arg_nodes = list(inner.expressions)
        else:
            this = inner.this
            if isinstance(this, exp.Distinct):
                distinct = True
                arg_nodes = list(this.expressions)
            else:
                arg_nodes = [this] if this is not None else []
            if isinstance(inner, exp.Count):
                arg_nodes += list(inner.expressions)
            elif isinstance(inner, (exp.ArgMax, exp.ArgMin)):
                if inner.args.get("count") is not None:
                    raise self.error(f"{name}() with a count argument is not supported", node)
                if inner.expression is not None:
                    arg_nodes.append(inner.expression)
            elif inner.args.get("expressions") or inner.args.get("count"):
                raise self.error(f"too many arguments for aggregate function {name}()", node)

        star = False
        if isinstance(inner, exp.Count) and len(arg_nodes) == 1 and isinstance(arg_nodes[0], exp.Star):
            if distinct:
                raise self.error("count(DISTINCT *) is not valid", node)
            star, arg_nodes = True, []
        if any(isinstance(a, exp.Star) for a in arg_nodes):
            raise self.error(f"* is only allowed as count(*), not in {name}()", node)

        args = [self.compile(a, _ROW, name) for a in arg_nodes]
        types = [a.type for a in args]
        t0 = types[0] if types else None

        def need(n: int) -> None:
            if len(args) != n:
                raise self.error(f"aggregate function {name}() takes {n} argument(s), got {len(args)}", node)

        acc: _Acc
        if isinstance(inner, exp.Count):
            if not star and not args:
                raise self.error("count needs an argument", node)
            acc = _Count(star)
        elif isinstance(inner, exp.Sum):
            need(1)
            acc = _Sum(t0)
        elif isinstance(inner, exp.Avg) or name == "mean":
            need(1)
            acc = _Avg()
        elif isinstance(inner, (exp.Min, exp.Max)):
            need(1)
            acc = _MinMax(1 if isinstance(inner, exp.Max) else -1, t0)
        elif isinstance(inner, (exp.First, exp.FirstValue, exp.AnyValue)):
            need(1)
            acc = _FirstLast(False, ignore_nulls, t0)
        elif isinstance(inner, (exp.Last, exp.LastValue)):
            need(1)
            acc = _FirstLast(True, ignore_nulls, t0)
        elif isinstance(inner, exp.ArrayAgg):
            need(1)
            acc = _CollectList(t0)
        elif isinstance(inner, exp.ArrayUniqueAgg):
            need(1)
            acc = _CollectSet(t0)
        elif isinstance(inner, (exp.ArgMax, exp.ArgMin)):
            need(2)
            acc = _MaxBy(1 if isinstance(inner, exp.ArgMax) else -1, t0)
        elif isinstance(inner, exp.CountIf):
            need(1)
            acc = _CountIf()
        elif isinstance(inner, exp.LogicalAnd) or name in ("every", "bool_and"):
            need(1)
            acc = _BoolAgg(True)
        elif isinstance(inner, exp.LogicalOr) or name in ("some", "bool_or"):
            need(1)
            acc = _BoolAgg(False)
        else:  # pragma: no cover - _is_agg_node and this chain agree
            self._unsupported(inner)
        if ignore_nulls and not isinstance(acc, _FirstLast):
            raise self.error(f"IGNORE NULLS is not supported for {name}()", node)
        filter_fn = self.compile(filter_node, _ROW, name).fn if filter_node is not None else None
        call = _AggCall(name, acc, [a.fn for a in args], distinct, filter_fn)
        idx = len(self.calls)
        self.calls.append(call)
        return _C(lambda env: env[idx], acc.result_type)


def _lookup(m: Any, name: str, what: str) -> Any:
    if not isinstance(m, Mapping):
        raise ExprError(f"cannot extract {what} {name!r} from non-struct value {m!r}")
    try:
        return m[name]
    except KeyError:
        pass
    low = name.lower()
    hits = [k for k in m if isinstance(k, str) and k.lower() == low]
    if len(hits) == 1:
        return m[hits[0]]
    if not hits:
        raise ExprError(f"unknown {what} {name!r}; available: {sorted(map(str, m))}")
    raise ExprError(f"ambiguous {what} {name!r}: matches {hits}")


def _widen_fn(fn: Fn) -> Fn:
    def g(r: Any) -> Any:
        v = fn(r)
        return float(v) if _is_long(v) else v

    return g


def _path_getter(names: list[str], t: Any) -> Fn:
    first, rest = names[0], names[1:]

    def get(r: Any) -> Any:
        v = _lookup(r, first, "column")
        for n in rest:
            if v is None:
                return None
            v = _lookup(v, n, "struct field")
        return v

    return _widen_fn(get) if t == _DOUBLE else get


def _coerce_branches(cs: list[_C]) -> tuple[list[Fn], Any]:
    t = _common_type([c.type for c in cs])
    if t == _DOUBLE:
        return [c.fn if c.type == _DOUBLE else _widen_fn(c.fn) for c in cs], t
    return [c.fn for c in cs], t


def _all_const(cs: list[_C]) -> bool:
    return all(c.const for c in cs)


# ---- handlers ------------------------------------------------------------------------------

_Handler = Callable[[_Compiler, Any, str, Any], _C]
_HANDLERS: dict[type, _Handler] = {}
_ANON_HANDLERS: dict[str, _Handler] = {}


def _handles(*types: type) -> Callable[[_Handler], _Handler]:
    def deco(f: _Handler) -> _Handler:
        for t in types:
            _HANDLERS[t] = f
        return f

    return deco


def _anon(*names: str) -> Callable[[_Handler], _Handler]:
    def deco(f: _Handler) -> _Handler:
        for n in names:
            _ANON_HANDLERS[n] = f
        return f

    return deco


def _int_literal(text: str) -> int | None:
    return int(text) if text.isdigit() else None


@_handles(exp.Literal)
def _h_literal(cx: _Compiler, node: exp.Literal, scope: str, agg: Any) -> _C:
    if node.is_string:
        return _const(node.this, _STRING)
    text = str(node.this)
    iv = _int_literal(text)
    if iv is not None:
        if iv > _LONG_MAX:
            raise cx.error("integer literal out of bigint range", node)
        return _const(iv, _LONG)
    try:
        return _const(float(text), _DOUBLE)
    except ValueError:
        raise cx.error(f"unsupported numeric literal {text!r}", node) from None


@_handles(exp.Boolean)
def _h_boolean(cx: _Compiler, node: exp.Boolean, scope: str, agg: Any) -> _C:
    return _const(bool(node.this), _BOOL)


@_handles(exp.Null)
def _h_null(cx: _Compiler, node: exp.Null, scope: str, agg: Any) -> _C:
    return _const(None, _NULL)


@_handles(exp.Paren)
def _h_paren(cx: _Compiler, node: exp.Paren, scope: str, agg: Any) -> _C:
    return cx.compile(node.this, scope, agg)


@_handles(exp.Column)
def _h_column(cx: _Compiler, node: exp.Column, scope: str, agg: Any) -> _C:
    if isinstance(node.this, exp.Star):
        raise cx.error("* is only allowed as count(*)", node)
    return cx.column_path([p.name for p in node.parts], node, scope)


@_handles(exp.Dot)
def _h_dot(cx: _Compiler, node: exp.Dot, scope: str, agg: Any) -> _C:
    parts: list[str] = []
    cur: exp.Expression = node
    while isinstance(cur, exp.Dot):
        parts.insert(0, cur.expression.name)
        cur = cur.this
    if isinstance(cur, exp.Column) and not isinstance(cur.this, exp.Star):
        return cx.column_path([p.name for p in cur.parts] + parts, node, scope)
    base = cx.compile(cur, scope, agg)
    for p in parts:
        base = cx.field_access(base, p, node)
    return base


@_handles(exp.Star)
def _h_star(cx: _Compiler, node: exp.Star, scope: str, agg: Any) -> _C:
    raise cx.error("* is only allowed as count(*)", node)


def _binary(op: Callable[[Any, Any], Any], rtype: Callable[[Any, Any], Any]) -> _Handler:
    def h(cx: _Compiler, node: exp.Binary, scope: str, agg: Any) -> _C:
        a, b = cx.compile(node.this, scope, agg), cx.compile(node.expression, scope, agg)
        fa, fb = a.fn, b.fn

        def f(r: Any) -> Any:
            x = fa(r)
            if x is None:  # like Spark, the right side is not evaluated when the left is NULL
                return None
            y = fb(r)
            if y is None:
                return None
            return op(x, y)

        return _C(f, rtype(a.type, b.type), a.const and b.const)

    return h


def _arith_type(ta: Any, tb: Any) -> Any:
    if _STRING in (ta, tb):
        other = tb if ta == _STRING else ta
        return other if other in _NUMERIC else None
    if ta == _DOUBLE or tb == _DOUBLE:
        return _DOUBLE if (ta in _NUMERIC + (None, _NULL) and tb in _NUMERIC + (None, _NULL)) else None
    if ta == _LONG and tb == _LONG:
        return _LONG
    return None


_HANDLERS[exp.Add] = _binary(_add, _arith_type)
_HANDLERS[exp.Sub] = _binary(_sub, _arith_type)
_HANDLERS[exp.Mul] = _binary(_mul, _arith_type)
_HANDLERS[exp.Mod] = _binary(_mod, _arith_type)
_HANDLERS[exp.Div] = _binary(_div, lambda a, b: _DOUBLE)
_HANDLERS[exp.IntDiv] = _binary(_intdiv, lambda a, b: _LONG)


def _cmp_op(test: Callable[[int], bool], what: str) -> Callable[[Any, Any], Any]:
    return lambda a, b: test(_cmp(a, b, what))


_BOOL_T = lambda a, b: _BOOL
_HANDLERS[exp.EQ] = _binary(_cmp_op(lambda c: c == 0, "="), _BOOL_T)
_HANDLERS[exp.NEQ] = _binary(_cmp_op(lambda c: c != 0, "<>"), _BOOL_T)
_HANDLERS[exp.LT] = _binary(_cmp_op(lambda c: c < 0, "<"), _BOOL_T)
_HANDLERS[exp.LTE] = _binary(_cmp_op(lambda c: c <= 0, "<="), _BOOL_T)
_HANDLERS[exp.GT] = _binary(_cmp_op(lambda c: c > 0, ">"), _BOOL_T)
_HANDLERS[exp.GTE] = _binary(_cmp_op(lambda c: c >= 0, ">="), _BOOL_T)


@_handles(exp.NullSafeEQ)
def _h_nullsafe_eq(cx: _Compiler, node: exp.NullSafeEQ, scope: str, agg: Any) -> _C:
    a, b = cx.compile(node.this, scope, agg), cx.compile(node.expression, scope, agg)
    fa, fb = a.fn, b.fn

    def f(r: Any) -> bool:
        x, y = fa(r), fb(r)
        if x is None or y is None:
            return x is None and y is None
        return _cmp(x, y, "<=>") == 0

    return _C(f, _BOOL, a.const and b.const)


def _concat_values(fns: list[Fn], r: Any) -> Any:
    vals = []
    for g in fns:  # like Spark, stop at the first NULL argument
        v = g(r)
        if v is None:
            return None
        vals.append(v)
    if vals and all(isinstance(v, (list, tuple)) for v in vals):
        return [x for v in vals for x in v]
    parts = []
    for v in vals:
        if isinstance(v, (list, tuple, Mapping)):
            raise ExprError(f"[DATATYPE_MISMATCH] concat arguments must all be strings or all arrays, got {v!r}")
        parts.append(_to_str(v))
    return "".join(parts)


@_handles(exp.Concat)
def _h_concat(cx: _Compiler, node: exp.Concat, scope: str, agg: Any) -> _C:
    if node.args.get("coalesce"):
        cx._unsupported(node)
    cs = [cx.compile(e, scope, agg) for e in node.expressions]
    fns = [c.fn for c in cs]
    t = _STRING if not any(isinstance(c.type, _ArrayT) for c in cs) else None
    return _C(lambda r: _concat_values(fns, r), t, _all_const(cs))


@_handles(exp.DPipe)
def _h_dpipe(cx: _Compiler, node: exp.DPipe, scope: str, agg: Any) -> _C:
    cs = [cx.compile(node.this, scope, agg), cx.compile(node.expression, scope, agg)]
    fns = [c.fn for c in cs]
    return _C(lambda r: _concat_values(fns, r), _STRING, _all_const(cs))


def _connective(cx: _Compiler, node: exp.Binary, scope: str, agg: Any, name: str, dominant: bool) -> _C:
    """AND (dominant False) / OR (dominant True) in three-valued logic, lazy like Spark's."""
    a, b = cx.compile(node.this, scope, agg), cx.compile(node.expression, scope, agg)
    fa, fb = a.fn, b.fn

    def f(r: Any) -> Any:
        x = _check_bool(fa(r), name)
        if x is dominant:
            return dominant
        y = _check_bool(fb(r), name)
        if y is dominant:
            return dominant
        return None if x is None or y is None else not dominant

    return _C(f, _BOOL, a.const and b.const)


@_handles(exp.And)
def _h_and(cx: _Compiler, node: exp.And, scope: str, agg: Any) -> _C:
    return _connective(cx, node, scope, agg, "AND", False)


@_handles(exp.Or)
def _h_or(cx: _Compiler, node: exp.Or, scope: str, agg: Any) -> _C:
    return _connective(cx, node, scope, agg, "OR", True)


@_handles(exp.Not)
def _h_not(cx: _Compiler, node: exp.Not, scope: str, agg: Any) -> _C:
    a = cx.compile(node.this, scope, agg)
    fa = a.fn

    def f(r: Any) -> Any:
        v = _check_bool(fa(r), "NOT")
        return None if v is None else not v

    return _C(f, _BOOL, a.const)


@_handles(exp.Neg)
def _h_neg(cx: _Compiler, node: exp.Neg, scope: str, agg: Any) -> _C:
    child = node.this
    if (isinstance(child, (exp.Cast, exp.TryCast)) and child.args["to"].this == _DT.BIGINT
            and isinstance(child.this, exp.Literal)):
        child = child.this  # -9223372036854775808L
    if isinstance(child, exp.Literal) and not child.is_string:
        iv = _int_literal(str(child.this))
        if iv is not None:
            if -iv < _LONG_MIN:
                raise cx.error("integer literal out of bigint range", node)
            return _const(-iv, _LONG)
    a = cx.compile(child, scope, agg)
    fa = a.fn

    def f(r: Any) -> Any:
        v = fa(r)
        return None if v is None else _neg(v)

    return _C(f, _DOUBLE if a.type == _STRING else a.type, a.const)


def _unary_fn(op: Callable[[Any], Any], rtype: Callable[[Any], Any]) -> _Handler:
    def h(cx: _Compiler, node: exp.Func, scope: str, agg: Any) -> _C:
        cs = cx.args(node, scope, agg)
        if len(cs) != 1:
            raise cx.error(f"{_fn_name(node)}() takes 1 argument, got {len(cs)}", node)
        fa = cs[0].fn

        def f(r: Any) -> Any:
            v = fa(r)
            return None if v is None else op(v)

        return _C(f, rtype(cs[0].type), cs[0].const)

    return h


_HANDLERS[exp.Abs] = _unary_fn(_abs, lambda t: _DOUBLE if t == _STRING else t)
_HANDLERS[exp.Upper] = _unary_fn(lambda v: _scalar_text(v, "upper").upper(), lambda t: _STRING)
_HANDLERS[exp.Lower] = _unary_fn(lambda v: _scalar_text(v, "lower").lower(), lambda t: _STRING)
_HANDLERS[exp.Length] = _unary_fn(lambda v: len(_scalar_text(v, "length")), lambda t: _LONG)


def _size(v: Any) -> int:
    if isinstance(v, (list, tuple, Mapping)):
        return len(v)
    raise ExprError(f"[DATATYPE_MISMATCH] size requires an ARRAY or MAP, got {_kind(v).upper()} {v!r}")


_HANDLERS[exp.ArraySize] = _unary_fn(_size, lambda t: _LONG)
_ANON_HANDLERS["cardinality"] = _HANDLERS[exp.ArraySize]


@_anon("isnull")
def _h_isnull(cx: _Compiler, node: exp.Anonymous, scope: str, agg: Any) -> _C:
    cs = cx.args(node, scope, agg)
    if len(cs) != 1:
        raise cx.error("isnull() takes 1 argument", node)
    fa = cs[0].fn
    return _C(lambda r: fa(r) is None, _BOOL, cs[0].const)


@_anon("isnotnull")
def _h_isnotnull(cx: _Compiler, node: exp.Anonymous, scope: str, agg: Any) -> _C:
    cs = cx.args(node, scope, agg)
    if len(cs) != 1:
        raise cx.error("isnotnull() takes 1 argument", node)
    fa = cs[0].fn
    return _C(lambda r: fa(r) is not None, _BOOL, cs[0].const)


@_handles(exp.Is)
def _h_is(cx: _Compiler, node: exp.Is, scope: str, agg: Any) -> _C:
    a = cx.compile(node.this, scope, agg)
    fa, rhs = a.fn, node.expression
    if isinstance(rhs, exp.Null):
        f = lambda r: fa(r) is None
    elif isinstance(rhs, exp.Boolean):
        want = bool(rhs.this)
        f = lambda r: _check_bool(fa(r), "IS TRUE/FALSE") is want
    else:
        raise cx.error("unsupported IS predicate", node)
    if node.args.get("negate"):
        g = f
        f = lambda r: not g(r)
    return _C(f, _BOOL, a.const)


@_handles(exp.In)
def _h_in(cx: _Compiler, node: exp.In, scope: str, agg: Any) -> _C:
    if node.args.get("query") is not None or node.args.get("unnest") is not None or node.args.get("field"):
        raise cx.error("IN supports only a literal list of values, not a subquery", node)
    a = cx.compile(node.this, scope, agg)
    items = [cx.compile(e, scope, agg) for e in node.expressions]
    fa, fns = a.fn, [c.fn for c in items]

    def f(r: Any) -> Any:
        v = fa(r)
        if v is None:
            return None
        saw_null = False
        for g in fns:
            w = g(r)
            if w is None:
                saw_null = True
            elif _cmp(v, w, "IN") == 0:
                return True
        return None if saw_null else False

    return _C(f, _BOOL, a.const and _all_const(items))


@_handles(exp.Between)
def _h_between(cx: _Compiler, node: exp.Between, scope: str, agg: Any) -> _C:
    if node.args.get("symmetric"):
        raise cx.error("BETWEEN SYMMETRIC is not supported", node)
    a, lo, hi = (cx.compile(node.args[k], scope, agg) for k in ("this", "low", "high"))
    fa, flo, fhi = a.fn, lo.fn, hi.fn

    def f(r: Any) -> Any:
        v = fa(r)
        if v is None:
            return None
        x = flo(r)
        ge = None if x is None else _cmp(v, x, "BETWEEN") >= 0
        if ge is False:
            return False
        y = fhi(r)
        le = None if y is None else _cmp(v, y, "BETWEEN") <= 0
        if le is False:
            return False
        return None if ge is None or le is None else True

    return _C(f, _BOOL, a.const and lo.const and hi.const)


@_handles(exp.If)
def _h_if(cx: _Compiler, node: exp.If, scope: str, agg: Any) -> _C:
    if node.args.get("false") is None:
        raise cx.error("if() takes 3 arguments: if(condition, then, else)", node)
    c = cx.compile(node.this, scope, agg)
    t, e = cx.compile(node.args["true"], scope, agg), cx.compile(node.args["false"], scope, agg)
    (ft, fe), rt = _coerce_branches([t, e])
    fc = c.fn

    def f(r: Any) -> Any:
        return ft(r) if _check_bool(fc(r), "if condition") is True else fe(r)

    return _C(f, rt, c.const and t.const and e.const)


@_handles(exp.Case)
def _h_case(cx: _Compiler, node: exp.Case, scope: str, agg: Any) -> _C:
    base = cx.compile(node.this, scope, agg) if node.this is not None else None
    conds = [cx.compile(i.this, scope, agg) for i in node.args.get("ifs") or []]
    vals = [cx.compile(i.args["true"], scope, agg) for i in node.args.get("ifs") or []]
    default = node.args.get("default")
    dflt = cx.compile(default, scope, agg) if default is not None else _const(None, _NULL)
    fns, rt = _coerce_branches(vals + [dflt])
    pairs = list(zip([c.fn for c in conds], fns[:-1]))
    fd = fns[-1]
    if base is None:
        def f(r: Any) -> Any:
            for fc, fv in pairs:
                if _check_bool(fc(r), "CASE WHEN condition") is True:
                    return fv(r)
            return fd(r)
    else:
        fb = base.fn

        def f(r: Any) -> Any:
            v = fb(r)
            if v is not None:
                for fc, fv in pairs:
                    w = fc(r)
                    if w is not None and _cmp(v, w, "CASE") == 0:
                        return fv(r)
            return fd(r)

    consts = conds + vals + [dflt] + ([base] if base is not None else [])
    return _C(f, rt, _all_const(consts))


@_handles(exp.Coalesce)
def _h_coalesce(cx: _Compiler, node: exp.Coalesce, scope: str, agg: Any) -> _C:
    cs = cx.args(node, scope, agg)
    if node.args.get("is_nvl") and len(cs) != 2:
        raise cx.error("nvl() takes 2 arguments", node)
    fns, rt = _coerce_branches(cs)

    def f(r: Any) -> Any:
        for g in fns:
            v = g(r)
            if v is not None:
                return v
        return None

    return _C(f, rt, _all_const(cs))


@_handles(exp.Nullif)
def _h_nullif(cx: _Compiler, node: exp.Nullif, scope: str, agg: Any) -> _C:
    a, b = cx.compile(node.this, scope, agg), cx.compile(node.expression, scope, agg)
    fa, fb = a.fn, b.fn

    def f(r: Any) -> Any:
        x = fa(r)
        if x is None:
            return None
        y = fb(r)
        return None if y is not None and _cmp(x, y, "nullif") == 0 else x

    return _C(f, a.type, a.const and b.const)


@_handles(exp.Nvl2)
def _h_nvl2(cx: _Compiler, node: exp.Nvl2, scope: str, agg: Any) -> _C:
    a = cx.compile(node.this, scope, agg)
    t, e = cx.compile(node.args["true"], scope, agg), cx.compile(node.args["false"], scope, agg)
    (ft, fe), rt = _coerce_branches([t, e])
    fa = a.fn
    return _C(lambda r: ft(r) if fa(r) is not None else fe(r), rt, a.const and t.const and e.const)


def _extreme(sign: int, what: str) -> _Handler:
    def h(cx: _Compiler, node: exp.Func, scope: str, agg: Any) -> _C:
        cs = cx.args(node, scope, agg)
        if len(cs) < 2:
            raise cx.error(f"{what}() requires at least 2 arguments", node)
        fns, rt = _coerce_branches(cs)

        def f(r: Any) -> Any:
            vals = [v for v in (g(r) for g in fns) if v is not None]
            if not vals:
                return None
            kinds = {_kind(v) for v in vals}
            if len(kinds) > 1:
                if kinds <= {_LONG, _DOUBLE}:
                    vals = [float(v) for v in vals]
                else:
                    raise ExprError(f"[DATATYPE_MISMATCH] {what}() arguments must have the same type, got {vals!r}")
            best = vals[0]
            for v in vals[1:]:
                if _compare(v, best) * sign > 0:
                    best = v
            return best

        return _C(f, rt, _all_const(cs))

    return h


_HANDLERS[exp.Greatest] = _extreme(1, "greatest")
_HANDLERS[exp.Least] = _extreme(-1, "least")


@_handles(exp.Round)
def _h_round(cx: _Compiler, node: exp.Round, scope: str, agg: Any) -> _C:
    if node.args.get("truncate") is not None:
        raise cx.error("round() takes at most 2 arguments", node)
    a = cx.compile(node.this, scope, agg)
    d = node.args.get("decimals")
    s = cx.compile(d, scope, agg) if d is not None else _const(0, _LONG)
    if not s.const:
        raise cx.error("the scale of round() must be a constant", node)
    fa, fs = a.fn, s.fn
    return _C(lambda r: _round(fa(r), fs(r)), _DOUBLE if a.type == _STRING else a.type, a.const and s.const)


@_handles(exp.Substring)
def _h_substring(cx: _Compiler, node: exp.Substring, scope: str, agg: Any) -> _C:
    a = cx.compile(node.this, scope, agg)
    if node.args.get("start") is None:
        raise cx.error("substring() needs a start position", node)
    p = cx.compile(node.args["start"], scope, agg)
    ln = node.args.get("length")
    n = cx.compile(ln, scope, agg) if ln is not None else _const(_INT_MAX, _LONG)
    fa, fp, fn_ = a.fn, p.fn, n.fn

    def f(r: Any) -> Any:
        v = fa(r)
        if v is None:
            return None
        pos = fp(r)
        return None if pos is None else _substring(v, pos, fn_(r))

    return _C(f, _STRING, a.const and p.const and n.const)


@_handles(exp.Array)
def _h_array(cx: _Compiler, node: exp.Array, scope: str, agg: Any) -> _C:
    cs = [cx.compile(e, scope, agg) for e in node.expressions]
    fns, et = _coerce_branches(cs) if cs else ([], _NULL)

    def f(r: Any) -> list:
        vals = [g(r) for g in fns]
        kinds = {_kind(v) for v in vals if v is not None}
        if kinds == {_LONG, _DOUBLE}:
            vals = [None if v is None else float(v) for v in vals]
        return vals

    return _C(f, _ArrayT(et), _all_const(cs))


@_handles(exp.Struct)
def _h_struct(cx: _Compiler, node: exp.Struct, scope: str, agg: Any) -> _C:
    names, cs = [], []
    for i, e in enumerate(node.expressions):
        if isinstance(e, exp.PropertyEQ):
            names.append(e.this.name)
            cs.append(cx.compile(e.expression, scope, agg))
        else:
            names.append(e.alias_or_name if isinstance(e, exp.Column) else f"col{i + 1}")
            cs.append(cx.compile(e, scope, agg))
    fns = [c.fn for c in cs]
    t = _StructT(tuple((n, c.type) for n, c in zip(names, cs)))
    return _C(lambda r: {n: g(r) for n, g in zip(names, fns)}, t, _all_const(cs))


def _cast_target(cx: _Compiler, node: exp.Expression) -> str:
    to = node.args["to"]
    t = to.this
    if t in _STRING_DT:
        return _STRING
    if t == _DT.BIGINT:
        return _LONG
    if t == _DT.INT:
        return "int"
    if t == _DT.DOUBLE:
        return _DOUBLE
    if t == _DT.BOOLEAN:
        return _BOOL
    raise cx.error(
        f"unsupported cast target type {to.sql(dialect='spark')}; supported: {', '.join(_CAST_TARGETS)}", node)


@_handles(exp.Cast, exp.TryCast)
def _h_cast(cx: _Compiler, node: exp.Expression, scope: str, agg: Any) -> _C:
    target = _cast_target(cx, node)
    a = cx.compile(node.this, scope, agg)
    conv, fa = _CASTS[target], a.fn
    if node.args.get("safe"):  # try_cast: NULL instead of a run-time error
        def f(r: Any) -> Any:
            try:
                return conv(fa(r))
            except ExprRuntimeError:
                return None
    else:
        def f(r: Any) -> Any:
            return conv(fa(r))

    return _C(f, _LONG if target == "int" else target, a.const)
