"""Part: verify. `backfill verify` and `backfill diff`: read both outputs, reconcile, attribute causes, check, report.

Everything heavy stays in Spark; the driver collects only counts, a bounded timeline, a bounded
histogram and a few samples per category.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from backfill.errors import SourceError, SpecError
from backfill.io.runs import last_run
from backfill.io.sources import read_source
from backfill.ledger import LEDGER_SCHEMA
from backfill.ranges import in_range
from backfill.session import release
from backfill.ops.windows import TimeWindows
from backfill.plan.definition import Plan
from backfill.jobspec.models import OperatorSpec
from backfill.verify import causes as causes_mod
from backfill.verify import evidence
from backfill.verify import alerts, bounds, cache, join_evidence, joins, mechanism, restarts
from backfill.verify.catalogue import CAUSES, SEVERITY
from backfill.checks.expectations import RESULT_FORMAT_REPORT, duplicated_groups, unique_check, validate
from backfill.ops.aggregate import numbered_finals, window_checks, window_frame
from backfill.jobspec.topology import upstream
from backfill.ops.registry import OPERATORS
from backfill.verify.reconcile import (MATCH, MISMATCH, Comparison, Tolerance, align, parse_tolerances, reconcile,
                                       require_columns)
from backfill.verify.tables import (TableRef, apply_mapping, decode_window_topic, is_topic_archive, parse_ref,
                                    read_table, with_cluster_security)

Progress = Callable[[str], None]
SAMPLES_PER_GROUP = 3
RECORDS_PER_SAMPLE = 12
TIMELINE_BUCKETS = 60
BOOKKEEPING = ("emit_seq", "task", "partition", "offset")
PROOF_COLUMNS = ("restart_n", "restart_from", "restart_to", "closed_at")


@dataclass
class Section:
    """The comparison of one output pair (one operator in verify, the two tables in diff)."""

    name: str
    left: str
    right: str
    sides: tuple[str, str]
    keys: tuple[str, ...]
    columns: tuple[str, ...]
    counts: dict[str, int]
    causes: dict[str, int] | None = None
    samples: list[dict[str, Any]] = field(default_factory=list)
    timeline: list[dict[str, Any]] = field(default_factory=list)
    lateness: list[dict[str, Any]] = field(default_factory=list)
    expectations: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    restarts: list[dict[str, Any]] = field(default_factory=list)
    corrections: dict[str, Any] | None = None
    seconds: float = 0.0

    @property
    def differences(self) -> int:
        """Rows that are not a match."""
        return sum(n for c, n in self.counts.items() if c != MATCH)


@dataclass
class Outcome:
    """A whole verify or diff: sections, verdict, where the report is."""

    mode: str
    job: str | None
    sections: list[Section]
    report_dir: Path
    started_at: str
    duration_s: float = 0.0
    run: dict[str, Any] | None = None

    @property
    def counts(self) -> dict[str, int]:
        """Counts per category over all sections."""
        total: dict[str, int] = {}
        for s in self.sections:
            for c, n in s.counts.items():
                total[c] = total.get(c, 0) + n
        return total

    @property
    def causes(self) -> dict[str, int] | None:
        """Counts per cause over all sections (verify only)."""
        if self.mode != "verify":
            return None
        total = {c: 0 for c in CAUSES}
        for s in self.sections:
            for c, n in (s.causes or {}).items():
                total[c] = total.get(c, 0) + n
        return total

    @property
    def expectations_ok(self) -> bool:
        """Every suite run (stream output, and the run's own before publish) passed."""
        suites = [e for s in self.sections for e in s.expectations]
        suites += list((self.run or {}).get("expectations", {}).values())
        return all(e["success"] for e in suites)

    @property
    def verdict(self) -> str:
        """match: nothing differs; explained: every difference has a cause; differences: some do not."""
        if not any(s.differences for s in self.sections):
            return "match"
        causes = self.causes
        if causes is not None and causes.get("unexplained", 0) == 0:
            return "explained"
        return "differences"

    @property
    def exit_code(self) -> int:
        """0 matched or explained, 1 unexplained differences or failed expectations."""
        return 0 if self.verdict in ("match", "explained") and self.expectations_ok else 1

    def to_json(self) -> dict[str, Any]:
        """report.json (spec/job-spec.md "Verify")."""
        out: dict[str, Any] = {"verdict": self.verdict, "counts": self.counts}
        if self.causes is not None:
            out["causes"] = self.causes
        out.update({"mode": self.mode, "job": self.job, "exit_code": self.exit_code,
                    "expectations_ok": self.expectations_ok, "started_at": self.started_at,
                    "duration_s": round(self.duration_s, 3),
                    "sections": [_section_json(s) for s in self.sections]})
        if self.run is not None:
            out["run"] = {k: self.run.get(k) for k in ("run_id", "duration_s", "records_in", "sinks", "expectations")}
        return out


def _section_json(s: Section) -> dict[str, Any]:
    return {"name": s.name, "left": s.left, "right": s.right, "sides": list(s.sides), "keys": list(s.keys),
            "columns": list(s.columns), "counts": s.counts, "causes": s.causes, "notes": s.notes,
            "seconds": round(s.seconds, 3), "expectations": s.expectations, "timeline": s.timeline,
            "lateness": s.lateness, "samples": s.samples, "restarts": s.restarts, "corrections": s.corrections}


def default_report_dir(name: str) -> Path:
    """reports/<name>-<UTC timestamp>/ under the current directory."""
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return Path("reports") / f"{name}-{stamp}"


# ----------------------------------------------------------------------------- verify


@dataclass(frozen=True)
class Target:
    """One operator to verify and where its streaming output is."""

    operator: str
    against: str
    base: str | None  # directory `against` is relative to (the job's for job-level settings, else cwd)


def verify_plan(spark: SparkSession, plan: Plan, targets: list[Target], maps: dict[str, str],
                tolerances: dict[str, Tolerance], report_dir: Path, progress: Progress = lambda _: None,
                run: dict[str, Any] | None = None, commits: restarts.Commits | None = None,
                corrections: Path | None = None) -> Outcome:
    """Reconcile each target operator's published output with its streaming output; write nothing but the
    corrections.

    `commits`: the application's committed input offsets when it restarted (verify/restarts.py).
    `corrections`: a folder; each operator's windows to republish are written to `<folder>/<operator>`.
    """
    started, stamp = time.time(), dt.datetime.now(dt.timezone.utc).isoformat()
    sections = []
    for target in targets:
        t = time.time()
        out = None if corrections is None else corrections / target.operator
        section = verify_operator(spark, plan, target, maps, tolerances, progress, commits, out)
        section.seconds = time.time() - t
        sections.append(section)
    return Outcome(mode="verify", job=plan.job.spec.name, sections=sections, report_dir=report_dir,
                   started_at=stamp, duration_s=time.time() - started, run=run)


def targets_for(plan: Plan, against: list[str]) -> list[Target]:
    """--against OPERATOR=PATH options, else every operator with `verify.<op>.against` in the job."""
    out = []
    for item in against:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise SpecError(f"--against {item!r}: use OPERATOR=TABLE_OR_PATH (path@version for a Delta version)")
        out.append(Target(name.strip(), path.strip(), None))
    if not out:
        out = [Target(name, v.against, str(plan.job.base)) for name, v in plan.job.spec.verify.items() if v.against]
    if not out:
        raise SpecError("nothing to verify: give --against OPERATOR=TABLE_OR_PATH (or verify.<operator>.against "
                        "in the job)")
    names = [op.name for op in plan.job.spec.operators]
    for t in out:
        if t.operator not in names:
            raise SpecError(f"--against {t.operator}=...: no operator {t.operator!r} (operators: {', '.join(names)})")
    return out


def verify_operator(spark: SparkSession, plan: Plan, target: Target, maps: dict[str, str],
                    tolerances: dict[str, Tolerance], progress: Progress,
                    commits: restarts.Commits | None = None, corrections: Path | None = None) -> Section:
    """Read, normalise, compare, attribute and check one operator, as its kind is verified (ops/registry.py)."""
    how = _verified_as(plan, target.operator)
    if how == "join":
        return verify_join(spark, plan, target, maps, progress, corrections)
    if how == "alerts":
        return verify_alerts(spark, plan, target, maps, progress, corrections)
    op = plan.job.spec.operator(target.operator)
    assert how == "windows" and op.aggregate is not None and op.aggregate.window is not None
    kind = op.aggregate.window.type
    windows = TimeWindows.of(op.aggregate.window) if kind in ("tumbling", "hopping") else None
    width = windows.size if windows is not None else int(op.aggregate.window.time_difference or 0)
    settings = plan.job.spec.verify.get(op.name)
    backfill_ref = _published(plan, op.name)
    stream_ref = with_cluster_security(parse_ref(target.against, target.base), plan.job)
    progress(f"{op.name}: reading {backfill_ref} and {stream_ref}")
    mapping = {**(settings.columns if settings else {}), **maps}
    backfill = read_table(spark, backfill_ref, _output_schema(op))
    stream_fallback = T.StructType([*backfill.schema.fields, T.StructField("partition", T.IntegerType()),
                                    T.StructField("offset", T.LongType())])
    stream = read_table(spark, stream_ref, stream_fallback)
    aggs = tuple(op.aggregate.aggregations)
    if is_topic_archive(stream):  # an archived output topic: decode its windowed keys and values
        values = T.StructType([T.StructField(mapping.get(a, a), backfill.schema[a].dataType) for a in aggs
                               if a in backfill.columns])
        stream = decode_window_topic(stream, width, values, f"--against {op.name}={target.against}",
                                     session=kind == "session", key=_output_key(plan, op, settings),
                                     value=settings.value if settings else None, job=plan.job)
    stream = apply_mapping(stream, mapping, f"--against {op.name}={target.against}")
    if "window_end" not in stream.columns and kind != "session":
        stream = stream.withColumn("window_end", F.col("window_start") + F.lit(width))
    session = kind == "session"  # a session is (key, start, end): its end is part of its identity
    require_columns(stream, ("key", "window_start", *(("window_end",) if session else ()), *aggs),
                    f"streaming output {stream_ref}",
                    "map it with --map col=source_col (or verify.<operator>.columns in the job)")
    columns = (() if session else ("window_end",)) + aggs + (
        ("ts",) if "ts" in stream.columns and "ts" in backfill.columns else ())
    updates = op.aggregate.emit == "updates"
    numbered = updates or numbered_finals(op)  # its rows are ordered by emit_seq
    order = tuple(c for c in ("partition", "offset") if c in stream.columns)
    tol = {**parse_tolerances([f"{c}={v}" for c, v in (settings.tolerance if settings else {}).items()]),
           **tolerances}
    cmp = Comparison(keys=("key", "window_start", "window_end") if session else ("key", "window_start"),
                     columns=columns, tolerances=tol, left="backfill",
                     right="stream", left_order=("emit_seq",) if numbered else (),
                     right_order=order if len(order) == 2 else (), updates=updates)
    backfill, stream = _text_key(backfill), _text_key(stream)
    # every window either output wrote, before the range cuts them: where the stream's output evidently went
    positions = (backfill.select("key", F.col("window_start").cast("long").alias("at")),
                 stream.select("key", F.col("window_start").cast("long").alias("at")))
    backfill, stream = _in_range(plan, backfill), _in_range(plan, stream)
    stream = align(backfill, stream, cmp)
    progress(f"{op.name}: reconciling")
    compared, counts = reconcile(backfill, stream, cmp)
    result = compared.drop("_lrows", "_maybe")
    ev = None
    try:
        notes = _notes(cmp, order, updates)
        coalesced = None
        if updates and op.aggregate.cache == "on" and len(order) == 2:
            progress(f"{op.name}: comparing update sequences (cache: on)")
            result, coalesced = _update_sequences(compared, result, backfill, stream, cmp, counts)
            notes.append("cache: on: a window whose last value matches is compared update by update; the "
                         "stream's updates must be a coalescing of the backfill's (docs/semantics.md §14)")
        ledger = _ledger(spark, plan)
        differs = sum(counts.values()) - counts[MATCH]
        attributed, cause_counts, found = None, {c: 0 for c in CAUSES}, []
        up = upstream(op, plan.job.spec.operators)
        if up is not None:  # a chain: its input is operators.<up>'s forwarded rows, not records that can be read
            notes.append(f"a chain: this operator reads the rows operators.{up.name} forwards, so its input "
                         "records are not read and only what the outputs themselves show is a cause (exact "
                         "copies); every other difference is unexplained")
            if differs:
                progress(f"{op.name}: attributing causes (the outputs only)")
                attributed = causes_mod.attribute_outputs_only(result, cmp).persist(StorageLevel.MEMORY_AND_DISK)
                for row in attributed.groupBy("cause").count().collect():
                    cause_counts[row["cause"]] = row["count"]
        else:
            ev = evidence.gather(spark, plan, op, ledger, last_run(plan.runs_sink, plan.job.spec.name, plan.start,
                                                                     plan.end), store=bool(differs))
            notes.append(f"each task's stream time at the end of the data: {ev.stream_times_from}")
            notes.append(f"which input records reached the operator: {ev.values_checked_by}")
            notes.append(f"the input's offset gaps: {ev.gaps_from}")
        if differs and up is None:
            progress(f"{op.name}: attributing causes")
            restart = _restart_evidence(stream, compared, ev, cmp, commits, updates, f"{op.name}")
            if windows is None:  # sliding and session windows: the records inside each window's bounds
                attributed, found = causes_mod.attribute_by_bounds(result, cmp, op, ev, _written(plan, positions, ev),
                                                                   restart)
                if mechanism.applies(op):  # attribute_by_bounds stored its rows; stored again once reattributed
                    progress(f"{op.name}: recomputing with the other final mechanism")
                    first = attributed
                    attributed = _other_mechanism(spark, plan, op, stream, cmp, attributed).persist(
                        StorageLevel.MEMORY_AND_DISK)
                    attributed.count()
                    first.unpersist()
            else:
                rest = result if coalesced is None else result.where(F.col("_coalesced").isNull())
                attributed, found = causes_mod.attribute(rest, cmp, op, ev, _written(plan, positions, ev), restart)
                if coalesced is not None:
                    attributed = attributed.unionByName(coalesced, allowMissingColumns=True)
            for row in attributed.groupBy("cause").count().collect():
                cause_counts[row["cause"]] = row["count"]
        progress(f"{op.name}: samples")
        samples = _samples(result, attributed, cmp, ev, windows)
        progress(f"{op.name}: timeline")
        section = Section(name=op.name, left=str(backfill_ref), right=str(stream_ref), sides=("backfill", "stream"),
                          keys=cmp.keys, columns=cmp.columns, counts=counts, causes=cause_counts, samples=samples,
                          timeline=_timeline(result, windows.advance if windows is not None else 1, attributed),
                          lateness=_lateness(ledger, op.name),
                          notes=notes, restarts=found)
        progress(f"{op.name}: expectations on the streaming output")
        section.expectations = _stream_suites(stream, op, plan)
        if corrections is not None:
            progress(f"{op.name}: writing corrections to {corrections}")
            section.corrections = write_corrections(spark, result, attributed, cmp, plan, op.name, corrections)
        if attributed is not None:
            attributed.unpersist()
        return section
    finally:
        compared.unpersist()
        if ev is not None:
            evidence.release(ev)


def _update_sequences(compared: DataFrame, result: DataFrame, backfill: DataFrame, stream: DataFrame,
                      cmp: Comparison, counts: dict[str, int]) -> tuple[DataFrame, DataFrame]:
    """cache: on: the windows whose last value matches but whose updates differ become mismatches of their update
    sequence (`counts` moved accordingly), and their causes: `cache_coalesced` or `unexplained` (verify/cache.py)."""
    seq = cache.sequences(compared, backfill, stream, cmp).localCheckpoint()
    n = seq.count()
    counts[MATCH] -= n
    counts[MISMATCH] += n
    marked = result.join(seq, list(cmp.keys), "left")
    is_seq = F.col("_coalesced").isNotNull()
    diff = F.when(is_seq, F.array(F.lit(cache.UPDATES))).otherwise(F.col("diff_columns"))
    result = (marked.withColumn("category", F.when(is_seq, F.lit(MISMATCH)).otherwise(F.col("category")))
              .withColumn("diff_columns", diff))
    causes = result.where(is_seq).select(
        *[c for c in result.columns if not c.startswith("_") or c in ("_rows", "_copies", "_extra")],
        F.when(F.col("_coalesced"), F.lit(cache.CAUSE)).otherwise(F.lit("unexplained")).alias("cause"),
        cache.detail(F.col("_coalesced")).alias("detail"))
    return result, causes


def _other_mechanism(spark: SparkSession, plan: Plan, op: OperatorSpec, stream: DataFrame, cmp: Comparison,
                     attributed: DataFrame) -> DataFrame:
    """`close_mechanism_differs` for the differing windows the other final mechanism reproduces."""
    keys, detail = mechanism.compared(spark, plan, op, stream, cmp, lambda df: _in_range(plan, _text_key(df)))
    hit = attributed.join(keys, list(cmp.keys), "left")
    other = mechanism.reproduced(F.col("category"), cmp.label("missing"))
    return (hit.withColumn("cause", F.when(other, F.lit(mechanism.CAUSE)).otherwise(F.col("cause")))
            .withColumn("detail", F.when(other, F.lit(detail)).otherwise(F.col("detail"))).drop("_alt_category"))


CORRECTABLE = ("late_drop_differs", "reprocessed_after_restart", "state_lost_on_restore", "stale_after_restart")


def write_corrections(spark: SparkSession, result: DataFrame, attributed: DataFrame | None, cmp: Comparison,
                      plan: Plan, name: str, path: Path) -> dict[str, Any]:
    """The windows to republish over the stream's serving table, in the operator's sink format: the backfill's
    value where a cause shows the stream's is wrong (`correction`: replace, insert; delete for a window the
    stream should not have), never where the right value is not knowable (range_boundary, tie_order,
    missing_input, unexplained). Replaces whatever was at `path`."""
    from backfill.io.sinks import write_output

    sink = plan.job.spec.sinks[name]
    action = (F.when(F.col("category") == MISMATCH, F.lit("replace"))
              .when(F.col("category") == cmp.label("missing"), F.lit("insert"))
              .when(F.col("category") == cmp.label("extra"), F.lit("delete")))
    wanted = (attributed.where(F.col("cause").isin(*CORRECTABLE)).select(*cmp.keys, "cause", action.alias("correction"))
              if attributed is not None else None)
    # the backfill's values, as reconciled (its last row per window)
    values = result.where(F.col("category") != cmp.label("extra")).select(
        *cmp.keys, *[F.col(f"l_{c}").alias(c) for c in cmp.columns])
    if wanted is None:
        rows = values.limit(0).withColumn("cause", F.lit(None).cast("string")) \
            .withColumn("correction", F.lit(None).cast("string"))
    else:
        rows = wanted.join(values, list(cmp.keys), "left").select(*cmp.keys, *cmp.columns, "correction", "cause")
    rows = rows.orderBy(*cmp.keys).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        counts = {r["correction"]: r["count"] for r in rows.groupBy("correction").count().collect()}
        write_output(spark, rows, sink.format, str(path), column="window_start", start=None, end=None,
                     metadata={"backfill.corrections": plan.job.spec.name, "backfill.operator": name})
    finally:
        rows.unpersist()
    return {"path": str(path), "format": sink.format, "rows": sum(counts.values()), "by_correction": counts}


def _restart_evidence(stream: DataFrame, compared: DataFrame, ev: evidence.Evidence, cmp: Comparison,
                      commits: restarts.Commits | None, updates: bool, name: str) -> evidence.RestartEvidence:
    """The committed offsets of the operator's input topic; else what the stream itself shows: a final window
    emitted again with another value, or a window with more updates than one per record."""
    if commits is not None:
        topics = [r["topic"] for r in ev.raw.select("topic").distinct().limit(100).collect()] \
            if len({t for t, _, _ in commits if t is not None}) > 1 else []
        return evidence.RestartEvidence(commits=restarts.commits_for(commits, topics, name))
    if not set(cmp.right_order) >= {"partition", "offset"}:
        return evidence.RestartEvidence()
    if updates:
        return evidence.RestartEvidence(changed=restarts.replayed_updates(compared, cmp.keys))
    return evidence.RestartEvidence(changed=restarts.changed_reemissions(stream, cmp.keys, cmp.columns))


def verify_join(spark: SparkSession, plan: Plan, target: Target, maps: dict[str, str], progress: Progress,
                corrections: Path | None = None) -> Section:
    """A stream-stream join: both outputs as multisets of (key, ts, value), causes from the join's records
    as the run processed them (verify/joins.py)."""
    op = plan.job.spec.operator(target.operator)
    settings = plan.job.spec.verify.get(op.name)
    backfill_ref = _published(plan, op.name)
    stream_ref = with_cluster_security(parse_ref(target.against, target.base), plan.job)
    progress(f"{op.name}: reading {backfill_ref} and {stream_ref}")
    where = f"--against {op.name}={target.against}"
    raw = read_table(spark, backfill_ref, T.StructType([
        T.StructField("key", T.StringType()), T.StructField("value", T.StringType()),
        T.StructField("ts", T.LongType()), T.StructField("emit_seq", T.LongType()),
        T.StructField("task", T.IntegerType())]))
    vtype = raw.schema["value"].dataType
    mapping = {**(settings.columns if settings else {}), **maps}
    stream = apply_mapping(read_table(spark, stream_ref, T.StructType([
        T.StructField("key", T.StringType()), T.StructField("value", T.StringType()),
        T.StructField("ts", T.LongType()), T.StructField("partition", T.IntegerType()),
        T.StructField("offset", T.LongType())])), mapping, where)
    unique = _unique_suite(stream, op.name)
    outputs = (joins.backfill_rows(raw), joins.stream_rows(stream, vtype, where))  # before the range cuts them
    backfill, stream_rows = (df.where(in_range("ts", plan.start, plan.end)) for df in outputs)
    rows = joins.reconcile(backfill, stream_rows).persist(StorageLevel.MEMORY_AND_DISK)
    attributed = None
    try:
        progress(f"{op.name}: reconciling")
        counts = {c: 0 for c in joins.categories()}
        for r in rows.groupBy("category").count().collect():
            counts[r["category"]] = r["count"]
        cause_counts = {c: 0 for c in CAUSES}
        if sum(counts.values()) - counts[MATCH]:
            progress(f"{op.name}: attributing causes")
            run = last_run(plan.runs_sink, plan.job.spec.name, plan.start, plan.end)
            attributed = joins.attribute(rows, join_evidence.evidence(plan, op, vtype, spark, run, outputs))
            counts = {c: 0 for c in joins.categories()}
            counts[MATCH] = rows.where(F.col("category") == MATCH).count()
            for r in attributed.groupBy("category", "cause").count().collect():
                counts[r["category"]] += r["count"]
                cause_counts[r["cause"]] = cause_counts.get(r["cause"], 0) + r["count"]
        progress(f"{op.name}: samples, timeline")
        notes = ["a join emits several rows per key and timestamp: rows are compared as multisets of (key, ts, "
                 "value); within a key, a matched row written after one the backfill emits later has moved",
                 "the wall-clock throttle of non-joined rows is taken as 0 (the stream's may come out later, or "
                 "not yet when its output ends: emit_throttle)"]
        if corrections is not None:
            notes.append("--corrections: written for window aggregates only, not for a join's rows")
        final = rows.where(F.col("category") == MATCH)  # every row once: matches, then what differs, paired
        if attributed is not None:
            final = final.unionByName(attributed.drop("cause", "detail", "inputs", "r_v"), allowMissingColumns=True)
        section = Section(name=op.name, left=str(backfill_ref), right=str(stream_ref), sides=("backfill", "stream"),
                          keys=joins.KEYS, columns=joins.COLUMNS, counts=counts, causes=cause_counts,
                          samples=_join_samples(rows, attributed), notes=notes,
                          timeline=_timeline(final if attributed is not None else rows, 1, attributed, column="ts"))
        section.expectations = unique
        return section
    finally:
        rows.unpersist()
        if attributed is not None:
            release(attributed)


def verify_alerts(spark: SparkSession, plan: Plan, target: Target, maps: dict[str, str], progress: Progress,
                  corrections: Path | None = None) -> Section:
    """A rules operator: its alerts against a live job's, keyed by (rule_id, transaction_id) (verify/alerts.py)."""
    op = plan.job.spec.operator(target.operator)
    settings = plan.job.spec.verify.get(op.name)
    backfill_ref = _published(plan, op.name)
    stream_ref = with_cluster_security(parse_ref(target.against, target.base), plan.job)
    progress(f"{op.name}: reading {backfill_ref} and {stream_ref}")
    where = f"--against {op.name}={target.against}"
    raw = read_table(spark, backfill_ref, T.StructType([
        T.StructField(c, t) for c, t in (("rule_id", T.LongType()), ("key", T.StringType()),
                                         ("value", T.StringType()), ("transaction", T.StringType()),
                                         ("ts", T.LongType()), ("rule", T.StringType()),
                                         ("emit_seq", T.LongType()))]))
    mapping = {**(settings.columns if settings else {}), **maps}
    stream = alerts.stream_alerts(apply_mapping(read_table(spark, stream_ref, T.StructType([
        T.StructField("rule_id", T.LongType()), T.StructField("transaction_id", T.StringType())])), mapping, where),
        where)
    ours = alerts.backfill_alerts(raw).where(in_range("ts", plan.start, plan.end))
    cmp = alerts.comparison(stream)
    cmp = dataclasses.replace(cmp, tolerances=parse_tolerances(
        [f"{c}={v}" for c, v in (settings.tolerance if settings else {}).items()]))
    progress(f"{op.name}: reconciling")
    compared, counts = reconcile(ours, stream, cmp)
    result = compared.drop("_lrows", "_maybe")
    attributed = None
    input_read: DataFrame | None = None
    stream_windows: dict[tuple[int, str], tuple[list[Any], str]] = {}
    held_windows: dict[tuple[int, str], list[tuple[int, int, int]]] = {}
    try:
        cause_counts = {c: 0 for c in CAUSES}
        notes_first: list[str] = []
        if sum(counts.values()) - counts[MATCH]:
            progress(f"{op.name}: attributing causes")
            versions, rerun, holds = None, None, None
            if sum(counts.values()) - counts[MATCH] - counts[cmp.label("duplicate")]:
                from backfill.plan.evaluator import operator_rerun  # the evaluator imports this package's users

                input_read, rerun = operator_rerun(plan, spark, op.name)
            ledgered = _ledgered_transactions(spark, plan, op, input_read) if counts[cmp.label("extra")] else None
            if input_read is not None and rerun is not None:
                rows = alerts.differing(result, cmp)  # what the reruns and the replays below may explain
                versions, tried = alerts.rule_versions(rows, cmp, op.rules, input_read, rerun,
                                                       lambda line: progress(f"{op.name}: {line}"),
                                                       _window_of(plan, op), stream_windows)
                if tried:
                    notes_first.append(tried)
                holds, unheld = alerts.held_watermarks(rows, cmp, op.rules, input_read,
                                                       _held_of(plan, op, input_read), held_windows)
                if unheld:
                    notes_first.append(unheld)
            attributed = alerts.attribute(result, cmp, ledgered, versions, holds) \
                .withColumn("_task", F.lit(None).cast("int")) \
                .select("*", *[F.lit(None).cast("long").alias(c) for c in PROOF_COLUMNS])
            for row in attributed.groupBy("cause").count().collect():
                cause_counts[row["cause"]] = row["count"]
        notes = [f"an alert is identified by its rule and its transaction's {alerts.ID_FIELD!r}; compared: "
                 f"{', '.join(cmp.columns) or 'nothing else (the stream has neither key nor value)'}"]
        if plan.start is not None or plan.end is not None:
            notes.append("the range cuts the backfill's alerts by their transaction's timestamp; the stream's "
                         "alerts are compared whole")
        notes += notes_first
        if corrections is not None:
            notes.append("--corrections: written for window aggregates only, not for alerts")
        samples = _samples(result, attributed, cmp, None, None)
        _attach_transactions(samples, ours, stream)
        if any(s.get("l_transaction") is not None for s in samples):
            progress(f"{op.name}: the sampled alerts' windows")
            unshown = _attach_windows(spark, plan, op, samples, input_read)
            if unshown:
                notes.append(unshown)
        for s in samples:  # the stream's alert as the rerun that gives it reproduces it (rule_version_differs)
            if (s["rule_id"], s["transaction_id"]) in stream_windows:
                s["r_window"], s["r_rule"] = stream_windows[(s["rule_id"], s["transaction_id"])]
        sampled = {(s["rule_id"], s["transaction_id"]) for s in samples}
        shown = {k: w for k, w in held_windows.items() if k in sampled}
        if shown and input_read is not None:  # ... and as the held watermark gives it (watermark_held)
            texts = _with_texts(input_read, op, shown)
            for s in samples:
                if (s["rule_id"], s["transaction_id"]) in texts:
                    s["r_window"], s["r_rule"] = texts[(s["rule_id"], s["transaction_id"])], s.get("l_rule")
        section = Section(name=op.name, left=str(backfill_ref), right=str(stream_ref), sides=("backfill", "stream"),
                          keys=cmp.keys, columns=cmp.columns, counts=counts, causes=cause_counts, samples=samples,
                          notes=notes)
        section.expectations = _unique_suite(stream, op.name)
        return section
    finally:
        compared.unpersist()


def _ledgered_transactions(spark: SparkSession, plan: Plan, op: OperatorSpec,
                           processed: DataFrame | None = None) -> DataFrame | None:
    """The transactions the run ledgered for a rules operator, by id (verify/alerts.py `ledgered`); None when
    the job publishes no ledger. `processed`: the operator's input as the run processes it, where verify has it
    already (else the source is read)."""
    ledger = _ledger(spark, plan)
    if ledger is None:
        return None
    assert op.rules is not None
    source = op.rules.input
    if processed is not None and "timestamp" in processed.columns:
        records = processed.where(F.col("source") == source)
    else:
        records = read_source(spark, plan.job, source, plan.source(source).rank).records
    return alerts.ledgered(ledger, records, op.name).localCheckpoint()


def _attach_windows(spark: SparkSession, plan: Plan, op: OperatorSpec, samples: list[dict[str, Any]],
                    processed: DataFrame | None) -> str | None:
    """Each sampled alert the backfill raised gets `l_window`: the transactions its rule's window held when it
    fired (docs/semantics.md §12.13), from the operator's input as the run processes it (`processed`, read
    again when None). Returns a note when some could not be shown."""
    from backfill.ops.rules import WINDOW_STATE_LIMIT
    from backfill.plan.evaluator import operator_rerun  # the evaluator imports this package's users

    assert op.rules is not None
    if processed is None:
        processed, _ = operator_rerun(plan, spark, op.name)
    wanted = spark.createDataFrame([(s["rule_id"], s["transaction_id"]) for s in samples
                                    if s.get("l_transaction") is not None], "rule_id long, transaction_id string")
    txs = _transactions(processed, op)
    places = {(r["rule_id"], r["transaction_id"]): (r["partition"], r["offset"]) for r in txs.select(
        "partition", "offset", alerts.transaction_id(F.col("value"), txs.schema["value"].dataType).alias(
            "transaction_id")).join(F.broadcast(wanted), "transaction_id").collect()}
    windows = _windows(plan, op, processed, [(r, p, o) for (r, _), (p, o) in places.items()])
    for s in samples:
        place = places.get((s["rule_id"], s["transaction_id"]))
        if place is not None and (s["rule_id"], *place) in windows:
            s["l_window"] = windows[(s["rule_id"], *place)]
    unshown = sum(s.get("l_transaction") is not None and s.get("l_window") is None for s in samples)
    return (f"windows: {unshown} sampled alert(s) of the backfill are shown without their window: a state of more "
            f"than {WINDOW_STATE_LIMIT:,} transactions is not replayed on the driver (or its replay did not give "
            "the alert)" if unshown else None)


def _window_of(plan: Plan, op: OperatorSpec) -> Callable[[DataFrame, int, int, int], list[dict[str, Any]] | None]:
    """The window of one alert (rule id, transaction partition, offset) over an adjusted input (§12.13)."""
    def window(processed: DataFrame, rule_id: int, partition: int, offset: int) -> list[dict[str, Any]] | None:
        return _windows(plan, op, processed, [(rule_id, partition, offset)]).get((rule_id, partition, offset))
    return window


def _held_of(plan: Plan, op: OperatorSpec, processed: DataFrame
             ) -> Callable[[list[tuple[int, int, int]]], dict[tuple[int, int, int], list[Any]]]:
    """Evaluations (rule id, transaction partition, offset) replayed with a held watermark (§12.14)."""
    from backfill.ops.rules import held_watermark

    operator = plan.operator(op.name)
    return lambda wanted: held_watermark(operator, processed, wanted)  # type: ignore[arg-type]


def _transactions(processed: DataFrame, op: OperatorSpec) -> DataFrame:
    """A rules operator's transactions in its input as the run processes it."""
    assert op.rules is not None
    return processed.where((F.col("source") == op.rules.input) & F.col("_drop").isNull())


def _windows(plan: Plan, op: OperatorSpec, processed: DataFrame, alerts_at: list[tuple[int, int, int]]
             ) -> dict[tuple[int, int, int], list[dict[str, Any]]]:
    """Per alert (rule id, transaction partition, offset) the operator gives over `processed`: its window's
    transactions (ops/rules.py `window_contents`), each with partition, offset, ts and its text (`value`)."""
    from backfill.ops.rules import window_contents

    operator = plan.operator(op.name)
    asked = [(int(r), int(p), int(o)) for r, p, o in alerts_at]
    return _with_texts(processed, op, window_contents(operator, processed, asked))  # type: ignore[arg-type]


def _with_texts(processed: DataFrame, op: OperatorSpec, members: dict[Any, list[tuple[int, int, int]]]
                ) -> dict[Any, list[dict[str, Any]]]:
    """Windows of transactions (partition, offset, ts), each transaction with its text (`value`)."""
    inside = {(p, o) for ms in members.values() for p, o, _ in ms}
    texts: dict[tuple[int, int], str] = {}
    if inside:
        txs = _transactions(processed, op)
        at = txs.sparkSession.createDataFrame(sorted(inside), "partition int, offset long")
        texts = {(r["partition"], r["offset"]): r["text"] for r in txs.join(F.broadcast(at), ["partition", "offset"])
                 .select("partition", "offset", F.col("value").cast("string").alias("text")).collect()}
    return {a: [{"partition": p, "offset": o, "ts": t, "value": texts.get((p, o))} for p, o, t in ms]
            for a, ms in members.items()}


def _attach_transactions(samples: list[dict[str, Any]], ours: DataFrame, stream: DataFrame) -> None:
    """Each sampled alert's transaction and rule version as the backfill has them, and the stream's transaction
    where it carries one: what a person looks at first."""
    if not samples:
        return
    wanted = ours.sparkSession.createDataFrame([(s["rule_id"], s["transaction_id"]) for s in samples],
                                               "rule_id long, transaction_id string")
    mine = {(r["rule_id"], r["transaction_id"]): r for r in ours.join(wanted, list(alerts.KEYS)).select(
        *alerts.KEYS, "transaction", "rule").collect()}
    theirs = {}
    if "transaction" in stream.columns:
        theirs = {(r["rule_id"], r["transaction_id"]): r["transaction"] for r in stream.join(
            wanted, list(alerts.KEYS)).select(*alerts.KEYS, "transaction").collect()}
    for s in samples:
        k = (s["rule_id"], s["transaction_id"])
        s["l_transaction"] = mine[k]["transaction"] if k in mine else None
        s["l_rule"] = mine[k]["rule"] if k in mine else None
        s["r_transaction"] = theirs.get(k)


def _unique_suite(stream: DataFrame, name: str) -> list[dict[str, Any]]:
    """(partition, offset) uniqueness of a streaming output, when it has them."""
    unique = ("partition", "offset")
    if not set(unique) <= set(stream.columns):
        return []
    return [_suite(duplicated_groups(stream, unique), [unique_check(unique)], f"{name}.stream.unique",
                   f"groups of {unique} in the streaming output of {name}")]


def _join_samples(rows: DataFrame, attributed: DataFrame | None) -> list[dict[str, Any]]:
    """A few rows per (category, cause): values, positions, the records that prove the cause."""
    frame = rows.where(F.col("category") == MATCH).select(
        "*", F.lit(None).cast("string").alias("cause"), F.lit(None).cast("string").alias("detail"),
        F.lit(None).cast(joins.INPUT_TYPE).alias("inputs"), F.lit(None).cast("string").alias("r_v"))
    if attributed is not None:
        frame = frame.unionByName(attributed.select(*frame.columns))
    group = Window.partitionBy("category", "cause").orderBy("key", "ts", "emit_seq", "partition", "offset")
    picked = frame.withColumn("_n", F.row_number().over(group)).where(F.col("_n") <= SAMPLES_PER_GROUP).collect()
    out = []
    for r in picked:
        cat = r["category"]
        here = cat != "missing_in_stream"
        there = cat not in ("extra_in_stream", "duplicate_in_stream")
        stream_value = r["r_v"] if r["r_v"] is not None else (r["v"] if here else None)
        row = {"key": r["key"], "ts": r["ts"], "category": cat, "cause": r["cause"], "detail": r["detail"],
               "l_value": r["v"] if there else None, "r_value": stream_value,
               "l_position": f"task {r['task']}, at its record {r['emit_seq'] // joins.STRIDE}"
               if there and r["emit_seq"] is not None else None,
               "r_position": f"partition {r['partition']}, offset {r['offset']}"
               if r["partition"] is not None else None,
               "diff_columns": ["value"] if cat == MISMATCH else (["position"] if cat == "moved_in_stream" else [])}
        if r["inputs"]:
            row["inputs"] = [dict(x.asDict()) for x in r["inputs"]]
            row["inputs_total"] = len(row["inputs"])
        out.append(row)
    severity = {c: i for i, c in enumerate(SEVERITY)}
    return sorted(out, key=lambda r: (r["category"] == MATCH, severity.get(r.get("cause") or "", len(SEVERITY)),
                                      str(r["key"]), r["ts"] or 0))


def _verified_as(plan: Plan, name: str) -> str:
    """How verify reconciles the operator's output (its class's `verified_as`); one line where it does not."""
    spec = plan.job.spec.operator(name)
    cls = OPERATORS[spec.processor]
    if cls.verified_as is None:
        raise SpecError(f"operators.{name}: verify reconciles window aggregates, stream-stream joins and rules "
                        f"alerts; this operator is a {cls.noun}; compare its output with backfill diff")
    return cls.verified_as


def _published(plan: Plan, name: str) -> TableRef:
    """The operator's published sink (what `backfill run` wrote)."""
    sink = plan.job.spec.sinks.get(name)
    if sink is None:
        raise SpecError(f"operators.{name} has no sink, so nothing was published to verify; add sinks.{name}")
    path = plan.job.resolve(sink.path)
    if not Path(path).exists():
        raise SourceError(f"sinks.{name}: {path} does not exist; run `backfill run {plan.job.path}` first, "
                          "or pass --run")
    return TableRef(path=path, format=sink.format)


def _ledger(spark: SparkSession, plan: Plan) -> DataFrame | None:
    """The run's ledger (late drops with their stream time), when the job publishes one."""
    if not plan.ledger_sink or not Path(plan.ledger_sink).exists():
        return None
    sink = plan.job.spec.sinks["_ledger"]
    ledger = read_table(spark, TableRef(plan.ledger_sink, sink.format), LEDGER_SCHEMA)
    return ledger.select(*[F.col(f.name).cast(f.dataType) for f in LEDGER_SCHEMA.fields])


def _output_schema(op: OperatorSpec) -> T.StructType:
    """The columns an aggregate's published output has (for reading an empty JSONL output)."""
    assert op.aggregate is not None
    fields = [T.StructField("key", T.StringType()), T.StructField("window_start", T.LongType()),
              T.StructField("window_end", T.LongType())]
    fields += [T.StructField(name, T.DoubleType()) for name in op.aggregate.aggregations]
    fields += [T.StructField("ts", T.LongType())]
    if op.aggregate.emit == "updates" or numbered_finals(op):
        fields += [T.StructField("emit_seq", T.LongType()), T.StructField("task", T.IntegerType())]
    return T.StructType(fields)


def _output_key(plan: Plan, op: Any, settings: Any) -> Any:
    """The output topic's inner key format: `verify.<op>.key`, else the input's (an un-re-keyed aggregate keeps
    its input's key serde)."""
    if settings is not None and settings.key is not None:
        return settings.key
    if op.aggregate.group_by is None:
        return plan.job.spec.sources[op.aggregate.input].key
    return None


def _text_key(df: DataFrame) -> DataFrame:
    return df.withColumn("key", evidence.key_text(df))


def _in_range(plan: Plan, df: DataFrame) -> DataFrame:
    """Windows whose start is in the verified range [start, end) (the run's range)."""
    return df.where(in_range("window_start", plan.start, plan.end))


def _notes(cmp: Comparison, order: tuple[str, ...], updates: bool) -> list[str]:
    notes = []
    if len(order) < 2:
        notes.append("the streaming output has no partition/offset columns: its last row per window is not "
                     "knowable, the largest values are kept")
    if updates:
        notes.append("emit: updates: the last value per window is compared (intermediate updates depend on cache "
                     "flushes, docs/semantics.md §8); repeats beyond the backfill's own are duplicates")
    if "ts" not in cmp.columns:
        notes.append("ts is not compared (missing on one side)")
    return notes


def _written(plan: Plan, positions: tuple[DataFrame, DataFrame], ev: evidence.Evidence) -> bounds.Written:
    """What shows where the stream's output starts and ends (verify/bounds.py): both outputs' window starts, each
    key's task (its input partition), and the run's declared range."""
    mine, theirs = positions
    return bounds.Written(stream=theirs, backfill=mine, tasks=bounds.tasks_of(ev.records),
                          declared=(plan.start, plan.end))


def _stream_suites(stream: DataFrame, op: OperatorSpec, plan: Plan) -> list[dict[str, Any]]:
    """The window suite on the streaming output as archived (every row, not only the last per window),
    and `(partition, offset)` uniqueness as its own suite on the duplicated groups (as before publish:
    one aggregation instead of GX's window over every row). Their results are rendered in the report itself
    (GX's Data Docs load their styling and scripts from the internet, so they are not built)."""
    assert op.aggregate is not None
    if op.aggregate.window.type in ("tumbling", "hopping"):
        w = TimeWindows.of(op.aggregate.window)
        frame, checks = window_frame(stream, w), window_checks(w, stream.columns)
    else:  # the operator's own window checks (sliding: length D, ts inside; sessions: start <= end == ts)
        planned = plan.operator(op.name).output_suite(stream)
        assert planned is not None
        frame, checks = planned.frame, [c for c in planned.checks if c.args.get("column") in planned.frame.columns]
    return [_suite(frame, checks, f"{op.name}.stream", f"streaming output of {op.name}"),
            *_unique_suite(stream, op.name)]


def _suite(df: DataFrame, checks: list[Any], name: str, target: str) -> dict[str, Any]:
    out = validate(df, name, target, checks, result_format=RESULT_FORMAT_REPORT).to_dict()
    out["docs"] = None  # kept in report.json's shape; no Data Docs page is written
    return out


# ----------------------------------------------------------------------------- diff


def diff_tables(spark: SparkSession, old: str, new: str, on: list[str], tolerances: dict[str, Tolerance],
                report_dir: Path, progress: Progress = lambda _: None, only: list[str] | None = None) -> Outcome:
    """Compare two outputs keyed by `on` (reprocessing after a logic change): no causes, same report.

    `only`: the columns to compare (default: every column both have, keys and bookkeeping aside)."""
    started, stamp = time.time(), dt.datetime.now(dt.timezone.utc).isoformat()
    old_ref, new_ref = parse_ref(old), parse_ref(new)
    progress(f"reading {old_ref} and {new_ref}")
    left, right = read_table(spark, old_ref), read_table(spark, new_ref)
    keys = tuple(c.strip() for c in on if c.strip())
    if not keys:
        raise SpecError("--on: give the key columns, e.g. --on key,window_start")
    for what, df in (("OLD", left), ("NEW", right)):
        require_columns(df, keys, f"{what} {old_ref if what == 'OLD' else new_ref}", "check --on")
    columns = tuple(c for c in left.columns if c in right.columns and c not in keys and c not in BOOKKEEPING)
    if only:
        for what, df in (("OLD", left), ("NEW", right)):
            require_columns(df, tuple(only), f"{what} {old_ref if what == 'OLD' else new_ref}", "check --columns")
        columns = tuple(c for c in only if c not in keys)
    ordered = "emit_seq" in left.columns and "emit_seq" in right.columns and "emit_seq" not in keys
    cmp = Comparison(keys=keys, columns=columns, tolerances=tolerances, left="old", right="new",
                     left_order=("emit_seq",) if ordered else (), right_order=("emit_seq",) if ordered else (),
                     updates=ordered)
    right = align(left, right, cmp)
    progress("comparing")
    compared, counts = reconcile(left, right, cmp)
    result = compared.drop("_lrows", "_maybe")
    try:
        section = Section(name="diff", left=str(old_ref), right=str(new_ref), sides=("old", "new"), keys=keys,
                          columns=columns, counts=counts, samples=_samples(result, None, cmp, None, None),
                          timeline=_timeline(result, 1) if "window_start" in keys else [],
                          notes=[f"compared columns: {', '.join(columns) or '(keys only)'}"])
    finally:
        compared.unpersist()
    return Outcome(mode="diff", job=None, sections=[section], report_dir=report_dir, started_at=stamp,
                   duration_s=time.time() - started)


# ----------------------------------------------------------------------------- what the report shows


def _samples(result: DataFrame, attributed: DataFrame | None, cmp: Comparison, ev: evidence.Evidence | None,
             windows: TimeWindows | None) -> list[dict[str, Any]]:
    """A few rows per (category, cause), with the input records behind them when the input is known."""
    # the matches (most rows): the first few by key without ordering them all
    frame = result.where(F.col("category") == MATCH).orderBy(*cmp.keys).limit(SAMPLES_PER_GROUP) \
        .withColumn("cause", F.lit(None).cast("string")).withColumn("detail", F.lit(None).cast("string")) \
        .withColumn("records", F.lit(None))
    if attributed is not None:
        # the offsets that prove a restart cause (verify/restarts.py), null for the other causes
        rest = attributed.withColumn("task", F.col("_task"))
        frame = frame.select("*", *[F.lit(None).cast("long").alias(c) for c in PROOF_COLUMNS],
                             F.lit(None).cast("int").alias("task"))
        rest = rest.select(*[c for c in frame.columns if c in rest.columns])
    else:
        rest = result.where(F.col("category") != MATCH).withColumn("cause", F.lit(None).cast("string")) \
            .withColumn("detail", F.lit(None).cast("string")).withColumn("records", F.lit(None))
    group = Window.partitionBy("category", "cause").orderBy(*cmp.keys)
    picked = rest.withColumn("_n", F.row_number().over(group)).where(F.col("_n") <= SAMPLES_PER_GROUP).drop("_n")
    picked = frame.unionByName(picked, allowMissingColumns=True)
    rows = [r.asDict(recursive=True) for r in picked.collect()]
    if ev is not None and windows is not None and rows:
        _attach_inputs(rows, ev, windows)
    severity = {c: i for i, c in enumerate(SEVERITY)}
    order = {c: i for i, c in enumerate(cmp.categories)}
    # differences first, the causes that need a person first; matches last
    return sorted(rows, key=lambda r: (r["category"] == MATCH, severity.get(r.get("cause") or "", len(SEVERITY)),
                                       order.get(r["category"], 99), str(r[cmp.keys[0]])))


def _attach_inputs(rows: list[dict[str, Any]], ev: evidence.Evidence, windows: TimeWindows) -> None:
    """Each sampled window's first input records (partition, offset, ts, status, value) and how many it has."""
    spark = ev.raw.sparkSession
    wanted = spark.createDataFrame([(r["key"], r["window_start"]) for r in rows], "key string, window_start long")
    found = evidence.sample_members(ev, windows, wanted, RECORDS_PER_SAMPLE).select(
        "key", "window_start", "partition", "offset", "ts", "status", F.to_json(F.struct("value")).alias("value"),
        "total")
    by_window: dict[tuple[str, int], list[dict[str, Any]]] = {}
    totals: dict[tuple[str, int], int] = {}
    for rec in found.collect():
        by_window.setdefault((rec["key"], rec["window_start"]), []).append(
            {"partition": rec["partition"], "offset": rec["offset"], "ts": rec["ts"], "status": rec["status"],
             "value": rec["value"]})
        totals[(rec["key"], rec["window_start"])] = rec["total"]
    for r in rows:
        r["inputs"] = sorted(by_window.get((r["key"], r["window_start"]), []),
                             key=lambda x: (x["partition"], x["offset"]))
        r["inputs_total"] = totals.get((r["key"], r["window_start"]), 0)


def _timeline(result: DataFrame, step: int, attributed: DataFrame | None = None,
              column: str = "window_start") -> list[dict[str, Any]]:
    """Rows and non-matches per bucket of window start (a join: of ts; at most TIMELINE_BUCKETS buckets), with
    the non-matches per cause when causes were attributed."""
    bounds = result.agg(F.min(column).alias("lo"), F.max(column).alias("hi")).first()
    if bounds is None or bounds["lo"] is None:
        return []
    lo, hi = bounds["lo"], bounds["hi"]
    width = max(step, math.ceil((hi - lo + 1) / TIMELINE_BUCKETS / step) * step)
    bucket = F.floor((F.col(column) - F.lit(lo)) / F.lit(width)).cast("long")
    rows = result.groupBy(bucket.alias("b")).agg(
        F.count(F.lit(1)).alias("rows"), F.count(F.when(F.col("category") != MATCH, 1)).alias("differ")).collect()
    by_cause: dict[int, dict[str, int]] = {}
    if attributed is not None:
        for r in attributed.groupBy(bucket.alias("b"), "cause").count().collect():
            by_cause.setdefault(r["b"], {})[r["cause"]] = r["count"]
    return sorted(({"start": lo + r["b"] * width, "width": width, "rows": r["rows"], "differ": r["differ"],
                    "causes": by_cause.get(r["b"], {})} for r in rows), key=lambda x: x["start"])


def _lateness(ledger: DataFrame | None, operator: str, bins: int = 30) -> list[dict[str, Any]]:
    """Histogram of how far behind stream time the operator's late drops were (ms)."""
    if ledger is None:
        return []
    late = ledger.where((F.col("operator") == operator) & (F.col("reason") == "late")).select(
        (F.col("stream_time") - F.col("timestamp")).alias("behind"))
    top = late.agg(F.max("behind").alias("hi")).first()
    if top is None or top["hi"] is None:
        return []
    width = max(1, math.ceil((top["hi"] + 1) / bins))
    rows = late.groupBy(F.floor(F.col("behind") / F.lit(width)).cast("long").alias("b")).count().collect()
    return sorted(({"from_ms": r["b"] * width, "to_ms": (r["b"] + 1) * width, "count": r["count"]} for r in rows),
                  key=lambda x: x["from_ms"])
