"""Part: plan. What a run reads, processes and writes, and why: one frozen object, printed by `plan`, run by `run`."""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from backfill.jobspec import versions
from backfill.jobspec.load import Job
from backfill.jobspec.models import SourceSpec
from backfill.ops.base import Operator


@dataclass(frozen=True)
class SourcePlan:
    """One input: where it is read from and which event-time bounds the run keeps."""

    name: str
    format: str
    location: str
    rank: int
    timestamp: str
    on_invalid: str
    order: str
    read_from: int | None = None
    read_until: int | None = None
    reads_all: bool = False  # every record, whatever the range (a rules operator's source)
    spec: SourceSpec | None = field(default=None, repr=False, compare=False)

    def describe(self) -> dict[str, Any]:
        """The printed fields, JSON-ready (not the job's own source spec)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "spec"}


@dataclass(frozen=True)
class Plan:
    """A whole run: the job, the output range [start, end) by window start, sources and operators."""

    job: Job
    start: int | None
    end: int | None
    sources: tuple[SourcePlan, ...]
    operators: tuple[Operator, ...]
    ledger_sink: str | None
    runs_sink: str | None
    notes: tuple[str, ...] = field(default=())
    kafka_streams: str = versions.CURRENT  # the release line whose rules apply (jobspec/versions.py)

    @property
    def ranged(self) -> bool:
        """True when --start or --end limits the outputs."""
        return self.start is not None or self.end is not None

    @property
    def written_paths(self) -> list[str]:
        """Every location a run writes: the operators' sinks, the ledger, the runs table."""
        paths = [op.sink for op in self.operators if op.sink] + [self.ledger_sink, self.runs_sink]
        return [p for p in paths if p]

    def source(self, name: str) -> SourcePlan:
        """The plan of source `name`."""
        return next(s for s in self.sources if s.name == name)

    def operator(self, name: str) -> Operator:
        """The planned operator `name`."""
        return next(o for o in self.operators if o.name == name)

    @property
    def given_order(self) -> bool:
        """True when the sources carry their recorded processing order (`order_by`), not flow control."""
        return any(s.spec is not None and s.spec.order_by for s in self.sources)
