"""Part: plan. Execute a plan on Spark: read, extract timestamps, order, run each operator, account, check, publish.

The loop is the same for every operator (`backfill.ops.base.Operator`): nothing here depends on what kind
of operator it runs.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import json
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from backfill import __version__
from backfill.columns import check_declared
from backfill.checks.conservation import check_chains, check_conservation, conservation_rows
from backfill.checks.expectations import PublishChecks, warm_up
from backfill.errors import NotImplementedYet, SourceError, SpecError
from backfill.io.publish import complete_pending, publish
from backfill.io.sinks import Staged, discard, stage_output
from backfill.io.sources import read_source
from backfill.ledger import CONFLICTING_OFFSET, INVALID_TIMESTAMP, UNREADABLE, ledger_rows
from backfill.ops.base import Operator, OperatorCounts, OperatorResult
from backfill.ops.join import BESIDE_VALUE, STRIDE as JOIN_STRIDE, as_processed
from backfill.jobspec.models import OperatorSpec
from backfill.jobspec.rekeys import copied, rekeys, stream_name, subtopologies
from backfill.ops.repartition import as_is, partitions_of, repartition
from backfill.order import cooldown
from backfill.order.tasks import Queues, check_copartitioned, order_records, spread_partitions
from backfill.plan import fused, offsets
from backfill.plan.definition import Plan
from backfill.plan import strategy
from backfill.ops.aggregate import WindowAggregate
from backfill.ops import filters
from backfill.jobspec.topology import beside as beside_source, chain_order, in_task, task_count, upstream, wheres
from backfill.ops.chained import as_table, forwarded
from backfill.ops.table_join import STRIDE as TABLE_JOIN_STRIDE, TABLE_VALUE
from backfill.session import release, together
from backfill.ranges import in_range, instant
from backfill.time.extract import INVALID, NO_PARTITION_TIME, extract

Progress = Callable[[str], None]


@dataclass
class RunSummary:
    """What a run did, printed at the end and appended to the runs table."""

    run_id: str
    job: str
    start: int | None
    end: int | None
    records_read: dict[str, int] = field(default_factory=dict)
    records_processed: dict[str, int] = field(default_factory=dict)
    beyond_range: dict[str, int] = field(default_factory=dict)
    # re-keyed operators' repartition topics (ops/repartition.py): records written, partitions, the key
    repartitions: dict[str, dict[str, Any]] = field(default_factory=dict)
    # chained operators (docs/semantics.md §18): the operator each reads and the forwarded rows it read
    chained: dict[str, dict[str, Any]] = field(default_factory=dict)
    source_drops: dict[str, dict[str, int]] = field(default_factory=dict)
    # one record per offset (plan/offsets.py): identical copies read once, per source and partition; the gaps
    # (offsets missing inside a partition) with their first ranges; sources whose gaps a run cannot tell
    duplicates: dict[str, dict[str, int]] = field(default_factory=dict)
    gaps: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    gaps_not_checked: dict[str, str] = field(default_factory=dict)
    # how it ran (plan/strategy.py): stage -> the way taken, as `plan` predicts it
    strategies: dict[str, str] = field(default_factory=dict)
    operators: dict[str, OperatorCounts] = field(default_factory=dict)
    ledger: dict[str, int] = field(default_factory=dict)
    ledger_rows: int = 0
    inputs: dict[str, Any] = field(default_factory=dict)
    sinks: dict[str, Any] = field(default_factory=dict)
    expectations: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    duration_s: float = 0.0
    code_version: str = __version__
    # scheduled runs (scheduling/): how the run came about, the pass it belongs to, its input fingerprint
    mode: str = "manual"
    pass_id: str | None = None
    fingerprint: dict[str, Any] | None = None
    data_reach: int | None = None  # how far every partition's data reached when it was decided
    intervals: list[dict[str, Any]] = field(default_factory=list)  # a pass: each interval's own summary

    @property
    def records_in(self) -> int:
        """All records read from every source."""
        return sum(self.records_read.values())

    @property
    def records_per_s(self) -> float:
        """Throughput over the whole run."""
        return self.records_in / self.duration_s if self.duration_s else 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (the --json output)."""
        out = asdict(self)
        out["records_in"] = self.records_in
        out["records_per_s"] = round(self.records_per_s, 1)
        return out


@dataclass(frozen=True)
class Intervals:
    """A pass over several scheduled intervals: computed once, each interval published as its own range."""

    bounds: list[tuple[int, int]]
    fingerprints: dict[tuple[int, int], dict[str, Any]] = field(default_factory=dict)
    mode: str = "due"
    modes: dict[tuple[int, int], str] = field(default_factory=dict)  # per interval, when not all `mode`
    reach: int | None = None  # how far every partition's data reached (recorded; reopens open intervals)
    before_publish: Callable[[tuple[int, int]], None] = lambda _: None
    on_published: Callable[[dict[str, Any]], Any] = lambda _: None


def run_plan(plan: Plan, spark: SparkSession, progress: Progress = lambda _: None,
             intervals: Intervals | None = None) -> RunSummary:
    """Run every operator of the plan and publish its outputs; raise BackfillError on any failed check.

    With `intervals` (contiguous, covering the plan's range), the outputs, ledger and checks are computed
    once and each interval is then staged and published on its own (its own commits and manifest).
    """
    for op in plan.operators:
        if not op.implemented:
            raise NotImplementedYet(f"{plan.job.path}: operators.{op.name}: {op.not_implemented_reason}; "
                                    "remove it from the job or wait for its issue")
    started = time.time()
    warm_up()  # GX is imported while Spark works, used by the publish checks
    summary = RunSummary(run_id=uuid.uuid4().hex[:12], job=plan.job.spec.name, start=plan.start, end=plan.end)
    # what a killed run of this job left: its publish is completed, its staged files removed
    summary.warnings += complete_pending(spark, plan.runs_sink, plan.written_paths)
    progress("reading sources")
    reads = [_reads(op) for op in plan.operators]
    headers = any(r is None or "headers" in r for r in reads)
    fields = value_fields(plan)
    records = _narrowed(_read_all(plan, spark, summary, fields, headers), fields)
    for op in _over_sources(plan).operators:  # every `where` is a boolean over these records (§15)
        if op.spec is not None:
            filters.check_types(op.spec, records, str(plan.job.path))
    progress("ordering records per task")
    rekeyed = any(op.spec is not None and rekeys(op.spec) for op in _over_sources(plan).operators)
    if not rekeyed:  # what no step reads is not shuffled nor sorted (a re-key's key may read any column)
        records = records.select(*_kept_columns(plan, records.columns))
    stored: list[DataFrame] = []  # intermediate checkpoints (a re-keyed job's upstream order), freed at the end
    one = strategy.one_pass(plan)
    spread = spread_partitions(records) if one is not None else None  # Spark's estimate of the input
    summary.strategies[strategy.PASS] = strategy.pass_how(one, spread is not None)
    ordered = _ordered(plan, records, summary, stored)
    # materialised once: every later step (stats, ledger, outputs, checks) reads it instead of re-sorting;
    # a local checkpoint stores rows as they are (measured far cheaper than building the columnar cache).
    # Only the columns later steps read: the checkpoint is a barrier to Spark's own pruning, and what is
    # dropped here is neither shuffled, sorted nor computed (unused window columns go too)
    ordered = ordered.select(*_kept_columns(plan, ordered.columns))
    # a large input ordered chunk by chunk is stored already (order/tasks.py); the one pass stores its groups
    if (rekeyed or not stored) and one is None:
        ordered = ordered.localCheckpoint(eager=False)
    try:
        _run_operators(plan, spark, ordered, summary, progress, started, intervals, stored, one, spread)
    finally:
        for frame in (ordered, *stored):
            release(frame)
    return summary


def _ordered(plan: Plan, records: DataFrame, summary: RunSummary, stored: list[DataFrame] | None = None
             ) -> DataFrame:
    """The records in each task's processing order, with every operator's stream-time columns.

    A re-keyed operator (`group_by`) reads its repartition topic instead: its records are derived from the
    upstream tasks' order (ops/repartition.py), then ordered per downstream task; both are one frame. Chained
    operators (docs/semantics.md §18) are no part of it: they read what their upstream forwarded, later.
    """
    plan = _over_sources(plan)
    rekeyed = [op for op in plan.operators if op.spec is not None and rekeys(op.spec)]
    stream_times = {name: _filtered_view(op, col) for op in plan.operators if op not in rekeyed
                    for name, col in op.stream_time_columns().items()}
    one = plan.sources[0] if len(plan.sources) == 1 else None
    constants = {"source": one.name, "source_rank": one.rank} if one is not None else None  # io/sources.py
    names = [s.name for s in plan.sources]
    queues = Queues(tuple(names), subtopologies(plan.job.spec.operators, names),
                    {s.name: s.read_until for s in plan.sources})
    taken: list[str] = []
    ordered = order_records(records, stream_times, given_order=plan.given_order, single_queue=one is not None,
                            stored=stored, constants=constants, queues=queues, taken=taken)
    summary.strategies[strategy.ORDERING] = taken[0]
    ordered = offsets.checked(plan, ordered, summary.gaps_not_checked)
    if rekeyed:
        ordered = _with_repartitions(plan, records, ordered, rekeyed, summary, stored if stored is not None else [])
    check_declared(ordered)
    return ordered


def _with_repartitions(plan: Plan, records: DataFrame, ordered: DataFrame, rekeyed: list[Operator],
                       summary: RunSummary, stored: list[DataFrame], counts: dict[str, int] | None = None,
                       beside: DataFrame | None = None) -> DataFrame:
    """The ordered records plus each re-keyed operator's repartition topics (and, for a join, the input it
    reads as it is), ordered per downstream task; `counts`: partition counts of derived inputs (§18.3);
    `beside`: the source a chained join reads besides the operator, in the sources' order (not in `ordered`,
    the chain's own records), re-keyed or read as it is (§18.5)."""
    declared = {s.name: (s.spec.partitions if s.spec is not None else None)
                or summary.inputs.get(s.name, {}).get("partitions") for s in plan.sources}
    declared.update(counts or {})
    needed = {src for op in rekeyed if op.spec is not None for src in op.spec.inputs}
    unknown = {src for src in needed if not declared.get(src)}
    observed = {r["source"]: r["n"] + 1 for r in records.where(F.col("source").isin(*unknown))
                .groupBy("source").agg(F.max("partition").alias("n")).collect()} if unknown else {}
    # the upstream order, stored once: each repartition is built from it (a small plan instead of the whole
    # reading and ordering again per operator, which Spark's optimizer takes minutes over)
    ordered = ordered.localCheckpoint(eager=False)
    stored.append(ordered)
    frames = [ordered]
    beyond = _beyond(plan)
    for op in rekeyed:
        assert op.spec is not None
        n = partitions_of(op.spec, declared, observed)
        topics = rekeys(op.spec, op.profile.join_null_keys_reach_join)
        pool = ordered if beside is None else ordered.unionByName(beside, allowMissingColumns=True)
        upstream = pool.where(_passes(op)) if _passes(op) is not None else pool  # filtered before the topic
        parts = [repartition(r, upstream, n, beyond) for r in topics]
        parts += [as_is(upstream, src, name, beyond) for src, name in copied(op.spec)]
        derived = functools.reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), parts)
        streams = Queues((*[r.topic for r in topics], *[name for _, name in copied(op.spec)]))
        taken: list[str] = []
        frames.append(order_records(derived, op.stream_time_columns(), single_queue=len(parts) == 1, queues=streams,
                                    taken=taken))
        summary.strategies[strategy.rekeyed_stage(op.name)] = taken[0]
        for r in topics:
            summary.repartitions[r.topic] = {"from": r.input, "key": r.spec.key, "partitions": n, "operator": op.name}
    types = {f.dataType for df in frames for f in df.schema.fields if f.name == "key"}
    if len(types) > 1:  # a new key of another type than the sources' keys: one column, as text
        frames = [df.withColumn("key", F.col("key").cast("string")) for df in frames]
    return functools.reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), frames)


def _over_sources(plan: Plan) -> Plan:
    """The plan of the operators that read sources (all but the chained ones, docs/semantics.md §18)."""
    specs = plan.job.spec.operators
    return dataclasses.replace(plan, operators=tuple(op for op in plan.operators
                                                     if op.spec is None or upstream(op.spec, specs) is None))


def _run_chained(plan: Plan, ordered: DataFrame, results: dict[str, OperatorResult], summary: RunSummary,
                 stored: list[DataFrame]) -> dict[str, OperatorResult]:
    """Each chained operator over the rows the operator it reads forwarded (ops/chained.py), after it: ordered
    per task (re-keyed: through its repartition topic), counted and run as one plan of its own."""
    specs = plan.job.spec.operators
    done: dict[str, OperatorResult] = {}
    for spec in chain_order(specs):
        op = plan.operator(spec.name)
        up = upstream(spec, specs)
        assert up is not None
        rows = {**results, **done}[up.name].forwarded_rows()
        stage = dataclasses.replace(plan, sources=(), operators=(op,))
        summary.chained[op.name] = {"from": up.name, "records": 0, "forwarded": rows.count()}
        if in_task(spec, specs):  # in the upstream's tasks, beside a source (§18.7-§18.9)
            # stored once, as an ordered chain is (_chain_ordered): the operator reads it several times (a
            # stream-stream join: its pairs, flags, outer store and expired rows), each a run of the upstream
            chained = _in_task(op, up, rows, ordered, specs, str(plan.job.path)).localCheckpoint(eager=False)
            stored.append(chained)
        else:
            records = forwarded(up, rows)
            filters.check_types(spec, records, str(plan.job.path))  # over what it reads: the forwarded rows
            chained = _chain_ordered(stage, records, ordered, summary, stored)
        _record_stats(stage, chained, summary)
        candidates = chained.where(_ledger_candidates(stage))
        done[op.name] = op.run(_filtered_view(op, chained), _filtered_view(op, candidates), summary.operators[op.name])
    return done


def _chain_ordered(stage: Plan, records: DataFrame, ordered: DataFrame, summary: RunSummary,
                   stored: list[DataFrame]) -> DataFrame:
    """A chained operator's forwarded records in each task's order (one queue: the upstream's task), or its
    repartition topic's when it re-keys (§18.3: the derived stream's partition time stands for the upstream's)."""
    (op,) = stage.operators
    assert op.spec is not None
    if not rekeys(op.spec):
        times = {name: _filtered_view(op, col) for name, col in op.stream_time_columns().items()}
        taken: list[str] = []
        chained = order_records(records, times, single_queue=True, taken=taken)
        summary.strategies[strategy.chained_stage(op.name)] = taken[0]
    else:
        upstream_order = order_records(records, {}, single_queue=True)
        counts = _input_counts(stage, ordered, summary)
        # a join's source input, re-keyed or read as it is by its tasks (§18.5), from the sources' order
        kept = [src for src in op.spec.inputs if op.spec.reads_source(src)]
        beside = ordered.where(F.col("source").isin(*kept)) if kept else None
        if beside is not None:
            _check_chained_values(op.spec, records, beside, kept[0])
        chained = _with_repartitions(stage, records, upstream_order, [op], summary, stored, counts, beside)
    chained = chained.localCheckpoint(eager=False)
    stored.append(chained)
    check_declared(chained)
    return chained


def _in_task(op: Operator, up: OperatorSpec, rows: DataFrame, ordered: DataFrame, specs: list[OperatorSpec],
             path: str) -> DataFrame:
    """A join in the tasks of the operator it reads: its source's records in their tasks' order, beside the
    operator's rows placed where the record that made each was processed. For a stream-table join the operator
    is its table (a table aggregate, docs/semantics.md §18.7: ops/chained.py as_table) or its stream (a join's or
    a table aggregate's rows, §18.8: each at the seq of the record whose processing forwarded it, `_pos` its place
    among that record's rows), the table's value in a column of its own; for a stream-stream join one side
    (§18.9: a stream-table join's or a table aggregate's rows, one per record at most, so each has the seq of its
    record), with the join's stream times over both. Both are in one task order already: nothing is sorted
    again."""
    assert op.spec is not None and op.spec.join is not None
    # what its source dropped (unreadable, an invalid timestamp) never reaches it: counted by the sources' pass
    source = ordered.where((F.col("source") == beside_source(op.spec, specs)) & F.col("_drop").isNull())
    if op.spec.join.table is None:  # a stream-stream join: the rows one side, the source as it is the other
        stream = _at_their_records(up, rows)
        filters.check_types(op.spec, stream, path)
        stream, source = _one_key_type(stream, source)
        rows_type = stream.schema["value"].dataType
        if source.schema["value"].dataType != rows_type:  # the source's own value beside the rows' (a count's
            # struct beside a plain value): `value` only says whether it has one
            source = source.withColumn(BESIDE_VALUE, F.col("value")).withColumn(
                "value", F.when(F.col("value").isNotNull(), _placeholder(rows_type, op.name)))
        both = stream.unionByName(source, allowMissingColumns=True)
        # its own stream times over what reaches it, in the task's order (a row at the seq of its record)
        running = Window.partitionBy("task").orderBy("seq").rowsBetween(Window.unboundedPreceding, Window.currentRow)
        return both.select("*", *[F.max(F.when(reaches, F.col("ts"))).over(running).alias(name)
                                  for name, reaches in op.stream_time_columns().items()])
    if op.spec.join.table == up.name:
        stream = source
        table = as_table(up, rows, source.schema["value"].dataType.simpleString())
    else:
        stream = _at_their_records(up, rows)
        table = source.withColumn(TABLE_VALUE, F.col("value")) \
            .withColumn("value", F.lit(None).cast(stream.schema["value"].dataType))
    filters.check_types(op.spec, stream, path)
    stream, table = _one_key_type(stream, table)
    return stream.unionByName(table, allowMissingColumns=True)


def _at_their_records(up: OperatorSpec, rows: DataFrame) -> DataFrame:
    """The rows `up` forwarded, each at the seq of the record whose processing forwarded it (§18.8, §18.9): a
    join's emit_seq is seq * its STRIDE + the row's place, an aggregate's the seq itself (one update per record);
    `_pos` numbers the rows a stream-stream join forwards at one record."""
    stride = 1 if up.join is None else TABLE_JOIN_STRIDE if up.join.table is not None else JOIN_STRIDE
    stream = forwarded(up, rows, stride=stride)
    if stride == JOIN_STRIDE:
        place = Window.partitionBy("task", "seq").orderBy("offset")
        stream = stream.withColumn("_pos", (F.row_number().over(place) - 1).cast("long"))
    return stream


def _one_key_type(a: DataFrame, b: DataFrame) -> tuple[DataFrame, DataFrame]:
    """Two frames of one task with one key serde (checked): keys of different column types as text."""
    if a.schema["key"].dataType == b.schema["key"].dataType:
        return a, b
    return a.withColumn("key", F.col("key").cast("string")), b.withColumn("key", F.col("key").cast("string"))


def _placeholder(kind: T.DataType, operator: str) -> Column:
    """A value of type `kind` that is not null (BESIDE_VALUE holds the record's real one)."""
    if isinstance(kind, T.StructType):
        return F.struct(*[F.lit(None).cast(f.dataType).alias(f.name) for f in kind.fields])
    if isinstance(kind, (T.StringType, T.NumericType, T.BooleanType, T.BinaryType)):
        return F.lit("0").cast(kind)
    raise SpecError(f"operators.{operator}.join: the rows it reads have values of type {kind.simpleString()}, "
                    "which cannot sit beside its source's values; give the upstream's joiner a string or a struct")


def _counted_inputs(plan: Plan, spec: OperatorSpec) -> list[str]:
    """The `source` names of an operator's input records in the frame it is counted over: its inputs; for a
    chained join, the rows it reads from the operator, and its source input as its tasks read it (a copy or a
    repartition topic: the source's own records are counted by the sources' pass, docs/semantics.md §18.6)."""
    up = upstream(spec, plan.job.spec.operators)
    if up is None or spec.join is None:
        return list(spec.inputs)
    beside = [r.topic for r in rekeys(spec) if r.input != up.name] + [name for _, name in copied(spec)]
    if in_task(spec, plan.job.spec.operators):  # its source, read in the upstream's tasks (§18.7, §18.8)
        beside.append(beside_source(spec, plan.job.spec.operators))
    return [up.name, *beside]


def _check_chained_values(spec: OperatorSpec, records: DataFrame, beside: DataFrame, source: str) -> None:
    """A chained join's two inputs are one table in its tasks, as a job's sources are (_check_value_formats):
    the operator's rows and the source must both have JSON (struct) values, or both plain ones."""
    mine = isinstance(records.schema["value"].dataType, T.StructType)
    theirs = isinstance(beside.schema["value"].dataType, T.StructType)
    if mine != theirs:
        what = {True: "a struct", False: "a plain value"}
        raise SpecError(f"operators.{spec.name}.join: the rows it reads from an operator have {what[mine]} and source "
                        f"{source!r} {what[theirs]}; its tasks read both as one table: give the upstream's value "
                        "the source's kind (a JSON source, or a joiner that gives a string)")


def _input_counts(stage: Plan, ordered: DataFrame, summary: RunSummary) -> dict[str, int]:
    """The chained operator's inputs' partition counts: its upstream's tasks (docs/semantics.md §18.3), from the
    sources' partition counts (declared, else the largest partition + 1) and repartition topics; a join's
    source input's own."""
    specs = stage.job.spec.operators
    (op,) = stage.operators
    assert op.spec is not None
    declared = {name: spec.partitions or summary.inputs.get(name, {}).get("partitions")
                for name, spec in stage.job.spec.sources.items()}
    observed = {r["source"]: r["n"] + 1 for r in ordered.groupBy("source").agg(F.max("partition").alias("n"))
                .collect()}
    up = upstream(op.spec, specs)
    assert up is not None
    count = lambda name: declared.get(name) or max(observed.get(name, 0), 1)  # noqa: E731
    return {up.name: task_count(up, specs, count), **{src: count(src) for src in op.spec.inputs if src != up.name}}


def _run_operators(plan: Plan, spark: SparkSession, ordered: DataFrame, summary: RunSummary,
                   progress: Progress, started: float, intervals: Intervals | None = None,
                   stored: list[DataFrame] | None = None, one: WindowAggregate | None = None,
                   spread: int | None = None) -> None:
    """Counts and checks, every operator, the ledger, then publish (nothing is published if a check fails).

    `one`: the operator when the one pass runs the plan (plan/fused.py), which appends the groups it stores
    to `stored`, released by the caller; `spread`: see fused.one_pass."""
    if one is not None:
        progress("checking and aggregating records (one pass)")
        groups, seen = fused.one_pass(one, ordered, ~_beyond(plan), stat_columns(plan, one.late_refs()), spread)
        groups = groups.localCheckpoint(eager=True)
        if stored is not None:
            stored.append(groups)
        tasks = fused.window_tasks(groups)
        rows = fused.stat_rows(plan, one, tasks, seen)
        apply_stats(plan, rows, ordered, summary)
        results, dropped = fused.results(one, groups, summary.operators[one.name], stored, tasks.one_task_keys)
        if offsets.found(rows):  # in the one pass's record rows; past the cool-down, in the records themselves
            beyond = [ordered.where(_beyond(plan))] if offsets.found(rows, beyond=True) else []
            offsets.report(plan, [dropped, *beyond], summary)
    else:
        progress("checking records")
        first = _over_sources(plan)
        if offsets.found(_record_stats(first, ordered, summary)):
            offsets.report(plan, [ordered], summary)
        processed = _cut_cooldown(plan, ordered)
        progress("aggregating")
        # every record that can give a ledger row, found in one scan (a few percent of the records)
        dropped = processed.where(_ledger_candidates(first)).persist(StorageLevel.MEMORY_AND_DISK)
        results = {op.name: op.run(_filtered_view(op, processed), _filtered_view(op, dropped),
                                   summary.operators[op.name]) for op in first.operators}
        results.update(_run_chained(plan, ordered, results, summary, stored if stored is not None else []))
    # the ledger is small (late records only) and read three times: count, check, write
    ledger = _ledger(spark, dropped, results).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        late_rows = _check_ledger(plan, ledger, summary)
        if intervals is not None:
            _publish_intervals(plan, spark, results, ledger, late_rows, summary, progress, started, intervals)
            return
        progress("staging outputs")
        staged = _stage(plan, spark, results, ledger, late_rows, summary)
        progress("publishing")
        summary.duration_s = round(time.time() - started, 3)
        summary.sinks = publish(spark, plan.runs_sink, str(plan.job.path), staged, summary.to_dict(), progress)
    finally:
        ledger.unpersist()
        dropped.unpersist()
        for result in results.values():
            for frame in result.cached:  # persisted or a local checkpoint
                frame.unpersist()
                release(frame)


def _publish_intervals(plan: Plan, spark: SparkSession, results: dict[str, OperatorResult], ledger: DataFrame,
                       late_rows: dict[str, int], summary: RunSummary, progress: Progress, started: float,
                       intervals: Intervals) -> None:
    """Stage and publish each interval of a pass as its own range, in order; a failure stops at that interval.

    An interval's manifest carries its own outputs, ledger rows, open windows and fingerprint, the pass's
    record counts, and as duration its share of the pass's computation plus its own staging.
    """
    assert plan.runs_sink is not None
    shared = (time.time() - started) / len(intervals.bounds)
    summary.pass_id = summary.run_id
    for i, (lo, hi) in enumerate(intervals.bounds):
        begun = time.time()
        part = copy.deepcopy(summary)
        part.intervals = []
        part.run_id, part.start, part.end = f"{summary.run_id}-{i}", lo, hi
        part.mode = intervals.modes.get((lo, hi), intervals.mode)
        part.fingerprint = intervals.fingerprints.get((lo, hi))
        part.data_reach = intervals.reach
        sub = dataclasses.replace(plan, start=lo, end=hi)
        part.ledger_rows = ledger.where(in_range("range_time", lo, hi)).count()
        progress(f"staging {instant(lo)} .. {instant(hi)} ({i + 1} of {len(intervals.bounds)})")
        staged = _stage(sub, spark, results, ledger, late_rows, part)
        intervals.before_publish((lo, hi))
        progress(f"publishing {instant(lo)} .. {instant(hi)} ({i + 1} of {len(intervals.bounds)})")
        part.duration_s = round(shared + time.time() - begun, 3)
        manifest = part.to_dict()
        if part.fingerprint is not None:  # the interval's own input, not the pass's
            manifest["records_in"] = sum(c[0] for parts in part.fingerprint.values() for c in parts.values())
        part.sinks = publish(spark, plan.runs_sink, str(plan.job.path), staged, manifest, progress)
        done = part.to_dict()
        done["records_in"] = manifest["records_in"]
        summary.intervals.append(done)
        intervals.on_published(done)
    summary.duration_s = round(time.time() - started, 3)
    summary.sinks = {name: sink for part in summary.intervals for name, sink in part["sinks"].items()}


def ordered_records(plan: Plan, spark: SparkSession) -> DataFrame:
    """The records each task processes, in order, with every operator's stream time (for `inspect`)."""
    summary = RunSummary(run_id="inspect", job=plan.job.spec.name, start=plan.start, end=plan.end)
    kept = _cut_cooldown(plan, _ordered(plan, _read_all(plan, spark, summary), summary)).where(
        F.col("_drop").isNull())
    return kept.select("task", "seq", "source", "partition", "offset", "key", "ts",
                       *[F.col(op.stream_time).alias(f"stream_time_{op.name}") for op in _over_sources(plan).operators
                         if op.stream_time_columns()])  # a rules operator has no stream time


def repartitioned_records(plan: Plan, spark: SparkSession, operator: str) -> DataFrame:
    """A re-keyed operator's repartition topic as its downstream tasks read it (for `verify`): the records
    in repartition coordinates with `st`, the operator's stream time with this record, and `_origin`."""
    op = plan.operator(operator)
    assert op.spec is not None
    summary = RunSummary(run_id="verify", job=plan.job.spec.name, start=plan.start, end=plan.end)
    ordered = _cut_cooldown(plan, _ordered(plan, _read_all(plan, spark, summary), summary))
    return (ordered.where((F.col("source") == stream_name(op.spec)) & F.col("_drop").isNull())
            .withColumn("st", F.col(op.stream_time)))


def join_records(plan: Plan, spark: SparkSession, operator: str) -> DataFrame:
    """A join's input records as it processed them in the run (for `verify`): task, seq, side, the join's and
    both stores' stream times at each record (ops/join.py `as_processed`)."""
    op = plan.operator(operator)
    assert op.spec is not None
    summary = RunSummary(run_id="verify", job=plan.job.spec.name, start=plan.start, end=plan.end)
    ordered = _cut_cooldown(plan, _ordered(plan, _read_all(plan, spark, summary), summary))
    return as_processed(ordered, op.spec, op.stream_time)


def operator_windows(plan: Plan, spark: SparkSession, operator: str, spec: Any) -> DataFrame:
    """An `emit: final` window operator's closed windows as the run computes them, but with the operator's
    job spec replaced by `spec` (for `verify`: the other final mechanism, docs/semantics.md §4.5); nothing is
    published."""
    op = plan.operator(operator)
    other = dataclasses.replace(op, spec=spec)
    summary = RunSummary(run_id="verify", job=plan.job.spec.name, start=plan.start, end=plan.end)
    ordered = _ordered(plan, _read_all(plan, spark, summary), summary)
    _record_stats(plan, ordered, summary)
    processed = _cut_cooldown(plan, ordered)
    result = other.run(processed, processed.where(_ledger_candidates(plan)), summary.operators[op.name])
    return result.output


def operator_rerun(plan: Plan, spark: SparkSession,
                   operator: str) -> tuple[DataFrame, Callable[[DataFrame], DataFrame]]:
    """An operator's input as the run processes it (read, ordered and cut once, stored), and a function that
    runs the operator over an adjusted copy of it and returns its output (for `verify`: what the operator gives
    had the input arrived otherwise, e.g. a rule message on the other side of a transaction, docs/semantics.md
    §12.12); nothing is published."""
    op = plan.operator(operator)
    summary = RunSummary(run_id="verify", job=plan.job.spec.name, start=plan.start, end=plan.end)
    ordered = _ordered(plan, _read_all(plan, spark, summary), summary)
    _record_stats(plan, ordered, summary)
    processed = _cut_cooldown(plan, ordered).localCheckpoint()

    def run(adjusted: DataFrame) -> DataFrame:
        counts = copy.deepcopy(summary.operators[op.name])
        return op.run(adjusted, adjusted.where(_ledger_candidates(plan)), counts).output

    return processed, run


# `value`, then `.field` or `.`quoted field``: Spark SQL names are case-insensitive
VALUE_REF = re.compile(r"\bvalue\b(\s*\.\s*(?:`([^`]+)`|([A-Za-z_]\w*)))?", re.IGNORECASE)


def value_fields(plan: Plan) -> set[str] | None:
    """The fields of a JSON value that the operators' expressions read (`value.<field>`, lower case); None:
    the whole value (an expression names `value` itself, or an operator reads it as text)."""
    texts: list[str] = []
    for op in plan.operators:
        mine = op.expressions()
        if mine is None:  # the whole value (ops/base.py: a kind that does not say is never narrowed)
            return None
        texts += mine
    fields: set[str] = set()
    for text in texts:
        for m in VALUE_REF.finditer(text):
            if m.group(1) is None:
                return None
            fields.add((m.group(2) or m.group(3)).lower())
    return fields


def _narrowed(records: DataFrame, fields: set[str] | None) -> DataFrame:
    """A JSON value narrowed to the fields the operators read, right after parsing (which still checks the
    whole value against its schema): what is dropped here is neither shuffled, sorted nor stored."""
    dtype = records.schema["value"].dataType
    if fields is None or not isinstance(dtype, T.StructType) or not dtype.fields:  # no fields (values `{}`)
        return records
    kept = [f.name for f in dtype.fields if f.name.lower() in fields] or [dtype.fields[0].name]  # null stays null
    if len(kept) == len(dtype.fields):
        return records
    value = F.col("value")
    return records.withColumn("value", F.when(value.isNotNull(), F.struct(*[value[f].alias(f) for f in kept])))


def _passes(op: Operator) -> Column | None:
    """The operator's filters as one column (ops/filters.py), or None without any."""
    return filters.passes(op.spec) if op.spec is not None else None


def _filtered_view(op: Operator, what: Any) -> Any:
    """A frame or a predicate as the operator sees it: without the records its filters drop."""
    cond = _passes(op)
    if cond is None:
        return what
    return what.where(cond) if isinstance(what, DataFrame) else what & cond


def _reads(op: Operator) -> frozenset[str] | None:
    """`Operator.reads`, plus the record columns its filters name."""
    reads = op.reads()
    texts = list(wheres(op.spec).values()) if op.spec is not None else []
    if reads is None or not texts:
        return reads
    return reads | {c for c in ("timestamp", "headers") if any(c in t for t in texts)}


def _kept_columns(plan: Plan, columns: list[str]) -> list[str]:
    """The ordered records' columns that the operators, counts, ledger and checks of this plan read.

    `seq`, `timestamp` and `headers` stay when some operator reads them (`Operator.reads`; None: all);
    the partition time before a record only for a cool-down cut (`read_until`).
    """
    reads = [_reads(op) for op in plan.operators]
    if any(r is None for r in reads) or plan.given_order:
        return columns
    drop = {"seq", "timestamp", "headers"} - set().union(*[r for r in reads if r is not None])
    if not any(s.read_until is not None for s in plan.sources):
        drop.add("_partition_time_before")
    return [c for c in columns if c not in drop]


def _read_all(plan: Plan, spark: SparkSession, summary: RunSummary, fields: set[str] | None = None,
              headers: bool = True) -> DataFrame:
    """Every source's records as one frame; `fields`: the value fields the run reads (None: all); `headers`:
    whether it reads record headers."""
    frames = []
    for sp in plan.sources:
        spec = sp.spec
        assert spec is not None
        bound = None if sp.reads_all else sp.read_from if sp.read_from is not None else plan.start
        read = read_source(spark, plan.job, sp.name, sp.rank, bound, sp.read_until, fields, headers)
        summary.inputs[sp.name] = read.manifest(sp.format)
        df = extract(read.records, spec.timestamp, sp.name)
        if spec.on_error == "fail":
            df = df.withColumn("_fatal", F.coalesce(F.col("_fatal"), F.col("_problem")))
        if bound is not None:  # warm-up bound; records without a timestamp stay for the ledger
            df = df.where(F.col("ts").isNull() | (F.col("ts") >= F.lit(bound)))
            summary.gaps_not_checked[sp.name] = offsets.not_checked(bound)
        frames.append(df)
    _check_value_formats(plan, frames)
    # sources with different JSON value schemas (a join's two topics) union to one struct of all fields
    return functools.reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), frames)


def _check_value_formats(plan: Plan, frames: list[DataFrame]) -> None:
    """All sources of a job are read as one frame: JSON (struct) and plain values cannot be mixed yet."""
    kinds = {sp.name: isinstance(df.schema["value"].dataType, T.StructType) for sp, df in zip(plan.sources, frames)}
    if len(set(kinds.values())) > 1:
        shown = ", ".join(f"{name}: {'json' if is_json else 'string'}" for name, is_json in kinds.items())
        raise SpecError(f"{plan.job.path}: sources mix JSON and plain values ({shown}); one job reads all its "
                        "sources as one table, so give them the same value.format (e.g. json)")


STAT_GROUPS = ("source", "_drop", "_fatal", "task")


def _record_stats(plan: Plan, ordered: DataFrame, summary: RunSummary) -> list[Any]:
    """One pass of counts: per source and drop reason, per operator; fail on a fatal record. Returns the rows."""
    rows = ordered.groupBy(*STAT_GROUPS).agg(*stat_columns(plan)).collect()
    apply_stats(plan, rows, ordered, summary)
    return rows


def stat_columns(plan: Plan, late: dict[str, Column] | None = None) -> list[Column]:
    """The counting pass's aggregations (grouped by STAT_GROUPS, or over all records: plan/fused.py, whose
    operator's `late_windows` columns are `late`)."""
    live = ~_beyond(plan)
    cols: list[Column] = [F.count(F.lit(1)).alias("n"), F.count(F.when(~live, 1)).alias("beyond")]
    for op in plan.operators:
        if late is not None:
            cols += op.count_columns(live, late)
            continue
        cols += op.count_columns(_filtered_view(op, live))
        if _passes(op) is not None:  # its filtered records, and every record of its inputs: counted apart
            assert op.spec is not None
            cols += [F.count(F.when(live & filters.filtered(op.spec), 1)).alias(op.stat("filtered")),
                     F.count(F.when(live & F.col("source").isin(*_counted_inputs(plan, op.spec))
                                    & F.col("_drop").isNull(), 1)).alias(op.stat("all"))]
    # one topic per source iff one topic hash (string min/max would cost more than all other counts)
    # a record without a topic of its own (it got the source's default) and an unreadable one do not count
    defaults = [F.lit((s.spec.topic if s.spec is not None else None) or s.name) for s in plan.sources]
    named = ~F.col("topic").isin(*defaults) & F.coalesce(~F.col("_drop").startswith("unreadable"), F.lit(True))
    topic = F.when(named, F.xxhash64("topic"))
    return cols + [F.min(topic).alias("topic_lo"), F.max(topic).alias("topic_hi"), *offsets.stat_columns(live)]


def apply_stats(plan: Plan, rows: list[Any], ordered: DataFrame, summary: RunSummary) -> None:
    """The counting pass's rows into the summary and every operator's counts; fail on a fatal record, a
    source of several topics or inputs that are not co-partitioned (`ordered` is read only to say which)."""
    copies = {name: op.name for op in plan.operators if op.spec is not None for _, name in copied(op.spec)}
    # a join in its upstream's tasks (§18.7, §18.8): its source's records, counted as their source already
    copies.update({beside_source(op.spec, plan.job.spec.operators): op.name for op in plan.operators
                   if op.spec is not None and in_task(op.spec, plan.job.spec.operators)})
    fatal = [r for r in rows if r["_fatal"] is not None]
    if fatal:
        _raise_fatal(ordered)
    _check_one_topic_per_source(ordered, rows)
    _check_copartitioning(plan, rows, {name: int(i["partitions"]) for name, i in summary.inputs.items()
                                       if i.get("partitions")})
    offsets.fail_on_conflicts(plan, rows, ordered)  # a source of several topics has no offsets of its own
    specs = plan.job.spec.operators
    reads = {up.name: op.name for op in plan.operators if op.spec is not None
             and (up := upstream(op.spec, specs)) is not None}
    for r in rows:
        src = r["source"]
        if src in copies:  # a join input copied into a re-keyed join's tasks: counted as its source
            if copies[src] in summary.chained:  # beside the rows a chained join reads (docs/semantics.md §18.6)
                chain = summary.chained[copies[src]]
                chain["beside"] = chain.get("beside", 0) + r["n"]
            continue
        if src in reads:  # an operator's forwarded rows (docs/semantics.md §18): counted as its output
            summary.chained[reads[src]]["records"] += r["n"]
            continue
        if src in summary.repartitions:  # a derived topic: its records are counted by their source already
            topic = summary.repartitions[src]
            chain = summary.chained.get(topic["operator"])
            if chain is not None and topic["from"] != chain["from"]:  # a chained join's source input, re-keyed
                chain["beside"] = chain.get("beside", 0) + r["n"]
            what = "records" if r["task"] is not None else "null_keys"  # a null new key is never written
            topic[what] = topic.get(what, 0) + r["n"]
            continue
        summary.records_read[src] = summary.records_read.get(src, 0) + r["n"]
        summary.beyond_range[src] = summary.beyond_range.get(src, 0) + r["beyond"]
        if r["_drop"] is not None:
            reason = UNREADABLE if r["_drop"].startswith("unreadable") else r["_drop"] \
                if r["_drop"] == CONFLICTING_OFFSET else INVALID_TIMESTAMP
            drops = summary.source_drops.setdefault(src, {})
            drops[reason] = drops.get(reason, 0) + r["n"]
    for sp in plan.sources:  # a source without records is still reported, with a warning
        if summary.records_read.setdefault(sp.name, 0) == 0:
            summary.warnings.append(f"source {sp.name} has no records ({sp.location}"
                                    f"{', from ' + str(sp.read_from) if sp.read_from is not None else ''}); "
                                    "its operators produced nothing from it")
    for src in summary.records_read:
        summary.records_processed[src] = summary.records_read[src] - summary.beyond_range.get(src, 0) - \
            sum(summary.source_drops.get(src, {}).values())
    for op in plan.operators:
        summary.operators[op.name] = counts = op.counts(rows)
        if _passes(op) is not None:  # docs/semantics.md §15: in = contributing + dropped + filtered
            counts.filtered = sum(r[op.stat("filtered")] for r in rows)
            counts.records_in = sum(r[op.stat("all")] for r in rows)


def _check_copartitioning(plan: Plan, rows: list[Any], summary_partitions: dict[str, int]) -> None:
    """An operator over several inputs needs equal partition counts: declared `partitions:`, else max partition + 1."""
    observed: dict[str, int] = {}
    for r in rows:
        if r["task"] is not None:
            observed[r["source"]] = max(observed.get(r["source"], 0), r["task"] + 1)
    declared = {s.name: (s.spec.partitions if s.spec is not None else None) or summary_partitions.get(s.name)
                for s in plan.sources}
    specs = plan.job.spec.operators
    for op in plan.operators:
        if op.spec is not None and in_task(op.spec, specs):
            continue  # checked with the sources (below), in the pass that reads them
        if len(op.inputs) > 1 and op.copartitioned and not (op.spec is not None and rekeys(op.spec)):
            check_copartitioned({s: declared.get(s) or observed.get(s, 0) for s in op.inputs}, op.name)
    for spec in specs:  # a join in its upstream's tasks: its source and the upstream's first input (§18.7-8)
        up = upstream(spec, specs)
        if up is None or not in_task(spec, specs):
            continue
        mine, theirs = beside_source(spec, specs), up.inputs[0]
        if {mine, theirs} <= set(declared):
            check_copartitioned({mine: declared.get(mine) or observed.get(mine, 0),
                                 up.name: declared.get(theirs) or observed.get(theirs, 0)}, spec.name)


def _check_one_topic_per_source(ordered: DataFrame, rows: list[Any]) -> None:
    """A source is one topic: its partitions are the task's queues (several topics need several sources)."""
    hashes: dict[str, set[int]] = {}
    for r in rows:
        hashes.setdefault(r["source"], set()).update(h for h in (r["topic_lo"], r["topic_hi"]) if h is not None)
    for source, seen in hashes.items():
        if len(seen) > 1:
            names = [r["topic"] for r in ordered.where(F.col("source") == source).select("topic").distinct()
                     .limit(10).collect()]
            raise SourceError(f"sources.{source}: holds records of several topics ({', '.join(sorted(names))}); "
                              "a source is one topic: declare one source per topic (filter the table by topic)")


def _raise_fatal(ordered: DataFrame) -> None:
    first = (ordered.where(F.col("_fatal").isNotNull())
             .orderBy("source_rank", "partition", "offset").select(
                 "source", "topic", "partition", "offset", "_fatal", "_raw_ts", "_problem", "_where").first())
    assert first is not None
    where = f"sources.{first['source']}: record {record_location(first)}"
    if first["_fatal"] == INVALID:
        raise SourceError(f"{where} has an invalid timestamp ({first['_raw_ts']}); Kafka Streams' default "
                          "extractor fails here too: set timestamp.on_invalid: skip or partition_time")
    if first["_fatal"] == NO_PARTITION_TIME:
        raise SourceError(f"{where} has an invalid timestamp ({first['_raw_ts']}) and no partition time yet (no "
                          "earlier valid record in its partition): on_invalid: partition_time fails here, as Kafka "
                          "Streams does; use skip")
    raise SourceError(f"{where} is unreadable ({first['_problem']}); fix the data or set on_error: skip "
                      "to send such records to the ledger")


def record_location(row: Any) -> str:
    """`topic/partition@offset`, plus `file line N` for a line of a JSONL file (found by its text)."""
    where = row["_where"]
    kafka = f"{row['topic']}/{row['partition']}@{row['offset']}" if row["offset"] is not None else ""
    if where is None:
        return kafka
    line = _line_number(where["file"], where["text"])
    place = f"{where['file']} line {line}" if line else where["file"]
    return f"{kafka} ({place})" if kafka else place


def _line_number(file: str, text: str) -> int | None:
    """1-based number of the first line of `file` equal to `text` (only for error messages)."""
    try:
        with open(file, encoding="utf-8", errors="replace") as fh:
            for number, line in enumerate(fh, 1):
                if line.rstrip("\r\n") == text:
                    return number
    except OSError:
        return None
    return None


def _beyond(plan: Plan) -> Column:
    """Records after their partition's first record at/after the cool-down bound: never processed."""
    conds = [(F.col("source") == s.name) & cooldown.beyond(F.col("_partition_time_before"), s.read_until)
             for s in plan.sources if s.read_until is not None]
    return functools.reduce(lambda a, b: a | b, conds) if conds else F.lit(False)


def _cut_cooldown(plan: Plan, ordered: DataFrame) -> DataFrame:
    return ordered.where(~_beyond(plan))


def _in_range(plan: Plan, col: str) -> Column:
    return in_range(col, plan.start, plan.end)


def _ledger_candidates(plan: Plan) -> Column:
    """Records that may give a ledger row: dropped by a source, null key, or what an operator adds (late windows)."""
    extra = [c for c in (op.ledger_candidates() for op in plan.operators) if c is not None]
    return functools.reduce(lambda a, b: a | b, extra, F.col("_drop").isNotNull() | F.col("key").isNull())


def _ledger(spark: SparkSession, processed: DataFrame, results: dict[str, OperatorResult]) -> DataFrame:
    """Every ledger row of the run: the sources' unreadable records and each operator's, in as many partitions
    as a shuffle makes. The union of a many-operator plan's ledgers has the partitions of all of them (1,458 for
    80 operators), each a Spark task of a few rows: read together, they are a handful of tasks."""
    dropped = processed.where(F.col("_drop").isNotNull())
    reason = F.when(F.col("_drop").startswith("unreadable"), F.lit(UNREADABLE)) \
        .when(F.col("_drop") == CONFLICTING_OFFSET, F.lit(CONFLICTING_OFFSET)).otherwise(F.lit(INVALID_TIMESTAMP))
    detail = F.concat_ws(" in ", F.col("_problem"), F.col("_where.file"))
    source_rows = ledger_rows(dropped, reason=reason, detail=detail, timestamp=F.col("_raw_ts"),
                              stream_time=F.col("_partition_time"), range_time=F.col("_partition_time"))
    union = functools.reduce(DataFrame.unionByName, [source_rows, *[r.ledger for r in results.values()]])
    return union.coalesce(int(spark.conf.get("spark.sql.shuffle.partitions") or 8))


def _check_ledger(plan: Plan, ledger: DataFrame, summary: RunSummary) -> dict[str, int]:
    """Count the ledger rows per operator and reason (and those in range: what its sink gets), then check
    conservation (checks/conservation.py); returns the late rows per operator."""
    counted = ledger.groupBy("operator", "reason", _in_range(plan, "range_time").alias("in_range")).count().collect()
    summary.ledger_rows = sum(r["count"] for r in counted if r["in_range"])
    totals: dict[tuple[str | None, str], int] = {}
    for r in counted:
        totals[(r["operator"], r["reason"])] = totals.get((r["operator"], r["reason"]), 0) + r["count"]
    for (_, reason), n in totals.items():
        summary.ledger[reason] = summary.ledger.get(reason, 0) + n
    late = check_conservation(plan.operators, summary.operators, totals)
    check_chains(summary.chained, summary.operators)
    return late


def _stage(plan: Plan, spark: SparkSession, results: dict[str, OperatorResult], ledger: DataFrame,
           late_rows: dict[str, int], summary: RunSummary) -> list[Staged]:
    """Write and audit every sink's new content (io/publish.py commits them together); nothing visible changes."""
    # great-expectations suites on what is about to be committed (checks/expectations.py); failing blocks it
    checks = PublishChecks(spark, summary.expectations)
    checks.conservation(conservation_rows(late_rows, summary.operators))

    def output(op: Operator) -> Staged | None:
        counts = summary.operators[op.name]
        out = results[op.name].publishable(lambda column: _in_range(plan, column))
        staged = None
        if op.sink is None:
            counts.outputs = out.output.count()
            if out.before_commit is not None:  # the same refusal as with a sink: the counts would be wrong too
                out.before_commit(out.output)
        else:
            sink = plan.job.spec.sinks[op.name]
            staged = stage_output(spark, out.output, sink.format, op.sink, name=op.name, column=op.range_column,
                                  start=plan.start, end=plan.end, metadata=_commit_metadata(plan, summary, op.name),
                                  audit=_both(out.before_commit, checks.for_output(op)))
            counts.outputs = staged.rows
        if out.incomplete is not None:
            counts.incomplete_windows = out.incomplete()
        return staged

    def ledger_sink() -> Staged:
        sink = plan.job.spec.sinks["_ledger"]
        return stage_output(spark, ledger.where(_in_range(plan, "range_time")), sink.format, plan.ledger_sink,
                            name="_ledger", column="range_time", start=plan.start, end=plan.end,
                            metadata=_commit_metadata(plan, summary, "_ledger"))

    # every sink is written side by side; when one fails its audit, the others' staging is removed too
    calls = [functools.partial(output, op) for op in plan.operators] + ([ledger_sink] if plan.ledger_sink else [])
    return [s for s in together(calls, undo=lambda s: s is not None and discard(s)) if s is not None]


def _both(first: Callable[[DataFrame], None] | None, then: Callable[[DataFrame], None] | None
          ) -> Callable[[DataFrame], None] | None:
    """Two checks of a staged output, in order (either may be absent)."""
    if first is None or then is None:
        return first or then

    def check(staged: DataFrame) -> None:
        first(staged)
        then(staged)

    return check


def _commit_metadata(plan: Plan, summary: RunSummary, what: str) -> dict[str, str]:
    table = plan.job.spec.sinks[what].table if what in plan.job.spec.sinks else None
    return {"backfill.job": plan.job.spec.name, "backfill.run_id": summary.run_id, "backfill.output": what,
            "backfill.range": json.dumps([plan.start, plan.end]), **({"backfill.table": table} if table else {})}
