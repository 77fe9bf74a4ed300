"""Evaluate small Spark SQL expressions in pure Python, with Spark's semantics.

The Spark engine evaluates the expressions of a job spec with ``F.expr(sql)``; the reference engine
(the oracle of the property tests) evaluates the same text here, one record at a time. The text is
parsed with sqlglot (dialect ``spark``) and compiled into Python closures by a small evaluator.

Public API
----------
* ``compile_scalar(sql)`` -> ``f(row)``: a row is a mapping column -> value; structs are nested
  mappings (``value.amount``), a struct that is ``None`` gives ``None`` for its fields.
* ``compile_aggregate(sql)`` -> :class:`Aggregate` (``init`` / ``add`` / ``result``): one or more
  aggregate calls combined with scalar operators, e.g. ``round(sum(value.a) / count(), 2)``. Rows are
  added in processing order; ``first``/``last``/``collect_list``/``max_by``... follow that order.
* ``compile_fold(init_sql, step_sql)`` -> :class:`Aggregate`: Kafka Streams ``aggregate(initializer,
  aggregator)``; ``step_sql`` sees the row plus ``acc`` (the current state).
* ``is_order_sensitive(sql)``, ``normalize_count(sql)`` (``count()`` -> ``count(1)``; the Spark
  engine applies the same textual rewrite).

All three ``compile_*`` functions accept an optional keyword ``schema`` (a mapping column -> Spark
type name or nested mapping, a DDL string such as ``"key string, value struct<amount: double>"``, or
anything with ``simpleString()`` such as a pyspark ``StructType``). With a schema, unknown columns
are reported at compile time, integer values read from ``double`` columns are converted to float,
and result types follow Spark's static typing in more places (``coalesce(value.amount, 0)`` gives
``0.0`` like Spark, not ``0``).

States are immutable values: ``add`` never mutates the state it is given, so a caller may keep old
states (e.g. to emit every intermediate result, as Kafka Streams does).

Semantics (Spark 4 defaults, i.e. ANSI mode)
--------------------------------------------
* Types: Python ``int`` = bigint, ``float`` = double, ``str`` = string, ``bool`` = boolean,
  ``list`` = array, ``dict`` (any mapping) = struct. ``None`` = NULL.
* Arithmetic ``+ - *`` on bigints is checked for 64-bit overflow; ``/`` always gives a double;
  ``div`` is integral division truncating toward zero; ``%`` takes the sign of the dividend.
  Division or remainder by zero, overflow and malformed casts raise :class:`ExprRuntimeError`,
  as Spark does in ANSI mode. A string operand is cast to the other operand's numeric type.
* Comparisons and ``AND``/``OR``/``NOT`` use three-valued logic; ``AND``/``OR``, ``IF``, ``CASE``
  and ``coalesce`` are lazy like Spark's (``if(n = 0, null, x / n)`` never divides by zero).
  NaN equals NaN and sorts above every other double; ``-0.0 = 0.0``.
* Aggregates ignore NULL inputs (``count(*)``/``count(1)`` count every row); ``sum``/``avg``/
  ``min``/``max`` of no non-null input is NULL; ``sum`` of bigints is a bigint (overflow checked),
  of doubles a double; ``avg`` is a double computed as sum-of-doubles / count like Spark.
  ``first``/``last`` keep NULLs unless ``ignore nulls`` (``first(x, true)``) is given;
  ``max_by``/``min_by`` skip rows whose ordering value is NULL and on ties keep the *last* row
  (observed Spark behaviour). ``collect_set`` returns the distinct values in first-seen order
  (Spark's order is unspecified: compare it as a set); like Spark's, it keeps every NaN and
  merges -0.0 with 0.0, while ``count(DISTINCT ...)`` counts all NaNs as one value.
* ``cast(double AS string)`` and ``concat`` use Java's ``Double.toString`` layout (``1.0``,
  ``1.0E10``, ``1.0E-4``); ``round`` is HALF_UP on the decimal text of the double, like Spark.

Known deviations from Spark
---------------------------
* Integer literals are bigint (Spark: int), so int-range overflow of pure-literal arithmetic such
  as ``2147483647 + 1`` is not detected; all integral types (int, smallint, tinyint) are bigints.
  ``cast(x AS int)`` does check the int range.
* Decimal literals (``1.5``) are doubles (Spark: exact decimals). Results differ only in the
  last bits of literal-only decimal arithmetic (``0.1 + 0.2``) and in the text of decimals
  (``cast(1.50 AS string)`` is ``"1.50"`` in Spark, ``"1.5"`` here); ``1.5 div 1`` is rejected.
* Without a schema, types are known only from values and literals: ``coalesce(value.amount, 0)``
  with a NULL ``amount`` yields ``0`` (Spark: ``0.0``); numerically equal.
* ``cast(double AS string)`` follows Java 17's ``Double.toString`` (the JVM this project's Spark
  runs on), including its exact-long output for integral values in [2^53, 2^63)
  (``1.68944606535941197E18``). Java 17 also prints a handful of other values with extra digits
  (``2.0E23`` -> ``1.9999999999999998E23``, ``8.41E21``); those come out shortest here. On Java 19+
  Spark always prints the shortest digits: set ``LEGACY_JDK_DOUBLE_FORMAT = False``. ``round``
  uses the same digits, as Spark's ``BigDecimal(Double.toString(d))`` does.
* Analysis-time type errors (``true + 1``, ``if(1, ...)``, ``greatest(1, 'a')``) are found only
  when evaluated, with the values at hand, and raise :class:`ExprError`; branches of mixed string
  and number types are not cast (Spark: ``coalesce('a', 1)`` fails casting 'a' to bigint);
  ``CASE WHEN NULL`` is accepted; hex float strings are not accepted by casts; ``concat()`` with
  no argument does not parse.
* (Not a deviation) Spark 4 reads ``'it''s'`` as ``it's`` (doubled quote) and ``'a' 'b'`` as
  ``ab``; so does this module, although stock sqlglot reads the former as ``its``.
* Aggregates are computed in add order; Spark sums doubles in partition order, so float sums
  may differ in the last bits when Spark splits a group across partitions.
"""
from __future__ import annotations

import decimal
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol, runtime_checkable

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

from backfill.errors import SpecError
from backfill.sqldialect import SparkSQL

__all__ = [
    "LEGACY_JDK_DOUBLE_FORMAT",
    "SUPPORTED_AGGREGATES",
    "SUPPORTED_FUNCTIONS",
    "SUPPORTED_OPERATORS",
    "Aggregate",
    "CompiledAggregate",
    "CompiledFold",
    "CompiledScalar",
    "ExprError",
    "ExprRuntimeError",
    "compile_aggregate",
    "compile_fold",
    "compile_scalar",
    "is_order_sensitive",
    "normalize_count",
]


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


_COUNT_EMPTY = re.compile(r"(?i)\b(count)\s*\(\s*\)")
_QUOTED = re.compile(r"""'(?:\\.|''|[^'\\])*'|"(?:\\.|[^"\\])*"|`(?:``|[^`])*`""", re.DOTALL)


def normalize_count(sql: str) -> str:
    """Rewrite ``count()`` (not valid Spark SQL) to ``count(1)``, outside string literals and quoted
    identifiers. The Spark engine applies the same rewrite before ``F.expr``."""
    out: list[str] = []
    pos = 0
    for m in _QUOTED.finditer(sql):
        out.append(_COUNT_EMPTY.sub(r"\1(1)", sql[pos:m.start()]))
        out.append(m.group(0))
        pos = m.end()
    out.append(_COUNT_EMPTY.sub(r"\1(1)", sql[pos:]))
    return "".join(out)


def _parse(sql: str) -> exp.Expression:
    if not isinstance(sql, str):
        raise ExprError(f"expression must be a string, got {type(sql).__name__}")
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


# --------------------------------------------------------------------------------------------
# Static types (only what is needed for Spark's implicit widening)
# --------------------------------------------------------------------------------------------

_LONG, _DOUBLE, _STRING, _BOOL, _NULL = "bigint", "double", "string", "boolean", "void"
_NUMERIC = (_LONG, _DOUBLE)


@dataclass(frozen=True)
class _ArrayT:
    elem: Any


@dataclass(frozen=True)
class _MapT:
    key: Any
    value: Any


@dataclass(frozen=True)
class _StructT:
    fields: tuple[tuple[str, Any], ...]

    def field(self, name: str) -> tuple[str, Any] | None:
        for fname, ftype in self.fields:
            if fname == name:
                return fname, ftype
        hits = [(f, t) for f, t in self.fields if f.lower() == name.lower()]
        if len(hits) == 1:
            return hits[0]
        if len(hits) > 1:
            raise ExprError(f"ambiguous reference {name!r}: matches {[f for f, _ in hits]}")
        return None


_DT = exp.DataType.Type
_INTEGRAL_DT = {_DT.BIGINT, _DT.INT, _DT.SMALLINT, _DT.TINYINT}
_STRING_DT = {_DT.TEXT, _DT.VARCHAR, _DT.CHAR, _DT.NCHAR, _DT.NVARCHAR}


def _type_from_datatype(dt: exp.DataType) -> Any:
    t = dt.this
    if t in _INTEGRAL_DT:
        return _LONG
    if t in (_DT.DOUBLE, _DT.FLOAT):
        return _DOUBLE
    if t in _STRING_DT:
        return _STRING
    if t == _DT.BOOLEAN:
        return _BOOL
    if t == _DT.ARRAY:
        return _ArrayT(_type_from_datatype(dt.expressions[0]) if dt.expressions else None)
    if t == _DT.MAP:
        return _MapT(*(_type_from_datatype(e) for e in dt.expressions[:2]))
    if t == _DT.STRUCT:
        fields = []
        for cd in dt.expressions:
            kind = cd.args.get("kind")
            fields.append((cd.name, _type_from_datatype(kind) if kind is not None else None))
        return _StructT(tuple(fields))
    return None  # other types (timestamp, decimal, ...) are carried through untyped


def _type_from_spec(spec: Any) -> Any:
    if spec is None or isinstance(spec, (_ArrayT, _MapT, _StructT)):
        return spec
    if isinstance(spec, Mapping):
        return _StructT(tuple((str(k), _type_from_spec(v)) for k, v in spec.items()))
    if hasattr(spec, "simpleString"):
        spec = spec.simpleString()
    if isinstance(spec, str):
        try:
            return _type_from_datatype(exp.DataType.build(spec, dialect="spark"))
        except (SqlglotError, ValueError) as e:
            raise ExprError(f"cannot parse type {spec!r}: {e}") from None
    raise ExprError(f"unsupported schema/type specification {spec!r}")


def _schema_from(schema: Any) -> _StructT | None:
    if schema is None:
        return None
    if isinstance(schema, str) and not schema.strip().lower().startswith("struct"):
        schema = f"struct<{schema}>"
    t = _type_from_spec(schema)
    if not isinstance(t, _StructT):
        raise ExprError(f"schema must describe a struct (columns), got {schema!r}")
    return t


def _common_type(types: list[Any]) -> Any:
    """Result type of if/case/coalesce/greatest/array...; None when it cannot be decided."""
    ts = [t for t in types if t != _NULL]
    if not ts:
        return _NULL
    known = [t for t in ts if t is not None]
    if len(known) < len(ts):
        # An unknown branch: only "some branch is double, the known ones are numeric" is decidable.
        if known and all(t in _NUMERIC for t in known) and _DOUBLE in known:
            return _DOUBLE
        return None
    if all(t == known[0] for t in known):
        return known[0]
    if all(t in _NUMERIC for t in known):
        return _DOUBLE
    return None


# --------------------------------------------------------------------------------------------
# Value helpers
# --------------------------------------------------------------------------------------------

_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
_INT_MIN, _INT_MAX = -(2**31), 2**31 - 1


def _is_long(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _kind(v: Any) -> str:
    if isinstance(v, bool):
        return _BOOL
    if isinstance(v, int):
        return _LONG
    if isinstance(v, float):
        return _DOUBLE
    if isinstance(v, str):
        return _STRING
    if isinstance(v, Mapping):
        return "struct"
    if isinstance(v, (list, tuple)):
        return "array"
    return type(v).__name__  # e.g. datetime: passed through, compared only with its own kind


def _widen_double(v: Any) -> Any:
    return float(v) if _is_long(v) else v


def _check_long(v: int, what: str) -> int:
    if not _LONG_MIN <= v <= _LONG_MAX:
        raise ExprRuntimeError(f"[ARITHMETIC_OVERFLOW] long overflow in {what}")
    return v


def _check_bool(v: Any, what: str) -> Any:
    if v is None or isinstance(v, bool):
        return v
    raise ExprError(f"[DATATYPE_MISMATCH] {what} requires a BOOLEAN, got {_kind(v).upper()} {v!r}")


# Java's FloatingDecimal (the Double.toString of every JDK Spark 4 runs on) prints an integral
# double below 2^63 from its exact long value, rounded only by "insignificant" digits; above
# 2^53 that gives more digits than the shortest repr (1.68944606535941197E18, not 1.689446065359412E18).
# Set LEGACY_JDK_DOUBLE_FORMAT = False to mimic Spark on Java 19+, whose Double.toString always
# prints the shortest digits.
LEGACY_JDK_DOUBLE_FORMAT = True
_JDK_LONG_PATH_MIN, _JDK_LONG_PATH_MAX = float(2**53), float(2**63)
_JDK_INSIGNIFICANT_DIGITS = (
    0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7,
    8, 8, 8, 9, 9, 9, 9, 10, 10, 10, 11, 11, 11, 12, 12, 12, 12, 13, 13, 13, 14, 14, 14,
    15, 15, 15, 15, 16, 16, 16, 17, 17, 17, 18, 18, 18, 19,
)


def _jdk_long_digits(a: float) -> tuple[str, int]:
    """FloatingDecimal.developLongDigits: (digits, decimal exponent of the last digit)."""
    lv = int(a)
    bin_exp = math.frexp(a)[1] - 1
    p2 = bin_exp - 54
    insignificant = _JDK_INSIGNIFICANT_DIGITS[p2] if bin_exp > 53 and 1 < p2 < len(_JDK_INSIGNIFICANT_DIGITS) else 0
    if insignificant:
        pow10 = 10**insignificant
        lv, residue = divmod(lv, pow10)
        if residue >= pow10 >> 1:
            lv += 1
    return str(lv), insignificant


def _java_digits(a: float) -> tuple[str, int]:
    """Significant digits (no trailing zeros) and exponent of the last one, for finite a > 0."""
    if LEGACY_JDK_DOUBLE_FORMAT and _JDK_LONG_PATH_MIN <= a < _JDK_LONG_PATH_MAX and a == int(a):
        ds, exponent = _jdk_long_digits(a)
    else:
        _, digits_t, exponent = decimal.Decimal(repr(a)).as_tuple()
        ds = "".join(map(str, digits_t))
    stripped = ds.rstrip("0") or "0"
    return stripped, int(exponent) + len(ds) - len(stripped)


def _java_decimal(d: float) -> decimal.Decimal:
    """Scala's BigDecimal(d): the exact decimal written by Double.toString(d) (finite d)."""
    if d == 0.0:
        return decimal.Decimal(0)
    ds, exponent = _java_digits(abs(d))
    return decimal.Decimal((1 if d < 0 else 0, tuple(map(int, ds)), exponent))


def _java_double_str(d: float) -> str:
    """``java.lang.Double.toString``: shortest repr digits, except the JDK's exact-long path."""
    if math.isnan(d):
        return "NaN"
    if d == math.inf:
        return "Infinity"
    if d == -math.inf:
        return "-Infinity"
    if d == 0.0:
        return "-0.0" if math.copysign(1.0, d) < 0 else "0.0"
    sign = "-" if d < 0 else ""
    a = -d if d < 0 else d
    if a == 5e-324:
        return sign + "4.9E-324"
    ds, exponent = _java_digits(a)
    n = len(ds)
    if 1e-3 <= a < 1e7:
        if exponent >= 0:
            return f"{sign}{ds}{'0' * exponent}.0"
        point = n + exponent
        if point > 0:
            return f"{sign}{ds[:point]}.{ds[point:]}"
        return f"{sign}0.{'0' * -point}{ds}"
    return f"{sign}{ds[0]}.{ds[1:] or '0'}E{n - 1 + exponent}"


def _to_str(v: Any) -> Any:
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return _java_double_str(v)
    if isinstance(v, Mapping):
        return "{" + ", ".join("null" if x is None else _to_str(x) for x in v.values()) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join("null" if x is None else _to_str(x) for x in v) + "]"
    raise ExprError(f"cannot cast {v!r} to STRING")


_WS = "".join(chr(c) for c in range(33))  # Java String.trim(): every char <= ' '
_INT_TEXT = re.compile(r"[+-]?[0-9]+")
_DOUBLE_TEXT = re.compile(r"[+-]?(?:NaN|Infinity|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)[fFdD]?")
_DOUBLE_SPECIAL = {
    "inf": math.inf, "+inf": math.inf, "infinity": math.inf, "+infinity": math.inf,
    "-inf": -math.inf, "-infinity": -math.inf, "nan": math.nan,
}
_TRUE_TEXT = {"t", "true", "y", "yes", "1"}
_FALSE_TEXT = {"f", "false", "n", "no", "0"}


def _malformed(v: Any, target: str) -> ExprRuntimeError:
    return ExprRuntimeError(
        f"[CAST_INVALID_INPUT] the value {v!r} of the type STRING cannot be cast to {target.upper()}"
        " because it is malformed"
    )


def _to_integral(v: Any, lo: int = _LONG_MIN, hi: int = _LONG_MAX, target: str = "bigint") -> Any:
    if v is None:
        return None
    if isinstance(v, bool):
        return 1 if v else 0
    if isinstance(v, int):
        if not lo <= v <= hi:
            raise ExprRuntimeError(f"[CAST_OVERFLOW] the value {v} cannot be cast to {target.upper()}")
        return v
    if isinstance(v, float):
        # Spark: floor(x) <= MAX.toDouble && ceil(x) >= MIN.toDouble, then Java's saturating cast.
        if math.isnan(v) or math.isinf(v) or not (math.floor(v) <= float(hi) and math.ceil(v) >= float(lo)):
            raise ExprRuntimeError(
                f"[CAST_OVERFLOW] the value {_java_double_str(v)} cannot be cast to {target.upper()}")
        return max(lo, min(hi, int(v)))
    if isinstance(v, str):
        s = v.strip(_WS)
        if not _INT_TEXT.fullmatch(s):
            raise _malformed(v, target)
        r = int(s)
        if not lo <= r <= hi:
            raise _malformed(v, target)
        return r
    raise ExprError(f"[DATATYPE_MISMATCH] cannot cast {_kind(v).upper()} {v!r} to {target.upper()}")


def _to_int32(v: Any) -> Any:
    return _to_integral(v, _INT_MIN, _INT_MAX, "int")


def _to_double(v: Any) -> Any:
    if v is None or isinstance(v, float):
        return v
    if isinstance(v, bool):
        return 1.0 if v else 0.0
    if isinstance(v, int):
        return float(v)
    if isinstance(v, str):
        s = v.strip(_WS)
        special = _DOUBLE_SPECIAL.get(s.lower())
        if special is not None:
            return special
        if not _DOUBLE_TEXT.fullmatch(s):
            raise _malformed(v, "double")
        if s[-1] in "fFdD":
            s = s[:-1]
        return float(s)
    raise ExprError(f"[DATATYPE_MISMATCH] cannot cast {_kind(v).upper()} {v!r} to DOUBLE")


def _to_bool(v: Any) -> Any:
    if v is None or isinstance(v, bool):
        return v
    if isinstance(v, (int, float)):
        return v != 0
    if isinstance(v, str):
        s = v.strip(_WS).lower()
        if s in _TRUE_TEXT:
            return True
        if s in _FALSE_TEXT:
            return False
        raise _malformed(v, "boolean")
    raise ExprError(f"[DATATYPE_MISMATCH] cannot cast {_kind(v).upper()} {v!r} to BOOLEAN")


_CASTS: dict[str, Callable[[Any], Any]] = {
    _STRING: _to_str, _LONG: _to_integral, "int": _to_int32, _DOUBLE: _to_double, _BOOL: _to_bool,
}


def _cast_to_kind(v: Any, kind: str) -> Any:
    return {_LONG: _to_integral, _DOUBLE: _to_double, _BOOL: _to_bool, _STRING: _to_str}[kind](v)


# ---- comparison ----------------------------------------------------------------------------


def _coerce_pair(a: Any, b: Any, what: str) -> tuple[Any, Any]:
    """Spark's implicit casts for comparing two non-null values (ANSI rules)."""
    ka, kb = _kind(a), _kind(b)
    if ka == kb:
        return a, b
    if ka in _NUMERIC and kb in _NUMERIC:
        return float(a), float(b)
    if ka == _STRING and kb in (_LONG, _DOUBLE, _BOOL):
        return _cast_to_kind(a, kb), b
    if kb == _STRING and ka in (_LONG, _DOUBLE, _BOOL):
        return a, _cast_to_kind(b, ka)
    raise ExprError(f"[DATATYPE_MISMATCH] cannot compare {ka.upper()} {a!r} with {kb.upper()} {b!r} in {what}")


def _compare(a: Any, b: Any) -> int:
    """Order of two non-null values of the same kind (Spark: NaN is the largest double)."""
    if isinstance(a, float):
        an, bn = math.isnan(a), math.isnan(b)
        if an or bn:
            return 0 if an and bn else (1 if an else -1)
        return (a > b) - (a < b)
    if isinstance(a, Mapping):
        return _compare_seq(list(a.values()), list(b.values()))
    if isinstance(a, (list, tuple)):
        return _compare_seq(a, b)
    return (a > b) - (a < b)


def _compare_seq(xs: Any, ys: Any) -> int:
    for x, y in zip(xs, ys):
        if x is None or y is None:
            if x is None and y is None:
                continue
            return -1 if x is None else 1
        c = _compare(*_coerce_pair(x, y, "comparison"))
        if c:
            return c
    return (len(xs) > len(ys)) - (len(xs) < len(ys))


def _cmp(a: Any, b: Any, what: str) -> int:
    return _compare(*_coerce_pair(a, b, what))


def _norm_key(v: Any) -> Any:
    """Hashable key with Spark's grouping equality (NaN = NaN, -0.0 = 0.0)."""
    if isinstance(v, float):
        if math.isnan(v):
            return ("NaN",)
        return 0.0 if v == 0.0 else v
    if isinstance(v, Mapping):
        return ("struct", tuple(_norm_key(x) for x in v.values()))
    if isinstance(v, (list, tuple)):
        return ("array", tuple(_norm_key(x) for x in v))
    return v


# ---- arithmetic ----------------------------------------------------------------------------


def _num_pair(a: Any, b: Any, op: str) -> tuple[Any, Any]:
    ka, kb = _kind(a), _kind(b)
    if ka == _STRING and kb in _NUMERIC:
        a, ka = _cast_to_kind(a, kb), kb
    elif kb == _STRING and ka in _NUMERIC:
        b, kb = _cast_to_kind(b, ka), ka
    if ka not in _NUMERIC or kb not in _NUMERIC:
        raise ExprError(
            f"[DATATYPE_MISMATCH] operator {op} requires numeric operands, got {ka.upper()} {a!r}"
            f" and {kb.upper()} {b!r}")
    if ka != kb:
        return float(a), float(b)
    return a, b


def _add(a: Any, b: Any) -> Any:
    a, b = _num_pair(a, b, "+")
    r = a + b
    return _check_long(r, "+") if isinstance(r, int) else r


def _sub(a: Any, b: Any) -> Any:
    a, b = _num_pair(a, b, "-")
    r = a - b
    return _check_long(r, "-") if isinstance(r, int) else r


def _mul(a: Any, b: Any) -> Any:
    a, b = _num_pair(a, b, "*")
    r = a * b
    return _check_long(r, "*") if isinstance(r, int) else r


def _div(a: Any, b: Any) -> Any:
    def dbl(v: Any) -> float:
        k = _kind(v)
        if k not in (_LONG, _DOUBLE, _STRING):
            raise ExprError(f"[DATATYPE_MISMATCH] operator / requires numeric operands, got {k.upper()} {v!r}")
        return _to_double(v)

    x, y = dbl(a), dbl(b)
    if y == 0.0:
        raise ExprRuntimeError("[DIVIDE_BY_ZERO] division by zero")
    return x / y


def _trunc_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def _intdiv(a: Any, b: Any) -> Any:
    a, b = _num_pair(a, b, "div")
    if not (isinstance(a, int) and isinstance(b, int)):
        raise ExprError(
            "[DATATYPE_MISMATCH] div requires integral operands (note: decimal literals such as 1.5"
            f" are doubles in the reference engine), got {a!r} and {b!r}")
    if b == 0:
        raise ExprRuntimeError("[DIVIDE_BY_ZERO] division by zero in div")
    return _check_long(_trunc_div(a, b), "div")


def _mod(a: Any, b: Any) -> Any:
    a, b = _num_pair(a, b, "%")
    if b == 0:
        raise ExprRuntimeError("[REMAINDER_BY_ZERO] remainder by zero")
    if isinstance(a, int):
        r = abs(a) % abs(b)
        return -r if a < 0 else r
    if math.isinf(a) or math.isnan(a) or math.isnan(b):
        return math.nan  # Java: Infinity % x and NaN % x are NaN (math.fmod raises)
    return math.fmod(a, b)


def _neg(a: Any) -> Any:
    k = _kind(a)
    if k == _STRING:
        return -_to_double(a)
    if k == _LONG:
        return _check_long(-a, "unary -")
    if k == _DOUBLE:
        return -a
    raise ExprError(f"[DATATYPE_MISMATCH] unary - requires a numeric operand, got {k.upper()} {a!r}")


def _abs(a: Any) -> Any:
    k = _kind(a)
    if k == _STRING:
        return abs(_to_double(a))
    if k == _LONG:
        return _check_long(abs(a), "abs")
    if k == _DOUBLE:
        return abs(a)
    raise ExprError(f"[DATATYPE_MISMATCH] abs requires a numeric argument, got {k.upper()} {a!r}")


_DEC_CTX = decimal.Context(prec=1200, rounding=decimal.ROUND_HALF_UP, Emax=10_000, Emin=-10_000)


def _round(v: Any, scale: Any) -> Any:
    if v is None or scale is None:
        return None
    scale = _to_int32(scale)
    k = _kind(v)
    if k == _STRING:
        v, k = _to_double(v), _DOUBLE
    if k == _LONG:
        if scale >= 0:
            return v
        if scale < -19:
            return 0
        q = 10 ** (-scale)
        m, r = divmod(abs(v), q)
        res = (m + (1 if 2 * r >= q else 0)) * q
        return _check_long(-res if v < 0 else res, "round")
    if k == _DOUBLE:
        if math.isnan(v) or math.isinf(v):
            return v
        if scale > 400:
            return v
        if scale < -400:
            return 0.0
        d = _java_decimal(v)  # Spark: BigDecimal(Double.toString(v)).setScale(s, HALF_UP)
        r = float(d.quantize(decimal.Decimal(1).scaleb(-scale), rounding=decimal.ROUND_HALF_UP,
                             context=_DEC_CTX))
        return 0.0 if r == 0 else r
    raise ExprError(f"[DATATYPE_MISMATCH] round requires a numeric argument, got {k.upper()} {v!r}")


def _substring(s: Any, pos: Any, length: Any = _INT_MAX) -> Any:
    if s is None or pos is None or length is None:
        return None
    if not isinstance(s, str):
        if isinstance(s, (Mapping, list, tuple)):
            raise ExprError(f"[DATATYPE_MISMATCH] substring requires a STRING, got {s!r}")
        s = _to_str(s)
    pos, length = _to_int32(pos), _to_int32(length)
    n = len(s)
    start = pos - 1 if pos > 0 else (n + pos if pos < 0 else 0)
    end = start + length
    start = max(start, 0)
    if start >= end:
        return ""
    return s[start:end]


def _scalar_text(v: Any, fn: str) -> str:
    if isinstance(v, (Mapping, list, tuple)):
        raise ExprError(f"[DATATYPE_MISMATCH] {fn} requires a STRING, got {v!r}")
    return _to_str(v)


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
