"""Part: verify. Why a window differs, from evidence only (docs/semantics.md §8): the attribution; what is read
as evidence is verify/evidence.py.

Evidence: the backfill's ledger (late drops), the input records re-assigned to windows with the
engine's own TimeWindows (and their stream time at arrival, docs/semantics.md §4.2), the input's
offsets (gaps, where reading started), each task's stream time at the end of the data (windows not
closed), and the stream's exact repeats. A cause is named only when the evidence shows it:

- duplicate_delivery: the extra rows of a window are exact copies (at-least-once, docs/semantics.md §9).
- late_drop_differs: recomputing the window with the k records the backfill dropped as late added
  (the stream accepted them), or with the k accepted records that arrived behind stream time removed
  (the stream dropped them), gives the stream's value exactly; those records are shown.
- tie_order: only order-sensitive columns differ, the window holds records with equal timestamps, and they
  came through a repartition topic, whose interleaving is modelled, not known (docs/semantics.md §8). A
  partition's own records are taken in offset order, equal timestamps or not.
- range_boundary: a window the stream has was not closed by the end of the data read, or starts before the
  first record read of a partition that was read from a later offset (the stream read on, or from earlier);
  or the window straddles a bound of the stream's output that the evidence shows: the run's declared range,
  or where the stream's output of the window's task evidently starts or ends (verify/bounds.py). A window the
  stream lacks is never put down to the data read, nor to a bound the stream evidently went past.
- missing_input: the key's partition has an offset gap while the window was open (docs/semantics.md §8).
- reprocessed_after_restart, state_lost_on_restore, reemitted, stale_after_restart: what a restart of an
  at-least-once application did, in a task with evidence of a restart (verify/restarts.py, docs/semantics.md §9).
- session_merge_differs (session windows): a session of one side overlaps, within a gap, a different
  session of the same key on the other side: the records were merged differently (their processing order,
  or what the store still held, differed).
- close_mechanism_differs (emit: final, sliding and session windows): the operator recomputed with the other
  final mechanism (`close`) reproduces the stream's window (verify/mechanism.py).
- cache_coalesced (emit: updates, `cache: on`): the stream's updates of the window are a coalescing of the
  backfill's: each equals one of its updates, in order, and the last equals its last (verify/cache.py).
- unexplained: none of the above: a real logic difference.

Sliding and session windows (`attribute_by_bounds`) get the causes their outputs alone can show:
duplicate_delivery, session_merge_differs, range_boundary, and missing_input from the input's offset gaps (the
run's gap record, docs/semantics.md §7.4, when it stands for the input); and late_drop_differs where the
window recomputed over the records the backfill accepted for it gives the backfill's value and, with k late
drops added (or k records accepted behind stream time removed), the stream's; tie_order as for time windows;
and, in a task with evidence of a restart, reprocessed_after_restart and state_lost_on_restore proved the same
way as for time windows over the records inside the window's bounds (a window whose bounds both sides share),
reemitted for a window emitted again that closed after the restart point, and for a session only the stream has
(suppress) state_lost_on_restore or stale_after_restart when the key's records within its bounds from the
restart point on, or before it, reproduce it exactly (docs/semantics.md §9.5).
"""
from __future__ import annotations

from typing import Any

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from backfill.jobspec.fields import FOLD_FIELDS
from backfill.ops.expressions import CompiledAggregation, compile_aggregations
from backfill.ops.windows import SessionWindows, SlidingWindows, TimeWindows
from backfill.jobspec.models import OperatorSpec
from backfill.verify import bounds, restarts
from backfill.verify.catalogue import first_match
from backfill.verify.evidence import (DERIVED_GAPS, MAX_VARIANT, Evidence, RestartEvidence, bounded_members,
                                      distinct_keys, few, members, variants)
from backfill.verify.reconcile import MATCH, MISMATCH, Comparison, Tolerance


def recompute(rows: DataFrame, aggs: list[CompiledAggregation], group: list[str]) -> DataFrame:
    """The job's aggregations over `rows`, grouped (folds in offset order = processing order within a partition)."""
    fields = ", ".join(FOLD_FIELDS)
    by_seq = "(l, r) -> CASE WHEN l.seq < r.seq THEN -1 WHEN l.seq > r.seq THEN 1 ELSE 0 END"
    ordered = f"array_sort(collect_list(struct({fields})), {by_seq})"
    cols = [(a.fold_over(ordered) if a.is_fold else a.aggregate()).alias(a.name) for a in aggs]
    if "seq" not in rows.columns:
        rows = rows.withColumn("seq", F.col("offset"))
    return (rows.groupBy(*group).agg(*cols, F.max("ts").alias("ts"), F.count(F.lit(1)).alias("_n")))


def reproducing(rows: DataFrame, nonmatch: DataFrame, aggs: list[CompiledAggregation], cmp: Comparison,
                windows: TimeWindows | None, side: str = "r", group: tuple[str, ...] = ("variant",)) -> DataFrame:
    """The (key, window_start, *group) whose recomputation over `rows` gives the value of `side` exactly (r: the
    stream's, l: the backfill's). `windows`: time windows, whose end follows from their start; None: windows
    whose end is a key (sliding, session)."""
    from datacompy.spark import columns_equal

    values = recompute(rows, aggs, ["key", "window_start", *group])
    if windows is not None:
        values = values.withColumn("window_end", F.col("window_start") + F.lit(windows.size))
    compared = [c for c in cmp.columns if c in values.columns]
    present = "_in_stream" if side == "r" else "_in_backfill"
    other = nonmatch.where(F.col(present)).select("key", "window_start", *[f"{side}_{c}" for c in compared])
    mine = "l" if side == "r" else "r"
    joined = values.select("key", "window_start", *group, *[F.col(c).alias(f"{mine}_{c}") for c in compared]) \
        .join(other, ["key", "window_start"])
    ok = F.lit(True)
    for c in compared:
        tol = cmp.tolerances.get(c, Tolerance())
        ok = ok & F.coalesce(columns_equal(joined, f"l_{c}", f"r_{c}", rel_tol=tol.rel, abs_tol=tol.abs), F.lit(False))
    return joined.where(ok).select("key", "window_start", *group)


def late_variants(mem: DataFrame, nonmatch: DataFrame, aggs: list[CompiledAggregation], cmp: Comparison,
                  windows: TimeWindows | None) -> DataFrame:
    """Per window, the smallest variant that gives the stream's value exactly: (key, window_start, variant)."""
    found = reproducing(variants(mem), nonmatch, aggs, cmp, windows)
    # removing every accepted record (all arrived behind stream time) leaves no window: the stream has none
    counts = mem.groupBy("key", "window_start").agg(
        F.count(F.when(F.col("status") == "accepted", 1)).alias("_acc"),
        F.count(F.when((F.col("status") == "accepted") & (F.col("st") > F.col("ts")), 1)).alias("_beh"))
    absent = (counts.join(nonmatch.where(~F.col("_in_stream")).select("key", "window_start"), ["key", "window_start"])
              .where((F.col("_acc") > 0) & (F.col("_acc") == F.col("_beh")) & (F.col("_acc") <= MAX_VARIANT))
              .select("key", "window_start", (-F.col("_acc")).cast("int").alias("variant")))
    # fewest records first; on a tie, the stream accepting drops (+k) before the stream dropping (-k)
    return found.unionByName(absent).groupBy("key", "window_start").agg(
        F.min_by("variant", F.struct(F.abs("variant"), -F.col("variant"))).alias("variant"))


def variant_records(mem: DataFrame, best: DataFrame) -> DataFrame:
    """The records a chosen variant added (+k: late drops) or removed (-k: accepted behind stream time)."""
    per_window = Window.partitionBy("key", "window_start")
    ranked = (mem.withColumn("_rank_late", F.when(F.col("status") == "late", F.row_number().over(
        per_window.orderBy(F.col("status").desc(), "st", "offset"))))
        .withColumn("_rank_behind", F.when((F.col("status") == "accepted") & (F.col("st") > F.col("ts")),
                                           F.row_number().over(per_window.orderBy(
                                               ((F.col("status") == "accepted") & (F.col("st") > F.col("ts"))).desc(),
                                               F.col("st").desc(), F.col("offset").desc())))))
    chosen = ranked.join(best, ["key", "window_start"]).where(
        ((F.col("variant") > 0) & (F.col("_rank_late") <= F.col("variant")))
        | ((F.col("variant") < 0) & (F.col("_rank_behind") <= -F.col("variant"))))
    record = F.struct("partition", "offset", "ts", "st", "status")
    return chosen.groupBy("key", "window_start").agg(F.sort_array(F.collect_list(record)).alias("records"))


def attribute(result: DataFrame, cmp: Comparison, op: OperatorSpec, ev: Evidence, written: bounds.Written,
              restart: RestartEvidence | None = None) -> tuple[DataFrame, list[dict[str, Any]]]:
    """Non-matching rows with `cause`, `detail` and `records` (the input records that show the cause), and
    the restarts found (one entry per restarted task, verify/restarts.py `incidents`)."""
    assert op.aggregate is not None
    windows = TimeWindows.of(op.aggregate.window)
    aggs = compile_aggregations(op.aggregate.aggregations, f"operators.{op.name}.aggregate")
    nonmatch = (result.where(F.col("category") != MATCH)
                .withColumn("_in_stream", F.col("category") != cmp.label("missing"))
                .withColumn("_in_backfill", F.col("category") != cmp.label("extra"))
                .persist(StorageLevel.MEMORY_AND_DISK))
    try:
        n = nonmatch.count()
        mem = members(ev, windows, nonmatch.where(F.col("category") != cmp.label("duplicate")), n) \
            .persist(StorageLevel.MEMORY_AND_DISK)
        best = late_variants(mem, nonmatch, aggs, cmp, windows).localCheckpoint()  # one row per window, read thrice
        shown = variant_records(mem, best)
        # a task takes one partition in offset order, so records of equal timestamps keep their order; only a
        # repartition topic's interleaving is modelled, not known (docs/semantics.md §8)
        ties = mem.where(F.col("status") == "accepted").groupBy("key", "window_start").agg(
            ((F.count("ts") > F.countDistinct("ts")) & F.lit(op.aggregate.group_by is not None)).alias("_ties"))
        key_parts = ev.records.join(few(nonmatch.select("key").distinct(), n), "key", "left_semi") \
            .groupBy("key").agg(F.collect_set("partition").alias("_parts"))
        # the non-matching rows are few: stored once computed, later steps do not compute the variants again
        out = (nonmatch.join(best, ["key", "window_start"], "left").join(shown, ["key", "window_start"], "left")
               .join(ties, ["key", "window_start"], "left").join(key_parts, "key", "left")).localCheckpoint()
        out = out.withColumn("_task", F.when(F.size("_parts") == 1, F.col("_parts")[0]))
        points = _restart_points(ev, restart)
        out = _with_restarts(out, mem, nonmatch, best, points, ev, aggs, cmp, windows)
        parts = ev.partitions.collect()  # one row per input partition
        out = _with_boundaries(out, parts, windows, written, cmp)
        out = _with_gaps(out, ev, parts, windows)
        order_sensitive = [a.name for a in aggs if a.order_sensitive]
        attributed = _assign(out, cmp, windows, order_sensitive).persist(StorageLevel.MEMORY_AND_DISK)
        attributed.count()  # materialise while the inputs are cached
        found = restarts.incidents(attributed, points, ev.records) if points else []
        mem.unpersist()
        return attributed, found
    finally:
        nonmatch.unpersist()


def _restart_points(ev: Evidence, restart: RestartEvidence | None) -> dict[int, int | None]:
    """Per input partition with evidence of a restart: the committed offset, or None (to be inferred)."""
    if restart is None:
        return {}
    if restart.commits is not None:
        return {int(p): int(o) for p, o in restart.commits.items()}
    if restart.changed is None:
        return {}
    return {r["partition"]: None for r in ev.records.join(distinct_keys(restart.changed), "key", "left_semi")
            .select("partition").distinct().collect()}


def _with_restarts(out: DataFrame, mem: DataFrame, nonmatch: DataFrame, late: DataFrame,
                   points: dict[int, int | None], ev: Evidence, aggs: list[CompiledAggregation], cmp: Comparison,
                   windows: TimeWindows) -> DataFrame:
    """`restart_variant`, `restart_records`, `restart_from`/`restart_to` (a run applied twice or the records
    counted alone), and `_reemit`/`closed_at` for repeated emissions of windows closed after the restart."""
    empty = {"restart_variant": "long", "restart_records": "array<struct<partition:int,offset:long,ts:long,"
             "st:long,status:string>>", "restart_n": "long", "restart_from": "long", "restart_to": "long",
             "closed_at": "long"}
    if not points:
        for name, kind in empty.items():
            out = out.withColumn(name, F.lit(None).cast(kind))
        return out.withColumn("_reemit", F.lit(False)).withColumn("_restart_at", F.lit(None).cast("long"))
    # a window the stream's accepting late records explains is not searched; one explained by records dropped is
    # (a restart proven there explains it better, `_assign`)
    open_ = mem.join(late.where(F.col("variant") > 0).select("key", "window_start"), ["key", "window_start"],
                     "left_anti")
    rows = restarts.variants(open_, points)
    chosen = restarts.choose(reproducing(rows, nonmatch, aggs, cmp, windows))
    shown = restarts.variant_records(mem, chosen)
    out = out.join(chosen, ["key", "window_start"], "left").join(shown, ["key", "window_start"], "left") \
        .localCheckpoint()  # few rows; read twice
    return _reemissions(out, points, cmp, ev, windows.close(F.col("window_start")), strict=False)


def _reemissions(out: DataFrame, points: dict[int, int | None], cmp: Comparison, ev: Evidence, close: Column,
                 strict: bool) -> DataFrame:
    """`out` (with `restart_variant`, `restart_from`) with each task's restart point `_restart_at` (its
    committed offset, else the earliest record a proven variant applied twice), and, for a window the stream
    has more often, the offset its task's stream time reached its `close` at (`closed_at`; `strict`: passed it)
    and `_reemit`: that was at or after the restart point, so a restored buffer emitted it again."""
    twice = F.floor(F.col("restart_variant") / 10**6) == restarts.DOUBLE
    inferred = {r["_task"]: r["at"] for r in out.where(twice).groupBy("_task").agg(
        F.min("restart_from").alias("at")).collect()} if any(o is None for o in points.values()) else {}
    at = {p: (o if o is not None else inferred.get(p)) for p, o in points.items()}
    known = {p: o for p, o in at.items() if o is not None}
    if not known:
        return out.withColumn("closed_at", F.lit(None).cast("long")).withColumn("_reemit", F.lit(False)) \
            .withColumn("_restart_at", F.lit(None).cast("long"))
    at_map = F.create_map(*[x for p, o in known.items() for x in (F.lit(p), F.lit(o))])
    repeated = out.where((F.col("category") == cmp.label("duplicate")) & F.col("_task").isin(list(known))) \
        .select("key", "window_start", F.col("_task").alias("partition"), close.alias("_close"))
    closed = restarts.first_reaching(ev.records, repeated, strict)
    out = out.join(closed, ["key", "window_start"], "left").withColumn("_restart_at", at_map[F.col("_task")])
    return out.withColumn("_reemit", F.coalesce(F.col("closed_at") >= F.col("_restart_at"), F.lit(False)))


def _with_boundaries(out: DataFrame, parts: list[Any], windows: TimeWindows, written: bounds.Written,
                     cmp: Comparison) -> DataFrame:
    """`_end_open` / `_start_open` (window incomplete in the data read, for a window the stream has) and
    `_bound` (a bound of the stream's output the window straddles, verify/bounds.py)."""
    end_st = {r["partition"]: r["end_st"] for r in parts}
    late_start = {r["partition"]: r["first_ts"] for r in parts if (r["first_offset"] or 0) > 0}
    closes = windows.close(F.col("window_start"))
    known = F.col("_parts").isNotNull()
    if end_st:
        # the key's own partitions; a key never read is open only if it is open in every partition
        end_map = F.create_map(*[x for p, st in end_st.items() for x in (F.lit(p), F.lit(st if st is not None else -1))])
        own_open = F.exists("_parts", lambda p: F.coalesce(end_map[p], F.lit(-1)) < closes)
        every_open = F.lit(max(v if v is not None else -1 for v in end_st.values())) < closes
        end_open = F.when(known, own_open).otherwise(every_open)
    else:
        end_open = F.lit(True)
    if late_start:
        start_map = F.create_map(*[x for p, ts in late_start.items() for x in (F.lit(p), F.lit(ts))])
        own_start = F.exists("_parts", lambda p: F.col("window_start") <= F.coalesce(start_map[p], F.lit(-1)))
        any_start = F.lit(max(late_start.values())) >= F.col("window_start")
        start_open = F.when(known, own_start).otherwise(any_start)
    else:
        start_open = F.lit(False)
    missing = cmp.label("missing")
    out = (out.withColumn("_end_open", bounds.in_data_read(end_open, F.col("category"), missing))
           .withColumn("_start_open", bounds.in_data_read(start_open, F.col("category"), missing)))
    span = (F.col("window_start"), F.col("window_start") + F.lit(windows.size))
    return bounds.straddled(out, written, F.col("window_start"), span, closes)


def _with_gaps(out: DataFrame, ev: Evidence, parts: list[Any], windows: TimeWindows) -> DataFrame:
    """`_gap`: an offset gap in the key's partition (any partition for a key never read) while the window was open."""
    gaps = _gap_rows(ev, parts)
    if not gaps:
        return out.withColumn("_gap", F.lit(None).cast("string"))
    hits = []
    for g in gaps:
        lo = g["st_before"] if g["st_before"] is not None else -1
        hi = max(lo, g["ts_after"] if g["ts_after"] is not None else lo)
        in_partition = F.when(F.col("_parts").isNotNull(), F.array_contains("_parts", g["partition"])).otherwise(True)
        # a record lost there could only join windows still open then (end + G > ST) starting by the next record
        open_then = windows.accepts(F.col("window_start"), F.lit(lo)) & (F.col("window_start") <= F.lit(hi))
        text = f"partition {g['partition']} offsets {g['gap_from']}-{g['gap_to']} are missing in the input"
        hits.append(F.when(in_partition & open_then, F.lit(text)))
    return out.withColumn("_gap", F.coalesce(*hits))


def _gap_rows(ev: Evidence, parts: list[Any]) -> list[Any]:
    """The evidence's gaps, collected: only partitions whose offsets are not dense need the offset-ordered pass
    that finds them again; a run's gap record is read as it is."""
    if ev.gaps_from != DERIVED_GAPS:
        return ev.gaps.collect()
    gapped = [r["partition"] for r in parts if not r["dense"]]
    return ev.gaps.where(F.col("partition").isin(gapped)).collect() if gapped else []


def _bounds_gaps(out: DataFrame, ev: Evidence, rule: SessionWindows | SlidingWindows, end: Column) -> DataFrame:
    """`_gap` for sliding and session windows: an offset gap in the key's partition while the window could still
    take a record (stream time had not passed its close) and could hold one from the gap (a record at t is in
    sliding windows starting by t + 1, merges sessions starting by t + gap)."""
    reach = rule.gap if isinstance(rule, SessionWindows) else 1
    hits = []
    for g in _gap_rows(ev, ev.partitions.collect()):
        lo = g["st_before"] if g["st_before"] is not None else -1
        hi = max(lo, g["ts_after"] if g["ts_after"] is not None else lo)
        in_partition = F.when(F.col("_parts").isNotNull(), F.array_contains("_parts", g["partition"])).otherwise(True)
        open_then = ~rule.closed(end, F.lit(lo)) & (F.col("window_start") <= F.lit(hi + reach))
        text = f"partition {g['partition']} offsets {g['gap_from']}-{g['gap_to']} are missing in the input"
        hits.append(F.when(in_partition & open_then, F.lit(text)))
    return out.withColumn("_gap", F.coalesce(*hits) if hits else F.lit(None).cast("string"))


def _assign(out: DataFrame, cmp: Comparison, windows: TimeWindows, order_sensitive: list[str]) -> DataFrame:
    """One cause per row, strongest evidence first; `detail` says what the evidence was."""
    dup, missing = cmp.label("duplicate"), cmp.label("missing")
    only_order = _only_order(order_sensitive, F.col("_ties"))
    late_detail = _late_detail()
    # a restart cause yields to tie order and to a window incomplete in the data read (a chance match of a
    # recomputation there proves nothing)
    boundary = F.col("_end_open") | F.col("_start_open") | F.col(bounds.BOUND).isNotNull()
    kind = F.when(~only_order & ~boundary, F.floor(F.col("restart_variant") / 10**6))
    # records the backfill accepted behind stream time that the stream dropped: a restart explains the same value
    # better where one is proven (a restarted task's stream time starts over lower; it drops fewer, never more)
    late = F.col("variant").isNotNull() & ~((F.col("variant") < 0) & kind.isNotNull())
    cause, detail = first_match([
        ((F.col("category") == dup) & F.col("_reemit"), "reemitted", _reemit_detail("suppress's buffer")),
        *repeats(cmp),
        (late, "late_drop_differs", late_detail),
        (kind == restarts.DOUBLE, "reprocessed_after_restart", _double_detail()),
        (kind == restarts.SUFFIX, "state_lost_on_restore", _suffix_detail()),
        (only_order, "tie_order", _tie_detail()),
        (F.col("_end_open"), "range_boundary", "window not closed by the end of the data read "
                                               "(stream time < window end + grace)"),
        (F.col("_start_open"), "range_boundary", "window starts before the first record read of a partition read "
                                                 "from a later offset"),
        (F.col(bounds.BOUND).isNotNull(), "range_boundary", F.col(bounds.BOUND)),
        (F.col("_gap").isNotNull(), "missing_input", F.col("_gap")),
        (F.col("category") == missing, "unexplained", "no evidence why the stream lacks this window"),
        (None, "unexplained", "no evidence: a logic difference")])
    keep = [c for c in out.columns if not c.startswith("_") or c in ("_rows", "_copies", "_extra", "_task",
                                                                      "_restart_at")]
    records = (F.when(F.col("cause") == "late_drop_differs", F.col("records"))
               .when(F.col("cause").isin("reprocessed_after_restart", "state_lost_on_restore"),
                     F.col("restart_records")))
    dropped = ("variant", "restart_variant", "restart_records", "records")
    return out.withColumn("cause", cause).withColumn("detail", detail).withColumn("records", records).select(
        *[c for c in keep if c not in dropped], "records", "cause", "detail")


def _reemit_detail(buffer: str) -> Column:
    """A window emitted again after a restart: where it closed, against the task's restart point."""
    return F.format_string(
        "emitted %d times: the window closed at partition %d offset %d, after the restart point (offset %s), so "
        f"{buffer}, restored as it was at the last commit, emitted it again; a compacted table keeps the last "
        "emission, which is right", F.col("_rows"), F.col("_task"), F.col("closed_at"),
        F.coalesce(F.col("_restart_at").cast("string"), F.lit("?")))


def _double_detail() -> Column:
    return F.format_string(
        "%d record(s) of this window (partition %d offsets %d-%d, from the restart on) were applied twice: the "
        "store restored after the restart already held them and they were processed again; %s",
        F.col("restart_n"), F.col("_task"), F.col("restart_from"), F.col("restart_to"), _kept())


def _suffix_detail() -> Column:
    return F.format_string(
        "the stream's value is the aggregate of the window's last %d record(s) alone (partition %d offsets "
        "%d-%d): the window had expired in the store restored after the restart, so each record was "
        "aggregated from the initializer and not stored; %s", F.col("restart_n"), F.col("_task"),
        F.col("restart_from"), F.col("restart_to"), _kept())


def _only_order(order_sensitive: list[str], ties: Column) -> Column:
    """A mismatch in the `order_sensitive` columns only, of a window holding records of equal timestamps whose
    order is not knowable (`ties`)."""
    return (F.col("category") == MISMATCH) & F.coalesce(ties, F.lit(False)) & F.forall(
        "diff_columns", lambda c: F.array_contains(F.array(*[F.lit(n) for n in order_sensitive] or [F.lit("")]), c))


def _tie_detail() -> Column:
    return F.concat(F.lit("only order-sensitive columns differ ("), F.array_join("diff_columns", ", "),
                    F.lit("); records with equal timestamps: their order is not knowable"))


def _late_detail() -> Column:
    """What a late-drop variant (`variant`: +k records added, -k removed) shows."""
    return F.when(F.col("variant") > 0, F.format_string(
        "the stream accepted %d record(s) the backfill dropped as late", F.col("variant"))).otherwise(
        F.format_string("the stream dropped %d record(s) the backfill accepted behind stream time", -F.col("variant")))


RECORDS = "array<struct<partition:int,offset:long,ts:long,st:long,status:string>>"


def _late_by_bounds(out: DataFrame, nonmatch: DataFrame, ev: Evidence, op: OperatorSpec, cmp: Comparison,
                    aggs: list[CompiledAggregation], session: bool, end: Column) -> DataFrame:
    """`out` with `variant` and `records` where a mismatching sliding or session window is a late drop that
    differs (docs/semantics.md §10.2, §11.2): recomputed over the records the backfill accepted for it, the
    window gives the backfill's value (so the recomputation stands for the operator's own; a window whose
    members the store's history shaped otherwise, §10.3, is left alone), and with the k records the backfill
    dropped as late added, or the k it accepted behind stream time removed, the stream's value exactly."""
    none = (out.withColumn("variant", F.lit(None).cast("int")).withColumn("records", F.lit(None).cast(RECORDS))
            .withColumn("_ties", F.lit(False)))
    if not ev.ledger_read:
        return none
    both = nonmatch.where(F.col("category") == MISMATCH)
    if "window_end" not in both.columns:  # a sliding window's end is a value column (l_/r_): the same both sides
        both = both.withColumn("window_end", end)
    both = both.withColumn("_in_stream", F.lit(True)).withColumn("_in_backfill", F.lit(True))
    n = both.count()
    if not n:
        return none
    assert op.aggregate is not None
    mem = bounded_members(ev, both, n, session).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        accepted = mem.where(F.col("status") == "accepted").withColumn("_base", F.lit(0))
        standing = reproducing(accepted, both, aggs, cmp, None, side="l", group=("_base",))
        best = late_variants(mem, both, aggs, cmp, None).join(standing.select("key", "window_start"),
                                                              ["key", "window_start"], "left_semi")
        found = best.join(variant_records(mem, best), ["key", "window_start"])
        # records of equal timestamps that came through a repartition topic: their order is modelled, not known
        ties = accepted.groupBy("key", "window_start").agg(
            ((F.count("ts") > F.countDistinct("ts")) & F.lit(op.aggregate.group_by is not None)).alias("_ties"))
        return (out.join(found, ["key", "window_start"], "left").join(ties, ["key", "window_start"], "left")
                .withColumn("records", F.col("records").cast(RECORDS))
                .withColumn("_ties", F.coalesce(F.col("_ties"), F.lit(False))).localCheckpoint())
    finally:
        mem.unpersist()


def repeats(cmp: Comparison) -> list[tuple[Column, str, Column]]:
    """The first causes of a window the stream has more often: exact copies, else unexplained."""
    dup = F.col("category") == cmp.label("duplicate")
    detail = F.format_string("%d rows for this window, %d exact copies", F.col("_rows"), F.col("_copies"))
    return [(dup & (F.col("_copies") >= F.col("_extra")), "duplicate_delivery", detail), (dup, "unexplained", detail)]


def _no_restart_proof() -> list[Column]:
    """The restart proof columns (verify/restarts.py), empty: causes found without restart evidence."""
    return [*[F.lit(None).cast("long").alias(c) for c in ("restart_n", "restart_from", "restart_to", "closed_at")],
            F.lit(None).cast("long").alias("_restart_at")]


def attribute_outputs_only(result: DataFrame, cmp: Comparison) -> DataFrame:
    """Non-matching rows of an operator whose input is not read (it reads another operator's rows, a chain):
    `duplicate_delivery` where the extra rows are exact copies, `unexplained` for the rest (no evidence)."""
    cause, detail = first_match([
        *repeats(cmp),
        (None, "unexplained", "no evidence: the operator's input is another operator's rows, which verify does "
                              "not read")])
    nonmatch = result.where(F.col("category") != MATCH)
    keep = [c for c in nonmatch.columns if not c.startswith("_") or c in ("_rows", "_copies", "_extra")]
    return nonmatch.select(*keep, *_no_restart_proof(), F.lit(None).cast("int").alias("_task"),
                           F.lit(None).cast(RECORDS).alias("records"), cause.alias("cause"), detail.alias("detail"))


def _kept() -> Column:
    """What a compacted table of the stream's output holds for the window."""
    return F.when(F.col("_rows") > 1, F.format_string(
        "emitted %d times, a compacted table keeps the last, which is wrong", F.col("_rows"))).otherwise(
        F.lit("emitted once, wrong"))


def attribute_by_bounds(result: DataFrame, cmp: Comparison, op: OperatorSpec, ev: Evidence,
                        written: bounds.Written, restart: RestartEvidence | None = None
                        ) -> tuple[DataFrame, list[dict[str, Any]]]:
    """Sliding and session windows: non-matching rows with `cause` and `detail` from the outputs, each
    partition's stream time at the end of the data and the input records inside each window's bounds
    (docs/semantics.md §10, §11), and the restarts found (verify/restarts.py `incidents`)."""
    assert op.aggregate is not None
    w = op.aggregate.window
    session = w.type == "session"
    rule = SessionWindows.of(w) if session else SlidingWindows.of(w)
    gap = rule.gap if isinstance(rule, SessionWindows) else 0
    nonmatch = result.where(F.col("category") != MATCH)
    missing, extra = cmp.label("missing"), cmp.label("extra")
    parts = ev.records.join(distinct_keys(nonmatch), "key", "left_semi").groupBy("key").agg(
        F.collect_set("partition").alias("_parts"))
    out = nonmatch.join(parts, "key", "left").withColumn(
        "_task", F.when(F.size("_parts") == 1, F.col("_parts")[0]).cast("int"))
    out = out.join(ev.partitions.select(F.col("partition").alias("_task"), "end_st"), "_task", "left")
    # still open at the end of the data read: emit-on-close emits once stream time passed the window's close,
    # suppress once it reached it (docs/semantics.md §10.4, §11.5)
    end = F.col("window_end") if "window_end" in cmp.keys else \
        F.coalesce(F.col("l_window_end"), F.col("r_window_end"), F.col("window_start"))
    suppress = op.aggregate.emit == "final" and op.aggregate.close_mechanism == "suppress"
    closes = rule.close(end)
    open_ = bounds.in_data_read(F.coalesce(~(rule.reached if suppress else rule.closed)(end, F.col("end_st")),
                                           F.lit(False)), F.col("category"), missing)
    if session:  # a session missing on one side that overlaps another of the same key on the other side
        lonely = out.where(F.col("category").isin(missing, extra)).select(
            "key", "window_start", "window_end", "category")
        other = lonely.select("key", F.col("window_start").alias("_os"), F.col("window_end").alias("_oe"),
                              F.col("category").alias("_oc"))
        near = (lonely.join(other, "key").where(
            (F.col("_oc") != F.col("category")) & (F.col("_os") <= F.col("window_end") + F.lit(gap))
            & (F.col("window_start") <= F.col("_oe") + F.lit(gap)))
            .groupBy("key", "window_start", "window_end").agg(
                F.min(F.format_string("[%d, %d]", F.col("_os"), F.col("_oe"))).alias("_other")))
        out = out.join(near, ["key", "window_start", "window_end"], "left")
    else:
        out = out.withColumn("_other", F.lit(None).cast("string"))
    out = _bounds_gaps(out, ev, rule, end)
    aggs = compile_aggregations(op.aggregate.aggregations, f"operators.{op.name}.aggregate", session=session)
    out = _late_by_bounds(out, nonmatch, ev, op, cmp, aggs, session, end)
    points = _restart_points(ev, restart)
    out = _restarts_by_bounds(out, ev, op, cmp, aggs, session, end, points, closes)
    out = bounds.straddled(out, written, F.col("window_start"), (F.col("window_start"), end + F.lit(1)), closes)
    outside = F.col(bounds.BOUND).isNotNull()
    side = F.when(F.col("category") == missing, F.lit("stream")).otherwise(F.lit("backfill"))
    other, gap = F.col("_other").isNotNull(), F.col("_gap").isNotNull()
    # as for time windows (`_assign`): a restart cause yields to tie order and to a window open at the end of the
    # data read; the stream dropping records the backfill accepted behind stream time yields to a proven restart
    only_order = _only_order([a.name for a in aggs if a.order_sensitive], F.col("_ties"))
    kind = F.when(~only_order & ~open_, F.floor(F.col("restart_variant") / 10**6))
    late = F.col("variant").isNotNull() & ~((F.col("variant") < 0) & kind.isNotNull())
    cause, detail = first_match([
        ((F.col("category") == cmp.label("duplicate")) & F.col("_reemit"), "reemitted", _reemit_detail(
            "suppress's buffer" if suppress else "the window store")),
        *repeats(cmp),
        (late, "late_drop_differs", _late_detail()),
        (kind == restarts.DOUBLE, "reprocessed_after_restart", _double_detail()),
        (kind == restarts.SUFFIX, "state_lost_on_restore", _suffix_detail()),
        (F.col("_lost"), "state_lost_on_restore", F.format_string(
            "a session of the records from the restart point on alone (partition %d offset %d): they span exactly "
            "its bounds and give the stream's values; the session they belonged to had expired in the store "
            "restored after the restart, so they formed a new one", F.col("_task"), F.col("_restart_at"))),
        (F.col("_stale"), "stale_after_restart", F.format_string(
            "the session as it stood at the restart point (partition %d offset %d): its records read before it "
            "span exactly its bounds and give the stream's values; suppress's buffer, restored as of the last "
            "commit, still held it after the records that followed extended or merged it", F.col("_task"),
            F.col("_restart_at"))),
        (only_order, "tie_order", _tie_detail()),
        (other & gap, "missing_input", F.concat(
            F.col("_gap"), F.lit(": the records lost there may have merged this key's sessions otherwise"))),
        (other, "session_merge_differs", F.format_string(
            "the %s has the session %s of this key instead: the records merged differently (their processing "
            "order, or what the session store still held, differed)", side, F.col("_other"))),
        (open_, "range_boundary", f"window not closed by the end of the data read (stream time "
                                  f"{'<' if suppress else '<='} window end + grace" + (" + gap)" if session else ")")),
        (outside, "range_boundary", F.col(bounds.BOUND)),
        (gap, "missing_input", F.col("_gap")),
        (F.col("category") == missing, "unexplained", "no evidence why the stream lacks this window"),
        (None, "unexplained", "no evidence: a logic difference")])
    keep = [c for c in out.columns if (not c.startswith("_") or c in ("_rows", "_copies", "_extra", "_task",
                                                                       "_restart_at"))
            and c not in ("variant", "records", "restart_variant", "restart_records")]
    records = (F.when(cause == "late_drop_differs", F.col("records"))
               .when(cause.isin("reprocessed_after_restart", "state_lost_on_restore"), F.col("restart_records")))
    attributed = out.select(*keep, records.cast(RECORDS).alias("records"), cause.alias("cause"),
                            detail.alias("detail")).persist(StorageLevel.MEMORY_AND_DISK)
    found = restarts.incidents(attributed, points, ev.records) if points else []
    return attributed, found


def _restarts_by_bounds(out: DataFrame, ev: Evidence, op: OperatorSpec, cmp: Comparison,
                        aggs: list[CompiledAggregation], session: bool, end: Column, points: dict[int, int | None],
                        closes: Column) -> DataFrame:
    """`out` with the restart proof of sliding and session windows (docs/semantics.md §9.5): over the key's records
    inside a window's bounds (both sides share them: a mismatch), the run of records from the restart point on
    applied twice, or the last records counted alone, that gives the stream's value exactly; and `_reemit` for a
    window the stream emitted again that closed (`closes`: stream time reached its close, §10.4, §11.5) at or
    after the restart point of its task."""
    none = out
    proof = {"restart_variant": "long", "restart_records": RECORDS, "restart_n": "long", "restart_from": "long",
             "restart_to": "long", "closed_at": "long", "_restart_at": "long"}
    for name, kind in proof.items():
        none = none.withColumn(name, F.lit(None).cast(kind))
    for flag in ("_reemit", "_stale", "_lost"):
        none = none.withColumn(flag, F.lit(False))
    if not points or not ev.ledger_read:
        return none
    both = out.where(F.col("category") == MISMATCH).withColumn("window_end", end) \
        .withColumn("_in_stream", F.lit(True)).withColumn("_in_backfill", F.lit(True))
    # a window a late drop explains (records the stream accepted) is not searched: a restart never adds records
    both = both.where(~F.coalesce(F.col("variant") > 0, F.lit(False))).drop("records", "variant", "_ties")
    n = both.count()
    assert op.aggregate is not None
    suppress = op.aggregate.close_mechanism == "suppress"  # else emitted on close once stream time passed it
    # what else a restart can explain: windows the stream has more often; sessions only the stream has (suppress)
    others = [cmp.label("duplicate"), *([cmp.label("extra")] if session and suppress else [])]
    if not n and not out.where(F.col("category").isin(*others)).count():
        return none
    found = out.select("key", "window_start").limit(0).withColumn("restart_variant", F.lit(None).cast("long"))
    shown = None
    if n:
        mem = bounded_members(ev, both, n, session).persist(StorageLevel.MEMORY_AND_DISK)
        try:
            chosen = restarts.choose(reproducing(restarts.variants(mem, points), both, aggs, cmp, None))
            shown = restarts.variant_records(mem, chosen).localCheckpoint()
            found = chosen.localCheckpoint()
        finally:
            mem.unpersist()
    # a session is (key, start, end): only the mismatch searched takes the proof, not another session of its start
    mismatch = F.lit(MISMATCH).alias("category")
    out = out.join(found.select("*", mismatch), ["key", "window_start", "category"], "left")
    if shown is not None:
        out = out.join(shown.select("*", mismatch), ["key", "window_start", "category"], "left")
    else:
        for name, kind in {"restart_records": RECORDS, "restart_n": "long", "restart_from": "long",
                           "restart_to": "long"}.items():
            out = out.withColumn(name, F.lit(None).cast(kind))
    out = _reemissions(out.localCheckpoint(), points, cmp, ev, closes, not suppress)
    if session and suppress:
        return _stale_sessions(out, ev, cmp, aggs)
    return out.withColumn("_stale", F.lit(False)).withColumn("_lost", F.lit(False))


def _stale_sessions(out: DataFrame, ev: Evidence, cmp: Comparison, aggs: list[CompiledAggregation]) -> DataFrame:
    """Sessions only the stream has, in a task with a known restart point, that are exactly what the restart made
    of the key's accepted records within their bounds (docs/semantics.md §9.5): those records span exactly the
    session's bounds and, recomputed, give the stream's values.

    - `_stale`: the records read before the restart point: the session as it stood then. suppress's buffer was
      restored as of the last commit; the tombstone that retired the session when a later record extended or
      merged it was lost with the crash, so the buffer released it beside the session it had become.
    - `_lost`: the records from the restart point on: the session the replayed records formed on their own, as
      the restored store had expired the session they belonged to (§9.2; its stream time is the newest session
      it holds, its retention gap + grace)."""
    extra = out.where((F.col("category") == cmp.label("extra")) & F.col("_restart_at").isNotNull())
    n = extra.count()
    if not n:
        return out.withColumn("_stale", F.lit(False)).withColumn("_lost", F.lit(False))
    wanted = extra.withColumn("_in_stream", F.lit(True))
    at = wanted.select("key", "window_start", "window_end", "_restart_at")
    mem = (bounded_members(ev, wanted, n, session=True).join(at, ["key", "window_start", "window_end"])
           .where(F.col("status") == "accepted")
           .withColumn("_then", (F.col("offset") >= F.col("_restart_at")).cast("int")))  # 0: before, 1: from on
    spans = mem.groupBy("key", "window_start", "window_end", "_then").agg(F.min("ts").alias("_lo"),
                                                                            F.max("ts").alias("_hi"))
    exact = spans.where((F.col("_lo") == F.col("window_start")) & (F.col("_hi") == F.col("window_end")))
    found = (reproducing(mem, wanted, aggs, cmp, None, side="r", group=("_then",))
             .join(exact.select("key", "window_start", "_then"), ["key", "window_start", "_then"], "left_semi")
             .groupBy("key", "window_start").agg(F.min("_then").alias("_then")).localCheckpoint())
    return (out.join(found.select("*", F.lit(cmp.label("extra")).alias("category")),
                     ["key", "window_start", "category"], "left")
            .withColumn("_stale", F.coalesce(F.col("_then") == 0, F.lit(False)))
            .withColumn("_lost", F.coalesce(F.col("_then") == 1, F.lit(False))).drop("_then"))
