"""Part: reference engine. Values: the types Spark widens by, casts, Java's double format, comparison, arithmetic."""
from __future__ import annotations

import decimal
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlglot import exp
from sqlglot.errors import SqlglotError

from backfill.reference.expr.base import ExprError, ExprRuntimeError

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
