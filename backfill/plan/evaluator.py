"""Execute a plan on Spark: read, extract timestamps, order, run operators, check, publish, record the run."""
from __future__ import annotations

import functools
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from backfill import __version__
from backfill.errors import NotImplementedYet, PublishError, SourceError, SpecError
from backfill.io.publish import complete_pending, publish
from backfill.io.sinks import Staged, stage_output
from backfill.io.sources import read_source
from backfill.ledger import INVALID_TIMESTAMP, UNREADABLE, ledger_rows
from backfill.ops.aggregate import AggregateResult, aggregate, final_columns, late_windows, reaches
from backfill.ops.expressions import compile_aggregations
from backfill.ops.join import JoinResult, join, stream_time_columns
from backfill.ops.windows import TimeWindows
from backfill.order.tasks import check_copartitioned, order_records
from backfill.plan.definition import Plan
from backfill.ranges import in_range
from backfill.jobspec.models import OperatorSpec
from backfill.time.extract import INVALID, NO_PARTITION_TIME, extract
from backfill.verify.expectations import PublishChecks, warm_up

Progress = Callable[[str], None]


@dataclass
class OperatorCounts:
    """Conservation of one operator: in = contributing + dropped (by reason)."""

    records_in: int = 0
    contributing: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    late_pairs: int = 0
    outputs: int = 0
    incomplete_windows: int = 0
    final_stream_time: dict[int, int] = field(default_factory=dict)
    kind: str = "aggregate"

    @property
    def balanced(self) -> bool:
        """records_in == contributing + every dropped record."""
        return self.records_in == self.contributing + sum(self.dropped.values())


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
    source_drops: dict[str, dict[str, int]] = field(default_factory=dict)
    operators: dict[str, OperatorCounts] = field(default_factory=dict)
    ledger: dict[str, int] = field(default_factory=dict)
    ledger_rows: int = 0
    inputs: dict[str, Any] = field(default_factory=dict)
    sinks: dict[str, Any] = field(default_factory=dict)
    expectations: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    duration_s: float = 0.0
    code_version: str = __version__

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


def run_plan(plan: Plan, spark: SparkSession, progress: Progress = lambda _: None) -> RunSummary:
    """Run every operator of the plan and publish its outputs; raise BackfillError on any failed check."""
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
    records = _read_all(plan, spark, summary)
    progress("ordering records per task")
    ops = plan.job.spec.operators
    st_cols = _stream_times(ops)
    ordered = order_records(records, st_cols, given_order=_given_order(plan), single_queue=len(plan.sources) == 1)
    # materialised once: every later step (stats, ledger, outputs, checks) reads it instead of re-sorting;
    # a local checkpoint stores rows as they are (measured far cheaper than building the columnar cache).
    # Only the columns later steps read: the checkpoint is a barrier to Spark's own pruning, and what is
    # dropped here is neither shuffled, sorted nor computed (unused window columns go too)
    ordered = ordered.select(*_kept_columns(plan, ordered.columns)).localCheckpoint(eager=False)
    try:
        _run_operators(plan, spark, ordered, summary, progress, started)
    finally:
        _release(ordered)
    return summary


def _run_operators(plan: Plan, spark: SparkSession, ordered: DataFrame, summary: RunSummary,
                   progress: Progress, started: float) -> None:
    """Counts and checks, every operator, the ledger, then publish (nothing is published if a check fails)."""
    ops = plan.job.spec.operators
    progress("checking records")
    _record_stats(plan, ordered, summary)
    processed = _cut_cooldown(plan, ordered)
    progress("aggregating")
    # every record that can give a ledger row, found in one scan (a few percent of the records)
    dropped = processed.where(_ledger_candidates(plan)).persist(StorageLevel.MEMORY_AND_DISK)
    results = {op.name: join(op, processed, _st(i)) if op.kind == "join" else
               aggregate(op, processed, _st(i), summary.operators[op.name].final_stream_time, dropped)
               for i, op in enumerate(ops)}
    # the ledger is small (late records only) and read three times: count, check, write
    ledger = _ledger(plan, dropped, results).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        late_rows = _check_ledger(plan, ledger, summary)
        progress("staging outputs")
        staged = _stage(plan, spark, results, ledger, late_rows, summary)
        progress("publishing")
        summary.duration_s = round(time.time() - started, 3)
        summary.sinks = publish(spark, plan.runs_sink, str(plan.job.path), staged, summary.to_dict(), progress)
    finally:
        ledger.unpersist()
        dropped.unpersist()
        for result in results.values():
            for frame in getattr(result, "cached", ()):
                frame.unpersist()


def ordered_records(plan: Plan, spark: SparkSession) -> DataFrame:
    """The records each task processes, in order, with every operator's stream time (for `inspect`)."""
    summary = RunSummary(run_id="inspect", job=plan.job.spec.name, start=plan.start, end=plan.end)
    records = _read_all(plan, spark, summary)
    ops = plan.job.spec.operators
    ordered = order_records(records, _stream_times(ops), _given_order(plan),
                            single_queue=len(plan.sources) == 1)
    kept = _cut_cooldown(plan, ordered).where(F.col("_drop").isNull())
    return kept.select("task", "seq", "source", "partition", "offset", "key", "ts",
                       *[F.col(_st(i)).alias(f"stream_time_{op.name}") for i, op in enumerate(ops)])


def _release(checkpointed: DataFrame) -> None:
    """Free a local checkpoint's blocks now (Spark keeps them for the session's lifetime otherwise)."""
    plan = checkpointed._jdf.queryExecution().analyzed()
    if plan.getClass().getSimpleName() == "LogicalRDD":
        plan.rdd().unpersist(False)


def _kept_columns(plan: Plan, columns: list[str]) -> list[str]:
    """The ordered records' columns that the operators, counts, ledger and checks of this plan read.

    Joins read whole records. An aggregate needs `seq` only for order-dependent results (emit:
    updates, folds, first/last/...), `timestamp`/`headers` only for folds or where an aggregation
    names them (a textual test: a mention in a string literal keeps the column, harmless), and
    `_pmax_before` only for a cool-down cut (`read_until`).
    """
    ops = plan.job.spec.operators
    if any(op.kind != "aggregate" for op in ops) or _given_order(plan):
        return columns
    drop: set[str] = set()
    if not any(s.read_until is not None for s in plan.sources):
        drop.add("_pmax_before")
    texts: list[str] = []
    ordered_output = folds = False
    for op in ops:
        assert op.aggregate is not None
        aggs = compile_aggregations(op.aggregate.aggregations, f"operators.{op.name}.aggregate")
        ordered_output |= op.aggregate.emit == "updates" or any(a.order_sensitive for a in aggs)
        folds |= any(a.is_fold for a in aggs)  # a fold sees whole records (FOLD_FIELDS)
        texts += [t for a in aggs for t in (a.sql, a.init, a.step) if t]
    if not ordered_output:
        drop.add("seq")
    if not folds:
        drop.update(c for c in ("timestamp", "headers") if not any(c in t for t in texts))
    return [c for c in columns if c not in drop]


def _st(i: int) -> str:
    return f"_st_{i}"


def _stream_times(ops: list[OperatorSpec]) -> dict[str, Column]:
    """Stream-time columns: one per aggregate; join stream time and both store times per join."""
    cols: dict[str, Column] = {}
    for i, op in enumerate(ops):
        cols.update(stream_time_columns(op, _st(i)) if op.kind == "join" else {_st(i): reaches(op)})
    return cols


def _given_order(plan: Plan) -> bool:
    specs = plan.job.spec.sources
    given = {name for name in specs if specs[name].order_by}
    if given and given != set(specs):
        raise SourceError(f"sources: order_by is set on {', '.join(sorted(given))} but not on the others; "
                          "a recorded order must cover every source of the job")
    return bool(given)


def _read_all(plan: Plan, spark: SparkSession, summary: RunSummary) -> DataFrame:
    frames = []
    for sp in plan.sources:
        spec = plan.job.spec.sources[sp.name]
        read = read_source(spark, plan.job, sp.name, sp.rank, sp.read_from if sp.read_from is not None
                           else plan.start, sp.read_until)
        summary.inputs[sp.name] = read.manifest(sp.format)
        df = extract(read.records, spec.timestamp, sp.name)
        if spec.on_error == "fail":
            df = df.withColumn("_fatal", F.coalesce(F.col("_fatal"), F.col("_problem")))
        bound = sp.read_from if sp.read_from is not None else plan.start
        if bound is not None:  # warm-up bound; records without a timestamp stay for the ledger
            df = df.where(F.col("ts").isNull() | (F.col("ts") >= F.lit(bound)))
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


def _window_counts(op: OperatorSpec, st: str) -> dict[str, Column]:
    """Per-record arithmetic of late windows (no explode); property-tested against the reference engine."""
    assert op.aggregate is not None
    return late_windows(TimeWindows.of(op.aggregate.window), st)


def _record_stats(plan: Plan, ordered: DataFrame, summary: RunSummary) -> None:
    """One pass of counts: per source and drop reason, per operator; fail on a fatal record."""
    cols: list[Column] = [F.count(F.lit(1)).alias("n"),
                          F.count(F.when(_beyond(plan), 1)).alias("beyond")]
    for i, op in enumerate(plan.job.spec.operators):
        if op.kind == "join":
            cols += _join_stat_columns(plan, op, i)
            continue
        mine = (F.col("source") == op.inputs[0]) & F.col("_drop").isNull() & ~_beyond(plan)
        wc = _window_counts(op, _st(i))
        reach = mine & F.col("key").isNotNull()
        cols += [F.count(F.when(mine, 1)).alias(f"in_{i}"),
                 F.count(F.when(mine & F.col("key").isNull(), 1)).alias(f"nullkey_{i}"),
                 F.count(F.when(reach & wc["contributing"], 1)).alias(f"contrib_{i}"),
                 F.sum(F.when(reach, wc["late"]).otherwise(0)).alias(f"late_{i}"),
                 F.max(F.when(~_beyond(plan), F.col(_st(i)))).alias(f"st_{i}")]
    # one topic per source iff one topic hash (string min/max would cost more than all other counts)
    # a record without a topic of its own (it got the source's default) and an unreadable one do not count
    defaults = [F.lit(spec.topic or name) for name, spec in plan.job.spec.sources.items()]
    named = ~F.col("topic").isin(*defaults) & F.coalesce(~F.col("_drop").startswith("unreadable"), F.lit(True))
    topic = F.when(named, F.xxhash64("topic"))
    cols += [F.min(topic).alias("topic_lo"), F.max(topic).alias("topic_hi")]
    rows = ordered.groupBy("source", "_drop", "_fatal", "task").agg(*cols).collect()
    fatal = [r for r in rows if r["_fatal"] is not None]
    if fatal:
        _raise_fatal(ordered)
    _check_one_topic_per_source(ordered, rows)
    _check_copartitioning(plan, rows, {name: int(i["partitions"]) for name, i in summary.inputs.items()
                                       if i.get("partitions")})
    for r in rows:
        src = r["source"]
        summary.records_read[src] = summary.records_read.get(src, 0) + r["n"]
        summary.beyond_range[src] = summary.beyond_range.get(src, 0) + r["beyond"]
        if r["_drop"] is not None:
            reason = UNREADABLE if r["_drop"].startswith("unreadable") else INVALID_TIMESTAMP
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
    for i, op in enumerate(plan.job.spec.operators):
        if op.kind == "join":
            summary.operators[op.name] = _join_counts(rows, i)
            continue
        counts = OperatorCounts(dropped={"null_key": 0})
        for r in rows:
            if r[f"st_{i}"] is not None and r["task"] is not None:
                counts.final_stream_time[r["task"]] = max(counts.final_stream_time.get(r["task"], -1), r[f"st_{i}"])
            counts.records_in += r[f"in_{i}"]
            counts.contributing += r[f"contrib_{i}"]
            counts.late_pairs += int(r[f"late_{i}"] or 0)
            counts.dropped["null_key"] = counts.dropped.get("null_key", 0) + r[f"nullkey_{i}"]
        counts.dropped["late"] = counts.records_in - counts.contributing - counts.dropped["null_key"]
        summary.operators[op.name] = counts


def _join_stat_columns(plan: Plan, op: OperatorSpec, i: int) -> list[Column]:
    """Records reaching a join and those it skips for a null key or value (kafka-streams.md 10.2 steps 2-3)."""
    spec = op.join
    assert spec is not None
    mine = F.col("source").isin(spec.left, spec.right) & F.col("_drop").isNull() & ~_beyond(plan)
    outer = {"inner": [], "left": [spec.left], "outer": [spec.left, spec.right]}[spec.how]
    forwarded = (F.col("source").isin(*outer) if outer else F.lit(False)) & F.col("value").isNotNull()
    return [F.count(F.when(mine, 1)).alias(f"in_{i}"),
            F.count(F.when(mine & F.col("key").isNull() & ~forwarded, 1)).alias(f"nullkey_{i}"),
            F.count(F.when(mine & F.col("key").isNotNull() & F.col("value").isNull(), 1)).alias(f"nullvalue_{i}")]


def _join_counts(rows: list[Any], i: int) -> OperatorCounts:
    """A join's inputs and null drops; `expired` and `contributing` follow from its ledger (_check_ledger)."""
    counts = OperatorCounts(kind="join", dropped={"null_key": 0, "null_value": 0})
    for r in rows:
        counts.records_in += r[f"in_{i}"]
        counts.dropped["null_key"] += r[f"nullkey_{i}"]
        counts.dropped["null_value"] += r[f"nullvalue_{i}"]
    return counts


def _check_copartitioning(plan: Plan, rows: list[Any], summary_partitions: dict[str, int]) -> None:
    """A join's inputs must have equal partition counts: declared `partitions:`, else max partition + 1."""
    observed: dict[str, int] = {}
    for r in rows:
        if r["task"] is not None:
            observed[r["source"]] = max(observed.get(r["source"], 0), r["task"] + 1)
    for op in plan.job.spec.operators:
        if op.kind == "join":
            declared = {s: plan.job.spec.sources[s].partitions or summary_partitions.get(s) for s in op.inputs}
            check_copartitioned({s: declared[s] or observed.get(s, 0) for s in op.inputs}, op.name)


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
    before = F.coalesce(F.col("_pmax_before"), F.lit(-1))  # a partition's first record is never beyond
    conds = [(F.col("source") == s.name) & (before >= F.lit(s.read_until))
             for s in plan.sources if s.read_until is not None]
    return functools.reduce(lambda a, b: a | b, conds) if conds else F.lit(False)


def _cut_cooldown(plan: Plan, ordered: DataFrame) -> DataFrame:
    return ordered.where(~_beyond(plan))


def _in_range(plan: Plan, col: str) -> Column:
    return in_range(col, plan.start, plan.end)


def _ledger_candidates(plan: Plan) -> Column:
    """Records that may give a ledger row: dropped by a source, null key, or late for some window."""
    cond = F.col("_drop").isNotNull() | F.col("key").isNull()
    for i, op in enumerate(plan.job.spec.operators):
        if op.kind == "aggregate":
            cond = cond | F.coalesce(_window_counts(op, _st(i))["late"] > 0, F.lit(False))
    return cond


def _ledger(plan: Plan, processed: DataFrame, results: dict[str, AggregateResult | JoinResult]) -> DataFrame:
    dropped = processed.where(F.col("_drop").isNotNull())
    reason = F.when(F.col("_drop").startswith("unreadable"), F.lit(UNREADABLE)).otherwise(F.lit(INVALID_TIMESTAMP))
    detail = F.concat_ws(" in ", F.col("_problem"), F.col("_where.file"))
    source_rows = ledger_rows(dropped, reason=reason, detail=detail, timestamp=F.col("_raw_ts"),
                              stream_time=F.col("_pmax"), range_time=F.col("_pmax"))
    return functools.reduce(DataFrame.unionByName, [source_rows, *[r.ledger for r in results.values()]])


def _check_ledger(plan: Plan, ledger: DataFrame, summary: RunSummary) -> dict[str, int]:
    """Cross-check: the late ledger rows equal the late (record, window) pairs counted per record.

    One pass over the ledger also counts the rows inside the range (what its sink gets); returns the
    late rows per operator.
    """
    counted = ledger.groupBy("operator", "reason", _in_range(plan, "range_time").alias("in_range")).count().collect()
    summary.ledger_rows = sum(r["count"] for r in counted if r["in_range"])
    totals: dict[tuple[str | None, str], int] = {}
    for r in counted:
        totals[(r["operator"], r["reason"])] = totals.get((r["operator"], r["reason"]), 0) + r["count"]
    rows = [{"operator": op, "reason": reason, "count": n} for (op, reason), n in totals.items()]
    for r in rows:
        summary.ledger[r["reason"]] = summary.ledger.get(r["reason"], 0) + r["count"]
    for name, counts in summary.operators.items():
        if counts.kind == "join":
            _balance_join(name, counts, {r["reason"]: r["count"] for r in rows if r["operator"] == name})
        late_rows = sum(r["count"] for r in rows if r["operator"] == name and r["reason"] == "late")
        if late_rows != counts.late_pairs or not counts.balanced:
            raise PublishError(f"operators.{name}: conservation check failed (late ledger rows {late_rows}, "
                               f"late pairs {counts.late_pairs}, in {counts.records_in}, contributing "
                               f"{counts.contributing}, dropped {counts.dropped}); nothing was published")
    return {name: sum(r["count"] for r in rows if r["operator"] == name and r["reason"] == "late")
            for name in summary.operators}


def _balance_join(name: str, counts: OperatorCounts, ledger: dict[str, int]) -> None:
    """Null drops counted per record must all be in the ledger; the rest of a join's input contributed."""
    for reason in ("null_key", "null_value"):
        if ledger.get(reason, 0) != counts.dropped[reason]:
            raise PublishError(f"operators.{name}: conservation check failed ({ledger.get(reason, 0)} {reason} "
                               f"ledger rows, {counts.dropped[reason]} such records); nothing was published")
    counts.dropped["expired"] = ledger.get("expired", 0)
    counts.contributing = counts.records_in - sum(counts.dropped.values())


def _stage(plan: Plan, spark: SparkSession, results: dict[str, AggregateResult | JoinResult], ledger: DataFrame,
           late_rows: dict[str, int], summary: RunSummary) -> list[Staged]:
    """Write and audit every sink's new content (io/publish.py commits them together); nothing visible changes."""
    # great-expectations suites on what is about to be committed (verify/expectations.py); failing blocks it
    checks = PublishChecks(spark, {op.name: op for op in plan.job.spec.operators}, summary.expectations)
    checks.conservation(_conservation_rows(late_rows, summary))
    staged = []
    for op in plan.operators:
        result = results[op.name]
        column = "ts" if op.kind == "join" else "window_start"  # a join row's range is its timestamp
        output, incomplete, metrics = _output_and_incomplete(plan, result, column)
        if op.sink is None:
            summary.operators[op.name].outputs = output.count()
            if metrics is not None:  # the same refusal as with a sink: the counts would be wrong too
                _refuse_split(op.name, metrics, None)(output)
        else:
            sink = plan.job.spec.sinks[op.name]
            agg = plan.job.spec.operator(op.name).aggregate
            audit = checks.for_output(op.name, agg.emit) if agg is not None else None
            if metrics is not None:
                audit = _refuse_split(op.name, metrics, audit)
            staged.append(stage_output(spark, output, sink.format, op.sink, name=op.name, column=column,
                                       start=plan.start, end=plan.end,
                                       metadata=_commit_metadata(plan, summary, op.name), audit=audit))
            summary.operators[op.name].outputs = staged[-1].rows
        if incomplete is not None:
            summary.operators[op.name].incomplete_windows = incomplete()
    if plan.ledger_sink:
        sink = plan.job.spec.sinks["_ledger"]
        staged.append(stage_output(spark, ledger.where(_in_range(plan, "range_time")), sink.format, plan.ledger_sink,
                                   name="_ledger", column="range_time", start=plan.start, end=plan.end,
                                   metadata=_commit_metadata(plan, summary, "_ledger")))
    return staged


def _output_and_incomplete(plan: Plan, result: AggregateResult | JoinResult, column: str
                           ) -> tuple[DataFrame, Callable[[], int] | None, Callable[[], dict[str, Any]] | None]:
    """The rows to publish (in range), how to count the incomplete ones afterwards, and (emit: final)
    the metrics of the windows pass.

    For `emit: final` the windows are aggregated once: the pass that writes the closed windows also
    counts the open ones and the windows kept by several tasks (Observation metrics), instead of
    caching every window for several passes.
    """
    windows = getattr(result, "windows", None)
    if windows is None:
        output = result.output.where(_in_range(plan, column))
        if result.incomplete is None:
            return output, None, None
        return output, result.incomplete.where(_in_range(plan, column)).count, None
    seen = Observation()
    observed = windows.where(_in_range(plan, column)).observe(
        seen, F.count(F.when(~F.col("_closed"), 1)).alias("incomplete"),
        F.count(F.when(F.col("_split"), 1)).alias("split"), F.max(F.when(F.col("_split"), F.col("key"))).alias("key"))
    output = observed.where("_closed").select(*final_columns(windows))

    def metrics() -> dict[str, Any]:
        # filled by the first action on `output` (the sink's write); a sink that audits before it
        # writes (delta-spark) gets them from one extra pass
        if seen._jo is None or not seen._jo.future().isCompleted():
            output.write.format("noop").mode("overwrite").save()
        return seen.get

    return output, lambda: int(metrics()["incomplete"]), metrics


def _refuse_split(name: str, metrics: Callable[[], dict[str, Any]],
                  audit: Callable[[DataFrame], None] | None) -> Callable[[DataFrame], None]:
    """Before the commit: no window may be kept by two tasks, else (key, window_start) is not unique."""
    def check(staged: DataFrame) -> None:
        found = metrics()
        if found["split"]:
            raise PublishError(f"operators.{name}: key {found['key']!r} occurs in several partitions, so several "
                               f"tasks kept a window for it ({found['split']} windows) and the final output would "
                               "not be unique per (key, window_start); nothing was published")
        if audit is not None:
            audit(staged)

    return check


def _conservation_rows(late: dict[str, int], summary: RunSummary) -> list[dict[str, Any]]:
    """Per operator: records in, contributing + dropped, late ledger rows, late pairs (the ledger suite's table)."""
    return [{"operator": name, "records_in": c.records_in, "accounted": c.contributing + sum(c.dropped.values()),
             "late_ledger_rows": late.get(name, 0), "late_pairs": c.late_pairs}
            for name, c in summary.operators.items()]


def _commit_metadata(plan: Plan, summary: RunSummary, what: str) -> dict[str, str]:
    return {"backfill.job": plan.job.spec.name, "backfill.run_id": summary.run_id, "backfill.output": what,
            "backfill.range": json.dumps([plan.start, plan.end])}
