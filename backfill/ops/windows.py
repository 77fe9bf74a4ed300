"""Time windows (kafka-streams.md 3.1): epoch-aligned, no negative starts, end exclusive."""
from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column
from pyspark.sql import functions as F

from backfill.spec.models import WindowSpec


@dataclass(frozen=True)
class TimeWindows:
    """TimeWindows size S, advance A, grace G in ms (tumbling when A == S)."""

    size: int
    advance: int
    grace: int

    @classmethod
    def of(cls, spec: WindowSpec) -> TimeWindows:
        """From a validated tumbling/hopping window spec."""
        return cls(size=spec.size_ms, advance=spec.advance_ms, grace=spec.grace_ms)

    @property
    def per_record(self) -> int:
        """Most windows one record can fall into: ceil(S / A)."""
        return -(-self.size // self.advance)

    def starts_for(self, t: int) -> list[int]:
        """windowsFor(t): starts s = floor(max(0, t - S + A) / A) * A, ... while s <= t (ascending)."""
        first = max(0, t - self.size + self.advance) // self.advance * self.advance
        return list(range(first, t + 1, self.advance))

    def first_start(self, ts: str) -> Column:
        """Column: the first window start of column `ts` (ts >= 0, so div is floor division)."""
        s, a = self.size, self.advance
        return F.expr(f"(greatest(0L, {ts} - {s}L + {a}L) div {a}L) * {a}L")

    def last_start(self, ts: str) -> Column:
        """Column: the last window start of column `ts`: floor(t / A) * A."""
        return F.expr(f"({ts} div {self.advance}L) * {self.advance}L")

    def starts(self, ts: str) -> Column:
        """Column: array of window starts of column `ts`, ascending (windowsFor)."""
        return F.sequence(self.first_start(ts), self.last_start(ts), F.lit(self.advance).cast("long"))
