"""Part: operators. Time windows (docs/semantics.md §4.1): epoch-aligned, no negative starts, end exclusive; join windows
(docs/semantics.md §5); the close rule of sliding windows (§10) and sessions (§11)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from pyspark.sql import Column
from pyspark.sql import functions as F

from backfill.jobspec.models import DAY_MS, JoinSpec, WindowSpec


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

    # the grace rule (docs/semantics.md §4.2), the one definition every operator and verify call
    def close(self, start: Column) -> Column:
        """Column: the stream time at which the window starting at `start` closes: its end + grace."""
        return start + F.lit(self.size + self.grace)

    def accepts(self, start: Column, stream_time: Column) -> Column:
        """Column: the window starting at `start` accepts a record processed at `stream_time` (the record's own
        timestamp included): its end is later than stream time - grace, i.e. stream time < its close."""
        return stream_time < self.close(start)

    def closed(self, start: Column, stream_time: Column) -> Column:
        """Column: the window starting at `start` is closed at `stream_time` (no record is accepted any more)."""
        return stream_time >= self.close(start)

    def last_closed_start(self, stream_time: Column) -> Column:
        """Column: the newest window start closed at `stream_time` (a window is closed iff its start is at most
        this): stream time - size - grace."""
        return stream_time - F.lit(self.size + self.grace)


Time = TypeVar("Time", int, Column)  # the close rules below take plain ints (kernels) or Spark columns (verify)
Truth = bool | Column  # what a rule's test gives: a bool for ints, a boolean column for columns


class _Closing:
    """The close rule of windows whose end is inclusive (sliding windows, sessions): a window ending at `end`
    closes at `close(end)`; its operator refuses records for it, and emit-on-close emits it, once stream time
    has **passed** that time, while suppress releases it once its stream time **reaches** it (docs/semantics.md
    §10.4, §11.5). The one definition the kernels, their final rows, their plans and verify call."""

    def close(self, end: Time) -> Time:
        """The stream time at which a window ending at `end` closes."""
        raise NotImplementedError

    def closed(self, end: Time, stream_time: Time) -> Truth:
        """The window ending at `end` is closed at `stream_time`: stream time passed its close (a record for it is
        late; emit-on-close emits it)."""
        return self.close(end) < stream_time

    def reached(self, end: Time, stream_time: Time) -> Truth:
        """Stream time reached the close of the window ending at `end`: suppress releases it."""
        return self.close(end) <= stream_time


@dataclass(frozen=True)
class SlidingWindows(_Closing):
    """SlidingWindows time difference D and grace G in ms (docs/semantics.md §10): windows [start, start + D]."""

    diff: int
    grace: int

    @classmethod
    def of(cls, spec: WindowSpec) -> SlidingWindows:
        """From a validated sliding window spec."""
        return cls(diff=int(spec.time_difference or 0), grace=spec.grace_ms)

    @property
    def retention(self) -> int:
        """How far behind the newest start the store still shows a window: 2D + G (§10.5)."""
        return 2 * self.diff + self.grace

    def close(self, end: Time) -> Time:
        """end + G: the window is updated while its end is at or after stream time - G (§10.2)."""
        return end + self.grace

    def last_closed_start(self, stream_time: Time) -> Time:
        """The newest start of a window closed at `stream_time` (closed iff its start is at most this):
        stream time - G - D - 1."""
        return stream_time - (self.grace + self.diff + 1)

    def expired(self, t: Time, stream_time: Time) -> Truth:
        """A record at `t` is dropped at once: even its right window [t + 1, t + 1 + D] has reached its close
        (t + 1 + D <= stream time - G, §10.2)."""
        return self.reached(t + 1 + self.diff, stream_time)


@dataclass(frozen=True)
class SessionWindows(_Closing):
    """SessionWindows inactivity gap P and grace G in ms (docs/semantics.md §11): sessions [first, last]."""

    gap: int
    grace: int

    @classmethod
    def of(cls, spec: WindowSpec) -> SessionWindows:
        """From a validated session window spec."""
        return cls(gap=int(spec.gap or 0), grace=spec.grace_ms)

    @property
    def retention(self) -> int:
        """How far behind the store's time it still shows a session's end: P + G (§11.1)."""
        return self.gap + self.grace

    def close(self, end: Time) -> Time:
        """end + P + G: a record whose merged session ends before stream time - G - P is late (§11.2)."""
        return end + self.retention

    @property
    def segment_ms(self) -> int:
        """The length of the persistent store's segments: max(retention / 2, 60 s) (§4.8)."""
        return max(self.retention // 2, SEGMENT_FLOOR_MS)

    def emitted_on_close(self, end: int, closing_stream_time: int) -> bool:
        """Emit-on-close emits the session ending at `end` when the record that closed it (stream time
        `closing_stream_time`, the first to pass its close) still finds its segment in the store: the put of that
        record dropped every segment before the one of stream time - retention (§11.5)."""
        return segment_of(end, self.segment_ms) >= segment_of(closing_stream_time - self.retention, self.segment_ms)


SEGMENT_FLOOR_MS = 60_000  # Kafka Streams' smallest segment of a persistent window or session store (§4.8)


def segment_of(t: int, segment_ms: int) -> int:
    """The id of the store segment holding timestamp `t`: Java's long division (toward zero)."""
    return t // segment_ms if t >= 0 else -(-t // segment_ms)


# outer-store side byte (docs/semantics.md §5.3): right rows sort before left rows of equal timestamp
LEFT, RIGHT = 1, 0


@dataclass(frozen=True)
class JoinWindows:
    """JoinWindows before/after/grace in ms (docs/semantics.md §5.1, §5.4); eager: the spurious-result fix disabled."""

    before: int
    after: int
    grace: int
    eager: bool = False

    @classmethod
    def of(cls, spec: JoinSpec) -> JoinWindows:
        """From a validated join spec; eager without grace defaults as JoinWindows.of did (docs/semantics.md §5.4)."""
        w = spec.window
        grace = w.grace if w.grace is not None else max(DAY_MS - (w.before + w.after), 0)
        return cls(before=w.before, after=w.after, grace=grace, eager=spec.eager)

    @property
    def retention(self) -> int:
        """Join store retention R = before + after + G (docs/semantics.md §5.2)."""
        return self.before + self.after + self.grace

    def look_back(self, side: int) -> int:
        """Processor-side look-back/ahead: `after` for left rows, `before` for right rows (docs/semantics.md §5.1, §5.3)."""
        return self.after if side == LEFT else self.before

    def bounds(self, side: int, t: int) -> tuple[int, int]:
        """[from, to] of the other side's rows a record of `side` at t looks up (docs/semantics.md §5.1, clamped at 0)."""
        back, ahead = (self.before, self.after) if side == LEFT else (self.after, self.before)
        return max(0, t - back), max(0, t + ahead)
