"""Part: reference engine. The rules it needs, written again from the spec, never borrowed from the Spark engine.

A mistake in a rule shared by both engines would pass every differential test, so the reference engine has
its own: windowsFor (docs/semantics.md §4.1), join windows and retention (§5.1, §5.2), the emission order of a
task (the documented `emit_seq` numbering), co-partitioning (2), and which event-time bounds a run over
[start, end) reads (warm-up and cool-down, docs/semantics.md §6). It reads the job, never the plan.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from backfill.errors import NotImplementedYet, OrderingError
from backfill.jobspec.load import Job
from backfill.jobspec.models import OperatorSpec
from backfill.jobspec.topology import feeders, is_table_aggregate, is_table_join

DAY_MS = 24 * 3600 * 1000
JAVA_MAX = 2**63 - 1
LEFT, RIGHT = 1, 0  # the outer store's side byte: right rows sort before left rows of equal timestamp (docs/semantics.md §5.3)
# emission phases of one processed join record: closed outer-store rows, joined pairs, its own non-joined row
TRIGGERED, JOINED, IMMEDIATE = 0, 1, 2


def java_long(x: int) -> int:
    """x wrapped to a signed 64-bit value, as Java's long arithmetic does."""
    return (x + 2**63) % 2**64 - 2**63


def join_emit_seq(out_seq: int, phase: int, idx: int) -> int:
    """A join row's `emit_seq`: the processed record's seq times 2^31, plus 0 / 2^30 / 2^31-1 by phase, plus idx."""
    return out_seq * 2**31 + (0, 2**30, 2**31 - 1)[phase] + idx


@dataclass(frozen=True)
class Windows:
    """Tumbling (advance == size) or hopping windows: size, advance, grace in ms."""

    size: int
    advance: int
    grace: int

    @classmethod
    def of(cls, op: OperatorSpec) -> Windows:
        """The windows of an aggregate operator of the job."""
        assert op.aggregate is not None
        w = op.aggregate.window
        return cls(w.size_ms, w.advance_ms, w.grace_ms)

    @property
    def per_record(self) -> int:
        """How many windows one record can fall into at most: ceil(size / advance)."""
        return (self.size + self.advance - 1) // self.advance

    def starts_for(self, t: int) -> list[int]:
        """Every window start s with s <= t < s + size and s >= 0, ascending (windowsFor)."""
        starts = []
        s = t - t % self.advance
        while s >= 0 and s + self.size > t:
            starts.append(s)
            s -= self.advance
        return starts[::-1]


@dataclass(frozen=True)
class JoinWindows:
    """before / after / grace in ms; `eager`: the spurious-result fix is off (JoinWindows.of)."""

    before: int
    after: int
    grace: int
    eager: bool

    @classmethod
    def of(cls, op: OperatorSpec) -> JoinWindows:
        """A join operator's windows; JoinWindows.of without grace keeps 24 h minus the window (docs/semantics.md §5.4)."""
        assert op.join is not None
        w = op.join.window
        grace = w.grace if w.grace is not None else max(DAY_MS - w.before - w.after, 0)
        return cls(w.before, w.after, grace, op.join.eager)

    @property
    def retention(self) -> int:
        """How long a window store keeps a row behind its newest write: before + after + grace (9)."""
        return self.before + self.after + self.grace

    def look_back(self, side: int) -> int:
        """How far past its own timestamp a waiting row of `side` can still be joined: after (left), before (right)."""
        return self.after if side == LEFT else self.before

    def bounds(self, side: int, t: int) -> tuple[int, int]:
        """The other side's timestamps [from, to] a record of `side` at t joins with, clamped at 0 (docs/semantics.md §5.1)."""
        lo, hi = (t - self.before, t + self.after) if side == LEFT else (t - self.after, t + self.before)
        return max(0, lo), max(0, hi)


def check_supported(op: OperatorSpec) -> None:
    """Operators the reference engine replays: window aggregates by the record key, two-source joins."""
    if op.aggregate is not None:
        if op.aggregate.window is not None and op.aggregate.window.type not in ("tumbling", "hopping", "session", "sliding"):
            raise NotImplementedYet(f"operators.{op.name}: {op.aggregate.window.type} windows are not implemented "
                                    "yet")
    elif op.rules is not None:
        return
    elif op.join is not None and op.join.left == op.join.right:
        raise NotImplementedYet(f"operators.{op.name}: self-joins are not implemented")


def check_copartitioned(partitions: Mapping[str, int], operator: str) -> None:
    """A join's inputs are one task's queues only if their partition counts are equal."""
    if len(set(partitions.values())) > 1:
        shown = ", ".join(f"{source}: {n}" for source, n in partitions.items())
        raise OrderingError(f"operators.{operator}: inputs are not co-partitioned ({shown} partitions); "
                            "Kafka Streams requires equal partition counts")


def read_bounds(job: Job, start: int | None, end: int | None) -> dict[str, tuple[int | None, int | None]]:
    """Per source: (read from, read until) in event time for a run whose outputs fall in [start, end).

    From: an aggregate needs no record older than `start` (none falls into a later window, nor raises
    stream time above one that does); a join needs both records of every pair whose result is at or
    after `start`, plus one retention so that its stores hold what they held (max(before, after) + R).
    Until: an aggregate's partition stops at its first record at or after the time that closes the last
    window starting before `end`; a join reads everything (a late record still joins).
    """
    bounds: dict[str, tuple[int | None, int | None]] = {}
    for name in job.spec.sources:
        readers = [op for op in job.spec.operators if name in op.inputs]
        if not readers:
            bounds[name] = (None, None)
            continue
        warmups, closes = [], []
        feeding = feeders(job.spec.operators)  # a chained operator reads everything its upstream forwards (§18.4)
        if any(is_table_aggregate(op) or is_table_join(op) or op.name in feeding for op in readers):
            bounds[name] = (None, None)
            continue
        for op in readers:
            if op.join is not None:
                w = JoinWindows.of(op)
                warmups.append(max(w.before, w.after, 0) + w.retention)
                closes.append(None)
            elif op.aggregate is not None and op.aggregate.window.type == "sliding":
                w_s = op.aggregate.window
                diff = int(w_s.time_difference or 0)
                warmups.append(2 * diff)  # what the store reads back from a record at --start (t - 2D)
                closes.append(None if end is None else end - 1 + diff + w_s.grace_ms + 1)
            elif op.aggregate is not None and op.aggregate.window.type == "session":
                warmups.append(int(op.aggregate.window.gap or 0))  # a chain reaching --start starts before it
                closes.append(None)  # a session starting before `end` can grow through a chain of records
            else:
                w = Windows.of(op)
                warmups.append(0)
                closes.append(None if end is None else (end - 1) // w.advance * w.advance + w.size + w.grace)
        read_from = None if start is None else start - max(warmups)
        read_until = None if end is None or None in closes else max(c for c in closes if c is not None)
        bounds[name] = (read_from, read_until)
    return bounds
