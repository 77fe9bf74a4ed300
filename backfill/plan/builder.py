"""Part: plan. Build the plan from the job: sources, operators (ops/registry.py), range, warm-up and cool-down."""
from __future__ import annotations

from backfill.errors import SourceError, SpecError
from backfill.jobspec import versions
from backfill.jobspec.load import Job
from backfill.jobspec.rekeys import subtopologies
from backfill.jobspec.topology import feeders, upstream
from backfill.ops.base import Operator
from backfill.ops.filters import check_static
from backfill.ops.registry import operator_for
from backfill.plan.definition import Plan, SourcePlan
from backfill.plan.validate import (check_inputs_exist, check_paths, check_schedule, check_semantics,
                                   check_sinks_declared)


def build_plan(job: Job, start: int | None = None, end: int | None = None) -> Plan:
    """Decide what a run of `job` over outputs with window start in [start, end) reads and writes."""
    if start is not None and end is not None and start >= end:
        raise SpecError(f"--start {start} is not before --end {end}; the range is [start, end)")
    runs = _runs_location(job)
    check_semantics(job)
    check_sinks_declared(job)
    check_paths(job, runs)
    check_inputs_exist(job)
    for op in job.spec.operators:
        check_static(op, str(job.path))
    operators = tuple(operator_for(job, op, i, _sink_path(job, op.name), start, end)
                      for i, op in enumerate(job.spec.operators))
    check_schedule(job, operators)
    _check_recorded_order(job)
    sources = tuple(_source_plan(job, name, rank, operators, start, end)
                    for rank, name in enumerate(job.spec.sources))
    notes = []
    unused = [s.name for s in sources if not any(s.name in op.inputs for op in operators)]
    if unused:
        notes.append(f"sources not read by any operator (skipped): {', '.join(unused)}")
    return Plan(job=job, start=start, end=end, sources=sources, operators=operators,
                ledger_sink=_sink_path(job, "_ledger"), runs_sink=runs, notes=tuple(notes),
                kafka_streams=versions.profile(job.spec.kafka_streams).version)


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


def _check_recorded_order(job: Job) -> None:
    """A recorded order (`order_by`) is all or nothing: one task's records interleave across its sources."""
    specs = job.spec.sources
    given = {name for name in specs if specs[name].order_by}
    if given and given != set(specs):
        raise SourceError(f"sources: order_by is set on {', '.join(sorted(given))} but not on the others; "
                          "a recorded order must cover every source of the job")


def _flow_control(job: Job, name: str) -> str:
    """How a task takes this source's records (docs/semantics.md §2.2-§2.5), as `plan` says it."""
    groups = subtopologies(job.spec.operators, list(job.spec.sources))
    partners = [s for s in job.spec.sources if s != name and groups[s] == groups[name]]
    if not partners:
        return "offset order (the only queue of its tasks)"
    return (f"flow control: each task merges it with {', '.join(partners)} by head timestamp, ties as Java's "
            "PriorityQueue takes them (queues first offered in topic-name order)")


def _source_plan(job: Job, name: str, rank: int, operators: tuple[Operator, ...],
                 start: int | None, end: int | None) -> SourcePlan:
    spec = job.spec.sources[name]
    readers = [op for op in operators if name in op.inputs]
    # what a chained operator reads is complete, and so is a source a chained join reads beside its operator
    # (docs/semantics.md §18.4)
    feeding = feeders(job.spec.operators)
    chained = {o.name for o in job.spec.operators if upstream(o, job.spec.operators) is not None}
    everything = any(op.reads_all or op.name in feeding or op.name in chained for op in readers)
    closes = [op.close_time for op in readers if op.close_time is not None]
    ts = "record timestamp" if spec.timestamp.extractor == "record" else f"value field {spec.timestamp.field}"
    location = job.resolve(spec.path) if spec.path else f"kafka {spec.kafka.topic if spec.kafka else ''}"
    return SourcePlan(name=name, format=spec.format, location=location, rank=rank, timestamp=ts,
                      on_invalid=spec.timestamp.on_invalid,
                      order=f"recorded order ({spec.order_by})" if spec.order_by else _flow_control(job, name),
                      spec=spec,
                      read_from=start - max(op.warmup_ms for op in readers)
                      if readers and start is not None and not everything else None,
                      # an operator without a close time (joins, sessions) reads everything after --end
                      read_until=max(closes) if end is not None and readers and len(closes) == len(readers)
                      and not everything else None,
                      reads_all=everything)
