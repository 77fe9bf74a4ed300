"""Part: reference engine. Evaluate small Spark SQL expressions in pure Python, with Spark's semantics.

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
  Spark always prints the shortest digits: set ``LEGACY_JDK_DOUBLE_FORMAT = False`` in ``values.py``.
  ``round`` uses the same digits, as Spark's ``BigDecimal(Double.toString(d))`` does.
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

from backfill.reference.expr.base import (
    SUPPORTED_AGGREGATES,
    SUPPORTED_FUNCTIONS,
    SUPPORTED_OPERATORS,
    Aggregate,
    ExprError,
    ExprRuntimeError,
    normalize_count,
)
from backfill.reference.expr.compiled import (
    CompiledAggregate,
    CompiledFold,
    CompiledScalar,
    compile_aggregate,
    compile_fold,
    compile_scalar,
    is_order_sensitive,
)
from backfill.reference.expr.values import LEGACY_JDK_DOUBLE_FORMAT

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

