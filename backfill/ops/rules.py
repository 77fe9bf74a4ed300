"""Part: operators. The lookback rule engine (docs/semantics.md §12): per transaction and rule, an aggregate over the same
grouping key's transactions in [t - W, t], compared with the rule's limit; an alert when it holds.

Rule messages are few: the driver reads them in arrival order and turns them into a timeline (which rule
versions are present where on the arrival axis, where the state is cleared, where the widest window changes).
Transactions never come to the driver:

1. each transaction reads the fields the rules name, and finds the rule versions present at its arrival
   (or the final set) in a literal array: no join;
2. one fork per version; the grouping-key string and the state key (demo: the key string, shared by every
   rule with that string; intended: rule id and key string);
3. with `order: arrival`, the live job's watermark when the transaction was processed (the largest event time
   seen before it minus the out-of-orderness, once a rule had arrived): a running max over the arrival axis,
   in buckets whose earlier maxima the driver adds;
4. a per-state kernel (`rules_kernel.py`) replays the state: in event-time order it is a range over a sorted
   array; otherwise it replays every fork with timers, clears and resets.

The arrival axis is the recorded `seq` when both sources have `order_by`, else the record timestamp; a rule
message comes before a transaction at the same place, then partition and offset decide.
"""
from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from backfill.errors import SourceError, SpecError
from backfill.jobspec.durations import format_duration
from backfill.jobspec.models import OperatorSpec, RulesSpec
from backfill.jobspec.rulemessages import Rule, RuleMessageError, parse_rule
from backfill.ledger import ledger_rows
from backfill.ops.base import Check, Operator, OperatorCounts, OperatorResult, OutputSuite, in_source
from backfill.ops.rules_kernel import (JAVA_MIN, NUMBER, OUTPUT_SCHEMA, Held, Timeline, Version, held_watermarks,
                                       run_partition, window_members)

if TYPE_CHECKING:
    import pandas as pd
    from backfill.jobspec.load import Job

Axis = tuple[int, int, int, int]
REASONS = ("no_rule", "invalid_timestamp", "invalid_field", "invalid_rule", "null_value")
BUCKETS = 256  # running-max buckets of the watermark (the driver adds the maxima of the earlier ones)
OUTPUT_COLUMNS = ("rule_id", "key", "value", "transaction", "ts", "rule", "emit_seq")


class WouldFail(SourceError):
    """compat: demo, and the published code would throw where this data takes it: the live job fails there."""


@dataclass
class RuleTimeline:
    """What the driver learns from the rule messages, in arrival order."""

    versions: list[Rule] = field(default_factory=list)
    # version index, present from (inclusive) .. until (exclusive; None: to the end); from None: always
    intervals: list[tuple[int, Axis | None, Axis | None]] = field(default_factory=list)
    clears: list[Axis] = field(default_factory=list)
    widest: list[tuple[Axis, int | None]] = field(default_factory=list)
    initial_widest: int | None = None
    first_rule: Axis | None = None
    invalid: list[tuple[int, int, str]] = field(default_factory=list)  # partition, offset, why

    @property
    def aggregate_fields(self) -> list[str]:
        """Every field a rule version aggregates (the count fields excluded), in first-use order."""
        return list(dict.fromkeys(v.field for v in self.versions if v.field and not v.counts))

    @property
    def key_fields(self) -> list[str]:
        """Every field a rule version groups by."""
        return list(dict.fromkeys(k for v in self.versions for k in v.keys))


def build_timeline(messages: list[tuple[Axis, str | None]], spec: RulesSpec, name: str) -> RuleTimeline:
    """The rule timeline of one operator from its rule messages (axis, text), sorted by the axis."""
    tl = RuleTimeline()
    present: dict[int, tuple[int, Axis]] = {}  # rule id -> (version index, since)
    widest: int | None = None
    arrival_versions = spec.rule_versions == "as_of_arrival"
    for axis, text in sorted(messages, key=lambda m: m[0]):
        try:
            rule = parse_rule(text or "")
        except RuleMessageError as exc:
            tl.invalid.append((axis[2], axis[3], str(exc)))
            continue
        if tl.first_rule is None:
            tl.first_rule = axis
        if rule.state in ("ACTIVE", "PAUSE"):
            assert rule.rule_id is not None
            if rule.rule_id in present:
                idx, since = present.pop(rule.rule_id)
                tl.intervals.append((idx, since, axis))
            tl.versions.append(rule)
            present[rule.rule_id] = (len(tl.versions) - 1, axis)
            if rule.state == "ACTIVE" and (widest is None or rule.window_ms > widest):
                widest = rule.window_ms
                tl.widest.append((axis, widest))
        elif rule.state == "DELETE" and rule.rule_id in present:
            idx, since = present.pop(rule.rule_id)
            tl.intervals.append((idx, since, axis))
        elif rule.control == "DELETE_RULES_ALL":
            if spec.compat == "demo" and len(present) + (widest is not None) >= 2:
                raise WouldFail(f"operators.{name}: compat: demo: the DELETE_RULES_ALL message at partition "
                                f"{axis[2]} offset {axis[3]} would fail the published job with {len(present)} "
                                "rules present (ConcurrentModificationException); use compat: intended")
            for idx, since in present.values():
                tl.intervals.append((idx, since, axis))
            present.clear()
            widest = None
            tl.widest.append((axis, None))
        elif rule.control == "CLEAR_STATE_ALL":
            tl.clears.append(axis)
    for idx, since in present.values():
        tl.intervals.append((idx, since, None))
    if arrival_versions:
        return tl
    # rule_versions: final: the final set for every transaction, from the start (Flink BATCH: broadcast first)
    final = [idx for idx, _, until in tl.intervals if until is None]
    widths = [tl.versions[i].window_ms for i in final if tl.versions[i].state == "ACTIVE"]
    return RuleTimeline(versions=tl.versions, intervals=[(i, None, None) for i in final],
                        initial_widest=max(widths) if widths else None, first_rule=None, invalid=tl.invalid)


@dataclass(frozen=True)
class RulesOperator(Operator):
    """The `rules` operator of a job: alerts of per-event lookback rules."""

    noun = "rules operator"
    verified_as = "alerts"  # verify/alerts.py: keyed by (rule_id, transaction_id)

    range_column = "ts"  # an alert's range is its transaction's timestamp
    reads_all = True  # a state holds what arrived before: history before --start and after --end counts
    copartitioned = False  # rule messages are broadcast to every transaction

    @classmethod
    def from_job(cls, job: Job, spec: OperatorSpec, index: int, sink: str | None, start: int | None,
                 end: int | None) -> RulesOperator:
        """Both sources are read whole; they belong to rules operators only."""
        rs = spec.rules
        assert rs is not None
        for other in job.spec.operators:
            if other.rules is None and set(other.inputs) & {rs.input, rs.rules}:
                raise SpecError(f"{job.path}: operators.{other.name} reads a source of the rules operator "
                                f"{spec.name}; a rules operator reads its sources as JSON text, so give the other "
                                "operator a source of its own")
        text = f"order {rs.order}, rule versions {rs.rule_versions}, compat {rs.compat}"
        if rs.order == "arrival":
            text += f", watermark: largest event time - {format_duration(rs.out_of_orderness)}"
        why = ["reads every record of both sources: a state holds what arrived before (resets, clears, "
               "eviction), so no record outside the range can be skipped (alerts outside it are not published)"]
        return cls(name=spec.name, kind="rules", inputs=tuple(spec.inputs), window=text, emit="alerts", sink=sink,
                   why=tuple(why), spec=spec, index=index)

    @property
    def rule_set(self) -> RulesSpec:
        """The job's rules operator: its transactions, its rule messages and how it reads them."""
        assert self.spec is not None and self.spec.rules is not None
        return self.spec.rules

    def stream_time_columns(self) -> dict[str, Column]:
        """None: Flink's rule engine has no stream time; its watermark is computed in `run`."""
        return {}

    def count_columns(self, live: Column, late: dict[str, Column] | None = None) -> list[Column]:
        """Transactions and rule messages in."""
        return [F.count(F.when(in_source(self.rule_set.input) & live, 1)).alias(self.stat("tx")),
                F.count(F.when(in_source(self.rule_set.rules) & live, 1)).alias(self.stat("msgs"))]

    def counts(self, rows: list[Any]) -> OperatorCounts:
        """Records in; `run` counts the contributing ones from their own fates, and `settle` takes the drops from
        the ledger, so `in == contributing + dropped` checks the ledger against the records (docs/semantics.md
        §7.1)."""
        counts = OperatorCounts(kind="rules", dropped={reason: 0 for reason in REASONS})
        for r in rows:
            counts.records_in += r[self.stat("tx")] + r[self.stat("msgs")]
        return counts

    def settle(self, counts: OperatorCounts, ledger: Mapping[str, int]) -> None:
        """Every record in is a rule message applied, a transaction some rule saw (both counted by `run`), or a
        ledger row."""
        for reason in REASONS:
            counts.dropped[reason] = ledger.get(reason, 0)

    def run(self, processed: DataFrame, dropped: DataFrame, counts: OperatorCounts) -> OperatorResult:
        """Alerts and ledger rows; the records that contributed, counted into `counts`."""
        return _run(self, processed, counts)

    def output_suite(self, output: DataFrame) -> OutputSuite | None:
        """An alert names its rule, key, value and transaction; one alert per transaction and rule version."""
        checks = [Check("ExpectColumnValuesToNotBeNull", {"column": c}, f"every alert has a {c}")
                  for c in ("rule_id", "key", "value", "transaction", "ts", "emit_seq")]
        return OutputSuite(frame=output, checks=checks, unique=("emit_seq",))


# ------------------------------------------------------------------------------------------------ the run
@dataclass
class _Prepared:
    """What the kernel replays: the rule timeline, the parsed transactions, one fork per (transaction, rule
    version present), and how states are keyed and ordered."""

    base: DataFrame
    msgs: list[Any]
    tl: RuleTimeline
    tx: DataFrame
    forks: DataFrame
    versions: list[Version]
    timeline: Timeline
    arrival: bool
    demo: bool
    state_key: list[str]
    order: list[str]


def _prepare(op: RulesOperator, processed: DataFrame) -> _Prepared:
    spec = op.rule_set
    given = "_recorded_seq" in processed.columns
    base = processed.where(F.col("_drop").isNull())
    first = F.col("_recorded_seq") if given else F.col("ts")
    msgs = base.where(F.col("source") == spec.rules).select(first.alias("a0"), "partition", "offset",
                                                           F.col("value").cast("string").alias("text")).collect()
    tl = build_timeline([((r["a0"], 0, r["partition"], r["offset"]), r["text"]) for r in msgs], spec, op.name)
    tx = base.where(F.col("source") == spec.input).withColumn("_a0", first)
    # parsed once (the values are JSON text): the ledger, the watermark and the forks all read it
    kept = ["source", "topic", "partition", "offset", "key", "ts", "_a0", "_t", "_present", "_bad", "_ok",
            "_null_value", "_fields", *(["_v"] if spec.compat == "demo" else [])]
    tx = _read_fields(tx, spec, tl).withColumn("_null_value", F.col("value").isNull()).select(*kept) \
        .persist(StorageLevel.MEMORY_AND_DISK)
    timeline = Timeline()
    live = tx.where(F.col("_ok"))
    if spec.order == "arrival":
        marked, timeline = _with_watermark(tx.where(F.col("_t").isNotNull()), tl, spec)
        live = marked.where(F.col("_ok"))
    forks = _forks(live, tl, spec)
    versions = [_kernel_version(v, tl) for v in tl.versions]
    arrival, demo = spec.order == "arrival", spec.compat == "demo"
    state_key = ["key"] if demo else ["rule_id", "key"]
    order = ["a0", "a1", "a2", "a3", "rule_id"] if arrival else ["t", "a0", "a1", "a2", "a3", "rule_id"]
    return _Prepared(base=base, msgs=msgs, tl=tl, tx=tx, forks=forks, versions=versions, timeline=timeline,
                     arrival=arrival, demo=demo, state_key=state_key, order=order)


WINDOW_STATE_LIMIT = 100_000  # forks of one state replayed on the driver to show an alert's window


def _states(p: _Prepared, processed: DataFrame, wanted: list[tuple[int, int, int]]) -> Iterator[pd.DataFrame]:
    """The forks of each state holding one of the `wanted` evaluations (rule id, transaction partition, offset),
    in processing order, a state at a time; a state of more than WINDOW_STATE_LIMIT forks is left out (a hot key's
    whole history does not come to the driver)."""
    import pandas as pd

    spark = processed.sparkSession
    asked = spark.createDataFrame(wanted, "rule_id int, partition int, offset long")
    states = p.forks.join(F.broadcast(asked), ["rule_id", "partition", "offset"], "left_semi").select(
        *p.state_key).distinct()
    sizes = p.forks.join(F.broadcast(states), p.state_key, "left_semi").groupBy(*p.state_key).count()
    states = sizes.where(F.col("count") <= WINDOW_STATE_LIMIT).drop("count")
    rows = (p.forks.join(F.broadcast(states), p.state_key, "left_semi")
            .orderBy(*p.state_key, *p.order).toPandas())
    for _, group in (rows.groupby(p.state_key, sort=False) if len(rows) else []):
        yield pd.DataFrame(group)


def window_contents(op: RulesOperator, processed: DataFrame, wanted: list[tuple[int, int, int]]
                    ) -> dict[tuple[int, int, int], list[tuple[int, int, int]]]:
    """For alerts (rule id, transaction partition, offset) of this operator over `processed` (its input as the
    run processes it): the transactions in the rule's window when it fired, as (partition, offset, event
    time), found by replaying each alert's state literally on the driver (rules_kernel.py `window_members`;
    docs/semantics.md §12.13). An alert the operator does not give is absent, and so is one whose state holds
    more than WINDOW_STATE_LIMIT forks."""
    if not wanted:
        return {}
    p = _prepare(op, processed)
    try:
        found: dict[tuple[int, int, int], list[tuple[int, int, int]]] = {}
        for group in _states(p, processed, wanted):
            found.update(window_members(group, p.versions, p.timeline, p.arrival, p.demo))
        return {w: found[w] for w in wanted if w in found}
    finally:
        p.tx.unpersist()


HOLDS_TRIED = 16  # per evaluation: the latest forks before it at which timers evicted entries
HOLD_STEPS = 500_000  # forks a verify replays with held watermarks, in all: about 20 s on the driver (the
# exact replay ran 26,000 forks/s on a 100,000-fork state)


def held_watermark(op: RulesOperator, processed: DataFrame, wanted: list[tuple[int, int, int]]
                   ) -> dict[tuple[int, int, int], list[Held]]:
    """For evaluations (rule id, transaction partition, offset) of this operator over `processed`: each replayed
    with the watermark held from one of the HOLDS_TRIED latest evictions before it (rules_kernel.py
    `held_watermarks`; docs/semantics.md §12.14). Only with `order: arrival` (the other order has no cleanup);
    an evaluation whose state holds more than WINDOW_STATE_LIMIT forks is absent, and so are those beyond
    HOLD_STEPS replayed forks."""
    if not wanted or op.rule_set.order != "arrival":
        return {}
    p = _prepare(op, processed)
    try:
        found: dict[tuple[int, int, int], list[Held]] = {}
        left = HOLD_STEPS
        for group in _states(p, processed, wanted):
            got, spent = held_watermarks(group, p.versions, p.timeline, p.demo, wanted, HOLDS_TRIED, left)
            found.update(got)
            left -= spent
        return found
    finally:
        p.tx.unpersist()


def _run(op: RulesOperator, processed: DataFrame, counts: OperatorCounts) -> OperatorResult:
    p = _prepare(op, processed)
    spec, base, msgs, tl, tx, forks = op.rule_set, p.base, p.msgs, p.tl, p.tx, p.forks
    versions, timeline, arrival, demo, state_key, order = (p.versions, p.timeline, p.arrival, p.demo, p.state_key,
                                                           p.order)
    ledger = _ledger(op, base, tx, tl)
    # contributing from each record's own fate, apart from the ledger rows made of the others
    counts.contributing = tx.where(F.col("_ok")).count() + len(msgs) - len(tl.invalid)

    def kernel(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        return run_partition(batches, versions, timeline, arrival, demo, state_key)

    # every state whole in one partition, in processing order: one compiled call replays them all
    ordered = forks.repartition(*state_key).sortWithinPartitions(*state_key, *order)
    found = ordered.mapInPandas(kernel, OUTPUT_SCHEMA).persist(StorageLevel.MEMORY_AND_DISK)
    failed = found.where(F.col("fail").isNotNull()).orderBy("o0", "o1", "o2", "o3").limit(1).collect()
    if failed:
        f = failed[0]
        found.unpersist()
        raise WouldFail(f"operators.{op.name}: compat: demo: {f['fail']} at {spec.input} partition "
                        f"{f['partition']} offset {f['offset']}; use compat: intended to compute it as intended")
    alerts = _alerts(found, base.where(F.col("source") == spec.input), tl)
    return OperatorResult(output=alerts, ledger=ledger, range_column="ts", cached=(found, tx))


def _read_fields(tx: DataFrame, spec: RulesSpec, tl: RuleTimeline) -> DataFrame:
    """Event time, the fields the rules name (as text), the versions present, and what is wrong."""
    v = F.expr("try_parse_json(CAST(value AS STRING))")
    if spec.event_time == "timestamp":
        t = F.col("ts")
    else:
        raw = F.try_variant_get(v, _path(spec.event_time[6:]), "string")
        t = F.when(raw.rlike(r"^[+-]?[0-9]+$"), F.expr("try_cast(_raw_t AS BIGINT)"))
        tx = tx.withColumn("_raw_t", raw)
    tx = tx.withColumn("_v", v).withColumn("_t", t)
    fields = list(dict.fromkeys([*tl.key_fields, *tl.aggregate_fields]))
    for i, name in enumerate(fields):
        tx = tx.withColumn(f"_f{i}", F.try_variant_get(F.col("_v"), _path(name), "string"))
    col_of = {name: f"_f{i}" for i, name in enumerate(fields)}
    axis = _axis_col("_a0", 1)
    if spec.rule_versions == "final":
        present = F.array(*[F.lit(i) for i, _, _ in tl.intervals]).cast("array<int>")
    else:
        bounds = F.array(*[F.struct(F.lit(i).alias("i"), _axis_lit(lo).alias("lo"), _axis_lit(hi).alias("hi"))
                           for i, lo, hi in tl.intervals]) if tl.intervals else F.array().cast(
            "array<struct<i:int,lo:struct<a0:bigint,a1:int,a2:int,a3:bigint>,hi:struct<a0:bigint,a1:int,a2:int,a3:bigint>>>")
        present = F.transform(F.filter(bounds, lambda b: (axis >= b["lo"]) & (b["hi"].isNull() | (axis < b["hi"]))),
                              lambda b: b["i"])
        present = F.array_sort(present)
    tx = tx.withColumn("_present", present)
    numeric = {name: F.coalesce(F.col(col_of[name]).rlike(NUMBER.pattern), F.lit(False))
               for name in tl.aggregate_fields}
    ok = F.array(*[F.lit(True) if r.counts or not r.field else numeric[r.field] for r in tl.versions]) \
        if tl.versions else F.array().cast("array<boolean>")
    tx = tx.withColumn("_bad", F.filter("_present", lambda i: ~F.element_at(ok, i + 1)))
    tx = tx.withColumn("_ok", F.col("value").isNotNull() & F.col("_t").isNotNull() & (F.size("_present") > 0)
                       & (F.size("_bad") == 0))
    return tx.withColumns({"_fields": F.array(*[F.col(c) for c in col_of.values()]) if col_of
                           else F.array().cast("array<string>")})


def _path(name: str) -> str:
    return "$['" + name.replace("\\", "\\\\").replace("'", "\\'") + "']"


def _axis_col(first: str, kind: int) -> Column:
    return F.struct(F.col(first).cast("bigint").alias("a0"), F.lit(kind).cast("int").alias("a1"),
                    F.col("partition").cast("int").alias("a2"), F.col("offset").cast("bigint").alias("a3"))


def _axis_lit(axis: Axis | None) -> Column:
    if axis is None:
        return F.lit(None).cast("struct<a0:bigint,a1:int,a2:int,a3:bigint>")
    return F.struct(F.lit(axis[0]).cast("bigint").alias("a0"), F.lit(axis[1]).cast("int").alias("a1"),
                    F.lit(axis[2]).cast("int").alias("a2"), F.lit(axis[3]).cast("bigint").alias("a3"))


def _forks(tx: DataFrame, tl: RuleTimeline, spec: RulesSpec) -> DataFrame:
    """One row per (transaction, rule version present): the grouping-key string and the values."""
    fields = list(dict.fromkeys([*tl.key_fields, *tl.aggregate_fields]))
    col_of = {name: F.col("_fields")[i] for i, name in enumerate(fields)}
    carried = [c for c in ("_v", "wm") if c in tx.columns]
    forks = tx.select("partition", "offset", "_a0", "_t", "_fields", *carried, F.explode("_present").alias("version"))
    by_keys: dict[tuple[str, ...], list[int]] = {}
    for i, rule in enumerate(tl.versions):
        by_keys.setdefault(rule.keys, []).append(i)
    key = F.lit(None).cast("string")
    for keys, idxs in by_keys.items():
        parts: list[Column] = [F.lit("{")]
        for j, name in enumerate(keys):
            parts += [F.lit((";" if j else "") + name + "="), F.coalesce(col_of[name], F.lit("null"))]
        key = F.when(F.col("version").isin(*idxs), F.concat(*parts, F.lit("}"))).otherwise(key)
    rule_id = F.element_at(F.array(*[F.lit(r.rule_id) for r in tl.versions]).cast("array<int>"), F.col("version") + 1)
    values = [col_of[name].alias(f"v{i}") for i, name in enumerate(tl.aggregate_fields)]
    txid = F.to_json("_v") if spec.compat == "demo" else F.lit(None).cast("string")
    return forks.select(
        key.alias("key"), rule_id.alias("rule_id"), F.col("version").cast("int").alias("version"),
        F.col("_a0").cast("bigint").alias("a0"), F.lit(1).alias("a1"), F.col("partition").cast("int").alias("a2"),
        F.col("offset").alias("a3"), F.col("_t").alias("t"), "partition", "offset", *values, txid.alias("txid"),
        *(["wm"] if "wm" in carried else []))


def _kernel_version(rule: Rule, tl: RuleTimeline) -> Version:
    fields = tl.aggregate_fields
    assert rule.rule_id is not None and rule.limit is not None
    return Version(rule_id=rule.rule_id, active=rule.state == "ACTIVE", window_ms=rule.window_ms,
                   field=-1 if rule.counts or not rule.field else fields.index(rule.field),
                   aggregator=rule.aggregator or "SUM", operator=rule.operator or "", limit=rule.limit,
                   resets=rule.resets)


def _with_watermark(tx: DataFrame, tl: RuleTimeline, spec: RulesSpec) -> tuple[DataFrame, Timeline]:
    """The live job's watermark when each transaction was processed (`wm`), and the timeline events with theirs.

    wm = (largest event time of the transactions before it) - out_of_orderness once a rule message has
    arrived (before, the rule stream holds the combined watermark at Long.MIN_VALUE); computed as a running
    max within buckets of the arrival axis plus the maxima of the earlier buckets (`tx`: every transaction
    with an event time, forked or not: they all move the watermark).
    """
    ooo = spec.out_of_orderness
    axis = _axis_col("_a0", 1)
    changes = [(a, w) for a, w in tl.widest]
    stats = tx.agg(F.min("_a0").alias("lo"), F.max("_a0").alias("hi"),
                   *[F.max(F.when(axis < _axis_lit(a), F.col("_t"))).alias(f"c{k}") for k, (a, _) in enumerate(changes)]
                   ).first()
    assert stats is not None

    def gated(axis_: Axis, max_before: int | None) -> int:
        open_ = tl.first_rule is None and spec.rule_versions == "final" or (
            tl.first_rule is not None and tl.first_rule < axis_)
        return max_before - ooo if open_ and max_before is not None else JAVA_MIN

    timeline = Timeline(clears=tuple(tl.clears) if spec.rule_versions == "as_of_arrival" else (),
                        widest=tuple((a, gated(a, stats[f"c{k}"]), w) for k, (a, w) in enumerate(changes)),
                        initial_widest=tl.initial_widest)
    if stats["lo"] is None:
        return tx.withColumn("wm", F.lit(JAVA_MIN)), timeline
    lo, hi = int(stats["lo"]), int(stats["hi"])
    width = max(1, math.ceil((hi - lo + 1) / BUCKETS))
    bucket = F.floor((F.col("_a0") - F.lit(lo)) / F.lit(width)).cast("int")
    maxima = {r["b"]: r["m"] for r in tx.groupBy(bucket.alias("b")).agg(F.max("_t").alias("m")).collect()}
    earlier, best = {}, None
    for b in range(max(maxima) + 1):
        earlier[b] = best
        if maxima.get(b) is not None:
            best = maxima[b] if best is None else max(best, maxima[b])
    # transactions without a fork still move the watermark: the running max is over all of them (one row per
    # transaction, before the forks)
    within = F.max("_t").over(Window.partitionBy(bucket).orderBy("_a0", "partition", "offset")
                              .rowsBetween(Window.unboundedPreceding, -1))
    prior = F.element_at(F.create_map(*[F.lit(x) for b, m in earlier.items() if m is not None for x in (b, m)]),
                         bucket) if any(m is not None for m in earlier.values()) else F.lit(None).cast("bigint")
    max_before = F.greatest(within, prior)
    first_rule = tl.first_rule
    if spec.rule_versions == "final":
        gate = F.lit(True)
    elif first_rule is None:
        gate = F.lit(False)
    else:
        gate = axis > _axis_lit(first_rule)
    wm = F.when(gate & max_before.isNotNull(), max_before - F.lit(ooo)).otherwise(F.lit(JAVA_MIN))
    return tx.withColumn("wm", wm), timeline


def _alerts(found: DataFrame, tx: DataFrame, tl: RuleTimeline) -> DataFrame:
    """Alert rows: the kernel's findings with their transaction, rule version and emission order."""
    rule_json = F.element_at(F.array(*[F.lit(r.to_json()) for r in tl.versions]), F.col("version") + 1) \
        if tl.versions else F.lit(None).cast("string")
    txs = tx.select("partition", "offset", F.col("value").cast("string").alias("transaction"), "ts")
    alerts = found.where(F.col("fail").isNull()).join(txs, ["partition", "offset"])
    order = Window.orderBy("o0", "o1", "o2", "o3", "rule_id")
    return alerts.select("rule_id", "key", "value", "transaction", "ts", rule_json.alias("rule"),
                         F.row_number().over(order).cast("bigint").alias("emit_seq"))


def _ledger(op: RulesOperator, base: DataFrame, tx: DataFrame, tl: RuleTimeline) -> DataFrame:
    """Transactions no rule could see or read, and rule messages the live job would drop."""
    spec = op.rule_set
    reason = (F.when(F.col("_null_value"), F.lit("null_value"))
              .when(F.col("_t").isNull(), F.lit("invalid_timestamp"))
              .when(F.size("_present") == 0, F.lit("no_rule")).otherwise(F.lit("invalid_field")))
    ids = F.array(*[F.lit(r.rule_id) for r in tl.versions]) if tl.versions else F.array().cast("array<int>")
    names = F.array(*[F.lit(r.field) for r in tl.versions]) if tl.versions else F.array().cast("array<string>")
    # the rule with the lowest id that cannot read it (the live job forks in that order)
    first_bad = F.array_min(F.transform("_bad", lambda i: F.struct(F.element_at(ids, i + 1).alias("id"),
                                                                   F.element_at(names, i + 1).alias("field"))))
    detail = (F.when(F.col("_null_value"), F.lit(None))
              .when(F.col("_t").isNull(), F.lit(f"event_time {spec.event_time} is not epoch milliseconds"))
              .when(F.size("_present") == 0, F.lit(None))
              .otherwise(F.concat(F.lit("rule "), first_bad["id"].cast("string"), F.lit(": "), first_bad["field"],
                                  F.lit(" is not a number"))))
    rows = ledger_rows(tx.where(~F.col("_ok")), reason=reason, operator=op.name, detail=detail,
                       range_time=F.col("ts"))
    if not tl.invalid:
        return rows
    spark = base.sparkSession
    bad = spark.createDataFrame(tl.invalid, "partition int, offset long, why string")
    msgs = base.where(F.col("source") == spec.rules).join(F.broadcast(bad), ["partition", "offset"])
    return rows.unionByName(ledger_rows(msgs, reason="invalid_rule", operator=op.name, detail=F.col("why"),
                                        range_time=F.col("ts")))
