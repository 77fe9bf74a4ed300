"""Build the plan: sources, operators, output range, warm-up and cool-down (DESIGN.md "Boundaries")."""
from __future__ import annotations

from backfill.errors import SpecError
from backfill.ops.expressions import compile_aggregations, joiner_sql
from backfill.ops.windows import JoinWindows
from backfill.plan.definition import OperatorPlan, Plan, SourcePlan
from backfill.plan.validate import check_inputs_exist, check_paths, check_semantics, check_sinks_declared
from backfill.jobspec.durations import format_duration
from backfill.jobspec.load import Job
from backfill.jobspec.models import OperatorSpec


def build_plan(job: Job, start: int | None = None, end: int | None = None) -> Plan:
    """Decide what a run of `job` over outputs with window start in [start, end) reads and writes."""
    if start is not None and end is not None and start >= end:
        raise SpecError(f"--start {start} is not before --end {end}; the range is [start, end)")
    runs = _runs_location(job)
    check_semantics(job)
    check_sinks_declared(job)
    check_paths(job, runs)
    check_inputs_exist(job)
    operators = tuple(_operator_plan(job, op, start, end) for op in job.spec.operators)
    sources = tuple(_source_plan(job, name, rank, operators, start, end)
                    for rank, name in enumerate(job.spec.sources))
    notes = []
    unused = [s.name for s in sources if not any(s.name in op.inputs for op in operators)]
    if unused:
        notes.append(f"sources not read by any operator (skipped): {', '.join(unused)}")
    return Plan(job=job, start=start, end=end, sources=sources, operators=operators,
                ledger_sink=_sink_path(job, "_ledger"), runs_sink=runs, notes=tuple(notes))


def _sink_path(job: Job, name: str) -> str | None:
    """Where sink `name` writes, or None when it is absent or `format: none` (counted only)."""
    sink = job.spec.sinks.get(name)
    return job.resolve(sink.path) if sink is not None and sink.path else None


def _runs_location(job: Job) -> str:
    sinks = job.spec.sinks
    if "_runs" in sinks and sinks["_runs"].path:
        return job.resolve(sinks["_runs"].path)
    if "_ledger" in sinks and sinks["_ledger"].format == "delta" and sinks["_ledger"].path:
        return job.resolve(sinks["_ledger"].path).rstrip("/") + "_runs"
    return str(job.base / ".backfill" / job.spec.name / "runs")


def _operator_plan(job: Job, op: OperatorSpec, start: int | None, end: int | None) -> OperatorPlan:
    sink = _sink_path(job, op.name)
    if op.aggregate is None:
        assert op.join is not None
        joiner_sql(op.join.value, f"{job.path}: operators.{op.name}.join.value")  # parses, names in scope
        return _join_plan(job, op, sink, start, end)
    spec = op.aggregate
    compile_aggregations(spec.aggregations, f"{job.path}: operators.{op.name}.aggregate")
    w = spec.window
    if w.type in ("sliding", "session"):
        return OperatorPlan(name=op.name, kind="aggregate", inputs=(spec.input,), window=w.type, emit=spec.emit,
                            sink=sink, implemented=False,
                            not_implemented_reason=f"{w.type} windows are not implemented yet")
    size, advance, grace = w.size_ms, w.advance_ms, w.grace_ms
    text = (f"{w.type} size {format_duration(size)}" + (f" advance {format_duration(advance)}" if w.type == "hopping"
                                                        else "") + f" grace {format_duration(grace)}")
    why = []
    if start is not None:
        why.append(f"warm-up: records with timestamp >= {start} are read; an older record cannot fall into a window "
                   "starting at or after --start, nor raise stream time above a record that does")
    last_start = close = None
    if end is not None:
        last_start = (end - 1) // advance * advance
        close = last_start + size + grace
        why.append(f"cool-down: windows up to start {last_start} close when stream time reaches {close} "
                   f"(start + size + grace); each partition is processed up to its first record at or after it")
    return OperatorPlan(name=op.name, kind="aggregate", inputs=(spec.input,), window=text, emit=spec.emit,
                        sink=sink, warmup_ms=0, cooldown_ms=size + grace, last_window_start=last_start,
                        close_time=close, why=tuple(why))


def _join_plan(job: Job, op: OperatorSpec, sink: str | None, start: int | None, end: int | None) -> OperatorPlan:
    """A stream-stream join: co-partitioned inputs, warm-up from before/after/grace, no cool-down cut."""
    spec = op.join
    assert spec is not None
    w = JoinWindows.of(spec)
    text = (f"{spec.how}, before {format_duration(w.before)} after {format_duration(w.after)} grace "
            f"{format_duration(w.grace)}" + (" (eager: spurious-result fix off)" if w.eager else ""))
    base = {"name": op.name, "kind": "join", "inputs": tuple(op.inputs), "window": text, "emit": "updates",
            "sink": sink}
    if spec.left == spec.right:
        return OperatorPlan(**base, implemented=False, not_implemented_reason=(
            "self-joins (left and right the same source) are not implemented; declare the topic twice"))
    formats = {s: job.spec.sources[s].key.format for s in op.inputs}
    if len(set(formats.values())) > 1:
        raise SpecError(f"{job.path}: operators.{op.name}.join: key formats differ ({spec.left}: "
                        f"{formats[spec.left]}, {spec.right}: {formats[spec.right]}); co-partitioned join inputs "
                        "share one key serde")
    # a result at ts >= start pairs records >= start - max(before, after); one retention more lets the
    # outer store settle (its emission heuristic depends on history, kafka-streams.md 10.4 step 1)
    warmup = max(w.before, w.after, 0) + w.retention
    why = []
    if start is not None:
        why.append(f"warm-up: records with timestamp >= {start - warmup} are read (max(before, after) + before + "
                   "after + grace before --start): both records of every result at or after --start")
    if end is not None:
        why.append("cool-down: every record after --end is read: a join has no lateness cut-off (a late record "
                   "still joins what the other store retains, kafka-streams.md 10.2)")
    return OperatorPlan(**base, warmup_ms=warmup, why=tuple(why))


def _source_plan(job: Job, name: str, rank: int, operators: tuple[OperatorPlan, ...],
                 start: int | None, end: int | None) -> SourcePlan:
    spec = job.spec.sources[name]
    readers = [op for op in operators if name in op.inputs]
    closes = [op.close_time for op in readers if op.close_time is not None]
    ts = "record timestamp" if spec.timestamp.extractor == "record" else f"value field {spec.timestamp.field}"
    location = job.resolve(spec.path) if spec.path else f"kafka {spec.kafka.topic if spec.kafka else ''}"
    return SourcePlan(name=name, format=spec.format, location=location, rank=rank, timestamp=ts,
                      on_invalid=spec.timestamp.on_invalid,
                      order=f"recorded order ({spec.order_by})" if spec.order_by else "flow control (merge by head timestamp)",
                      read_from=start - max(op.warmup_ms for op in readers) if readers and start is not None else None,
                      read_until=None if any(op.kind == "join" for op in readers) else
                      max(closes) if closes and end is not None else None)
