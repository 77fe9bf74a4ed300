"""Part: scheduling. The interval grid of a job's `schedule:` and what the runs table says is published on it.

Pure functions (no Spark, no files): tested directly.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from backfill.jobspec.models import ScheduleSpec
from backfill.ranges import instant


@dataclass(frozen=True, order=True)
class Interval:
    """[start, end) in epoch ms: one scheduled publish."""

    start: int
    end: int

    def __str__(self) -> str:
        return f"{instant(self.start)} .. {instant(self.end)}"

    @property
    def key(self) -> str:
        """JSON-able name (fingerprints are stored by it)."""
        return f"{self.start}-{self.end}"


def align(schedule: ScheduleSpec, ms: int) -> int:
    """The start of the grid interval holding `ms`."""
    origin = schedule.start_ms or 0
    return origin + (ms - origin) // schedule.interval * schedule.interval


def grid(schedule: ScheduleSpec, first: int, until: int) -> list[Interval]:
    """The intervals starting at or after `first` (aligned down) and ending at or before `until`."""
    start = align(schedule, first)
    if schedule.start_ms is not None:
        start = max(start, schedule.start_ms)
    out = []
    while start + schedule.interval <= until:
        out.append(Interval(start, start + schedule.interval))
        start += schedule.interval
    return out


def published(rows: list[dict[str, Any]], job: str) -> dict[Interval, dict[str, Any]]:
    """Per exact range, the newest published manifest of `job` (failed runs and other jobs excluded)."""
    out: dict[Interval, dict[str, Any]] = {}
    for row in rows:  # oldest first: a later publish of the same range wins
        if row.get("job") == job and row.get("status") == "published":
            out[Interval(_bound(row.get("range_start"), low=True), _bound(row.get("range_end"), low=False))] = row
    return out


def _bound(value: Any, low: bool) -> int:
    """An open bound of a manual run covers everything on that side."""
    if value is None:
        return -(2 ** 62) if low else 2 ** 62
    return int(value)


class Coverage:
    """What the published ranges cover together: is an interval wholly inside it (log n per question)."""

    def __init__(self, ranges: list[Interval]) -> None:
        merged: list[list[int]] = []
        for r in sorted(ranges):
            if merged and r.start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], r.end)
            else:
                merged.append([r.start, r.end])
        self.starts = [m[0] for m in merged]
        self.spans = merged

    def covers(self, interval: Interval) -> bool:
        """True when published ranges, together, hold the whole interval (a longer manual run counts)."""
        import bisect

        i = bisect.bisect_right(self.starts, interval.start) - 1
        return i >= 0 and self.spans[i][1] >= interval.end


def contiguous(intervals: list[Interval]) -> list[list[Interval]]:
    """Sorted intervals grouped into runs of adjacent ones: each group is one pass with one warm-up."""
    groups: list[list[Interval]] = []
    for iv in sorted(intervals):
        if groups and groups[-1][-1].end == iv.start:
            groups[-1].append(iv)
        else:
            groups.append([iv])
    return groups
