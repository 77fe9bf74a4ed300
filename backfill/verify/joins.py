"""Part: verify. A stream-stream join's output reconciled with the stream's, with causes from evidence
(docs/semantics.md §5, §8).

A join emits several rows per key and timestamp, and nothing but its values identifies a row, so the two
outputs are compared as multisets of (key, ts, value): the n-th copy of a row on one side matches the n-th
copy on the other (backfill: emit order; stream: partition, offset). Within a key, the stream's rows keep
the order the task emitted them in, so a matched row written after a row the backfill emits later has
moved. What is left over is explained by the input records that can produce it: the pairs of the row's key
inside the join window whose joiner value is the row's, and the outer-side records whose non-joined row it
is, with what the run did to them (task order, the stores' stream times):

- duplicate_delivery: the stream has the row more often than the backfill (at-least-once, docs/semantics.md §9).
- expired_differs: the row pairs two records and the earlier was past its store's retention when the later
  arrived, on one side only. Either the backfill's store had moved on (the row is extra in the stream), or a
  record of the earlier one's side, processed later by the backfill, lies a retention ahead of it: another
  interleaving of the partitions expires it first (the row is missing from the stream) (docs/semantics.md §5.2).
- partner_after_close: a non-joined row whose record has a partner in its window. The row exists iff the
  window closed in join stream time before the partner arrived (the partner still joins: no grace check,
  docs/semantics.md §5.2), which the interleaving of the partitions decides (§5.3). Shown by the stream's own order (it
  wrote the row before the joined row), by the next record of the row's side after the partner lying past
  the close (one record of another partition moved ahead closes it), or by the backfill's order (it emitted
  the row before the partner arrived).
- emit_throttle: a non-joined row of the outer store at another position in its key's output, or missing
  and due after the last such row of its task the stream wrote. The stream scans its outer store when a
  wall-clock throttle allows (1 s by default), the backfill at every trigger (docs/semantics.md §5.6).
- processing_order: a joined row at another position: the task processed its records in another order
  (live edge, max.task.idle.ms, the first offering: docs/semantics.md §2.4, §8). The values agree. Proved by
  the records: a record of the row can come after every record of the row the stream wrote before it (not at
  or before one of them in the same partition); where none can, the moved row is unexplained (§5.7).
- range_boundary: a row the stream has whose window had not closed when the data read ends (the stream went
  on), or a row that straddles a bound of the stream's output the evidence shows (verify/bounds.py).
- missing_input (co-partitioned joins): an input partition of the row's task skips offsets within a store
  retention of the row's timestamp (docs/semantics.md §8).
- unexplained: none of the above. A stream value that no input records produce is a logic difference
  (category mismatch when the backfill has another row at the same key and timestamp).
"""
from __future__ import annotations

import dataclasses

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from backfill.errors import SourceError
from backfill.ops.join import JOINED, PHASE_BASE, STRIDE
from backfill.ops.windows import LEFT
from backfill.session import release, shallow
from backfill.verify import bounds
from backfill.verify.catalogue import first_match
from backfill.verify import join_evidence
from backfill.verify.join_evidence import NULL_KEY, JoinEvidence, value_text
from backfill.verify.reconcile import MATCH, MISMATCH, Comparison
from backfill.verify.tables import is_topic_archive

MOVED = "moved"
KEYS, COLUMNS = ("key", "ts"), ("value", "position")
INPUT_TYPE = T.ArrayType(T.StructType([
    T.StructField("partition", T.IntegerType()), T.StructField("offset", T.LongType()),
    T.StructField("ts", T.LongType()), T.StructField("status", T.StringType()),
    T.StructField("value", T.StringType())]))


def comparison() -> Comparison:
    """The labels of a join's comparison (its categories add `moved_in_stream`)."""
    return Comparison(keys=KEYS, columns=COLUMNS)


def categories() -> tuple[str, ...]:
    """Category names of a join section, in report order."""
    cmp = comparison()
    return (*cmp.categories, cmp.label(MOVED))


# ----------------------------------------------------------------------------- both outputs as rows


def backfill_rows(df: DataFrame) -> DataFrame:
    """The published join output as key (text), ts, v (canonical value), emit_seq, task."""
    vtype = df.schema["value"].dataType
    task = F.col("task").cast("int") if "task" in df.columns else F.lit(0)
    return df.select(F.col("key").cast("string").alias("key"), F.col("ts").cast("long").alias("ts"),
                     value_text(F.col("value"), vtype).alias("v"), F.col("emit_seq").cast("long").alias("emit_seq"),
                     task.alias("task"))


def stream_rows(df: DataFrame, vtype: T.DataType, where: str) -> DataFrame:
    """The stream's join output (an archived topic, or a table with key, value, ts) as key, ts, v, partition,
    offset; a JSON value is parsed with the backfill's value type so both sides print it alike."""
    if is_topic_archive(df):  # the record timestamp is the row's ts (docs/semantics.md §5.1)
        df = df.select(F.col("key").cast("string").alias("key"), F.col("value").cast("string").alias("value"),
                       F.col("timestamp").cast("long").alias("ts"), "partition", "offset")
    missing = [c for c in ("key", "value", "ts") if c not in df.columns]
    if missing:
        raise SourceError(f"{where}: no column {missing[0]!r} (columns: {', '.join(df.columns)}); a join's output "
                          "has key, value and ts (or is an archived topic); map it with --map col=source_col")
    value = F.col("value")
    if isinstance(vtype, T.StructType):
        text = value if isinstance(df.schema["value"].dataType, T.StringType) else F.to_json(value)
        value = F.from_json(text, vtype)
    order = [F.col(c) if c in df.columns else F.lit(None).cast(t).alias(c)
             for c, t in (("partition", "int"), ("offset", "long"))]
    return df.select(F.col("key").cast("string").alias("key"), F.col("ts").cast("long").alias("ts"),
                     value_text(value, vtype).alias("v"), *order)


def reconcile(backfill: DataFrame, stream: DataFrame) -> DataFrame:
    """One row per row copy on either side: key, ts, v, emit_seq, task, partition, offset, category."""
    cmp = comparison()
    k = F.coalesce(F.col("key"), F.lit(NULL_KEY))
    group = ["_k", "ts", "v"]
    b = backfill.withColumn("_k", k).withColumn(
        "_occ", F.row_number().over(Window.partitionBy(*group).orderBy("emit_seq")))
    s = stream.withColumn("_k", k).withColumn(
        "_occ", F.row_number().over(Window.partitionBy(*group).orderBy("partition", "offset")))
    mine = b.select(*group, "_occ", F.col("key").alias("_bk"), "emit_seq", "task", F.lit(True).alias("_in_b"))
    theirs = s.select(*group, "_occ", F.col("key").alias("_sk"), "partition", "offset", F.lit(True).alias("_in_s"))
    both = mine.join(theirs, [*group, "_occ"], "full_outer")
    copies = F.max(F.when(F.col("_in_b"), F.col("_occ"))).over(Window.partitionBy(*group))
    both = both.withColumn("key", F.coalesce("_bk", "_sk")).withColumn("_nb", F.coalesce(copies, F.lit(0)))
    # within a key, the stream writes rows in the order its task emitted them: a row written after one the
    # backfill emits later has moved (a null key has no such order: a producer spreads it over partitions)
    written_before = Window.partitionBy("_k").orderBy("partition", "offset").rowsBetween(Window.unboundedPreceding, -1)
    seen = F.max(F.when(F.col("_in_s"), F.col("emit_seq"))).over(written_before)
    matched = F.col("_in_b") & F.col("_in_s")
    both = both.withColumn("_seen", F.when(matched & F.col("key").isNotNull(), seen))
    category = (F.when(matched & (F.col("emit_seq") < F.col("_seen")), F.lit(cmp.label(MOVED)))
                .when(matched, F.lit(MATCH))
                .when(F.col("_in_b"), F.lit(cmp.label("missing")))
                .when(F.col("_occ") > 1, F.lit(cmp.label("duplicate")))
                .otherwise(F.lit(cmp.label("extra"))))
    return both.select("key", "ts", "v", "emit_seq", "task", "partition", "offset", "_occ", "_nb",
                       category.alias("category"), F.monotonically_increasing_id().alias("_id"))


# ----------------------------------------------------------------------------- evidence


def _rec(prefix: str, status: str) -> Column:
    """One input record shown with a sample."""
    return F.struct(F.col(f"{prefix}partition").cast("int").alias("partition"),
                    F.col(f"{prefix}offset").cast("long").alias("offset"), F.col(f"{prefix}ts").alias("ts"),
                    F.lit(status).alias("status"), F.lit(None).cast("string").alias("value"))


def _next_rec(status: str) -> Column:
    return F.struct(F.col("_next.partition").cast("int").alias("partition"),
                    F.col("_next.offset").cast("long").alias("offset"), F.col("_next.ts").alias("ts"),
                    F.lit(status).alias("status"), F.col("_next.value").alias("value"))


def _at(col: Column) -> Column:
    """An instant as the report prints times: UTC, with the milliseconds."""
    return F.date_format(F.timestamp_millis(col), "yyyy-MM-dd HH:mm:ss.SSS")


def attribute(rows: DataFrame, ev: JoinEvidence) -> DataFrame:
    """The rows that are not a match with `cause`, `detail`, `inputs` (the records that prove the cause) and
    `r_v` (the stream's value of a mismatch), as a local checkpoint: the caller releases it (session.release)."""
    cmp, c = comparison(), F.col
    missing, extra = cmp.label("missing"), cmp.label("extra")
    differ = rows.where(c("category") != MATCH).withColumn("k", F.coalesce(c("key"), F.lit(NULL_KEY)))
    # small frames stored as they are: each step then plans over a short lineage (planning dominated otherwise)
    open_rows = differ.where(c("category").isin(missing, extra)).localCheckpoint(eager=True)
    keys = open_rows.select("k").distinct()
    # read, ordered and cut once: the pairs, the non-joined rows and the look-ahead all read them
    ev = dataclasses.replace(ev, records=ev.records.localCheckpoint(eager=True))
    pairs = join_evidence.pairs(ev, keys).localCheckpoint(eager=True)
    single = join_evidence.singles(ev, keys).localCheckpoint(eager=True)
    held = [open_rows, pairs, single, ev.records]
    try:
        end_st = ev.records.groupBy("task").agg(F.max("_stj").alias("_end_st"))
        written = rows.where(c("partition").isNotNull() & (c("_occ") == 1)).select(
            F.coalesce(c("key"), F.lit(NULL_KEY)).alias("k"), "ts", "v", "partition", "offset")
        found = _pair_causes(open_rows, pairs, ev, missing, extra, held).unionByName(
            _single_causes(open_rows, single, pairs, written, ev, end_st, missing, extra, held))
        found = shallow(found, held)
        produced = found.select("_id").distinct().withColumn("_produced", F.lit(True))
        best = Window.partitionBy("_id").orderBy("cause", "detail")  # one named cause per row
        named = found.where(c("cause").isNotNull()).withColumn("_n", F.row_number().over(best)) \
            .where(c("_n") == 1).drop("_n")
        out = open_rows.join(named, "_id", "left").join(produced, "_id", "left")
        out = _boundaries(out, rows, ev)
        out = shallow(_throttled(out, rows, missing), held)
        if ev.gaps is not None:
            out = _missing_input(out, ev)
        out = _mismatches(out, missing, extra)
        why_not = F.when(c("category") == extra, F.lit("no input records of this key produce this row at this "
                                                        "timestamp")).otherwise(
            F.lit("the backfill emits this row and the stream does not; no evidence says why"))
        out = out.withColumn("detail", F.when(c("cause").isNull() & c("detail").isNull(), why_not)
                             .otherwise(c("detail"))).withColumn("cause", F.coalesce(c("cause"), F.lit("unexplained")))
        placed = differ.where(~c("category").isin(missing, extra))
        out = out.unionByName(_positions(placed, cmp, _orders(placed, rows, ev, cmp, held)),
                              allowMissingColumns=True).drop("k")
        return out.localCheckpoint(eager=True)
    finally:
        for frame in held:
            release(frame)


def _from_outer_store(emit_seq: Column) -> Column:
    """A non-joined row the outer store's scan emitted (its emit phase), not a record (docs/semantics.md §5.6)."""
    return F.pmod(emit_seq, F.lit(STRIDE)) < F.lit(PHASE_BASE[JOINED])


def _positions(rows: DataFrame, cmp: Comparison, orders: DataFrame | None) -> DataFrame:
    """Copies and moved rows: duplicate_delivery, or by the row's emit phase emit_throttle for a non-joined row
    from the outer store (the only rows the throttle delays), processing_order for the others (a joined row, a
    non-joined row emitted at once) unless `orders` (`_orders`) shows that no order of the task's records
    writes it where the stream did: unexplained."""
    c = F.col
    joined_row = ~_from_outer_store(c("emit_seq"))
    copy = c("category") == cmp.label("duplicate")
    if orders is None:
        rows = rows.withColumn("_reachable", F.lit(None).cast("boolean")).withColumn(
            "_order_detail", F.lit(None).cast("string")).withColumn("_order_inputs", F.lit(None).cast(INPUT_TYPE))
    else:
        rows = rows.join(orders, "_id", "left")
    cause, detail = first_match([
        (copy, "duplicate_delivery", F.concat(F.lit("copy "), c("_occ").cast("string"),
                                              F.lit(" of this row in the stream; the backfill emits it "),
                                              c("_nb").cast("string"), F.lit(" time(s)"))),
        (joined_row & ~F.coalesce(c("_reachable"), F.lit(True)), "unexplained", c("_order_detail")),
        (joined_row, "processing_order", F.coalesce(c("_order_detail"), F.lit(
            "a row written after a row of its key that the backfill emits later: the task processed its records in "
            "another order; the values agree"))),
        (None, "emit_throttle", "a non-joined row written after a row of its key that the backfill emits later: the "
                                "stream scans its outer store when its wall-clock throttle allows, the backfill at "
                                "every trigger; the values agree")])
    inputs = F.when(joined_row & ~copy, c("_order_inputs")).cast(INPUT_TYPE)
    return rows.select(*[c(n) for n in rows.columns if n not in ("_reachable", "_order_detail", "_order_inputs")],
                       cause.alias("cause"), detail.alias("detail"), inputs.alias("inputs"))


_QUEUED = "array<struct<topic:string,partition:int,offset:long,ts:long>>"


def _record_sets(ev: JoinEvidence, keys: DataFrame) -> DataFrame:
    """The input records that give each row of the keys: a joined row its pair, a non-joined row its record
    (task, k, ts, v, `_recs`); a row several pairs give has several sets."""
    c = F.col

    def rec(prefix: str, ts: str) -> Column:
        return F.struct(c(f"{prefix}topic").cast("string").alias("topic"),
                        c(f"{prefix}partition").cast("int").alias("partition"),
                        c(f"{prefix}offset").cast("long").alias("offset"), c(ts).cast("long").alias("ts"))

    if "_origin" in ev.records.columns:  # a re-keyed side: the order that holds is its input partition's
        ev = dataclasses.replace(ev, records=ev.records.select(
            *[c(n) for n in ev.records.columns if n not in ("topic", "partition", "offset")],
            *[F.coalesce(c(f"_origin.{n}"), c(n)).alias(n) for n in ("topic", "partition", "offset")]))
    joined = join_evidence.pairs(ev, keys).select("task", "k", "ts", "v",
                                                  F.array(rec("l_", "l_ts"), rec("r_", "r_ts")).alias("_recs"))
    single = join_evidence.singles(ev, keys).select("task", "k", "ts", "v",  # its row's ts is the record's
                                                    F.array(rec("_x_", "ts")).alias("_recs"))
    return joined.unionByName(single).withColumn("_recs", c("_recs").cast(_QUEUED))


def _orders(placed: DataFrame, rows: DataFrame, ev: JoinEvidence, cmp: Comparison,
            held: list[DataFrame]) -> DataFrame | None:
    """For each moved row that is not from the outer store: whether some order of its task's records emits it
    after every row of its key the stream wrote before it and the backfill emits later (docs/semantics.md §5.7).

    A row is emitted when the last of its records is processed (a joined row: the later of its pair; a
    non-joined row emitted at once: its record). Records of one partition are processed in offset order, in
    every order of the task (through a repartition topic too: one upstream task writes a partition's records
    of one key in offset order, so a re-keyed record counts at its input partition); records of different
    partitions in any. So the stream can have written row A after row B iff a record of A can come after every
    record of B (one that does not lie at or before a record of B in the same partition), or one record emits
    both and its store holds B's partner first (an earlier timestamp, or the same put first). `_reachable`:
    false where, for some B written before A, no records of A and of B allow it (`_order_detail` names B); true
    otherwise, with the records of both (`_order_inputs`); no row where every B is an outer-store row (emitted
    by a wall-clock scan, not by a record)."""
    c = F.col
    moved = placed.where((c("category") == cmp.label(MOVED)) & ~_from_outer_store(c("emit_seq"))).select(
        "_id", "k", "ts", "v", "emit_seq", "task", "partition", "offset")
    if moved.isEmpty():
        return None
    written = rows.where(c("partition").isNotNull() & c("emit_seq").isNotNull()
                         & ~_from_outer_store(c("emit_seq"))).select(
        F.coalesce(c("key"), F.lit(NULL_KEY)).alias("k"), c("ts").alias("_bts"), c("v").alias("_bv"),
        c("emit_seq").alias("_bseq"), c("partition").alias("_bp"), c("offset").alias("_bo"))
    before = moved.join(written, "k").where(
        (c("_bseq") > c("emit_seq")) & ((c("_bp") < c("partition")) | ((c("_bp") == c("partition"))
                                                                       & (c("_bo") < c("offset")))))
    sets = _record_sets(ev, moved.select("k").distinct()).localCheckpoint(eager=True)
    held.append(sets)
    mine = sets.select("task", "k", "ts", "v", c("_recs").alias("_a"))
    theirs = sets.select("task", "k", c("ts").alias("_bts"), c("v").alias("_bv"), c("_recs").alias("_b"))
    combos = before.join(mine, ["task", "k", "ts", "v"]).join(theirs, ["task", "k", "_bts", "_bv"])

    def held_back(x: Column, y: Column) -> Column:  # x lies at or before y in the same partition
        return (x["topic"] == y["topic"]) & (x["partition"] == y["partition"]) & (x["offset"] <= y["offset"])

    def same(x: Column, y: Column) -> Column:
        return (x["topic"] == y["topic"]) & (x["partition"] == y["partition"]) & (x["offset"] == y["offset"])

    # a record of A that no record of B holds back: processed last, it emits A after B
    after_all = F.exists("_a", lambda x: F.forall("_b", lambda y: ~held_back(x, y)))
    # or one record emits both (their shared record, processed last): its store gives the partners in timestamp
    # order, then in the order they were put
    two = (F.size("_a") == 2) & (F.size("_b") == 2)

    def in_store_order(i: int) -> Column:
        a, b = c("_a")[i], c("_b")[i]
        return same(c("_a")[1 - i], c("_b")[1 - i]) & ((b["ts"] < a["ts"]) | ((b["ts"] == a["ts"]) & ~held_back(a, b)))

    combos = combos.withColumn("_last", after_all).withColumn(
        "_ok", c("_last") | (two & (in_store_order(0) | in_store_order(1))))
    first = Window.partitionBy("_id", "_bseq").orderBy(c("_ok").desc(), c("_last").desc(), "_a", "_b")
    per_b = combos.withColumn("_n", F.row_number().over(first)).where(c("_n") == 1)
    worst = Window.partitionBy("_id").orderBy(c("_ok").asc(), "_bseq")
    chosen = per_b.withColumn("_n", F.row_number().over(worst)).where(c("_n") == 1)

    def shown(col: str, status: str) -> Column:
        return F.transform(col, lambda r: F.struct(r["partition"].alias("partition"), r["offset"].alias("offset"),
                                                   r["ts"].alias("ts"), F.lit(status).alias("status"),
                                                   F.lit(None).cast("string").alias("value")))

    b_row = F.concat(F.lit("the row at ts "), c("_bts").cast("string"), F.lit(" with value "), c("_bv"))
    detail = F.when(c("_last"), F.concat(
        F.lit("written after "), b_row, F.lit(", which the backfill emits later: a record of this row can come "
                                              "after every record of that one (they are in other partitions, or "
                                              "later in the same), so another order of the task's records, as a "
                                              "live application takes them, writes them so; the values agree"))
    ).when(c("_ok"), F.concat(
        F.lit("written after "), b_row, F.lit(", which the backfill emits later: processed after the others, the "
                                              "record both rows share emits both at once, and its store gives the "
                                              "other row's partner first (earlier timestamp); the values agree"))
    ).otherwise(F.concat(
        F.lit("written after "), b_row, F.lit(", which the backfill emits later, but no order of the task's records "
                                              "gives that: each record of this row lies at or before a record of "
                                              "that one in the same partition, so this row is always emitted first")))
    return chosen.select("_id", c("_ok").alias("_reachable"), detail.alias("_order_detail"), F.concat(
        shown("_a", "record of this row"), shown("_b", "record of the row written before")).cast(
        INPUT_TYPE).alias("_order_inputs"))


def _pair_causes(rows: DataFrame, pairs: DataFrame, ev: JoinEvidence, missing: str, extra: str,
                 held: list[DataFrame]) -> DataFrame:
    """Rows a pair of records produces: expired_differs when the earlier record's retention decides it."""
    c, w = F.col, ev.windows
    cand = rows.join(pairs.withColumnRenamed("task", "_ptask"), ["k", "ts", "v"])
    left_later = c("l_seq") > c("r_seq")
    earlier_side = F.when(left_later, F.lit(1 - LEFT)).otherwise(F.lit(LEFT))
    cand = cand.withColumn("_pid", F.monotonically_increasing_id()).localCheckpoint(eager=True)
    held.append(cand)
    probes = cand.select("_pid", c("_ptask").alias("task"), earlier_side.alias("_side"),
                         F.greatest("l_seq", "r_seq").alias("seq"))
    cand = cand.join(join_evidence.records_after(ev, probes), "_pid", "left")
    e_ts = F.when(left_later, c("r_ts")).otherwise(c("l_ts"))
    e_rec = F.when(left_later, _rec("r_", "earlier")).otherwise(_rec("l_", "earlier"))
    l_rec = F.when(left_later, _rec("l_", "later")).otherwise(_rec("r_", "later"))
    gone = (c("category") == extra) & ~c("visible")
    could_go = (c("category") == missing) & c("visible") & (c("_next.ts") >= e_ts + F.lit(w.retention))
    cause, detail = first_match([
        (gone, "expired_differs", F.concat(
            F.lit("when the later record arrived, the backfill's store of the earlier had reached "),
            _at(c("store_time")),
            F.lit(": the earlier record (ts "), e_ts.cast("string"), F.lit(") was past its retention of "),
            F.lit(f"{w.retention} ms; the stream's store still held it"))),
        (could_go, "expired_differs", F.concat(
            F.lit("the backfill paired them; a record of the earlier one's side at ts "), c("_next.ts").cast("string"),
            F.lit(", a retention ("), F.lit(str(w.retention)),
            F.lit(" ms) ahead of it, was processed after the later one: processed first, it expires the earlier"))),
        (None, None, None)])
    inputs = F.when(could_go, F.array(e_rec, l_rec, _next_rec("moves the store on"))).otherwise(F.array(e_rec, l_rec))
    out = cand.select("_id", cause.alias("cause"), detail.alias("detail"), inputs.cast(INPUT_TYPE).alias("inputs"))
    return out


def _single_causes(rows: DataFrame, single: DataFrame, pairs: DataFrame, written: DataFrame, ev: JoinEvidence,
                   end_st: DataFrame, missing: str, extra: str, held: list[DataFrame]) -> DataFrame:
    """Non-joined rows: still waiting at the end of the data, or decided by when the partner came."""
    c, w = F.col, ev.windows
    cand = rows.join(single.withColumnRenamed("task", "_ptask"), ["k", "ts", "v"]) \
        .join(end_st.withColumnRenamed("task", "_ptask"), "_ptask", "left")
    close = c("ts") + F.when(c("_side") == LEFT, F.lit(w.after)).otherwise(F.lit(w.before)) + F.lit(w.grace)
    cand = cand.withColumn("_close", close)
    # the record's partners in its window (the pairs it is part of)
    as_left = pairs.select(c("task").alias("_ptask"), c("l_seq").alias("seq"), F.lit(LEFT).alias("_side"),
                           c("r_seq").alias("_p_seq"), c("r_ts").alias("_p_ts"), c("r_partition").alias("_p_partition"),
                           c("r_offset").alias("_p_offset"), c("r_topic").alias("_p_topic"),
                           c("visible").alias("_p_visible"), c("ts").alias("_p_row_ts"), c("v").alias("_p_row_v"))
    as_right = pairs.select(c("task").alias("_ptask"), c("r_seq").alias("seq"), F.lit(1 - LEFT).alias("_side"),
                            c("l_seq").alias("_p_seq"), c("l_ts").alias("_p_ts"),
                            c("l_partition").alias("_p_partition"),
                            c("l_offset").alias("_p_offset"), c("l_topic").alias("_p_topic"),
                            c("visible").alias("_p_visible"), c("ts").alias("_p_row_ts"), c("v").alias("_p_row_v"))
    cand = cand.join(as_left.unionByName(as_right), ["_ptask", "seq", "_side"], "left")
    # where the stream wrote the joined row of the record and its partner (its first copy)
    joined_at = written.select(c("k"), c("ts").alias("_p_row_ts"), c("v").alias("_p_row_v"),
                               c("partition").alias("_j_partition"), c("offset").alias("_j_offset"))
    cand = cand.join(joined_at, ["k", "_p_row_ts", "_p_row_v"], "left")
    cand = cand.withColumn("_pid", F.monotonically_increasing_id()).localCheckpoint(eager=True)
    held.append(cand)
    # a record of the row's own side (another topic than the partner's) processed after the partner, past close
    probes = cand.where(c("_p_seq").isNotNull()).select("_pid", c("_ptask").alias("task"), "_side",
                                                        c("_p_seq").alias("seq"))
    cand = cand.join(join_evidence.records_after(ev, probes), "_pid", "left")
    trigger = F.floor(c("emit_seq") / F.lit(STRIDE))
    waiting = (c("category") == extra) & (c("_close") >= c("_end_st"))
    # the stream's own order shows its window closed first: it wrote the row unmatched, then the joined row
    # (a late partner still joins: no grace check in the join, docs/semantics.md §5.2)
    wrote_first = (c("category") == extra) & c("_p_seq").isNotNull() & (c("_j_partition") == c("partition")) & (
        c("_j_offset") > c("offset"))
    closed_first = (c("category") == extra) & c("_p_seq").isNotNull() & (c("_next.ts") > c("_close"))
    came_late = (c("category") == missing) & c("_p_seq").isNotNull() & (c("_p_seq") > trigger)
    # the backfill's store had expired the partner: the backfill emits the record unmatched, the stream joined it
    expired = (c("category") == missing) & c("_p_seq").isNotNull() & ~c("_p_visible")
    this = F.struct(c("_x_partition").cast("int").alias("partition"), c("_x_offset").cast("long").alias("offset"),
                    c("ts").alias("ts"), F.lit("unmatched record").alias("status"),
                    F.lit(None).cast("string").alias("value"))
    partner = F.struct(c("_p_partition").cast("int").alias("partition"), c("_p_offset").cast("long").alias("offset"),
                       c("_p_ts").alias("ts"), F.lit("partner").alias("status"),
                       F.lit(None).cast("string").alias("value"))
    cause, detail = first_match([
        (waiting, "range_boundary", F.concat(F.lit("its window closes at join stream time "), _at(c("_close")),
                                             F.lit("; the data read ends at "), _at(c("_end_st")),
                                             F.lit(": the backfill still holds it, the stream went on"))),
        (expired, "expired_differs", F.concat(
            F.lit("its partner (ts "), c("_p_ts").cast("string"),
            F.lit(") was past the backfill's store retention ("), F.lit(str(w.retention)),
            F.lit(" ms) when they met, so the backfill emits it unmatched; the stream's store still held it"))),
        (wrote_first, "partner_after_close", F.concat(
            F.lit("the stream wrote it unmatched (offset "), c("offset").cast("string"),
            F.lit(") before its joined row with the partner at ts "), c("_p_ts").cast("string"),
            F.lit(" (offset "), c("_j_offset").cast("string"), F.lit("): its window had closed (at "),
            _at(c("_close")), F.lit(") before the partner arrived; in the backfill the partner came first"))),
        (closed_first, "partner_after_close", F.concat(
            F.lit("in the backfill its partner (ts "), c("_p_ts").cast("string"),
            F.lit(") arrived before the window closed at "), _at(c("_close")), F.lit("; a record at ts "),
            c("_next.ts").cast("string"),
            F.lit(" from another partition, processed first, closes it and the stream emits it unmatched"))),
        (came_late, "partner_after_close", F.concat(
            F.lit("the backfill emitted it unmatched when its window closed (at "), _at(c("_close")),
            F.lit("), before its partner (ts "), c("_p_ts").cast("string"),
            F.lit(") arrived; the stream processed the partner first"))),
        (None, None, None)])
    inputs = F.when(closed_first, F.array(this, partner, _next_rec("closes the window"))).otherwise(
        F.when(c("_p_seq").isNotNull(), F.array(this, partner)).otherwise(F.array(this)))
    return cand.select("_id", cause.alias("cause"), detail.alias("detail"), inputs.cast(INPUT_TYPE).alias("inputs"))


def _boundaries(out: DataFrame, rows: DataFrame, ev: JoinEvidence) -> DataFrame:
    """range_boundary for a row no other cause explains that straddles a bound of the stream's output the evidence
    shows (verify/bounds.py): its records span [ts - before - after, ts], it is complete by ts + retention."""
    c = F.col
    mine, theirs = ev.outputs if ev.outputs is not None else (rows.where(c("emit_seq").isNotNull()),
                                                              rows.where(c("partition").isNotNull()))
    mine, theirs = (df.select(F.coalesce(c("key"), F.lit(NULL_KEY)).alias("key"), c("ts").alias("at"), *extra)
                    for df, extra in ((mine, ["task"]), (theirs, [])))
    tasks = bounds.tasks_of(mine, "task")
    written = bounds.Written(stream=theirs, backfill=mine.drop("task"), tasks=tasks, declared=ev.declared)
    w = ev.windows
    probe = (out.withColumn("_key", c("key")).withColumn("key", c("k"))
             .join(tasks.withColumnRenamed("task", "_t"), "key", "left")
             .withColumn("_task", F.coalesce(c("task"), c("_t"))))
    span = (c("ts") - F.lit(w.before + w.after), c("ts") + F.lit(1))
    marked = bounds.straddled(probe, written, c("ts"), span, c("ts") + F.lit(w.retention))
    hit = c("cause").isNull() & c(bounds.BOUND).isNotNull()
    return (marked.withColumn("detail", F.when(hit, c(bounds.BOUND)).otherwise(c("detail")))
            .withColumn("cause", F.when(hit, F.lit("range_boundary")).otherwise(c("cause")))
            .withColumn("key", c("_key")).drop("_key", "_t", "_task", bounds.BOUND))


def _throttled(out: DataFrame, rows: DataFrame, missing: str) -> DataFrame:
    """emit_throttle for a missing outer-store row that the backfill emits after the last outer-store row of
    its task the stream wrote. The stream scans its outer store at most once per throttle interval of wall
    clock (docs/semantics.md §5.6), so what closed after its last scan waits for a trigger that did not come before its
    output ends: a live application that read its input faster than the interval wrote none at all. Without
    any outer-store row of the task, the stream must have written an unmatched row of the task emitted at
    once (so it does emit unmatched rows: an inner join deployed by mistake stays unexplained)."""
    c = F.col
    phase = F.pmod(c("emit_seq"), F.lit(STRIDE))
    outer_store = _from_outer_store(c("emit_seq"))
    written = rows.where(c("partition").isNotNull() & c("emit_seq").isNotNull())
    last = written.groupBy("task").agg(F.max(F.when(outer_store, c("emit_seq"))).alias("_last_scan"),
                                       F.max((phase == F.lit(PHASE_BASE[2])).cast("int")).alias("_at_once"))
    out = out.join(last, "task", "left")
    due = c("cause").isNull() & (c("category") == missing) & outer_store
    after_last = due & (c("emit_seq") > c("_last_scan"))
    none_yet = due & c("_last_scan").isNull() & (c("_at_once") == 1)
    interval = ("the stream scans its outer store at most once per throttle interval of wall clock (1 s by "
                "default) and had not scanned again when its output ends")
    detail = (F.when(after_last, F.concat(
        F.lit("an unmatched row of the outer store, due after the last such row of task "), c("task").cast("string"),
        F.lit(" that the stream wrote (at the task's record "), F.floor(c("_last_scan") / F.lit(STRIDE)).cast("string"),
        F.lit(f"): {interval}")))
        .when(none_yet, F.concat(
            F.lit("the stream wrote no row of its outer store for task "), c("task").cast("string"),
            F.lit(f" (it wrote the task's unmatched rows emitted at once): {interval}"))))
    return (out.withColumn("detail", F.when(after_last | none_yet, detail).otherwise(c("detail")))
            .withColumn("cause", F.when(after_last | none_yet, F.lit("emit_throttle")).otherwise(c("cause")))
            .drop("_last_scan", "_at_once"))


def _missing_input(out: DataFrame, ev: JoinEvidence) -> DataFrame:
    """missing_input for an unexplained row of a task whose input skips offsets near the row's time: the
    records of the row (or that would have changed it) lie within a store retention of its timestamp."""
    c, reach = F.col, ev.windows.retention
    tasks = ev.records.select("k", F.col("task").alias("_ktask")).distinct()
    gaps = ev.gaps
    assert gaps is not None
    near = (out.where(c("cause").isNull()).select("_id", "k", "ts", "task").join(tasks, "k", "left")
            .withColumn("_task", F.coalesce("task", "_ktask"))
            .join(gaps.withColumnRenamed("task", "_task"), "_task")
            .where((F.coalesce(c("ts_before"), c("ts_after")) <= c("ts") + F.lit(reach))
                   & (c("ts_after") >= c("ts") - F.lit(reach))))
    first = Window.partitionBy("_id").orderBy("topic", "gap_from")
    near = near.withColumn("_n", F.row_number().over(first)).where(c("_n") == 1).select(
        "_id", F.concat(F.lit("the archive of "), c("topic"), F.lit(" partition "), c("_task").cast("string"),
                        F.lit(" skips offsets "), c("gap_from").cast("string"), F.lit("-"), c("gap_to").cast("string"),
                        F.lit(", between records at ts "), c("ts_before").cast("string"), F.lit(" and "),
                        c("ts_after").cast("string"), F.lit(f", within a store retention ({reach} ms) of this row: "
                                                            "the records lost there may have changed it")
                        ).alias("_gap_detail"))
    out = out.join(near, "_id", "left")
    return (out.withColumn("cause", F.when(c("_gap_detail").isNotNull(), F.lit("missing_input")).otherwise(c("cause")))
            .withColumn("detail", F.coalesce(c("_gap_detail"), c("detail"))).drop("_gap_detail"))


def _mismatches(rows: DataFrame, missing: str, extra: str) -> DataFrame:
    """A stream row no input records produce, paired with a backfill row of the same key and timestamp
    that nothing explains either: one mismatch (the values differ), unexplained."""
    c = F.col
    lone = c("cause").isNull() & c("_produced").isNull() & (c("category") == extra)
    spare = c("cause").isNull() & (c("category") == missing)
    rank = F.row_number().over(Window.partitionBy("k", "ts", "category", lone | spare).orderBy(
        "emit_seq", "partition", "offset"))
    ranked = rows.withColumn("_pair", F.when(lone | spare, rank))
    s = ranked.where(lone).select("k", "ts", "_pair", c("v").alias("r_v"), c("partition").alias("_sp"),
                                  c("offset").alias("_so"), c("_id").alias("_sid"))
    paired = ranked.join(s, ["k", "ts", "_pair"], "left")
    taken = paired.where(spare & c("_sid").isNotNull()).select(c("_sid").alias("_id"))
    out = paired.join(taken.withColumn("_gone", F.lit(True)), "_id", "left").where(c("_gone").isNull())
    out = out.withColumn("_is_pair", spare & c("_sid").isNotNull())
    is_pair = c("_is_pair")
    return (out.withColumn("category", F.when(is_pair, F.lit(MISMATCH)).otherwise(c("category")))
            .withColumn("partition", F.when(is_pair, c("_sp")).otherwise(c("partition")))
            .withColumn("offset", F.when(is_pair, c("_so")).otherwise(c("offset")))
            .withColumn("detail", F.when(is_pair, F.lit("no input records of this key produce the stream's value "
                                                        "at this timestamp: the joiner or the inputs differ"))
                        .otherwise(c("detail")))
            .withColumn("cause", F.when(is_pair, F.lit("unexplained")).otherwise(c("cause")))
            .drop("_pair", "_sp", "_so", "_sid", "_gone", "_produced", "_is_pair"))
