"""Part: reference engine. Aggregate accumulators (pure: add() returns a new state)."""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from backfill.reference.expr.base import ExprError
from backfill.reference.expr.values import (
    _BOOL,
    _DOUBLE,
    _LONG,
    _NUMERIC,
    _STRING,
    _ArrayT,
    _check_bool,
    _check_long,
    _cmp,
    _coerce_pair,
    _compare,
    _kind,
    _norm_key,
    _to_double,
    _widen_double,
)

# --------------------------------------------------------------------------------------------
# Aggregate accumulators (pure: add() returns a new state)
# --------------------------------------------------------------------------------------------

_NOTHING = object()


class _Acc:
    order_sensitive = False
    result_type: Any = None

    def init(self) -> Any:
        return None

    def add(self, state: Any, args: tuple) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def result(self, state: Any) -> Any:
        return state


class _Count(_Acc):
    result_type = _LONG

    def __init__(self, star: bool) -> None:
        self.star = star

    def init(self) -> Any:
        return 0

    def add(self, state: Any, args: tuple) -> Any:
        if self.star or all(a is not None for a in args):
            return state + 1
        return state


def _numeric_input(v: Any, fn: str) -> Any:
    k = _kind(v)
    if k in _NUMERIC:
        return v
    if k == _STRING:  # Spark implicitly casts string input of sum/avg to double
        return _to_double(v)
    raise ExprError(f"[DATATYPE_MISMATCH] {fn} requires numeric input, got {k.upper()} {v!r}")


class _Sum(_Acc):
    def __init__(self, arg_type: Any) -> None:
        self.as_double = arg_type in (_DOUBLE, _STRING)
        self.result_type = _DOUBLE if self.as_double else (_LONG if arg_type == _LONG else None)

    def add(self, state: Any, args: tuple) -> Any:
        v = args[0]
        if v is None:
            return state
        v = _numeric_input(v, "sum")
        if self.as_double:
            v = float(v)
        if state is None:
            return v
        if isinstance(state, int) and isinstance(v, int):
            return _check_long(state + v, "sum")
        return float(state) + float(v)


class _Avg(_Acc):
    result_type = _DOUBLE

    def init(self) -> Any:
        return (0.0, 0)

    def add(self, state: Any, args: tuple) -> Any:
        v = args[0]
        if v is None:
            return state
        return (state[0] + float(_numeric_input(v, "avg")), state[1] + 1)

    def result(self, state: Any) -> Any:
        return None if state[1] == 0 else state[0] / state[1]


class _MinMax(_Acc):
    def __init__(self, sign: int, arg_type: Any) -> None:
        self.sign = sign
        self.result_type = arg_type

    def add(self, state: Any, args: tuple) -> Any:
        v = args[0]
        if v is None:
            return state
        if self.result_type == _DOUBLE:
            v = _widen_double(v)
        if state is None:
            return v
        if _kind(v) != _kind(state):  # e.g. ints and floats mixed in an untyped column
            v, state = _coerce_pair(v, state, "max" if self.sign > 0 else "min")
        return v if _compare(v, state) * self.sign > 0 else state


class _FirstLast(_Acc):
    order_sensitive = True

    def __init__(self, last: bool, ignore_nulls: bool, arg_type: Any) -> None:
        self.last, self.ignore_nulls, self.result_type = last, ignore_nulls, arg_type

    def init(self) -> Any:
        return _NOTHING

    def add(self, state: Any, args: tuple) -> Any:
        v = args[0]
        if v is None and self.ignore_nulls:
            return state
        if self.last or state is _NOTHING:
            return v
        return state

    def result(self, state: Any) -> Any:
        return None if state is _NOTHING else state


def _cons_to_list(cell: Any) -> list:
    out = []
    while cell is not None:
        out.append(cell[0])
        cell = cell[1]
    out.reverse()
    return out


class _CollectList(_Acc):
    order_sensitive = True

    def __init__(self, arg_type: Any) -> None:
        self.result_type = _ArrayT(arg_type)

    def add(self, state: Any, args: tuple) -> Any:
        v = args[0]
        return state if v is None else (v, state)

    def result(self, state: Any) -> Any:
        return _cons_to_list(state)


class _CollectSet(_Acc):
    def __init__(self, arg_type: Any) -> None:
        self.result_type = _ArrayT(arg_type)

    def init(self) -> Any:
        return (frozenset(), None)

    def add(self, state: Any, args: tuple) -> Any:
        v = args[0]
        if v is None:
            return state
        if isinstance(v, float) and math.isnan(v):  # Spark's collect_set keeps every NaN (NaN != NaN)
            return (state[0], (v, state[1]))
        key = _norm_key(v)  # ... but -0.0 and 0.0 are one value (the first seen is kept)
        if key in state[0]:
            return state
        return (state[0] | {key}, (v, state[1]))

    def result(self, state: Any) -> Any:
        return _cons_to_list(state[1])


class _MaxBy(_Acc):
    order_sensitive = True

    def __init__(self, sign: int, arg_type: Any) -> None:
        self.sign, self.result_type = sign, arg_type

    def add(self, state: Any, args: tuple) -> Any:
        value, ordering = args
        if ordering is None:
            return state
        # Spark replaces on ties (>= / <=): the last row with the extreme ordering wins.
        if state is None or _cmp(ordering, state[0], "max_by/min_by") * self.sign >= 0:
            return (ordering, value)
        return state

    def result(self, state: Any) -> Any:
        return None if state is None else state[1]


class _CountIf(_Acc):
    result_type = _LONG

    def init(self) -> Any:
        return 0

    def add(self, state: Any, args: tuple) -> Any:
        return state + 1 if _check_bool(args[0], "count_if") is True else state


class _BoolAgg(_Acc):
    result_type = _BOOL

    def __init__(self, is_and: bool) -> None:
        self.is_and = is_and

    def add(self, state: Any, args: tuple) -> Any:
        v = _check_bool(args[0], "bool_and" if self.is_and else "bool_or")
        if v is None:
            return state
        if state is None:
            return v
        return (state and v) if self.is_and else (state or v)


class _AggCall:
    """One aggregate call: argument closures, optional DISTINCT and FILTER (WHERE ...)."""

    def __init__(self, name: str, acc: _Acc, arg_fns: list, distinct: bool, filter_fn: Any) -> None:
        self.name, self.acc, self.arg_fns = name, acc, arg_fns
        self.distinct, self.filter_fn = distinct, filter_fn

    def init(self) -> Any:
        inner = self.acc.init()
        return (frozenset(), inner) if self.distinct else inner

    def add(self, state: Any, row: Mapping[str, Any]) -> Any:
        if self.filter_fn is not None and _check_bool(self.filter_fn(row), f"FILTER of {self.name}") is not True:
            return state
        args = tuple(f(row) for f in self.arg_fns)
        if not self.distinct:
            return self.acc.add(state, args)
        seen, inner = state
        if any(a is None for a in args):
            return state
        key = _norm_key(args)
        if key in seen:
            return state
        return (seen | {key}, self.acc.add(inner, args))

    def result(self, state: Any) -> Any:
        return self.acc.result(state[1] if self.distinct else state)
