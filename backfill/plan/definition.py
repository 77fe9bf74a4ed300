"""The plan as data: what a run reads, processes and writes, and why (a frozen, printable object)."""
from __future__ import annotations

from dataclasses import dataclass, field

from backfill.jobspec.load import Job


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


@dataclass(frozen=True)
class OperatorPlan:
    """One operator: its window, emit mode, output sink and the warm-up / cool-down it needs."""

    name: str
    kind: str
    inputs: tuple[str, ...]
    window: str
    emit: str
    sink: str | None
    warmup_ms: int = 0
    cooldown_ms: int = 0
    last_window_start: int | None = None
    close_time: int | None = None
    why: tuple[str, ...] = ()
    implemented: bool = True
    not_implemented_reason: str | None = None


@dataclass(frozen=True)
class Plan:
    """A whole run: the job, the output range [start, end) by window start, sources and operators."""

    job: Job
    start: int | None
    end: int | None
    sources: tuple[SourcePlan, ...]
    operators: tuple[OperatorPlan, ...]
    ledger_sink: str | None
    runs_sink: str | None
    notes: tuple[str, ...] = field(default=())

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
