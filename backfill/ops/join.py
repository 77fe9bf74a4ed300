"""Part: operators. Stream-stream joins (docs/semantics.md §5) on records already in task order.

Set-based where the rule allows it. A pair (l, r) of equal key in one task is emitted when the later of
the two in task order (`seq`) is processed, iff the earlier lies in the later one's [from, to] (§5.1) and is
still retained by its window store: ts > storeST - R, storeST being the running max of that store's writes
in task order (9). Pairs come from a range join on (task, key, time bucket) whose condition carries the
bounds and the retention, so a hot key costs about the pairs it emits, never its cross product. The records
are shuffled once by (task, key), and the range join runs where they lie. A left or outer join reads its
result twice (the per-record flags, the pairs' output), so it is stored once (a local checkpoint), and the
right records its store refused find their pairs there too (the `expired` ledger rows).
Non-joined rows of left/outer joins emitted at once (fix disabled, `to < ST_j`, null keys; docs/semantics.md §5.3, §5.5) are
set-based too. The rows that wait in the outer store depend on the sequence of triggers (t == ST_j), the
minTime heuristic and the outer-store order (§5.3): a small per-task kernel replays only those.
The wall-clock throttle is taken as 0, as in TopologyTestDriver (unknowable from data, docs/semantics.md §5.6).
"""
from __future__ import annotations

import bisect
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from backfill.jobspec.fields import JOINER_FIELDS
from backfill.errors import SpecError
from backfill.jobspec import versions
from backfill.jobspec.durations import format_duration
from backfill.jobspec.models import JoinSpec, OperatorSpec
from backfill.ledger import NULL_KEY, ledger_rows
from backfill.ops.base import Operator, OperatorCounts, OperatorResult, around, check_null_drops, join_reads
from backfill.ops.expressions import joiner_sql
from backfill.jobspec.rekeys import join_streams, rekey_why
from backfill.ops.windows import LEFT, RIGHT, JoinWindows
from backfill.session import computed_once

if TYPE_CHECKING:
    import pandas as pd
    from backfill.jobspec.load import Job

NULL_VALUE = "null_value"
EXPIRED = "expired"
# emission phases of one processed record: closed outer-store rows, joined pairs, its own non-joined row
TRIGGERED, JOINED, IMMEDIATE = 0, 1, 2
STRIDE = 2**31  # emit_seq = seq * 2^31 + phase base + position in the phase (gaps allowed)
PHASE_BASE = (0, 2**30, STRIDE - 1)
JAVA_MAX = 2**63 - 1
KERNEL_SCHEMA = "task int, key {key}, out_seq long, idx long, seq long, ts long"  # key: the job's key type
FLAG_COLUMNS = ("_side", "_stj", "_to", "_korder")  # what the outer-store kernel needs of a record
# a join in its upstream's tasks (docs/semantics.md §18.9) whose source has values of another type than the
# operator's rows: the source's value, its `value` then a placeholder of the rows' type (null where it is null)
BESIDE_VALUE = "_beside_value"


def emit_seq(out_seq: int, phase: int, idx: int) -> int:
    """Emission order in a task: the processed record's seq, then the phase, then the position in it."""
    return out_seq * STRIDE + PHASE_BASE[phase] + idx


@dataclass(frozen=True)
class StreamJoin(Operator):
    """A KStream-KStream join: inner, left or outer, JoinWindows before/after/grace (10)."""

    noun = "stream-stream join"
    verified_as = "join"
    range_column = "ts"  # a join row's range is its timestamp

    def grace_ms(self) -> int:
        assert self.spec is not None and self.spec.join is not None
        return JoinWindows.of(self.spec.join).grace

    def settled_by(self, end: int) -> int:
        """A result at ts < end is final once every record within the window of it has arrived and a
        non-joined record's emission is due: stream time past end + max(before, after) + grace."""
        assert self.spec is not None and self.spec.join is not None
        w = JoinWindows.of(self.spec.join)
        return end + max(w.before, w.after, 0) + w.grace

    @classmethod
    def from_job(cls, job: Job, spec: OperatorSpec, index: int, sink: str | None, start: int | None,
                 end: int | None) -> StreamJoin:
        """Co-partitioned inputs with one key serde; warm-up from before/after/grace, no cool-down cut."""
        join_spec = spec.join
        assert join_spec is not None
        joiner_sql(join_spec.value, f"{job.path}: operators.{spec.name}.join.value")  # parses, names in scope
        w = JoinWindows.of(join_spec)
        text = (f"{join_spec.how}, before {format_duration(w.before)} after {format_duration(w.after)} grace "
                f"{format_duration(w.grace)}" + (" (eager: spurious-result fix off)" if w.eager else ""))
        base = {"name": spec.name, "kind": "join", "inputs": tuple(spec.inputs), "window": text, "emit": "updates",
                "sink": sink, "spec": spec, "index": index, "profile": versions.profile(job.spec.kafka_streams)}
        if join_spec.left == join_spec.right:
            return cls(**base, implemented=False, not_implemented_reason=(
                "self-joins (left and right the same source) are not implemented; declare the topic twice"))
        formats = {s: job.spec.sources[s].key.format for s in spec.inputs if spec.reads_source(s)}
        if len(set(formats.values())) > 1 and join_spec.group_by is None:
            raise SpecError(f"{job.path}: operators.{spec.name}.join: key formats differ ({join_spec.left}: "
                            f"{formats[join_spec.left]}, {join_spec.right}: {formats[join_spec.right]}); "
                            "co-partitioned join inputs share one key serde")
        # a result at ts >= start pairs records >= start - max(before, after); one retention more lets the
        # outer store settle (its emission heuristic depends on history, docs/semantics.md §5.3)
        warmup = max(w.before, w.after, 0) + w.retention
        why = rekey_why(spec)
        if start is not None:
            why.append(f"warm-up: records with timestamp >= {start - warmup} are read (max(before, after) + before "
                       "+ after + grace before --start): both records of every result at or after --start")
        if end is not None:
            why.append("cool-down: every record after --end is read: a join has no lateness cut-off (a late record "
                       "still joins what the other store retains, docs/semantics.md §5.2)")
        return cls(**base, warmup_ms=warmup, why=tuple(why))

    @property
    def join_spec(self) -> JoinSpec:
        """The job's join."""
        assert self.spec is not None and self.spec.join is not None
        return self.spec.join

    def expressions(self) -> list[str] | None:
        """Its joiner (`value`), re-keys and filters."""
        assert self.spec is not None
        return [self.join_spec.value, *around(self.spec)]

    def reads(self) -> frozenset[str] | None:
        """`seq` (the task order) and `timestamp` (a joiner field) always; `headers` only when a re-key names
        them (a joiner cannot). The rest of the record goes: headers are then not decoded, and no partition
        time before each record is computed or stored for a job without a cool-down cut."""
        assert self.spec is not None
        return join_reads(self.spec)

    def stream_time_columns(self) -> dict[str, Column]:
        """ST_j and both window stores' times."""
        assert self.spec is not None
        return stream_time_columns(self.spec, self.stream_time, self.profile)

    def count_columns(self, live: Column, late: dict[str, Column] | None = None) -> list[Column]:
        """Records reaching the join and those it skips for a null key or value (docs/semantics.md §5.5)."""
        spec = self.join_spec
        assert self.spec is not None
        left, right = join_streams(self.spec)
        mine = F.col("source").isin(left, right) & F.col("_drop").isNull() & live
        outer = {"inner": [], "left": [left], "outer": [left, right]}[spec.how]
        forwards = outer and self.profile.join_null_keys_reach_join
        forwarded = (F.col("source").isin(*outer) if forwards else F.lit(False)) & F.col("value").isNotNull()
        return [F.count(F.when(mine, 1)).alias(self.stat("in")),
                F.count(F.when(mine & F.col("key").isNull() & ~forwarded, 1)).alias(self.stat("nullkey")),
                F.count(F.when(mine & F.col("key").isNotNull() & F.col("value").isNull(), 1)
                        ).alias(self.stat("nullvalue")),
                # what reaches the join's stores or its outer side's output: a pair or a write, or a null key forwarded
                F.count(F.when(mine & F.col("value").isNotNull() & (F.col("key").isNotNull() | forwarded), 1)
                        ).alias(self.stat("reach"))]

    def counts(self, rows: list[Any]) -> OperatorCounts:
        """Inputs, null drops, and the records that reach the join (`contributing` until `run` takes away those
        that expired: their store refused them and they found nothing)."""
        counts = OperatorCounts(kind="join", dropped={"null_key": 0, "null_value": 0})
        for r in rows:
            counts.records_in += r[self.stat("in")]
            counts.dropped["null_key"] += r[self.stat("nullkey")]
            counts.dropped["null_value"] += r[self.stat("nullvalue")]
            counts.contributing += r[self.stat("reach")]
        return counts

    def run(self, processed: DataFrame, dropped: DataFrame, counts: OperatorCounts) -> OperatorResult:
        """Joined pairs, non-joined rows, the outer store's emissions; `expired` and null ledger rows."""
        assert self.spec is not None
        return join(self.spec, processed, self.stream_time, self.profile, counts)

    def settle(self, counts: OperatorCounts, ledger: Mapping[str, int]) -> None:
        """Null drops counted per record must all be in the ledger. `run` counted the records that contributed
        from their own fates; the expired ones are the ledger's rows, so `in == contributing + dropped` checks the
        ledger against the records (docs/semantics.md §5.2)."""
        check_null_drops(self.name, counts, ledger, ("null_key", "null_value"))
        counts.dropped["expired"] = ledger.get("expired", 0)


def outer_sides(spec: JoinSpec) -> tuple[int, ...]:
    """Sides whose unmatched records give non-joined results (docs/semantics.md §5.3)."""
    return {"inner": (), "left": (LEFT,), "outer": (LEFT, RIGHT)}[spec.how]


def stream_time_columns(op: OperatorSpec, st: str, rules: versions.Profile) -> dict[str, Column]:
    """ST_j over every record of either side (docs/semantics.md §5.5; before 3.7 only over records with key and value)
    and each window store's time over its writes (9)."""
    spec = op.join
    assert spec is not None
    live = F.col("_drop").isNull()
    written = live & F.col("key").isNotNull() & F.col("value").isNotNull()  # null puts are ignored (9)
    advancing = live if rules.join_time_before_null_check else written
    left, right = join_streams(op)
    return {st: advancing & F.col("source").isin(left, right),
            f"{st}_l": written & (F.col("source") == left),
            f"{st}_r": written & (F.col("source") == right)}


def join(op: OperatorSpec, ordered: DataFrame, st: str, rules: versions.Profile,
         counts: OperatorCounts | None = None) -> OperatorResult:
    """Run one stream-stream join over task-ordered records; `st` names its join stream-time column. Takes the
    expired records, counted one by one, from `counts.contributing` (the records that reached the join)."""
    spec = op.join
    assert spec is not None
    w = JoinWindows.of(spec)
    joiner = joiner_sql(spec.value, f"operators.{op.name}.join.value")
    recs = _records(ordered, op, st, w)  # a projection of the task order, which the caller materialises
    # shuffled once per query by (task, key): the range join, the value look-ups and the outer store's
    # triggers then need no other exchange of the records (the session lets a join on (task, key, bucket)
    # reuse it, session.py)
    joinable = recs.where(F.col("key").isNotNull() & F.col("value").isNotNull()).repartition("task", "key")
    sides = outer_sides(spec)
    # one range join gives the pairs and, null-extended, the left records without any visible row
    beside = _beside_side(op, recs)
    candidates = _pair_values(_pair_join(joinable, joinable, w, "both", wide=True,
                                         how="left" if LEFT in sides else "inner"), joiner, beside)
    cached: tuple[DataFrame, ...] = ()
    if sides:  # read again for the flags (and a left join's expired rows): stored as rows once instead of
        # running the range join again; a columnar cache measured slower than that (benchmarks/README.md,
        # 2026-11-28 21:50). A local checkpoint forgets the partitioning: the flags and the pairs' ordering
        # window shuffle what they read of it (cheaper than a second range join, measured the same day)
        candidates = candidates.localCheckpoint(eager=False)
        cached += (candidates,)
    pairs = candidates.where(F.col("r_seq").isNotNull()) if LEFT in sides else candidates
    rows = _joined_rows(pairs)
    if rules.join_null_keys_reach_join:  # 3.7+: an outer side forwards a null-key record at once (step 2)
        rows = rows.unionByName(_non_joined(recs.where(F.col("key").isNull() & F.col("value").isNotNull()
                                                       & F.col("_outer")), F.col("seq"), IMMEDIATE, joiner,
                                            beside=beside))
    incomplete = None
    if sides:
        flags = functools.reduce(DataFrame.unionByName, [_outer_flags(candidates, joinable, side, w) for side in sides])
        lone = flags.where(~F.col("matched")).persist(StorageLevel.MEMORY_AND_DISK)
        now = lone if w.eager else lone.where(F.col("_to") < F.col("_stj"))  # docs/semantics.md §5.3 / §5.4
        # the non-joined rows emitted at once and those the outer store emits look their values up together
        picked = [now.select("task", "key", "seq", F.col("seq").alias("_out_seq"), F.lit(IMMEDIATE).alias("_phase"),
                             F.lit(0).cast("long").alias("_idx"))]
        cached += (lone,)
        if not w.eager:
            kernel = computed_once(_outer_store(lone, recs, w, rules.outer_scan_per_side))
            picked.append(kernel.where(F.col("out_seq").isNotNull()).select(
                "task", "key", "seq", F.col("out_seq").alias("_out_seq"), F.lit(TRIGGERED).alias("_phase"),
                F.col("idx").alias("_idx")))
            incomplete = kernel.where(F.col("out_seq").isNull()).select("ts", "task", "seq")
            cached += (kernel,)
        rows = rows.unionByName(_non_joined(_with_values(joinable, functools.reduce(DataFrame.unionByName, picked)),
                                            F.col("_out_seq"), F.col("_phase"), joiner, F.col("_idx"), beside))
    # refused by its store and found nothing on arrival: no effect at all (an outer side still gives a row)
    # from the records as they lie: a filter of the (task, key) exchange would shuffle every record for a few
    refused = recs.where(F.col("key").isNotNull() & F.col("value").isNotNull() & F.col("_refused") & ~F.col("_outer"))
    if len(sides) == 2:  # every record is on an outer side
        expired = recs.where(F.lit(False))
    elif sides:  # a left join's refused records are right ones: their pairs are among the stored candidates
        found = candidates.where(F.col("r_seq") > F.col("l_seq")).select(
            F.col("l_task").alias("task"), F.col("r_seq").alias("seq")).join(
            refused.select("task", "seq"), ["task", "seq"], "left_semi").distinct()
        expired = refused.join(found, ["task", "seq"], "left_anti")
    else:
        expired = refused.join(_matched_later(refused, joinable, w), ["task", "seq"], "left_anti")
    if counts is not None and len(sides) < 2:  # their fate, counted apart from the ledger rows made of them
        expired = expired.persist(StorageLevel.MEMORY_AND_DISK)
        cached += (expired,)
        counts.contributing -= expired.count()
    ledger = _null_ledger(recs, op.name, rules).unionByName(ledger_rows(
        expired, reason=EXPIRED, operator=op.name, stream_time=F.col("_sst_own"), range_time=F.col("ts")))
    output = rows.select("key", "value", "ts",
                         _emit_seq_col(F.col("_out_seq"), F.col("_phase"), F.col("_idx")).alias("emit_seq"), "task")
    return OperatorResult(output=output, ledger=ledger, range_column="ts", incomplete=incomplete, cached=cached)


def as_processed(ordered: DataFrame, op: OperatorSpec, st: str) -> DataFrame:
    """The join's input records as it processes them (for `verify`): task, seq, side, ST_j, both stores' times."""
    assert op.join is not None
    return _records(ordered, op, st, JoinWindows.of(op.join))


def _records(ordered: DataFrame, op: OperatorSpec, st: str, w: JoinWindows) -> DataFrame:
    """Both inputs with side, outer flag, ST_j, the stores' times, `to` and whether the write is refused."""
    spec = op.join
    assert spec is not None
    left, right = join_streams(op)
    side = F.when(F.col("source") == left, F.lit(LEFT)).otherwise(F.lit(RIGHT))
    own = F.when(side == LEFT, F.col(f"{st}_l")).otherwise(F.col(f"{st}_r"))
    other = F.when(side == LEFT, F.col(f"{st}_r")).otherwise(F.col(f"{st}_l"))
    ahead = F.when(side == LEFT, F.lit(w.after)).otherwise(F.lit(w.before))
    outer = side.isin(*outer_sides(spec)) if outer_sides(spec) else F.lit(False)
    origin = ["_origin"] if "_origin" in ordered.columns else []  # a re-keyed join names its input records
    origin += [BESIDE_VALUE] if BESIDE_VALUE in ordered.columns else []
    return ordered.where(F.col("source").isin(left, right) & F.col("_drop").isNull()).select(
        "task", "seq", "source", "topic", "partition", "offset", *origin, "key", "value", "ts", "timestamp",
        side.alias("_side"), outer.alias("_outer"), F.col(st).alias("_stj"), own.alias("_sst_own"),
        other.alias("_sst_other"), F.greatest(F.lit(0), F.col("ts") + ahead).alias("_to"),
        # an expired write is dropped (in-memory store; RocksDB hides it on read): docs/semantics.md §5.2
        (F.col("ts") <= own - F.lit(w.retention)).alias("_refused"), key_order(ordered).alias("_korder"))


def key_order(df: DataFrame) -> Column:
    """A column sorting like the serialized key bytes (docs/semantics.md §5.3): a long's big-endian bytes compare unsigned."""
    if isinstance(df.schema["key"].dataType, T.LongType):
        return F.col("key").bitwiseXOR(F.lit(-(2**63)))
    return F.col("key")


def _bucket_width(w: JoinWindows) -> int:
    """Time bucket of the range join: a left record's range spans at most two buckets."""
    return max(w.before + w.after, 1)


def bucketed(left: DataFrame, right: DataFrame, w: JoinWindows, wide: bool = False,
             extra: tuple[str, ...] = ()) -> tuple[DataFrame, DataFrame, Column]:
    """Left rows exploded over the time buckets their look-up range touches, right rows in one bucket,
    and the equi-join condition on (task, key, bucket): the candidates a range join evaluates."""
    width = _bucket_width(w)
    cols = ["task", "key", "seq", "ts", "_sst_other", *extra] + (
        ["value", "timestamp", "topic", "partition", "offset"] if wide else []) + (
        [BESIDE_VALUE] if wide and BESIDE_VALUE in left.columns else [])
    # a left row covers both processors' ranges: [0 if ts == 0 else max(0, ts - before), max(0, ts + after)]
    lo = F.when(F.col("ts") == 0, F.lit(0)).otherwise(F.greatest(F.lit(0), F.col("ts") - F.lit(w.before)))
    hi = F.greatest(F.lit(0), F.col("ts") + F.lit(w.after))
    lrows = left.where(F.col("_side") == LEFT).select(
        *[F.col(c).alias(f"l_{c}") for c in cols], lo.alias("_lo"), hi.alias("_hi")).select(
        *[f"l_{c}" for c in cols], F.explode(F.expr(f"sequence(_lo div {width}L, _hi div {width}L)")).alias("l_bucket"))
    rrows = right.where(F.col("_side") == RIGHT).select(
        *[F.col(c).alias(f"r_{c}") for c in cols], F.expr(f"ts div {width}L").alias("r_bucket"))
    equi = (F.col("l_task") == F.col("r_task")) & (F.col("l_key") == F.col("r_key")) & (
        F.col("l_bucket") == F.col("r_bucket"))
    return lrows, rrows, equi


def _pair_join(left: DataFrame, right: DataFrame, w: JoinWindows, direction: str, wide: bool,
               how: str = "inner") -> DataFrame:
    """Visible pairs: the bucketed equi-join plus the bounds and retention of the later record (docs/semantics.md §5.1, §5.2).
    `how="left"` also gives each left row without any visible pair once per bucket, null-extended."""
    lrows, rrows, equi = bucketed(left, right, w, wide, extra=("_stj",) if how == "left" else ())
    return lrows.join(rrows, equi & _visible(w, direction), how)


def _visible(w: JoinWindows, direction: str) -> Column:
    """The later record finds the earlier: in its [from, to] and still retained, ts > storeST - R."""
    c, ret = F.col, F.lit(w.retention)
    left_later = ((c("l_seq") > c("r_seq")) & c("r_ts").between(F.greatest(F.lit(0), c("l_ts") - w.before),
                                                              F.greatest(F.lit(0), c("l_ts") + w.after))
                  & (c("r_ts") > c("l__sst_other") - ret))
    right_later = ((c("r_seq") > c("l_seq")) & c("l_ts").between(F.greatest(F.lit(0), c("r_ts") - w.after),
                                                               F.greatest(F.lit(0), c("r_ts") + w.before))
                   & (c("l_ts") > c("r__sst_other") - ret))
    return {"both": left_later | right_later, "left_later": left_later, "right_later": right_later}[direction]


def _side_struct(prefix: str, beside: bool = False) -> Column:
    """The joiner's view of one side of a pair (left.* / right.*); `beside`: the side whose value is in
    BESIDE_VALUE."""
    return F.struct(*[F.col(f"{prefix}{BESIDE_VALUE if c == 'value' and beside else c}").alias(c)
                      for c in JOINER_FIELDS])


def _beside_side(op: OperatorSpec, recs: DataFrame) -> int | None:
    """The side whose value is in BESIDE_VALUE (the source beside an operator's rows, §18.9), or None."""
    if BESIDE_VALUE not in recs.columns:
        return None
    left, _ = join_streams(op)
    return LEFT if op.reads_source(left) else RIGHT


def _pair_values(candidates: DataFrame, joiner: str, beside: int | None = None) -> DataFrame:
    """The range join's rows narrowed to what the flags and the joined rows read: both records' seq, the left
    one's flag columns, and for a visible pair its output (the joiner's value, the later timestamp and seq)
    and its fetch order (10.2 step 5: the earlier record's ts, then its arrival).

    The joiner runs here: the pairs then carry its result, not both records' fields (the optimizer prunes what
    the joiner does not read down to the range join's inputs). A null-extended row (no visible pair) has none."""
    left_later = F.col("l_seq") > F.col("r_seq")
    pair = F.col("r_seq").isNotNull()
    flags = [c for c in ("l_ts", "l__stj") if c in candidates.columns]
    return candidates.select(
        "l_task", "l_key", "l_seq", "r_seq", *flags, _side_struct("l_", beside == LEFT).alias("left"),
        _side_struct("r_", beside == RIGHT).alias("right"), F.greatest("l_ts", "r_ts").alias("_pts"),
        F.greatest("l_seq", "r_seq").alias("_out_seq"),
        F.when(left_later, F.col("r_ts")).otherwise(F.col("l_ts")).alias("_e_ts"),
        F.least("l_seq", "r_seq").alias("_e_seq")).select(
        "l_task", "l_key", "l_seq", "r_seq", *flags, F.when(pair, F.expr(joiner)).alias("_value"), "_pts",
        "_out_seq", "_e_ts", "_e_seq")


def _joined_rows(pairs: DataFrame) -> DataFrame:
    """One output per visible pair at the later record, in fetch order: other ts, then arrival (docs/semantics.md §5.1)."""
    rows = pairs.select(F.col("l_task").alias("task"), F.col("l_key").alias("key"), F.col("_value").alias("value"),
                        F.col("_pts").alias("ts"), "_out_seq", F.lit(JOINED).alias("_phase"), "_e_ts", "_e_seq")
    # after a store of the candidates (join()) this window shuffles the pairs again: sorting them before the
    # store, where the range join leaves them partitioned, measured slower (benchmarks/README.md 2026-11-28)
    order = Window.partitionBy("task", "key", "_out_seq").orderBy("_e_ts", "_e_seq")
    return rows.withColumn("_idx", (F.row_number().over(order) - 1).cast("long")).drop("_e_ts", "_e_seq")


def _non_joined(recs: DataFrame, out_seq: Column, phase: int | Column, joiner: str, idx: Column | None = None,
                beside: int | None = None) -> DataFrame:
    """Single-record results: the joiner of the record on its side and null on the other, its own timestamp (11)."""
    this = {side: F.struct(*[F.col(BESIDE_VALUE if c == "value" and side == beside else c).alias(c)
                             for c in JOINER_FIELDS]) for side in (LEFT, RIGHT)}
    phase = phase if isinstance(phase, Column) else F.lit(phase)
    none = {side: F.lit(None).cast(recs.select(this[side].alias("s")).schema["s"].dataType) for side in this}
    return recs.select(
        "task", "key", F.when(F.col("_side") == LEFT, this[LEFT]).otherwise(none[LEFT]).alias("left"),
        F.when(F.col("_side") == RIGHT, this[RIGHT]).otherwise(none[RIGHT]).alias("right"), "ts",
        out_seq.cast("long").alias("_out_seq"), phase.alias("_phase"),
        (idx if idx is not None else F.lit(0)).cast("long").alias("_idx")).select(
        "task", "key", F.expr(joiner).alias("value"), "ts", "_out_seq", "_phase", "_idx")


def _emit_seq_col(out_seq: Column, phase: Column, idx: Column) -> Column:
    """emit_seq() as a column; fails the run rather than overlap two phases."""
    base = F.when(phase == TRIGGERED, F.lit(PHASE_BASE[0])).when(phase == JOINED, F.lit(PHASE_BASE[1])).otherwise(
        F.lit(PHASE_BASE[2]))
    value = out_seq * F.lit(STRIDE) + base + idx
    return F.when(idx < F.lit(2**30), value).otherwise(
        F.raise_error(F.lit("a record emitted 2^30 join results or more; emit_seq cannot order them")))


def _outer_flags(candidates: DataFrame, joinable: DataFrame, side: int, w: JoinWindows) -> DataFrame:
    """Per record of an outer side: `matched` (it found a visible row when processed, 10.2 step 5) and
    `del_seq` (the first later record joining it, which deletes its outer-store entry).

    `candidates` is the left outer range join (_pair_join how="left", _pair_values); a pair's two records
    share task and key."""
    task, key = F.col("l_task").alias("task"), F.col("l_key").alias("key")
    if side == LEFT:
        # grouped by the record alone, with fixed-width buffers (a hash aggregate); the flag columns that
        # follow from the record's key, side and ts are computed after, on one row per record
        flags = candidates.groupBy(task, key, F.col("l_seq").alias("seq")).agg(
            F.max("l_ts").alias("ts"), F.max("l__stj").alias("_stj"),
            F.max(F.coalesce(F.col("l_seq") > F.col("r_seq"), F.lit(False))).alias("matched"),
            F.min(F.when(F.col("r_seq") > F.col("l_seq"), F.col("r_seq"))).alias("del_seq"))
        return flags.select("task", "key", "seq", "ts", F.lit(LEFT).alias("_side"), "_stj",
                            F.greatest(F.lit(0), F.col("ts") + F.lit(w.after)).alias("_to"),
                            key_order(joinable).alias("_korder"), "matched", "del_seq")
    found = candidates.where(F.col("r_seq").isNotNull()).groupBy(task, key, F.col("r_seq").alias("seq")).agg(
        F.max(F.col("r_seq") > F.col("l_seq")).alias("matched"),
        F.min(F.when(F.col("l_seq") > F.col("r_seq"), F.col("l_seq"))).alias("del_seq"))
    mine = joinable.where(F.col("_side") == RIGHT).select("task", "key", "seq", "ts", *FLAG_COLUMNS)
    return mine.join(found, ["task", "key", "seq"], "left").select(
        "task", "key", "seq", "ts", *FLAG_COLUMNS, F.coalesce("matched", F.lit(False)).alias("matched"), "del_seq")


def _matched_later(later: DataFrame, joinable: DataFrame, w: JoinWindows) -> DataFrame:
    """(task, seq) of the records in `later` that found a visible row when processed (few: refused writes)."""
    pairs = _pair_join(later, joinable, w, "left_later", wide=False).unionByName(
        _pair_join(joinable, later, w, "right_later", wide=False))
    return pairs.select(F.col("l_task").alias("task"), F.greatest("l_seq", "r_seq").alias("seq")).distinct()


def _with_values(recs: DataFrame, picked: DataFrame) -> DataFrame:
    """The record columns of picked (task, key, seq) rows, keeping picked's extra columns.

    The records are partitioned by (task, key) already and the picked rows are few (the non-joined ones):
    a hash table of the picked rows per partition instead of sorting every record for a merge join."""
    on = ["task", "key", "seq"]
    extra = [c for c in picked.columns if c not in recs.columns or c in on]
    return recs.join(picked.select(*extra).hint("shuffle_hash"), on)


def _null_ledger(recs: DataFrame, name: str, rules: versions.Profile) -> DataFrame:
    """Null key or value: skipped by the join processor (docs/semantics.md §5.5), stream time already advanced (3.7+);
    before 3.7 a null key never reaches the join at all."""
    # an outer side forwards null keys (step 2, 3.7+)
    forwarded = F.col("_outer") & F.col("value").isNotNull() & F.lit(rules.join_null_keys_reach_join)
    null_key = recs.where(F.col("key").isNull() & ~forwarded)
    null_value = recs.where(F.col("key").isNotNull() & F.col("value").isNull())
    # a null new key of a re-keyed join never reaches a task (ops/repartition.py): no stream time
    return ledger_rows(null_key, reason=NULL_KEY, operator=name, stream_time=F.when(F.col("task").isNotNull(),
                                                                                    F.col("_stj")),
                       range_time=F.col("ts")).unionByName(
        ledger_rows(null_value, reason=NULL_VALUE, operator=name, stream_time=F.col("_stj"),
                    range_time=F.col("ts")))


def _outer_store(lone: DataFrame, recs: DataFrame, w: JoinWindows, per_side: bool) -> DataFrame:
    """Per task kernel over the records that wait in the outer store and the triggers (docs/semantics.md §5.3).

    The triggers are joinable records (key and value set) taken from `recs` as they lie: the kernel groups by
    task, so the (task, key) exchange of the joinable records would only shuffle them once more."""
    waits = lone.where(F.col("_to") >= F.col("_stj")).select(
        "task", "key", "seq", "ts", *FLAG_COLUMNS, F.lit(True).alias("waits"),
        F.coalesce("del_seq", F.lit(JAVA_MAX)).alias("del_seq"))
    newest = F.col("ts") == F.col("_stj")  # only the newest record triggers (step 4)
    triggers = recs.where(F.col("key").isNotNull() & F.col("value").isNotNull() & newest).select(
        "task", "key", "seq", "ts", *FLAG_COLUMNS, F.lit(False).alias("waits"), F.lit(JAVA_MAX).alias("del_seq"))
    schema = KERNEL_SCHEMA.format(key=recs.schema["key"].dataType.simpleString())
    return waits.unionByName(triggers).groupBy("task").applyInPandas(_kernel(w, per_side), schema)


def _kernel(w: JoinWindows, per_side: bool) -> Any:
    """The applyInPandas function: one task's events -> its emitted and pending outer-store rows."""
    def run(pdf: pd.DataFrame) -> pd.DataFrame:
        import pandas as pd  # in the Python worker; the CLI does not pay for pandas

        task = int(pdf["task"].iloc[0])
        # one row per record: a waiting record that is also a trigger comes twice
        pdf = pdf.assign(trigger=pdf["ts"] == pdf["_stj"]).groupby("seq", sort=True).agg(
            side=("_side", "first"), key=("key", "first"), ts=("ts", "first"), stj=("_stj", "first"),
            korder=("_korder", "first"), waits=("waits", "max"), trigger=("trigger", "max"),
            del_seq=("del_seq", "min")).reset_index()
        cols = {c: pdf[c].tolist() for c in ("seq", "side", "ts", "stj", "korder", "waits", "trigger", "del_seq")}
        emitted, pending = outer_emissions(w, **cols, per_side=per_side)
        ts = dict(zip(cols["seq"], cols["ts"]))
        key = dict(zip(cols["seq"], pdf["key"].tolist()))
        rows = [(task, key[e], s, i, e, ts[e]) for s, i, e in emitted] + [
            (task, key[e], None, None, e, ts[e]) for e in pending]
        return pd.DataFrame(rows, columns=["task", "key", "out_seq", "idx", "seq", "ts"]).astype(
            {"out_seq": "Int64", "idx": "Int64"})
    return run


def java_long(x: int) -> int:
    """Wrap to a signed 64-bit value, as Java long arithmetic does."""
    return (x + 2**63) % 2**64 - 2**63


def outer_emissions(w: JoinWindows, seq: list[int], side: list[int], ts: list[int], stj: list[int],
                    korder: list[Any], waits: list[bool], trigger: list[bool], del_seq: list[int],
                    per_side: bool = True) -> tuple[list[tuple[int, int, int]], list[int]]:
    """Replay the outer store of one task: (trigger seq, position, record seq) emitted, and still pending.

    `per_side` (3.8+, KAFKA-15417): each entry is open by its own side's look-ahead. Before 3.8 the
    processing record's side decides for every entry, the first open entry ends the scan, and the cheap
    skip compares minTime with ST_j - its `before` - grace."""
    store: list[tuple[int, int, Any, int]] = []  # (ts, side byte, key order, seq): outer-store order (§5.3)
    gone = {}
    min_time = JAVA_MAX
    emitted: list[tuple[int, int, int]] = []
    for i, s in enumerate(seq):
        if trigger[i]:
            ahead = w.after if side[i] == LEFT else w.before  # the processor's joinAfterMs
            behind = w.before if side[i] == LEFT else w.after  # the processor's joinBeforeMs
            due = java_long(min_time + ahead + w.grace) < stj[i] if per_side else min_time < stj[i] - behind - w.grace
            if due:  # 10.4 step 1: cheap skip otherwise
                min_time, store = _emit_closed(store, gone, s, stj[i], w, emitted, None if per_side else ahead)
        if waits[i]:  # 10.2 step 6
            min_time = min(min_time, ts[i])
            bisect.insort(store, (ts[i], side[i], korder[i], s))
            gone[s] = del_seq[i]
    return emitted, [e[3] for e in store if gone[e[3]] == JAVA_MAX]


def _emit_closed(store: list[tuple[int, int, Any, int]], gone: dict[int, int], s: int, st: int, w: JoinWindows,
                 emitted: list[tuple[int, int, int]], legacy_ahead: int | None = None
                 ) -> tuple[int, list[tuple[int, int, Any, int]]]:
    """One emitNonJoinedOuterRecords pass (docs/semantics.md §5.3); rows joined before seq s are already deleted.
    `legacy_ahead` (before 3.8): the processor's look-ahead, for every entry; the first open entry stops."""
    min_time, kept, open_sides, i, idx = JAVA_MAX, [], 0, 0, 0
    while i < len(store):
        ts, side, _, seq = entry = store[i]
        if gone[seq] < s:  # deleted by a join (docs/semantics.md §5.1) before this trigger: never visited
            i += 1
            continue
        min_time = ts
        if legacy_ahead is not None:
            if ts + legacy_ahead + w.grace >= st:
                break
            emitted.append((s, idx, seq))
            idx += 1
            i += 1
            continue
        if open_sides == 3:  # an open row on both sides: everything after is open too
            break
        if ts + w.look_back(side) + w.grace >= st:
            open_sides |= 1 << side
            kept.append(entry)
        else:
            emitted.append((s, idx, seq))
            idx += 1
        i += 1
    return min_time, kept + store[i:]
