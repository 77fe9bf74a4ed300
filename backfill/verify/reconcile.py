"""Part: verify. Reduce two outputs to their last row per key and compare them by key, in Spark, at any scale.

An update stream is reduced to its last value per key by its write order (partition, offset): only
"the last value per window is emitted" is certain (docs/semantics.md §14). Rows repeated with
identical values beyond what the other side explains are duplicates (at-least-once delivery,
14.2.6): counted once, reported as such, never as extra rows. The keyed comparison is one full
outer join; per-column equality with tolerances is datacompy's Spark comparator (`columns_equal`).
Each side is read by one hash aggregation; only the keys that can hold a repeat are counted row by row.
"""
from __future__ import annotations

import functools
import re
from typing import Any
from collections.abc import Mapping
from dataclasses import dataclass, field

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from backfill.errors import SpecError

MATCH, MISMATCH = "match", "mismatch"
CATEGORY_KINDS = ("match", "mismatch", "missing", "extra", "duplicate")
BROADCAST_KEYS = 200_000  # keys up to which a side is filtered by a broadcast of them, not shuffled to meet them
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
                 order: tuple[str, ...], fingerprint: bool = False) -> DataFrame:
    """One row per key: the values of its last row by `order` (max of the values when unordered), `_rows`;
    with `fingerprint`, `_fp1` and `_fp2`: the sums of the low and the high 32 bits of each row's value hash
    (together, the exact sum of the hashes), equal for equal multisets of values (what `reconcile` compares to
    find the keys whose rows may repeat beyond the other side's); long sums, exact below 2^31 rows per key."""
    position = _position(df, order)
    counts = [F.count(F.lit(1)).alias("_rows")]
    if fingerprint:
        h = value_hash(columns)
        counts += [F.sum(h.bitwiseAND(F.lit(0xFFFFFFFF))).alias("_fp1"),
                   F.sum(F.shiftrightunsigned(h, 32)).alias("_fp2")]
    if position is not None:
        # one max_by per column, ordered by one fixed-width value: a hash aggregation (a struct of values
        # ordered by a struct needs a sort of every row); rows at the same position are copies in practice
        return df.groupBy(*keys).agg(*[F.max_by(c, position).alias(c) for c in columns], *counts)
    values = F.struct(*[F.col(c) for c in columns])
    last = F.max_by(values, F.struct(*[F.col(c) for c in order])) if order else F.max(values)
    return (df.groupBy(*keys).agg(last.alias("_last"), *counts)
            .select(*keys, *[F.col(f"_last.{c}").alias(c) for c in columns],
                    *[n for n in ("_rows", "_fp1", "_fp2") if fingerprint or n == "_rows"]))


_INTEGRAL = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)


def _position(df: DataFrame, order: tuple[str, ...]) -> Column | None:
    """`order` as one long ordered the same way, when it is one integral column, or two (partition, offset)
    whose ranges fit in 62 bits together ((partition - min) shifted left past (offset - min); one scan of
    the two columns finds the ranges). None otherwise: the caller orders by a struct."""
    if not order or not all(isinstance(df.schema[c].dataType, _INTEGRAL) for c in order):
        return None
    if len(order) == 1:
        return F.col(order[0])
    if len(order) != 2:
        return None
    hi, lo = order
    b = df.agg(F.min(hi).alias("a"), F.max(hi).alias("b"), F.min(lo).alias("c"), F.max(lo).alias("d")).first()
    if b is None or b["a"] is None or b["c"] is None:
        return F.lit(0).cast("long")  # no rows, or no positions: nothing to order
    shift = (b["d"] - b["c"]).bit_length()
    if (b["b"] - b["a"]).bit_length() + shift > 62:
        return None
    # null positions sort first, as in a struct
    return F.coalesce(F.shiftleft(F.col(hi).cast("long") - F.lit(b["a"]), shift)
                      + (F.col(lo).cast("long") - F.lit(b["c"])), F.lit(-1).cast("long"))


def value_hash(columns: tuple[str, ...]) -> Column:
    """One hash of a row's value columns (equal values, equal hash)."""
    return F.xxhash64(*[F.col(c) for c in columns]) if columns else F.lit(0)


def exact_repeats(right: DataFrame, left: DataFrame | None, cmp: Comparison, candidates: DataFrame,
                  n: int) -> DataFrame:
    """Per key of `candidates` (`n` keys, the only ones that may repeat) with repeats: `_copies`, rows of `right`
    that repeat an identical value more often than `left` has it (`left` None: more than once)."""
    keys = list(cmp.keys)
    if n <= BROADCAST_KEYS:  # few keys (the usual case): both sides are scanned for them only
        candidates = F.broadcast(candidates)
    counts = right.join(candidates, keys, "left_semi").groupBy(*keys, value_hash(cmp.columns).alias("_h")).agg(
        F.count(F.lit(1)).alias("_n"))
    if left is not None:
        mine = left.join(candidates, keys, "left_semi").groupBy(*keys, value_hash(cmp.columns).alias("_h")).agg(
            F.count(F.lit(1)).alias("_nl"))
        counts = counts.join(mine, [*keys, "_h"], "left")
        allowed = F.greatest(F.coalesce(F.col("_nl"), F.lit(0)), F.lit(1))
    else:
        allowed = F.lit(1)
    excess = F.greatest(F.col("_n") - allowed, F.lit(0))
    found = counts.groupBy(*keys).agg(F.sum(excess).cast("long").alias("_copies")).where(F.col("_copies") > 0)
    return F.broadcast(found) if n <= BROADCAST_KEYS else found


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


def reconcile(left: DataFrame, right: DataFrame, cmp: Comparison) -> tuple[DataFrame, dict[str, int]]:
    """(comparison, rows per category: every category, zero when none). The comparison has both sides as
    one row per key (the last by each side's order) joined by key: l_*/r_* values, `diff_columns`,
    `category`, `_rows` and `_lrows` (each side's rows per key, `_lrows` null where the left has none),
    `_copies` (right rows repeating an identical value beyond what the left explains: exact repeats with
    `cmp.updates`, else every repeat), `_extra` (rows too many) and `_maybe` (the key could hold a repeat).
    It is stored; the caller unpersists it.

    Counting every row by key and value was most of a reconciliation (an update stream has about one row
    per input record). Only keys with more than one right row can repeat a value; with `cmp.updates`, only
    those whose multiset of values differs from the left's (`last_per_key` fingerprints differ, or the left
    lacks the key): equal multisets repeat nothing beyond the left's own. Only those keys' rows are counted."""
    from datacompy.spark import columns_equal

    updates = cmp.updates
    lhs = last_per_key(left, cmp.keys, cmp.columns, cmp.left_order, fingerprint=updates)
    rhs = last_per_key(right, cmp.keys, cmp.columns, cmp.right_order, fingerprint=updates)
    fp = ("_fp1", "_fp2") if updates else ()
    lhs = lhs.select(*cmp.keys, *[F.col(c).alias(f"l_{c}") for c in cmp.columns], F.col("_rows").alias("_lrows"),
                     *[F.col(c).alias(f"_l{c}") for c in fp], F.lit(True).alias("_in_left"))
    rhs = rhs.select(*cmp.keys, *[F.col(c).alias(f"r_{c}") for c in cmp.columns], "_rows", *fp,
                     F.lit(True).alias("_in_right"))
    out = lhs.join(rhs, list(cmp.keys), "full_outer")
    maybe = F.col("_rows") > 1
    if updates:
        maybe = maybe & (F.col("_lrows").isNull() | (F.col("_rows") != F.col("_lrows"))
                         | (F.col("_fp1") != F.col("_l_fp1")) | (F.col("_fp2") != F.col("_l_fp2")))
    out = (out.withColumn("_maybe", F.coalesce(maybe, F.lit(False))).drop(*fp, *[f"_l{c}" for c in fp])
           .withColumn("_copies", F.lit(0).cast("long")))
    # final results: every row beyond the left side's (one, unless suppress released a window several times) is
    # one too many; updates: only the exact repeats (counted below)
    beyond = F.greatest(F.col("_rows") - F.greatest(F.coalesce(F.col("_lrows"), F.lit(1)), F.lit(1)), F.lit(0))
    out = out.withColumn("_extra", (F.col("_copies") if updates else beyond).cast("long"))
    equal = {c: _equal(columns_equal, out, c, cmp.tolerances.get(c, Tolerance())) for c in cmp.columns}
    diff = F.filter(F.array(*[F.when(~equal[c], F.lit(c)) for c in cmp.columns]), lambda x: x.isNotNull()) \
        if cmp.columns else F.array().cast("array<string>")
    category = (F.when(F.col("_in_right").isNull(), F.lit(cmp.label("missing")))
                .when(F.col("_in_left").isNull(), F.lit(cmp.label("extra")))
                .when(F.size("diff_columns") > 0, F.lit(MISMATCH))
                .when(F.col("_extra") > 0, F.lit(cmp.label("duplicate")))
                .otherwise(F.lit(MATCH)))
    both = F.col("_in_left").isNotNull() & F.col("_in_right").isNotNull()
    first = (out.withColumn("diff_columns", F.when(both, diff).otherwise(F.array().cast("array<string>")))
             .withColumn("category", category)
             .fillna(0, ["_rows", "_extra"])
             .drop("_in_left", "_in_right")).persist(StorageLevel.MEMORY_AND_DISK)
    tally = first.groupBy("category", "_maybe").count().collect()  # stores the comparison
    n = sum(r["count"] for r in tally if r["_maybe"])
    if not n:  # nothing can repeat (the usual case): done
        return first, _counts(tally, cmp)
    # the exact repeats of the few keys that can hold one; a match with rows too many is a duplicate
    try:
        repeats = exact_repeats(right, left if updates else None, cmp, first.where("_maybe").select(*cmp.keys), n)
        found = first.drop("_copies").join(repeats, list(cmp.keys), "left").fillna(0, ["_copies"])
        if updates:
            found = found.withColumn("_extra", F.col("_copies"))
        found = found.withColumn("category", F.when((F.col("category") == MATCH) & (F.col("_extra") > 0), F.lit(
            cmp.label("duplicate"))).otherwise(F.col("category"))).persist(StorageLevel.MEMORY_AND_DISK)
        return found, _counts(found.groupBy("category").count().collect(), cmp)
    finally:
        first.unpersist()


def _counts(rows: list[Any], cmp: Comparison) -> dict[str, int]:
    """Rows per category (every category, zero when none) from grouped counts."""
    counts = {c: 0 for c in cmp.categories}
    for row in rows:
        counts[row["category"]] += row["count"]
    return counts


def _equal(columns_equal: object, df: DataFrame, column: str, tol: Tolerance) -> Column:
    """datacompy's null-safe, NaN-aware, tolerant equality of l_<column> and r_<column>."""
    eq = columns_equal(df, f"l_{column}", f"r_{column}", rel_tol=tol.rel, abs_tol=tol.abs)  # type: ignore[operator]
    return F.coalesce(eq, F.lit(False))


def require_columns(df: DataFrame, needed: tuple[str, ...], what: str, hint: str) -> None:
    """Fail with one line when an output lacks a column the comparison needs."""
    missing = [c for c in needed if c not in df.columns]
    if missing:
        raise SpecError(f"{what}: no column {missing[0]!r} (columns: {', '.join(df.columns)}); {hint}")


def union_all(frames: list[DataFrame]) -> DataFrame:
    """Union by name of one or more frames."""
    return functools.reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), frames)
