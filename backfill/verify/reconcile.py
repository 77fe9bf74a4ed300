"""Part: verify. Normalise an output and compare two outputs by key, in Spark, at any scale (nothing collected).

An update stream is reduced to its last value per key by its write order (partition, offset): only
"the last value per window is emitted" is certain (kafka-streams.md 14.2.2). Rows repeated with
identical values beyond what the other side explains are duplicates (at-least-once delivery,
14.2.6): counted once, reported as such, never as extra rows. The keyed comparison is one full
outer join; per-column equality with tolerances is datacompy's Spark comparator (`columns_equal`).
"""
from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from backfill.errors import SpecError

MATCH, MISMATCH = "match", "mismatch"
CATEGORY_KINDS = ("match", "mismatch", "missing", "extra", "duplicate")
_TOLERANCE = re.compile(r"^(abs|rel):([0-9eE.+-]+)$")


@dataclass(frozen=True)
class Tolerance:
    """|a - b| <= abs + rel * |b| (datacompy's rule; b is the right-hand side)."""

    abs: float = 0.0
    rel: float = 0.0


@dataclass(frozen=True)
class Comparison:
    """What to compare: key columns, value columns, tolerances, and how each side orders its rows."""

    keys: tuple[str, ...]
    columns: tuple[str, ...]
    tolerances: Mapping[str, Tolerance] = field(default_factory=dict)
    left: str = "backfill"
    right: str = "stream"
    left_order: tuple[str, ...] = ()
    right_order: tuple[str, ...] = ()
    updates: bool = False  # several rows per key are normal (an update stream); only exact repeats beyond
    # the left side's own are duplicates

    def label(self, kind: str) -> str:
        """Category name: match, mismatch, missing_in_<right>, extra_in_<right>, duplicate_in_<right>."""
        return kind if kind in (MATCH, MISMATCH) else f"{kind}_in_{self.right}"

    @property
    def categories(self) -> tuple[str, ...]:
        """All category names, in report order."""
        return tuple(self.label(k) for k in CATEGORY_KINDS)


def parse_tolerances(items: list[str]) -> dict[str, Tolerance]:
    """`col=abs:0.01`, `col=rel:1e-6`, `col=abs:0.01,rel:1e-6` -> {col: Tolerance}."""
    out: dict[str, Tolerance] = {}
    for item in items:
        name, _, spec = item.partition("=")
        values = {"abs": 0.0, "rel": 0.0}
        for part in spec.split(","):
            match = _TOLERANCE.match(part.strip())
            if not name or not match:
                raise SpecError(f"--tolerance {item!r}: use col=abs:0.01, col=rel:1e-6 or col=abs:0.01,rel:1e-6")
            values[match[1]] = float(match[2])
        out[name.strip()] = Tolerance(**values)
    return out


def last_per_key(df: DataFrame, keys: tuple[str, ...], columns: tuple[str, ...],
                 order: tuple[str, ...]) -> DataFrame:
    """One row per key: the values of its last row by `order` (max of the values when unordered), `_rows`."""
    values = F.struct(*[F.col(c) for c in columns])
    last = F.max_by(values, F.struct(*[F.col(c) for c in order])) if order else F.max(values)
    return (df.groupBy(*keys).agg(last.alias("_last"), F.count(F.lit(1)).alias("_rows"))
            .select(*keys, *[F.col(f"_last.{c}").alias(c) for c in columns], "_rows"))


def value_hash(columns: tuple[str, ...]) -> Column:
    """One hash of a row's value columns (equal values, equal hash)."""
    return F.xxhash64(*[F.col(c) for c in columns]) if columns else F.lit(0)


def exact_repeats(right: DataFrame, left: DataFrame | None, cmp: Comparison) -> DataFrame:
    """Per key: `_copies`, rows that repeat an identical value more often than the left side has it."""
    counts = right.groupBy(*cmp.keys, value_hash(cmp.columns).alias("_h")).agg(F.count(F.lit(1)).alias("_n"))
    if left is not None and cmp.updates:
        mine = left.groupBy(*cmp.keys, value_hash(cmp.columns).alias("_h")).agg(F.count(F.lit(1)).alias("_nl"))
        counts = counts.join(mine, [*cmp.keys, "_h"], "left")
        allowed = F.greatest(F.coalesce(F.col("_nl"), F.lit(0)), F.lit(1))
    else:
        allowed = F.lit(1)
    excess = F.greatest(F.col("_n") - allowed, F.lit(0))
    return counts.groupBy(*cmp.keys).agg(F.sum(excess).cast("long").alias("_copies"))


def normalise(right: DataFrame, left_raw: DataFrame | None, cmp: Comparison) -> DataFrame:
    """The right side as one row per key with `_rows` (all its rows), `_copies` and `_extra` (rows too many)."""
    last = last_per_key(right, cmp.keys, cmp.columns, cmp.right_order)
    repeats = exact_repeats(right, left_raw, cmp)
    out = last.join(repeats, list(cmp.keys), "left").fillna(0, ["_copies"])
    # final results: every row after the first is one too many; updates: only the exact repeats
    extra = F.col("_copies") if cmp.updates else F.col("_rows") - 1
    return out.withColumn("_extra", extra.cast("long"))


def align(left: DataFrame, right: DataFrame, cmp: Comparison) -> DataFrame:
    """Cast the right side's keys and values to the left side's types where they differ."""
    types = {f.name: f.dataType for f in left.schema.fields}
    rtypes = {f.name: f.dataType for f in right.schema.fields}
    cols = []
    for name in right.columns:
        want, have = types.get(name), rtypes[name]
        numeric = isinstance(want, T.NumericType) and isinstance(have, T.NumericType)
        if want is None or want == have or (numeric and name not in cmp.keys):
            cols.append(F.col(name))
        else:
            cols.append(F.col(name).try_cast(want).alias(name))
    return right.select(*cols)


def compare(left: DataFrame, right: DataFrame, cmp: Comparison) -> DataFrame:
    """Full outer join by key: l_*/r_* values, `diff_columns`, `category`, `_rows`, `_copies`, `_extra`."""
    from datacompy.spark import columns_equal

    lhs = left.select(*cmp.keys, *[F.col(c).alias(f"l_{c}") for c in cmp.columns], F.lit(True).alias("_in_left"))
    rhs = right.select(*cmp.keys, *[F.col(c).alias(f"r_{c}") for c in cmp.columns], "_rows", "_copies", "_extra",
                       F.lit(True).alias("_in_right"))
    joined = lhs.join(rhs, list(cmp.keys), "full_outer")
    equal = {c: _equal(columns_equal, joined, c, cmp.tolerances.get(c, Tolerance())) for c in cmp.columns}
    diff = F.filter(F.array(*[F.when(~equal[c], F.lit(c)) for c in cmp.columns]), lambda x: x.isNotNull()) \
        if cmp.columns else F.array().cast("array<string>")
    category = (F.when(F.col("_in_right").isNull(), F.lit(cmp.label("missing")))
                .when(F.col("_in_left").isNull(), F.lit(cmp.label("extra")))
                .when(F.size("diff_columns") > 0, F.lit(MISMATCH))
                .when(F.col("_extra") > 0, F.lit(cmp.label("duplicate")))
                .otherwise(F.lit(MATCH)))
    both = F.col("_in_left").isNotNull() & F.col("_in_right").isNotNull()
    return (joined.withColumn("diff_columns", F.when(both, diff).otherwise(F.array().cast("array<string>")))
            .withColumn("category", category)
            .fillna(0, ["_rows", "_copies", "_extra"])
            .drop("_in_left", "_in_right"))


def _equal(columns_equal: object, df: DataFrame, column: str, tol: Tolerance) -> Column:
    """datacompy's null-safe, NaN-aware, tolerant equality of l_<column> and r_<column>."""
    eq = columns_equal(df, f"l_{column}", f"r_{column}", rel_tol=tol.rel, abs_tol=tol.abs)  # type: ignore[operator]
    return F.coalesce(eq, F.lit(False))


def category_counts(result: DataFrame, cmp: Comparison) -> dict[str, int]:
    """Rows per category (every category present, zero when none)."""
    counts = {c: 0 for c in cmp.categories}
    for row in result.groupBy("category").count().collect():
        counts[row["category"]] = row["count"]
    return counts


def require_columns(df: DataFrame, needed: tuple[str, ...], what: str, hint: str) -> None:
    """Fail with one line when an output lacks a column the comparison needs."""
    missing = [c for c in needed if c not in df.columns]
    if missing:
        raise SpecError(f"{what}: no column {missing[0]!r} (columns: {', '.join(df.columns)}); {hint}")


def union_all(frames: list[DataFrame]) -> DataFrame:
    """Union by name of one or more frames."""
    return functools.reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), frames)
