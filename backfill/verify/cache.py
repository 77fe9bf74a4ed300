"""Part: verify. `cache_coalesced`: an update stream written through Kafka Streams' record cache (docs/semantics.md
§14).

With the cache on, a window's updates are forwarded when the cache flushes (a commit, an eviction), each the
window's value at that moment: the stream has a subsequence of the updates the backfill emits with the cache
off, in the same order, ending with the same last value. For a job that declares `cache: on`, verify checks
that of every window whose last value matches but whose updates differ: a window whose stream updates each
equal one of the backfill's updates (values and timestamp), in order, the last one its last, is
`cache_coalesced`; one with an update the backfill never produced there, or out of order, is `unexplained`.
Both are counted as mismatches of the update sequence (`diff_columns`: `updates`).
"""
from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from backfill.verify.reconcile import MATCH, Comparison, Tolerance

CAUSE = "cache_coalesced"
UPDATES = "updates"  # the pseudo-column a coalesced window differs in


def sequences(compared: DataFrame, backfill: DataFrame, stream: DataFrame, cmp: Comparison) -> DataFrame:
    """The windows reconciled as matches whose stream has fewer rows than the backfill, or other values than its
    own (`_maybe`), with `_coalesced` (a proof that the stream's updates are a subsequence of the backfill's,
    in order, the last equal), `_bf_updates` and `_stream_updates` (how many each side has)."""
    keys = list(cmp.keys)
    wanted = compared.where((F.col("category") == MATCH) & (F.col("_maybe") | (F.col("_rows") < F.col("_lrows"))))
    wanted = F.broadcast(wanted.select(*keys).localCheckpoint())

    names = [f"_c{i}" for i in range(len(cmp.columns))]  # positional: a column name may be any identifier

    def listed(df: DataFrame, order: tuple[str, ...], name: str) -> DataFrame:
        row = F.struct(*[F.col(c) for c in order], *[F.col(c).alias(n) for c, n in zip(cmp.columns, names)])
        values = F.transform(F.array_sort(F.collect_list(row)), lambda r: F.struct(*[r[n] for n in names]))
        return df.join(wanted, keys, "left_semi").groupBy(*keys).agg(values.alias(name))

    types = {f.name: f.dataType for f in backfill.schema.fields}
    stream = stream.select(*keys, *cmp.right_order, *[F.col(c).cast(types[c]).alias(c) for c in cmp.columns])
    both = listed(backfill, cmp.left_order, "_bf").join(listed(stream, cmp.right_order, "_st"), keys)
    # greedy leftmost matching: the position in the backfill's updates after each stream update (-1: none left)
    equal = " AND ".join(_equal(f"_bf[j - 1].{n}", f"h.{n}", cmp.tolerances.get(c, Tolerance()))
                         for c, n in zip(cmp.columns, names)) or "true"
    first = f"array_min(filter(sequence(cast(at + 1 as int), size(_bf)), j -> {equal}))"
    step = F.expr(f"aggregate(_st, 0, (at, h) -> CASE WHEN at < 0 OR at >= size(_bf) THEN -1 "
                  f"ELSE coalesce({first}, -1) END)")
    matched = F.when(F.size("_st") == 0, F.lit(False)).otherwise(step >= 0)
    last = F.expr("size(_bf) > 0 AND size(_st) > 0 AND "
                  + " AND ".join(_equal(f"element_at(_bf, -1).{n}", f"element_at(_st, -1).{n}",
                                        cmp.tolerances.get(c, Tolerance())) for c, n in zip(cmp.columns, names)))
    return both.select(*keys, (matched & last & (F.size("_st") < F.size("_bf"))).alias("_coalesced"),
                       F.size("_bf").alias("_bf_updates"), F.size("_st").alias("_stream_updates"))


def _equal(ours: str, theirs: str, tol: Tolerance) -> str:
    """SQL: equal values, null-safe; numbers within the column's tolerance (|a - b| <= abs + rel * |b|)."""
    if not tol.abs and not tol.rel:
        return f"({ours} <=> {theirs})"
    near = f"abs({ours} - {theirs}) <= {tol.abs!r} + {tol.rel!r} * abs({theirs})"
    return f"(({ours} IS NULL AND {theirs} IS NULL) OR coalesce({near}, false))"


def detail(coalesced: Column) -> Column:
    """What the evidence shows, per window."""
    return F.when(coalesced, F.format_string(
        "the stream wrote %d of the backfill's %d updates of this window, each equal to one of them, in order, the "
        "last equal to its last: what the record cache's flushes forward", F.col("_stream_updates"),
        F.col("_bf_updates"))).otherwise(F.format_string(
            "the stream's %d updates of this window are not a subsequence of the backfill's %d (an update the "
            "backfill never produced here, or out of order), though the last values match",
            F.col("_stream_updates"), F.col("_bf_updates")))
