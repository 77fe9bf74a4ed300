"""Part: plan. What can be checked before any data is read (part of `plan`, so `run` checks it too).

Paths that would destroy data (a sink on an input, on the ledger, on the runs table or on another
sink), inputs that do not exist, expressions that do not parse, sinks missing for an operator.
Every message is one line naming the field and the fix, and points at docs/job-spec.md.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from backfill.errors import SpecError
from backfill.jobspec.durations import format_duration
from backfill.jobspec.load import Job
from backfill.ops.base import Operator

DOCS = "docs/job-spec.md"


@dataclass(frozen=True)
class Location:
    """A place a job reads or writes, named by its field path in the job file."""

    field: str
    path: Path
    writes: bool


def locations(job: Job, runs: str) -> list[Location]:
    """Every path-based input and output of the job (Kafka sources have no path)."""
    spec = job.spec
    found = [Location(f"sources.{name}.path", Path(job.resolve(src.path)), writes=False)
             for name, src in spec.sources.items() if src.path]
    found += [Location(f"sinks.{name}.path", Path(job.resolve(sink.path)), writes=True)
              for name, sink in spec.sinks.items() if sink.path]
    if "_runs" not in spec.sinks:
        found.append(Location("the runs table (default location)", Path(runs), writes=True))
    return found


def check_paths(job: Job, runs: str) -> None:
    """Refuse a sink that equals or lies inside (or contains) another location of the job."""
    places = locations(job, runs)
    for i, a in enumerate(places):
        for b in places[i + 1:]:
            if not (a.writes or b.writes):
                continue
            if a.path == b.path:
                relation = "is also"
            elif b.path.is_relative_to(a.path) or a.path.is_relative_to(b.path):
                relation = "contains or lies inside"
            else:
                continue
            writer, other = (a, b) if a.writes else (b, a)
            raise SpecError(f"{job.path}: {writer.field}: {writer.path} {relation} {other.field} ({other.path}); "
                            "publishing would overwrite it: give every sink a path of its own, outside the "
                            f"inputs ({DOCS}#sinks)")


def check_inputs_exist(job: Job) -> None:
    """Source paths and value schemas must exist before a run starts."""
    for name, src in job.spec.sources.items():
        if src.path and not Path(job.resolve(src.path)).exists():
            raise SpecError(f"{job.path}: sources.{name}.path: {job.resolve(src.path)} does not exist; paths are "
                            f"relative to the job file ({DOCS}#sources)")
        schema = src.value.schema_
        if schema and not Path(job.resolve(schema)).is_file():
            raise SpecError(f"{job.path}: sources.{name}.value.schema: {job.resolve(schema)} does not exist; give "
                            f"the path of a JSON schema file, relative to the job file ({DOCS}#sources)")


def check_sinks_declared(job: Job) -> None:
    """Every operator writes somewhere, or says it is only counted (`{format: none}`)."""
    for op in job.spec.operators:
        if op.name not in job.spec.sinks:
            raise SpecError(f"{job.path}: sinks.{op.name}: operator {op.name!r} has no sink; add one, e.g. "
                            f"{op.name}: {{format: delta, path: ../out/{op.name}}}, or {op.name}: {{format: none}} "
                            f"to only count its output ({DOCS}#sinks)")


def check_semantics(job: Job) -> None:
    """`semantics: flink` is the rule engine's: rules follow docs/semantics.md §12 whatever the job says, and the window
    aggregates and joins of this version follow Kafka Streams only."""
    if job.spec.semantics == "flink":
        other = [op.name for op in job.spec.operators if op.rules is None]
        if other:
            raise SpecError(f"{job.path}: semantics: flink applies to rules operators only; operators.{other[0]} "
                            "(an aggregate or join) follows semantics: kafka-streams: remove the line or move it "
                            f"to a job of its own ({DOCS}#a-job)")


def check_schedule(job: Job, operators: Sequence[Operator]) -> None:
    """`schedule.lag` is at least every operator's grace: an interval is published no earlier than the
    stream itself could finalise it (its data is also awaited, scheduling/due.py)."""
    schedule = job.spec.schedule
    if schedule is None:
        return
    for op in operators:
        if op.grace_ms() > schedule.lag:
            raise SpecError(f"{job.path}: schedule.lag: {format_duration(schedule.lag)} is shorter than the grace of "
                            f"operators.{op.name} ({format_duration(op.grace_ms())}); an interval would be published "
                            f"before late records may still change it: use lag: {format_duration(op.grace_ms())} or "
                            f"more ({DOCS}#schedule)")
