"""backfill.reference.expr: unit tests per construct, and differential tests against real Spark.

The differential tests run many hypothesis examples per Spark job (examples are unioned with an
example-id column and grouped by it), so the whole module stays well under a minute.
"""
from __future__ import annotations

import math
import os
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from backfill.reference.expr import (
    Aggregate,
    ExprError,
    ExprRuntimeError,
    compile_aggregate,
    compile_fold,
    compile_scalar,
    is_order_sensitive,
    normalize_count,
)

NAN, INF = float("nan"), float("inf")
SCHEMA = "key string, ts bigint, value struct<amount: double, n: bigint, user: string>"


def ev(sql: str, row: dict[str, Any] | None = None, **kw: Any) -> Any:
    return compile_scalar(sql, **kw)(row or {})


def run(agg: Aggregate, rows: list[dict[str, Any]]) -> Any:
    state = agg.init()
    for r in rows:
        state = agg.add(state, r)
    return agg.result(state)


def agg(sql: str, rows: list[dict[str, Any]], **kw: Any) -> Any:
    return run(compile_aggregate(sql, **kw), rows)


def same(ours: Any, theirs: Any, strict: bool = True) -> bool:
    """Equal up to a relative float tolerance of 1e-9; NaN equals NaN; strict also compares types."""
    if theirs is None or ours is None:
        return ours is None and theirs is None
    if isinstance(theirs, bool) or isinstance(ours, bool):
        return ours is theirs
    if isinstance(theirs, (int, float)):
        if not isinstance(ours, (int, float)):
            return False
        if strict and type(ours) is not type(theirs):
            return False
        if isinstance(theirs, float) and math.isnan(theirs):
            return isinstance(ours, float) and math.isnan(ours)
        return math.isclose(ours, theirs, rel_tol=1e-9, abs_tol=0.0) or ours == theirs
    if isinstance(theirs, dict):
        return isinstance(ours, dict) and list(ours) == list(theirs) and all(
            same(ours[k], theirs[k], strict) for k in theirs)
    if isinstance(theirs, (list, tuple)):
        return isinstance(ours, list) and len(ours) == len(theirs) and all(
            same(a, b, strict) for a, b in zip(ours, theirs))
    if isinstance(theirs, str) and isinstance(ours, str) and ours != theirs:
        return _jdk17_longer_digits(ours, theirs)
    return type(ours) is type(theirs) and ours == theirs


_MANTISSA_HEAD = re.compile(r"-?\d+\.?\d*$")
_MANTISSA_TAIL = re.compile(r"^\d*")


def _jdk17_longer_digits(ours: str, theirs: str) -> bool:
    """The documented deviation: Java 17's Double.toString prints a few doubles with more digits
    than the shortest repr (2^-24: ``5.9604644775390625E-8``, not ``5.960464477539063E-8``).

    Equal when the texts differ in one number's mantissa only, with the same exponent after it,
    the same double value, and Spark's mantissa longer. Any other difference (``1.0`` vs ``1``,
    ``1.0E7`` vs ``10000000.0``, a different value) fails.
    """
    p = 0
    while p < min(len(ours), len(theirs)) and ours[p] == theirs[p]:
        p += 1
    head = _MANTISSA_HEAD.search(ours[:p])
    start = head.start() if head else p
    ours_rest, theirs_rest = ours[start:], theirs[start:]
    mo = re.match(r"-?\d+\.\d+", ours_rest)
    mt = re.match(r"-?\d+\.\d+", theirs_rest)
    if not mo or not mt or len(mt.group()) <= len(mo.group()):
        return False
    suffix_o, suffix_t = ours_rest[mo.end():], theirs_rest[mt.end():]
    if suffix_o != suffix_t:
        return False
    exponent = re.match(r"E-?\d+", suffix_o)
    candidates = [""] if not exponent else [
        e for k in range(2, len(exponent.group()) + 1) if re.fullmatch(r"E-?\d+", e := exponent.group()[:k])]
    return any(float(mo.group() + e) == float(mt.group() + e) for e in candidates)


# ============================================================================================
# Unit tests
# ============================================================================================

ROW = {"key": "u1", "value": {"amount": 3.5, "user": "u1", "n": 4}, "ts": 10, "acc": "0+1"}


@pytest.mark.parametrize("sql, expected", [
    ("1", 1), ("10000000000", 10000000000), ("-3", -3), ("1.5", 1.5), (".5", 0.5), ("1e3", 1000.0),
    ("1L", 1), ("2.5D", 2.5), ("-9223372036854775808", -(2**63)), ("-9223372036854775808L", -(2**63)),
    ("'abc'", "abc"), ("'it''s'", "it's"), ("'a' 'b'", "ab"), ("'it\\'s'", "it's"), ("'a\\tb'", "a\tb"),
    ('"dq"', "dq"), ("''", ""), ("true", True), ("FALSE", False), ("null", None), ("(1)", 1),
])
def test_literals(sql: str, expected: Any) -> None:
    assert same(ev(sql), expected)


def test_integer_literal_out_of_range_is_rejected() -> None:
    with pytest.raises(ExprError, match="out of bigint range"):
        compile_scalar("9223372036854775808")


def test_struct_field_access() -> None:
    assert ev("value.amount", ROW) == 3.5
    assert ev("value.user", ROW) == "u1"
    assert ev("acc", ROW) == "0+1"
    assert ev("value.amount", {"value": None}) is None
    assert ev("VALUE.Amount", ROW) == 3.5  # Spark resolves names case-insensitively
    assert ev("`value`.`user`", ROW) == "u1"
    joined = {"left": {"value": {"x": 1}}, "right": {"value": None}}
    assert ev("left.value.x", joined) == 1
    assert ev("right.value.x", joined) is None
    assert ev("right.value", joined) is None
    deep = {"a": {"b": {"c": {"d": {"e": 5}}}}}
    assert ev("a.b.c.d.e", deep) == 5
    assert ev("named_struct('a', 1, 'b', 'x').b") == "x"


def test_unknown_column_is_an_error() -> None:
    f = compile_scalar("value.amout")
    with pytest.raises(ExprError, match="amout"):
        f(ROW)
    with pytest.raises(ExprError, match="unknown column 'nope'"):
        compile_scalar("nope + 1")({"ts": 1})
    with pytest.raises(ExprError, match="non-struct"):
        compile_scalar("key.x")(ROW)


def test_schema_checks_columns_at_compile_time() -> None:
    with pytest.raises(ExprError, match="unknown column 'nope'"):
        compile_scalar("nope", schema=SCHEMA)
    with pytest.raises(ExprError, match="no field 'amout'"):
        compile_scalar("value.amout", schema=SCHEMA)
    with pytest.raises(ExprError, match="non-struct"):
        compile_scalar("key.x", schema=SCHEMA)
    # an int read from a double column is a double (JSON decoders give 3 for 3.0)
    assert same(ev("value.amount", {"value": {"amount": 3}}, schema=SCHEMA), 3.0)


def test_schema_forms() -> None:
    nested = {"key": "string", "ts": "bigint", "value": {"amount": "double", "n": "bigint", "user": "string"}}
    ddl = "struct<key:string,ts:bigint,value:struct<amount:double,n:bigint,user:string>>"

    class FakeStructType:
        def simpleString(self) -> str:
            return ddl

    for schema in (SCHEMA, nested, ddl, FakeStructType()):
        assert same(ev("coalesce(value.amount, 0)", {"value": None}, schema=schema), 0.0)
    with pytest.raises(ExprError):
        compile_scalar("ts", schema="not a ( type")


@pytest.mark.parametrize("sql, expected", [
    ("1 + 2", 3), ("1 + 2.5", 3.5), ("7 - 10", -3), ("2 * 3", 6), ("2 * 1.5D", 3.0),
    ("7 / 2", 3.5), ("6 / 3", 2.0), ("7 div 2", 3), ("-7 div 2", -3), ("7 div -2", -3), ("-9 div -4", 2),
    ("7 % 3", 1), ("-7 % 3", -1), ("7 % -3", 1), ("-7.5D % 2", -1.5), ("7.5D % -2", 1.5), ("5 % 2.5D", 0.0),
    ("-(1)", -1), ("-(1.5D)", -1.5), ("- - 1", 1), ("1 + null", None), ("null * 2", None), ("null / 0", None),
    ("'5' + 1", 6), ("'5' * 1.5D", 7.5), ("'5' / 2", 2.5), ("'5' div 2", 2), ("-'5'", -5.0),
    ("9223372036854775807 - 1 + 1", 2**63 - 1), ("-9223372036854775807L - 1", -(2**63)),
    ("-9223372036854775808L % -1", 0), ("1e308D * 10", INF), ("ts + 1", 11), ("value.n / 8", 0.5),
])
def test_arithmetic(sql: str, expected: Any) -> None:
    assert same(ev(sql, ROW), expected)


ANSI_ERRORS = [
    ("1 / 0", "DIVIDE_BY_ZERO"), ("1.0D / 0", "DIVIDE_BY_ZERO"), ("1 div 0", "DIVIDE_BY_ZERO"),
    ("1 % 0", "REMAINDER_BY_ZERO"), ("1.5D % 0", "REMAINDER_BY_ZERO"),
    ("9223372036854775807 + 1", "ARITHMETIC_OVERFLOW"), ("-9223372036854775807L - 2", "ARITHMETIC_OVERFLOW"),
    ("4611686018427387904L * 2", "ARITHMETIC_OVERFLOW"), ("abs(-9223372036854775808)", "ARITHMETIC_OVERFLOW"),
    ("-(-9223372036854775808)", "ARITHMETIC_OVERFLOW"), ("-9223372036854775808L div -1", "ARITHMETIC_OVERFLOW"),
    ("round(9223372036854775807L, -1)", "ARITHMETIC_OVERFLOW"),
    ("cast('abc' as int)", "CAST_INVALID_INPUT"), ("cast('12.7' as bigint)", "CAST_INVALID_INPUT"),
    ("cast('' as double)", "CAST_INVALID_INPUT"), ("cast('1_000' as double)", "CAST_INVALID_INPUT"),
    ("cast('2' as boolean)", "CAST_INVALID_INPUT"), ("'5.5' + 1", "CAST_INVALID_INPUT"),
    ("'1.0' = 1", "CAST_INVALID_INPUT"), ("cast('9223372036854775808' as bigint)", "CAST_INVALID_INPUT"),
    ("cast(1e20D as bigint)", "CAST_OVERFLOW"), ("cast(2147483648D as int)", "CAST_OVERFLOW"),
    ("cast(3000000000L as int)", "CAST_OVERFLOW"), ("cast(cast('NaN' as double) as int)", "CAST_OVERFLOW"),
]


@pytest.mark.parametrize("sql, error", ANSI_ERRORS)
def test_ansi_runtime_errors(sql: str, error: str) -> None:
    """Spark 4 runs in ANSI mode: these fail at run time (checked against Spark in test_errors_match_spark)."""
    f = compile_scalar(sql)
    with pytest.raises(ExprRuntimeError, match=error) as info:
        f({})
    assert sql in str(info.value)  # the message names the expression


@pytest.mark.parametrize("sql", [
    "true + 1", "'a' - 'b'", "if(1, 'a', 'b')", "not 1", "true and 1", "size('abc')", "greatest(1, 'a')",
    "1.5 div 1", "upper(array(1))", "true = 1",
])
def test_type_errors(sql: str) -> None:
    with pytest.raises(ExprError, match="DATATYPE_MISMATCH"):
        ev(sql)


def test_try_cast_returns_null() -> None:
    assert ev("try_cast('abc' as int)") is None
    assert ev("try_cast('12' as int)") == 12


@pytest.mark.parametrize("sql, expected", [
    ("1 = 1", True), ("1 = 1.0D", True), ("1 <> 2", True), ("1 != 1", False), ("2 > 1", True),
    ("2 >= 2", True), ("1 < 0.5", False), ("1 <= 1", True), ("1 == 1", True),
    ("'a' < 'b'", True), ("'Z' < 'a'", True), ("'é' > 'z'", True), ("'10' < '9'", True),
    ("'1' = 1", True), ("'1' < 2", True), ("'true' = true", True), ("true > false", True),
    ("null = null", None), ("1 = null", None), ("null <=> null", True), ("1 <=> null", False),
    ("1 <=> 1.0D", True), ("-0.0D = 0.0D", True),
    ("cast('NaN' as double) = cast('NaN' as double)", True), ("cast('NaN' as double) > 1e300", True),
    ("cast('NaN' as double) <=> cast('NaN' as double)", True),
    ("true and null", None), ("false and null", False), ("null and false", False), ("null or true", True),
    ("null or false", None), ("not null", None), ("not (1 = 1)", False), ("true or 1/0 = 1", True),
    ("false and 1/0 = 1", False),
    ("1 in (1, 2)", True), ("3 in (1, 2)", False), ("1 in (2, null)", None), ("1 in (1, null)", True),
    ("null in (1, 2)", None), ("1 not in (2, null)", None), ("1 in (1.0D)", True), ("1 in ('1')", True),
    ("2 between 1 and 3", True), ("null between 1 and 3", None), ("2 between null and 1", False),
    ("5 between 1 and null", None), ("2 not between 1 and 3", False),
    ("null is null", True), ("1 is null", False), ("1 is not null", True), ("true is true", True),
    ("null is true", False), ("null is not false", True), ("isnull(null)", True), ("isnotnull(1)", True),
])
def test_comparisons_and_three_valued_logic(sql: str, expected: Any) -> None:
    assert same(ev(sql), expected)


@pytest.mark.parametrize("sql, expected", [
    ("concat('a', 'b', 'c')", "abc"), ("concat('a', null)", None), ("concat('', '')", ""),
    ("concat('a', 1.0D)", "a1.0"), ("concat('a', 3)", "a3"), ("concat('a', true)", "atrue"),
    ("concat(1, 2)", "12"), ("concat('x', 1e300)", "x1.0E300"), ("concat(array(1), array(2, 3))", [1, 2, 3]),
    ("'a' || 'b'", "ab"), ("'a' || null", None), ("concat(acc, '+', cast(value.n as string))", "0+1+4"),
    ("concat(null, 1/0)", None),  # stops at the first NULL, like Spark
])
def test_concat(sql: str, expected: Any) -> None:
    assert same(ev(sql, ROW), expected)


@pytest.mark.parametrize("sql, expected", [
    ("cast(1 as string)", "1"), ("cast(1.0D as string)", "1.0"), ("cast(-0.0D as string)", "-0.0"),
    ("cast(100.0D as string)", "100.0"), ("cast(1e6D as string)", "1000000.0"), ("cast(1e7D as string)", "1.0E7"),
    ("cast(12345678.9D as string)", "1.23456789E7"), ("cast(9999999.999D as string)", "9999999.999"),
    ("cast(1e-3D as string)", "0.001"), ("cast(1e-4D as string)", "1.0E-4"), ("cast(0.00099D as string)", "9.9E-4"),
    ("cast(-1.5e-7D as string)", "-1.5E-7"), ("cast(0.1D + 0.2D as string)", "0.30000000000000004"),
    ("cast(1.7976931348623157E308D as string)", "1.7976931348623157E308"), ("cast(5e-324D as string)", "4.9E-324"),
    ("cast(1.689446065359412E18D as string)", "1.68944606535941197E18"),  # Java's exact-long path
    ("cast(cast('NaN' as double) as string)", "NaN"), ("cast(cast('-inf' as double) as string)", "-Infinity"),
    ("cast(true as string)", "true"), ("cast(array(1.5D, null) as string)", "[1.5, null]"),
    ("cast(named_struct('a', 1, 'b', 'x') as string)", "{1, x}"), ("cast(null as string)", None),
    ("cast(' 12 ' as int)", 12), ("cast('+5' as bigint)", 5), ("cast('-0' as int)", 0), ("cast('\t5\n' as int)", 5),
    ("cast(12.99D as int)", 12), ("cast(-12.7D as bigint)", -12), ("cast(true as int)", 1),
    ("cast(9.223372036854776E18D as bigint)", 2**63 - 1), ("cast(2147483647.5D as int)", 2147483647),
    ("cast('1e3' as double)", 1000.0), ("cast(' 1.5 ' as double)", 1.5), ("cast('1.5d' as double)", 1.5),
    ("cast('.5' as double)", 0.5), ("cast('5.' as double)", 5.0), ("cast('Infinity' as double)", INF),
    ("cast('-infinity' as double)", -INF), ("cast('NAN' as double)", NAN), ("cast(3 as double)", 3.0),
    ("cast(true as double)", 1.0), ("cast('true' as boolean)", True), ("cast(' N ' as boolean)", False),
    ("cast('yes' as boolean)", True), ("cast('0' as boolean)", False), ("cast(0 as boolean)", False),
    ("cast(2.5D as boolean)", True), ("cast(value.amount as string)", "3.5"), ("value.n::string", "4"),
])
def test_casts(sql: str, expected: Any) -> None:
    assert same(ev(sql, ROW), expected)


def test_unsupported_cast_target() -> None:
    with pytest.raises(ExprError, match="unsupported cast target type DATE"):
        compile_scalar("cast(ts as date)")


@pytest.mark.parametrize("sql, expected", [
    ("if(true, 1, 2)", 1), ("if(null, 1, 2)", 2), ("if(false, 1/0, 3)", 3.0), ("if(true, 1, 2.5D)", 1.0),
    ("case when 1 = 1 then 'a' when 1/0 = 1 then 'b' end", "a"), ("case when false then 1 end", None),
    ("case when false then 1/0 else 2 end", 2.0), ("case 1 when 1.0D then 'eq' else 'ne' end", "eq"),
    ("case null when null then 1 else 2 end", 2), ("case 2 when 1 then 'a' end", None),
    ("coalesce(null, 1)", 1), ("coalesce(null, null)", None), ("coalesce(1, 1/0)", 1.0),
    ("coalesce(1, 2.5D)", 1.0), ("nvl(null, 2)", 2), ("ifnull(null, 'x')", "x"),
    ("nullif(1, 1)", None), ("nullif(1, 2)", 1), ("nvl2(null, 1, 2)", 2), ("nvl2(0, 1, 2)", 1),
    ("greatest(1, null, 3)", 3), ("greatest(null, null)", None), ("least('b', 'a')", "a"),
    ("greatest(1, 2.5D)", 2.5), ("greatest(3, 2.5D)", 3.0), ("least(2, 1.5D)", 1.5),
    ("least(null, 2, null, 1)", 1), ("greatest(cast('NaN' as double), 1D)", NAN),
    ("least(cast('NaN' as double), 1D)", 1.0), ("greatest(true, false)", True),
    ("greatest(array(1), array(2))", [2]),
])
def test_conditionals(sql: str, expected: Any) -> None:
    assert same(ev(sql), expected)


def test_branch_widening_follows_schema() -> None:
    rows = [{"value": {"amount": None, "n": 2, "user": None}}, {"value": {"amount": 2.0, "n": None, "user": "x"}}]
    for r in rows:
        typed = compile_scalar("coalesce(value.amount, 0)", schema=SCHEMA)(r)
        assert isinstance(typed, float)
        typed = compile_scalar("if(value.user is null, value.n, value.amount)", schema=SCHEMA)(r)
        assert typed is None or isinstance(typed, float)
    # without a schema the type of a NULL column is unknown: numerically equal, but an int
    assert compile_scalar("coalesce(value.amount, 0)")(rows[0]) == 0


@pytest.mark.parametrize("sql, expected", [
    ("round(2.675D, 2)", 2.68), ("round(2.5D)", 3.0), ("round(-2.5D)", -3.0), ("round(0.285D, 2)", 0.29),
    ("round(1.005D, 2)", 1.01), ("round(-0.5D)", -1.0), ("round(12.345D, -1)", 10.0), ("round(125, -1)", 130),
    ("round(-15, -1)", -20), ("round(5, 2)", 5), ("round(1.0000000000000002D, 15)", 1.0),
    ("round(123.456D, 400)", 123.456), ("round(123.456D, -400)", 0.0), ("round(-123.456D, -5)", 0.0),
    ("round(1e300D, 2)", 1e300), ("round(cast('NaN' as double), 2)", NAN), ("round(null, 2)", None),
    ("round(2.5D, null)", None), ("round('2.5', 0)", 3.0), ("round(1.5)", 2.0),
    ("abs(-3)", 3), ("abs(-2.5D)", 2.5), ("abs(null)", None), ("abs('-5')", 5.0),
    ("upper('abc')", "ABC"), ("upper('straße')", "STRASSE"), ("lower('ABC')", "abc"), ("upper(true)", "TRUE"),
    ("ucase('a')", "A"), ("lcase('A')", "a"), ("upper(null)", None),
    ("length('héllo')", 5), ("length('😀')", 1), ("length('')", 0), ("length(123)", 3), ("length(1.0D)", 3),
    ("char_length('ab')", 2), ("length(null)", None),
    ("substring('hello', 2)", "ello"), ("substring('hello', 0, 2)", "he"), ("substring('hello', -3, 2)", "ll"),
    ("substring('hello', 1, -1)", ""), ("substring('hello', -10, 3)", ""), ("substring('hello', -10, 7)", "he"),
    ("substring('hello', 6)", ""), ("substring('hello', -6, 2)", "h"), ("substr('hello', 2, 100)", "ello"),
    ("substring('hello', 2.7D)", "ello"), ("substring(12345, 2, 2)", "23"), ("substring(null, 1)", None),
    ("substring('hello', null)", None),
    ("array(1, 2)", [1, 2]), ("array(1, null, 3)", [1, None, 3]), ("array(1, 2.5D)", [1.0, 2.5]), ("array()", []),
    ("size(array(1, 2, 3))", 3), ("size(array())", 0), ("size(null)", None), ("size(array(null))", 1),
    ("cardinality(array(1))", 1), ("named_struct('a', 1, 'b', 'x')", {"a": 1, "b": "x"}),
])
def test_functions(sql: str, expected: Any) -> None:
    assert same(ev(sql), expected)


def test_round_scale_must_be_constant() -> None:
    with pytest.raises(ExprError, match="constant"):
        compile_scalar("round(1.5D, ts)")


@pytest.mark.parametrize("sql, name", [
    ("ceil(value.amount)", "ceil"), ("foo(1)", "foo"), ("regexp_extract(key, 'a', 0)", "regexp_extract"),
    ("key like 'a%'", "Like"), ("sum(ts) over ()", "window"), ("x in (select 1)", "subquery"),
    ("cast(ts as date)", "date"), ("date '2020-01-01'", "date"),
])
def test_unsupported_constructs_name_themselves(sql: str, name: str) -> None:
    with pytest.raises(ExprError) as info:
        compile_scalar(sql)
    msg = str(info.value)
    assert name.lower() in msg.lower()
    if "unsupported function" in msg:
        assert "supported functions: abs" in msg and "aggregates: " in msg


@pytest.mark.parametrize("sql", ["", "   ", "1 +", "foo(", "a b c", "'unterminated", "select 1", "1; 2"])
def test_parse_errors(sql: str) -> None:
    with pytest.raises(ExprError):
        compile_scalar(sql)


def test_aggregates_are_rejected_in_scalar_expressions() -> None:
    with pytest.raises(ExprError, match=r"aggregate function sum\(\) is not allowed"):
        compile_scalar("sum(ts) + 1")


# ---- normalize_count ------------------------------------------------------------------------


@pytest.mark.parametrize("sql, expected", [
    ("count()", "count(1)"), ("COUNT( )", "COUNT(1)"), ("sum(x) / count()", "sum(x) / count(1)"),
    ("count(*)", "count(*)"), ("count(x)", "count(x)"), ("xcount()", "xcount()"),
    ("concat('count()', count())", "concat('count()', count(1))"), ("`count()`", "`count()`"),
    ("'it''s count()' || count ()", "'it''s count()' || count(1)"),
])
def test_normalize_count(sql: str, expected: str) -> None:
    assert normalize_count(sql) == expected


def test_the_spark_engine_rewrites_count_as_the_reference_does() -> None:
    """One rewrite for both engines: a `count()` inside a string literal stays as written in the Spark engine's
    compiled aggregation too (its own copy once rewrote it there)."""
    from backfill.ops.expressions import compile_aggregations

    [compiled] = compile_aggregations({"n": "concat('count()', count())"}, "operators.a")
    assert compiled.sql is not None and "'count()'" in compiled.sql and "count(1)" in compiled.sql


# ---- aggregates -----------------------------------------------------------------------------


def _rows(*values: Any, ts: list[int] | None = None) -> list[dict[str, Any]]:
    ts = ts or list(range(len(values)))
    return [{"key": "k", "ts": t, "value": v} for t, v in zip(ts, values)]


ROWS = _rows(
    {"amount": 1.5, "n": 5, "user": "u1"},
    {"amount": None, "n": 5, "user": "x"},
    None,
    {"amount": 2.5, "n": None, "user": None},
    {"amount": 2.5, "n": 7, "user": "u1"},
)


@pytest.mark.parametrize("sql, expected", [
    ("count()", 5), ("count(*)", 5), ("count(1)", 5), ("count(value)", 4), ("count(value.amount)", 3),
    ("count(value.user)", 3), ("count(value.user, value.n)", 3), ("count(null)", 0),
    ("count(DISTINCT value.user)", 2), ("count(DISTINCT value.user, value.n)", 3), ("count(DISTINCT 1)", 1),
    ("sum(value.amount)", 6.5), ("sum(value.n)", 17), ("sum(DISTINCT value.n)", 12), ("sum(1)", 5),
    ("avg(value.amount)", 6.5 / 3), ("avg(value.n)", 17 / 3), ("avg(DISTINCT value.amount)", 2.0),
    ("mean(value.n)", 17 / 3), ("avg(1)", 1.0),
    ("min(ts)", 0), ("max(ts)", 4), ("min(value.amount)", 1.5), ("max(value.user)", "x"), ("min(value.user)", "u1"),
    ("sum(value.a) / count()", None), ("sum(value.amount) / count()", 1.3), ("round(avg(value.amount), 2)", 2.17),
    ("first(value.user)", "u1"), ("last(value.user)", "u1"), ("first(value.amount)", 1.5),
    ("last(value.n)", 7), ("first(value)", {"amount": 1.5, "n": 5, "user": "u1", "a": None, "x": None}),
    ("first_value(value.n)", 5), ("last_value(value.amount)", 2.5), ("any_value(value.user)", "u1"),
    ("collect_list(value.user)", ["u1", "x", "u1"]), ("array_agg(value.n)", [5, 5, 7]),
    ("collect_list(DISTINCT value.user)", ["u1", "x"]), ("collect_set(value.user)", ["u1", "x"]),
    ("size(collect_set(value.amount))", 2),
    ("max_by(value.user, ts)", "u1"), ("min_by(value.user, value.n)", "x"), ("max_by(value.user, value.amount)", "u1"),
    ("count_if(value.amount > 2)", 2), ("bool_and(value.amount > 1)", True), ("bool_or(value.user = 'x')", True),
    ("every(value.n > 5)", False), ("some(value.n > 5)", True),
    ("count(*) FILTER (WHERE value.n > 4)", 3), ("sum(value.amount) FILTER (WHERE value.user = 'u1')", 4.0),
    ("max(ts) - min(ts)", 4), ("coalesce(sum(value.x), 0)", 0), ("1", 1), ("count(*) + 1", 6),
    ("sum(value.n) div count()", 3), ("sum(value.n) % 7", 3), ("sum(value.amount) AS total", 6.5),
])
def test_aggregates(sql: str, expected: Any) -> None:
    rows = [dict(r, value=None if r["value"] is None else dict(r["value"], a=None, x=None)) for r in ROWS]
    assert same(agg(sql, rows), expected)


@pytest.mark.parametrize("sql, expected", [
    ("count()", 0), ("count(value.amount)", 0), ("count(DISTINCT value.user)", 0), ("sum(value.n)", None),
    ("avg(value.amount)", None), ("min(ts)", None), ("max(value.user)", None), ("first(value.user)", None),
    ("last(value.user)", None), ("collect_list(value.user)", []), ("collect_set(value.user)", []),
    ("max_by(value.user, ts)", None), ("count_if(value.n > 0)", 0), ("bool_and(value.n > 0)", None),
    ("sum(value.a) / count()", None), ("coalesce(sum(value.n), 0)", 0),
])
def test_aggregates_of_no_rows(sql: str, expected: Any) -> None:
    assert same(agg(sql, []), expected)


def test_first_last_null_handling() -> None:
    rows = _rows({"u": None}, {"u": "a"}, {"u": "b"}, {"u": None})
    assert agg("first(value.u)", rows) is None
    assert agg("last(value.u)", rows) is None
    assert agg("first(value.u, true)", rows) == "a"
    assert agg("first(value.u) IGNORE NULLS", rows) == "a"
    assert agg("last(value.u, true)", rows) == "b"
    assert agg("last_value(value.u) ignore nulls", rows) == "b"
    assert agg("first(value.u) RESPECT NULLS", rows) is None


def test_max_by_ties_keep_the_last_row_and_skip_null_orderings() -> None:
    rows = _rows({"v": "a", "o": 1}, {"v": "b", "o": 1}, {"v": "c", "o": 0}, {"v": "d", "o": None})
    assert agg("max_by(value.v, value.o)", rows) == "b"
    assert agg("min_by(value.v, value.o)", rows) == "c"
    assert agg("max_by(value.v, value.o)", _rows({"v": "a", "o": 1}, {"v": None, "o": 1})) is None
    assert agg("max_by(value.v, value.o)", _rows({"v": "a", "o": None})) is None


def test_min_max_follow_spark_nan_ordering_and_distinct_normalizes_floats() -> None:
    rows = _rows({"x": 1.0}, {"x": NAN}, {"x": -0.0}, {"x": 0.0}, {"x": NAN}, {"x": None})
    assert math.isnan(agg("max(value.x)", rows))
    assert agg("min(value.x)", rows) == 0.0
    assert agg("count(DISTINCT value.x)", rows) == 3  # 1.0, NaN, 0.0 (= -0.0)
    assert agg("size(collect_set(value.x))", rows) == 4  # Spark's collect_set keeps each NaN
    assert same(agg("collect_set(value.x)", rows), [1.0, NAN, -0.0, NAN])


def test_sum_types_and_overflow() -> None:
    assert isinstance(agg("sum(value.n)", _rows({"n": 1}, {"n": 2})), int)
    assert isinstance(agg("sum(value.n)", _rows({"n": 1}, {"n": 2}), schema="value struct<n: double>"), float)
    assert agg("sum(value.s)", _rows({"s": "1"}, {"s": "2.5"})) == 3.5  # strings are summed as doubles
    assert isinstance(agg("avg(value.n)", _rows({"n": 2}, {"n": 2})), float)
    with pytest.raises(ExprRuntimeError, match="ARITHMETIC_OVERFLOW"):
        agg("sum(value.n)", _rows({"n": 2**62}, {"n": 2**62}))
    with pytest.raises(ExprError, match="DATATYPE_MISMATCH"):
        agg("sum(value.b)", _rows({"b": True}))


@pytest.mark.parametrize("sql, message", [
    ("sum(sum(ts))", "cannot be nested"), ("count(*) + ts", "must be inside an aggregate"),
    ("ts", "must be inside an aggregate"), ("max_by(value.user)", "takes 2 argument"),
    ("sum(ts) over ()", "window"), ("median(ts)", "unsupported function median()"),
    ("count(DISTINCT *)", "count(DISTINCT *)"), ("sum(*)", "only allowed as count(*)"),
    ("sum(ts) IGNORE NULLS", "IGNORE NULLS"),
])
def test_aggregate_errors(sql: str, message: str) -> None:
    with pytest.raises(ExprError, match=message.replace("(", r"\(").replace(")", r"\)").replace("*", r"\*")):
        compile_aggregate(sql)


def test_aggregate_errors_at_runtime_name_the_expression() -> None:
    a = compile_aggregate("sum(value.n)")
    with pytest.raises(ExprError, match="unknown column 'value'") as info:
        a.add(a.init(), {"ts": 1})
    assert "sum(value.n)" in str(info.value)


def test_compiled_objects_satisfy_the_protocol() -> None:
    assert isinstance(compile_aggregate("count()"), Aggregate)
    assert isinstance(compile_fold("0", "acc + 1"), Aggregate)
    assert callable(compile_scalar("1"))


ROW_ST = st.fixed_dictionaries({
    "key": st.sampled_from(["k1", "k2"]),
    "ts": st.integers(0, 1000),
    "value": st.one_of(st.none(), st.fixed_dictionaries({
        "amount": st.one_of(st.none(), st.floats(-1e6, 1e6)),
        "n": st.one_of(st.none(), st.integers(-1000, 1000)),
        "user": st.one_of(st.none(), st.sampled_from(["u1", "u2", "u3"])),
    })),
})
STATEFUL = ["count()", "sum(value.n)", "avg(value.amount)", "collect_list(value.user)", "collect_set(value.user)",
            "count(DISTINCT value.user)", "first(value.user)", "last(value.user, true)", "max_by(value.user, ts)",
            "min(value.amount)"]


@settings(max_examples=60, deadline=None, database=None, derandomize=True)
@given(st.lists(ROW_ST, max_size=12), st.sampled_from(STATEFUL))
def test_states_are_immutable_values(rows: list[dict[str, Any]], sql: str) -> None:
    """add() never mutates its input: every intermediate state still gives its own result later."""
    a = compile_aggregate(sql)
    states, results = [a.init()], []
    for r in rows:
        results.append(a.result(states[-1]))
        states.append(a.add(states[-1], r))
    results.append(a.result(states[-1]))
    for s, expected in zip(states, results):
        assert same(a.result(s), expected)
    for i in range(len(rows) + 1):  # and each equals a fresh run over the prefix
        assert same(results[i], run(compile_aggregate(sql), rows[:i]))


@pytest.mark.parametrize("sql, expected", [
    ("first(value.user)", True), ("last(value.user)", True), ("collect_list(value.user)", True),
    ("array_agg(value.user)", True), ("first_value(value.n)", True), ("last_value(value.n)", True),
    ("max_by(value.user, ts)", True), ("min_by(value.user, ts)", True), ("any_value(ts)", True),
    ("size(collect_list(value.user)) + count()", True), ("count()", False), ("sum(value.amount)", False),
    ("count(DISTINCT value.user)", False), ("collect_set(value.user)", False), ("round(avg(ts), 2)", False),
    ("max(ts) - min(ts)", False), ("concat(min(key), 'first')", False),
])
def test_is_order_sensitive(sql: str, expected: bool) -> None:
    assert is_order_sensitive(sql) is expected


def test_is_order_sensitive_validates() -> None:
    with pytest.raises(ExprError):
        is_order_sensitive("median(ts)")


# ---- folds ----------------------------------------------------------------------------------


def test_fold_string_concatenation() -> None:
    f = compile_fold("'0'", "concat(acc, '+', cast(value.n as string))")
    assert run(f, _rows({"n": 1}, {"n": 2})) == "0+1+2"
    assert run(f, []) == "0"
    assert run(f, _rows({"n": 1}, None, {"n": 3})) is None  # concat with NULL is NULL, and stays NULL


def test_fold_sees_row_columns_and_acc() -> None:
    f = compile_fold("named_struct('n', 0, 'last', cast(null as string))",
                     "named_struct('n', acc.n + 1, 'last', coalesce(value.user, acc.last))")
    assert run(f, _rows({"user": "a"}, {"user": None}, {"user": "b"}, {"user": None})) == {"n": 4, "last": "b"}
    g = compile_fold("cast(0 as double)", "acc * 0.5 + coalesce(value.amount, 0)")
    assert run(g, _rows({"amount": 4.0}, {"amount": None}, {"amount": 1.0})) == 2.0
    h = compile_fold("0", "acc + ts")
    assert run(h, _rows(None, None, ts=[5, 7])) == 12


def test_fold_init_is_evaluated_with_no_columns_and_errors_are_clear() -> None:
    with pytest.raises(ExprError, match="not allowed in a fold initializer"):
        compile_fold("ts", "acc")
    with pytest.raises(ExprError, match="not allowed in a scalar expression"):
        compile_fold("0", "acc + count()")
    f = compile_fold("0", "acc + value.n")
    with pytest.raises(ExprError, match="acc \\+ value.n"):
        run(f, [{"ts": 1}])


# ============================================================================================
# Differential tests against Spark
# ============================================================================================

# Spark (and Java) are hard requirements of the project: these always run (scripts/setup.sh checks Java)
needs_java = pytest.mark.spark


@pytest.fixture(scope="module")
def spark(spark_module: Any) -> Any:
    """The project's session (conf/local.yaml with the pinned jars): a session built here without them
    would be the one the whole test process reuses."""
    return spark_module


def _py(v: Any) -> Any:
    """Spark result -> plain Python (Row -> dict).

    A Spark Decimal becomes the double nearest to it: the reference engine computes decimal literals as
    doubles (its documented deviation, backfill/reference/expr.py), so the comparison is that its double
    is exactly the nearest double to Spark's exact decimal, not merely close.
    """
    from decimal import Decimal

    from pyspark.sql import Row

    if isinstance(v, Row):
        return {k: _py(x) for k, x in v.asDict().items()}
    if isinstance(v, list):
        return [_py(x) for x in v]
    if isinstance(v, Decimal):
        return float(v)  # correctly rounded (Python converts exactly, then rounds once)
    return v


SPARK_SCHEMA = ("eid int, idx int, key string, ts bigint, "
                "value struct<amount: double, n: bigint, user: string>")

AMOUNT = st.one_of(
    st.none(),
    st.integers(-10**6, 10**6).map(lambda i: i / 1000),
    st.floats(-1e9, 1e9, allow_nan=False),
    st.sampled_from([0.0, -0.0, 0.5, 2.675, 1.005, -2.5, 1e-5, 1e7, 1.5e16, 2.0**60, NAN, INF, -INF]),
)
N = st.one_of(st.none(), st.integers(-10**6, 10**6), st.integers(-2**40, 2**40))
USER = st.one_of(st.none(), st.sampled_from(["u1", "u2", "U1", "", "ü", "a b"]), st.text(max_size=4))
VALUE = st.one_of(st.none(), st.fixed_dictionaries({"amount": AMOUNT, "n": N, "user": USER}))
RECORD = st.fixed_dictionaries({"key": st.sampled_from(["k1", "k2"]), "ts": st.integers(0, 10**6), "value": VALUE})
GROUPS = st.lists(st.lists(RECORD, min_size=1, max_size=8), min_size=1, max_size=40)
def _rec(amount: Any = None, n: Any = None, user: Any = None, ts: int = 0, key: str = "k1") -> dict[str, Any]:
    return {"key": key, "ts": ts, "value": {"amount": amount, "n": n, "user": user}}


EDGE_GROUPS = [  # always run (hypothesis @example): NaN / -0.0 / infinities, ties, NULL structs
    [_rec(NAN, 1, "b"), _rec(NAN, 1, "a"), _rec(-0.0, 2, "a", 1), _rec(0.0, 2, None, 1), _rec(1.0, None, "")],
    [_rec(INF, 5, "u1"), _rec(-INF, 5, "u2"), {"key": "k2", "ts": 3, "value": None}, _rec(None, None, None)],
    [{"key": "k1", "ts": 0, "value": None}],
    [_rec(2.675, 2**40, "ü"), _rec(1.005, -(2**40), "a b"), _rec(1.5e16, 0, "U1"), _rec(2.0**60, 7, "u1")],
    [_rec(0.5, 3, "x", 9), _rec(-2.5, 3, "y", 9), _rec(1e-5, 3, "z", 9)],
    [_rec(2.0**-24, 1, "j"), _rec(2e23, 2, "j")],  # Java 17 prints both with extra digits
]
# The suite runs a fixed (derandomized) set of examples so CI is reproducible; EXPR_SPARK_EXAMPLES=60
# searches harder with fresh random examples (each example is one Spark job over up to 40 groups).
# Shrinking is off: a Spark-backed shrink can run for many minutes; the failing groups are printed.
_DEEP = int(os.environ.get("EXPR_SPARK_EXAMPLES", "0"))
SPARK_SETTINGS = settings(max_examples=_DEEP or 5, derandomize=not _DEEP, deadline=None, database=None,
                          phases=[Phase.explicit, Phase.generate],
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _frame(spark: Any, groups: list[list[dict[str, Any]]]) -> Any:
    """All examples in one single-partition DataFrame (eid = example, idx = processing order)."""
    data = []
    for eid, rows in enumerate(groups):
        for idx, r in enumerate(rows):
            v = r["value"]
            data.append((eid, idx, r["key"], r["ts"], None if v is None else (v["amount"], v["n"], v["user"])))
    return spark.createDataFrame(data, SPARK_SCHEMA).coalesce(1)


def _check(label: str, ours: Any, theirs: Any, typed: Any, rows: Any) -> None:
    assert same(typed, theirs, strict=True), f"{label}: reference (schema) {typed!r} != Spark {theirs!r} for {rows!r}"
    assert same(ours, theirs, strict=False), f"{label}: reference {ours!r} != Spark {theirs!r} for {rows!r}"


CONSTANTS = [
    "'it''s'", "'a''''b'", "''''", "'a' 'b'", "'a\\tb'", "'\\u0041'", "1.5 + 1", "5 / 2", "5 div 2", "-5 div 2",
    "-5 % 3", "5 % -3", "-7.5D % 2", "1e308D % 7", "9 / 4", "1e308D * 10", "'5' + 1", "'5' * 1.5D", "-'5'",
    "'1' = 1", "'1' < 2", "'true' = true", "1 = 1.0D", "null = null", "1 <=> null", "null <=> null",
    "-0.0D = 0.0D", "cast('NaN' as double) = cast('NaN' as double)", "cast('NaN' as double) > 1e300",
    "1 in (2, null)", "1 in (1, null)", "1 not in (2, null)", "null and false", "null or true", "null or false",
    "2 between null and 1", "5 between 1 and null", "null is not false",
    "concat('a', 1.0D)", "concat('a', 1.5)", "concat('a', 3)", "concat('a', true)", "concat('a', null)",
    "concat(1, 2)", "concat('x', 1e300)", "concat(array(1), array(2, 3))", "'a' || 'b'",
    "cast(1e10 as string)", "cast(1e7 as string)", "cast(1e-3 as string)", "cast(1e-4 as string)",
    "cast(0.1D + 0.2D as string)", "cast(-0.0D as string)", "cast(123456789.0D as string)",
    "cast(12345678.9D as string)", "cast(1.7976931348623157E308D as string)", "cast(4.9E-324D as string)",
    "cast(1.689446065359412E18D as string)", "cast(9007199254740993L as double)", "cast(true as string)",
    "cast(array(1.5D, null) as string)", "cast(named_struct('a', 1, 'b', 'x') as string)",
    "cast(' 12 ' as int)", "cast(12.99D as int)", "cast(-12.7D as bigint)", "cast('1e3' as double)",
    "cast('1.5f' as double)", "cast('-infinity' as double)", "cast('NAN' as double)", "cast('yes' as boolean)",
    "cast(' N ' as boolean)", "cast(2.5D as boolean)", "cast(9.223372036854776E18D as bigint)",
    "cast(-9.223372036854776E18D as bigint)", "cast(2147483647.5D as int)", "cast(-2147483648.9D as int)",
    "round(2.675D, 2)", "round(2.5D)", "round(-2.5D)", "round(125, -1)", "round(-15, -1)", "round(1.005D, 2)",
    "round(0.285D, 2)", "round(1.23456789e20D, 2)", "round(12.345D, -1)", "round(123.456D, -400)",
    "round(-123.456D, -5)", "round(1e300D, 2)", "round(cast('NaN' as double), 2)", "round(-0.4D)",
    "abs(-2.5D)", "abs(-0.0D)", "abs('-5')", "upper('straße')", "lower('İ')", "length('héllo')", "length('😀')",
    "length(123)", "length(true)", "upper(true)", "substring('hello', 0, 2)", "substring('hello', -3, 2)",
    "substring('hello', 1, -1)", "substring('hello', -10, 7)", "substring('hello', 6)", "substring('hello', -6, 2)",
    "substring('hello', 2.7D)", "substring(12345, 2, 2)", "greatest(1, null, 3)", "least('b', 'a')",
    "greatest(1, 2.5D)", "greatest(3, 2.5D)", "greatest(cast('NaN' as double), 1D)",
    "least(cast('NaN' as double), 1D)", "greatest(true, false)", "least(null, 2, null, 1)",
    "if(false, 1/0, 3)", "if(true, 1, 2.5D)", "coalesce(1, 1/0)", "coalesce(1, 2.5D)",
    "case when false then 1/0 else 2 end",
    "case 1 when 1.0D then 'eq' else 'ne' end", "case null when null then 1 else 2 end", "nullif(1, 1)",
    "nvl2(null, 1, 2)", "array(1, 2.5D)", "array(1, null, 3)", "size(array(null))", "size(array())",
    "named_struct('a', 1, 'b', named_struct('c', 'x'))", "try_cast('abc' as int)",
    "-9223372036854775808L % -1", "-2147483648 div -1", "2147483647L + 1",
]


@needs_java
@pytest.mark.spark
def test_constant_expressions_match_spark(spark: Any) -> None:
    from pyspark.sql import functions as F

    row = spark.range(1).select(*[F.expr(e).alias(f"c{i}") for i, e in enumerate(CONSTANTS)]).collect()[0]
    bad = []
    for i, e in enumerate(CONSTANTS):
        theirs, ours = _py(row[f"c{i}"]), ev(e)
        if not same(ours, theirs, strict=True):
            bad.append(f"{e}: reference {ours!r}, Spark {theirs!r}")
    assert not bad, "\n".join(bad)


@needs_java
@pytest.mark.spark
def test_errors_match_spark(spark: Any) -> None:
    """The ANSI errors of test_ansi_runtime_errors (and a few type errors) fail in Spark too."""
    from pyspark.sql import functions as F

    cases = list(ANSI_ERRORS) + [(sql, "DATATYPE_MISMATCH") for sql in
                                 ("true + 1", "if(1, 'a', 'b')", "size('abc')", "greatest(1, 'a')")]
    df = spark.createDataFrame([(0,)], "z int")
    wrong = []
    for sql, expected in cases:
        try:
            df.select(F.expr(sql)).collect()
        except Exception as exc:  # noqa: BLE001 - Spark's error condition is compared below
            condition = getattr(exc, "getCondition", lambda: None)() or ""
            if not condition.startswith(expected):  # e.g. DATATYPE_MISMATCH.BINARY_OP_WRONG_TYPE
                wrong.append((sql, expected, condition or type(exc).__name__))
        else:
            wrong.append((sql, expected, "no error"))
    assert not wrong, f"Spark's error differs from ours: {wrong}"


SCALARS = [
    "value.amount", "value.n + 1", "value.n - ts", "value.n * 3", "value.amount * 2 + value.n", "value.amount / 4",
    "if(value.n = 0, null, ts / value.n)", "if(value.n = 0, null, ts div value.n)",
    "if(value.n = 0, null, ts % value.n)",
    "value.amount % 3", "-value.amount", "abs(value.n)", "round(value.amount, 2)", "round(value.amount)",
    "round(value.amount, -2)", "round(value.n, -3)", "cast(value.amount as string)", "cast(value.n as string)",
    "cast(value.n as double)", "cast(value.amount > 0 as string)", "cast(value.n % 1000 as int)",
    "cast(cast(value.amount as string) as double)", "cast(cast(value.n as string) as bigint)",
    "concat(key, '-', value.user)", "concat(value.user, value.amount, value.n)", "key || ':' || cast(ts as string)",
    "upper(value.user)", "lower(value.user)", "length(value.user)", "substring(value.user, 2)",
    "substring(value.user, -2, 1)", "substring(value.user, 0, 2)", "value.amount > 1.5", "value.amount = value.n",
    "value.user = 'u1'", "value.user < key", "value.n <=> null", "value.user IN ('u1', 'u2', null)",
    "value.n IN (1, 2, 3)", "value.n BETWEEN 0 AND 1000", "value.amount IS NULL", "value IS NULL",
    "isnull(value.user)", "NOT (value.amount > 0)", "value.amount > 0 AND value.n > 0",
    "value.amount > 0 OR value.user IS NULL", "coalesce(value.amount, value.n, 0)", "nvl(value.user, 'none')",
    "nullif(value.user, 'u1')", "greatest(value.amount, value.n, 0)", "least(value.n, ts)",
    "CASE WHEN value.amount > 100 THEN 'big' WHEN value.amount > 0 THEN 'small' ELSE 'other' END",
    "CASE value.user WHEN 'u1' THEN 1 WHEN 'u2' THEN 2 END", "if(value.user IS NULL, value.amount, 0)",
    "array(value.n, ts)", "size(array(value.user, key))", "named_struct('u', value.user, 'n', value.n)",
    "value.amount * 0.1", "ts + 1.5",
]


@needs_java
@pytest.mark.spark
@SPARK_SETTINGS
@given(GROUPS)
@example(EDGE_GROUPS)
def test_scalar_expressions_match_spark(spark: Any, groups: list[list[dict[str, Any]]]) -> None:
    from pyspark.sql import functions as F

    df = _frame(spark, groups)
    got = df.select("eid", "idx", *[F.expr(e).alias(f"c{i}") for i, e in enumerate(SCALARS)]).collect()
    untyped = [compile_scalar(e) for e in SCALARS]
    typed = [compile_scalar(e, schema=SCHEMA) for e in SCALARS]
    assert len(got) == sum(map(len, groups))
    for r in got:
        row = groups[r["eid"]][r["idx"]]
        for i, e in enumerate(SCALARS):
            _check(e, untyped[i](row), _py(r[f"c{i}"]), typed[i](row), row)


AGGREGATES = [
    "count()", "count(*)", "count(1)", "count(value)", "count(value.amount)", "count(value.user)",
    "count(value.user, value.n)", "count(DISTINCT value.user)", "count(DISTINCT value.amount)",
    "count(DISTINCT value.user, value.n)", "sum(value.amount)", "sum(value.n)", "sum(DISTINCT value.n)",
    "avg(value.amount)", "avg(value.n)", "min(ts)", "max(ts)", "min(value.amount)", "max(value.amount)",
    "min(value.n)", "max(value.user)", "min(value.user)", "sum(value.n) / count()", "sum(value.n) div count()",
    "sum(value.n) % 7", "round(avg(value.amount), 2)", "round(sum(value.amount), -1)", "max(ts) - min(ts)",
    "coalesce(sum(value.amount), 0)", "coalesce(max(value.n), -1)", "greatest(max(value.n), 0)",
    "least(min(value.amount), 0.5)", "sum(if(value.amount > 0, 1, 0))",
    "sum(CASE WHEN value.user IS NULL THEN 1 ELSE 0 END)", "count_if(value.amount > 100)",
    "count(*) FILTER (WHERE value.n > 0)", "sum(value.amount) FILTER (WHERE value.user IS NOT NULL)",
    "sum(length(value.user))", "max(concat(key, ':', cast(value.n as string)))", "max(cast(value.amount as string))",
    "min(concat(value.user, '/', value.amount))", "avg(abs(value.n))", "max(upper(value.user))",
    "min(substring(value.user, 2, 2))", "max(value.amount * 2 + 1)", "bool_and(value.amount >= 0)",
    "bool_or(value.user = 'u1')", "size(collect_list(value.user))", "size(collect_set(value.amount))",
    "sum(value.n * 2) - max(ts)", "mean(value.amount)",
]


@needs_java
@pytest.mark.spark
@SPARK_SETTINGS
@given(GROUPS)
@example(EDGE_GROUPS)
def test_aggregates_match_spark(spark: Any, groups: list[list[dict[str, Any]]]) -> None:
    from pyspark.sql import functions as F

    df = _frame(spark, groups)
    got = df.groupBy("eid").agg(*[F.expr(normalize_count(e)).alias(f"c{i}") for i, e in enumerate(AGGREGATES)])
    got = got.collect()
    assert sorted(r["eid"] for r in got) == list(range(len(groups)))
    for r in got:
        rows = groups[r["eid"]]
        for i, e in enumerate(AGGREGATES):
            _check(e, run(_UNTYPED[e], rows), _py(r[f"c{i}"]), run(_TYPED[e], rows), rows)


_UNTYPED = {e: compile_aggregate(e) for e in AGGREGATES}
_TYPED = {e: compile_aggregate(e, schema=SCHEMA) for e in AGGREGATES}

W = "(PARTITION BY eid ORDER BY idx ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)"
RUNNING = [  # "{w}" marks each aggregate call; Spark evaluates it as a running window in idx order
    "first(value.user) OVER {w}", "last(value.user) OVER {w}", "first(value.user, true) OVER {w}",
    "last(value.amount, true) OVER {w}", "first_value(value.n) OVER {w}", "last_value(value.n) OVER {w}",
    "collect_list(value.user) OVER {w}", "array_agg(value.amount) OVER {w}",
    "max_by(value.user, value.n) OVER {w}", "min_by(value.amount, ts) OVER {w}",
    "max_by(key, value.amount) OVER {w}", "count() OVER {w}", "sum(value.amount) OVER {w}",
    "avg(value.n) OVER {w}", "round(avg(value.amount) OVER {w}, 2)", "max(value.user) OVER {w}",
    "sum(value.n) OVER {w} / count() OVER {w}", "min(value.amount) OVER {w}",
]


@needs_java
@pytest.mark.spark
@SPARK_SETTINGS
@given(GROUPS)
@example(EDGE_GROUPS)
def test_running_aggregates_match_spark_windows(spark: Any, groups: list[list[dict[str, Any]]]) -> None:
    """Order-sensitive aggregates, and every intermediate result (Kafka Streams emits one per record)."""
    from pyspark.sql import functions as F

    df = _frame(spark, groups)
    cols = [F.expr(normalize_count(e.replace("{w}", W))).alias(f"c{i}") for i, e in enumerate(RUNNING)]
    got = {(r["eid"], r["idx"]): r for r in df.select("eid", "idx", *cols).collect()}
    for i, e in enumerate(RUNNING):
        sql = e.replace(" OVER {w}", "")
        assert is_order_sensitive(sql) == any(
            f in sql for f in ("first", "last", "collect_list", "array_agg", "max_by", "min_by"))
        a, t = compile_aggregate(sql), compile_aggregate(sql, schema=SCHEMA)
        for eid, rows in enumerate(groups):
            sa, stt = a.init(), t.init()
            for idx, row in enumerate(rows):
                sa, stt = a.add(sa, row), t.add(stt, row)
                _check(f"{sql} after row {idx}", a.result(sa), _py(got[(eid, idx)][f"c{i}"]), t.result(stt), rows)


FOLDS = [  # (init, step); Spark folds the idx-sorted values with aggregate(array, init, (acc, value) -> step)
    ("'0'", "concat(acc, '+', cast(value.n as string))"),
    ("cast(0 as bigint)", "acc + coalesce(value.n, 0)"),
    ("cast(0 as double)", "acc * 0.5 + coalesce(value.amount, 0)"),
    ("''", "if(value.user IS NULL, acc, concat(acc, value.user))"),
    ("cast(null as string)", "coalesce(acc, value.user)"),
    ("cast(0 as bigint)", "if(value.n > acc, value.n, acc)"),
]


def _spark_folds(df: Any) -> Any:
    from pyspark.sql import functions as F

    values = "transform(array_sort(collect_list(struct(idx, value))), s -> s.value)"
    return df.groupBy("eid").agg(*[
        F.expr(f"aggregate({values}, {init}, (acc, value) -> {step})").alias(f"f{i}")
        for i, (init, step) in enumerate(FOLDS)])


@needs_java
@pytest.mark.spark
@SPARK_SETTINGS
@given(GROUPS)
@example(EDGE_GROUPS)
def test_folds_match_spark_aggregate(spark: Any, groups: list[list[dict[str, Any]]]) -> None:
    got = _spark_folds(_frame(spark, groups)).collect()
    assert len(got) == len(groups)
    untyped = [compile_fold(init, step) for init, step in FOLDS]
    typed_folds = [compile_fold(init, step, schema=SCHEMA) for init, step in FOLDS]
    for r in got:
        rows = groups[r["eid"]]
        for i, (init, step) in enumerate(FOLDS):
            ours, typed = run(untyped[i], rows), run(typed_folds[i], rows)
            _check(f"fold({init}, {step})", ours, _py(r[f"f{i}"]), typed, rows)


@needs_java
@pytest.mark.spark
def test_empty_input_matches_spark(spark: Any) -> None:
    """A global aggregation of no rows: count 0, sum/avg/min NULL, collect_list [], fold = init."""
    from pyspark.sql import functions as F

    empty = spark.createDataFrame([], SPARK_SCHEMA)
    aggs = [e for e in AGGREGATES]
    row = empty.agg(*[F.expr(normalize_count(e)).alias(f"c{i}") for i, e in enumerate(aggs)]).collect()[0]
    for i, e in enumerate(aggs):
        _check(e, agg(e, []), _py(row[f"c{i}"]), agg(e, [], schema=SCHEMA), [])
    values = "transform(array_sort(collect_list(struct(idx, value))), s -> s.value)"
    row = empty.agg(*[F.expr(f"aggregate({values}, {init}, (acc, value) -> {step})").alias(f"f{i}")
                      for i, (init, step) in enumerate(FOLDS)]).collect()[0]
    for i, (init, step) in enumerate(FOLDS):
        _check(f"fold({init}, {step})", run(compile_fold(init, step), []), _py(row[f"f{i}"]),
               run(compile_fold(init, step, schema=SCHEMA), []), [])
