"""Part: operators. The per-key kernel of the lookback rule engine (flink.md 6.5-6.8, 7.2-7.3): one state's forks.

Spark hands it every fork of one state key (the grouping-key string, and with `compat: intended` the rule
id too), and the rule versions as plain tuples. It replays the state in processing order: store the
transaction (a set: demo stores field-equal transactions once), evaluate ACTIVE versions over [t - W, t],
clear the state after an alert of a COUNT_WITH_RESET_FLINK rule; with `order: arrival` also the global
events the driver knows (CLEAR_STATE_ALL, widest-window changes) and the cleanup timers, which fire when
the watermark rises past them and evict entries older than the timer minus the widest window then.

Two paths give the same answers:
* the fast path, for a state whose forks arrive in event-time order with nothing that rewrites history
  (no reset rule, no clear, no eviction that a window could see): windows are ranges of a sorted array,
  sums are differences of a cumulative sum, minima and maxima one monotone-deque pass per window length;
* the exact replay, record by record, for everything else.
"""
from __future__ import annotations

import bisect
import re
from collections import deque
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

import numpy as np
import pandas as pd

JAVA_MIN = -2**63
NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")
DOUBLE_MIN = Decimal("4.9E-324")
DOUBLE_MAX = Decimal("1.7976931348623157E+308")
AVG_PLACES = 10
Axis = tuple[int, int, int, int]

# an alert (or compat: demo's first failure) and its place in the processing order (o0..o3, then rule_id)
OUTPUT_SCHEMA = ("partition int, offset long, rule_id int, version int, key string, value string, o0 long, "
                 "o1 long, o2 long, o3 long, fail string")


@dataclass(frozen=True)
class Version:
    """What the kernel needs of one rule version."""

    rule_id: int
    active: bool
    window_ms: int
    field: int  # index into the fork's values; -1: the count fields
    aggregator: str
    operator: str
    limit: Decimal
    resets: bool


@dataclass(frozen=True)
class Timeline:
    """The global events of `order: arrival` with `rule_versions: as_of_arrival`, on the arrival axis."""

    clears: tuple[Axis, ...] = ()
    # (axis of the rule message, watermark just before it, widest window after it: None after DELETE_RULES_ALL)
    widest: tuple[tuple[Axis, int, int | None], ...] = ()
    initial_widest: int | None = None  # before the first change (rule_versions: final: the final widest)

    def widest_before(self, axis: Axis) -> int | None:
        """The widest ACTIVE window in force just before `axis`."""
        i = bisect.bisect_left([c[0] for c in self.widest], axis)
        return self.widest[i - 1][2] if i else self.initial_widest

    def clears_between(self, lo: Axis, hi: Axis) -> bool:
        """A CLEAR_STATE_ALL between two places on the axis."""
        i = bisect.bisect_right(self.clears, lo)
        return i < len(self.clears) and self.clears[i] < hi

    def never_narrows(self) -> bool:
        """No DELETE_RULES_ALL: the widest window only grows."""
        return all(w is not None for _, _, w in self.widest)


def plain(d: Decimal) -> str:
    """The decimal string of an alert value: plain, without trailing zeros."""
    out = format(d.normalize(), "f")
    return "0" if out in ("-0", "0") else out


def java_second(t: int) -> int:
    """(t / 1000) * 1000 with Java's truncating division: the cleanup timer of an evaluation at t."""
    return int(t / 1000) * 1000 if t >= 0 else -((-t) // 1000) * 1000


def holds(value: Decimal, op: str, limit: Decimal) -> bool:
    """Rule.apply: compareTo-based, so scale does not matter."""
    if op == "EQUAL":
        return value == limit
    if op == "NOT_EQUAL":
        return value != limit
    if op == "GREATER":
        return value > limit
    if op == "LESS":
        return value < limit
    if op == "GREATER_EQUAL":
        return value >= limit
    return value <= limit


def run_state(pdf: pd.DataFrame, versions: list[Version], timeline: Timeline, arrival: bool, demo: bool,
              out_of_orderness: int) -> pd.DataFrame:
    """All alerts (and the first failure of compat: demo) of one state key's forks."""
    order = ["a0", "a1", "a2", "a3", "rule_id"] if arrival else ["t", "a0", "a1", "a2", "a3", "rule_id"]
    pdf = pdf.sort_values(order, kind="stable").reset_index(drop=True)
    replay = _Replay(pdf, versions, timeline, arrival, demo)
    rows = replay.fast() if replay.fast_path_applies() else replay.exact()
    return pd.DataFrame(rows, columns=["partition", "offset", "rule_id", "version", "key", "value", "o0", "o1", "o2",
                                       "o3", "fail"])


class _Replay:
    """One state's forks in processing order, as columns."""

    def __init__(self, pdf: pd.DataFrame, versions: list[Version], timeline: Timeline, arrival: bool,
                 demo: bool) -> None:
        self.pdf, self.versions, self.timeline = pdf, versions, timeline
        self.arrival, self.demo = arrival, demo
        self.n = len(pdf)
        self.t = pdf["t"].to_numpy(dtype=np.int64)
        self.vidx = pdf["version"].to_numpy(dtype=np.int64)
        self.part = pdf["partition"].to_numpy()
        self.off = pdf["offset"].to_numpy()
        self.axes: list[Axis] = list(zip(pdf["a0"].tolist(), pdf["a1"].tolist(), pdf["a2"].tolist(),
                                          pdf["a3"].tolist()))
        self.vals = pdf["vals"].tolist()
        self.key = pdf["key"].iloc[0] if self.n else ""

    # ------------------------------------------------------------------ shared
    def _row(self, i: int, value: Decimal | None, fail: str | None = None) -> tuple[Any, ...]:
        v = self.versions[self.vidx[i]]
        a = self.axes[i]
        o = (a[0], a[2], a[3], 0) if self.arrival else (int(self.t[i]), a[0], a[2], a[3])
        return (int(self.part[i]), int(self.off[i]), v.rule_id, int(self.vidx[i]), self.key,
                None if value is None else plain(value), *(int(x) for x in o), fail)

    def _fail(self, i: int, v: Version, values: list[Decimal]) -> str | None:
        """compat: demo: where the published code throws (flink.md 6.6)."""
        if not self.demo:
            return None
        if v.aggregator == "AVG":
            return f"rule {v.rule_id}: AVG would fail the published job (NullPointerException)"
        if v.aggregator == "MAX" and any(x < DOUBLE_MIN for x in values):
            return f"rule {v.rule_id}: MAX of a value <= 0 would fail the published job (IllegalArgumentException)"
        if v.aggregator == "MIN" and any(x > DOUBLE_MAX for x in values):
            return f"rule {v.rule_id}: MIN of a value above the largest double would fail the published job"
        return None

    @staticmethod
    def _aggregate(v: Version, values: list[Decimal]) -> Decimal:
        if v.aggregator == "SUM":
            return sum(values, Decimal(0))
        if v.aggregator == "AVG":
            return (sum(values, Decimal(0)) / len(values)).quantize(Decimal(1).scaleb(-AVG_PLACES), ROUND_HALF_UP)
        return max(values) if v.aggregator == "MAX" else min(values)

    def _value(self, i: int, field: int) -> Decimal | None:
        if field < 0:
            return Decimal(1)
        text = self.vals[i][field]
        return Decimal(text) if text is not None and NUMBER.match(text) else None

    def _identity(self, i: int) -> Any:
        return self.pdf["txid"].iat[i] if self.demo else (int(self.part[i]), int(self.off[i]))

    # ------------------------------------------------------------------ exact replay
    def exact(self) -> list[tuple[Any, ...]]:
        """DynamicAlertFunction.processElement per fork, with timers, clears and resets."""
        rows: list[tuple[Any, ...]] = []
        times: list[int] = []  # distinct event times in the state, sorted
        entries: dict[int, list[tuple[Any, int]]] = {}  # event time -> (identity, fork index)
        timers: dict[int, tuple[int, Axis]] = {}  # timer time -> (watermark, axis) when registered
        wm = self.pdf["wm"].to_numpy(dtype=np.int64) if self.arrival else None
        prev: Axis | None = None
        for i in range(self.n):
            axis = self.axes[i]
            if self.arrival and prev is not None and axis != prev:
                if self.timeline.clears_between(prev, axis):
                    times, entries = [], {}
                assert wm is not None
                times, entries = self._fire(timers, int(wm[i]), axis, times, entries)
            prev = axis
            t = int(self.t[i])
            ident = self._identity(i)
            bucket = entries.get(t)
            if bucket is None:
                bucket = entries[t] = []
                bisect.insort(times, t)
            if all(e != ident for e, _ in bucket):
                bucket.append((ident, i))
            v = self.versions[self.vidx[i]]
            if not v.active:
                continue
            if self.arrival:
                assert wm is not None
                timers.setdefault(java_second(t), (int(wm[i]), axis))
            lo = bisect.bisect_left(times, t - v.window_ms)
            hi = bisect.bisect_right(times, t)
            values = [x for ts in times[lo:hi] for _, j in entries[ts] if (x := self._value(j, v.field)) is not None]
            fail = self._fail(i, v, values)
            if fail is not None:
                return [self._row(i, None, fail)]
            value = self._aggregate(v, values)
            if holds(value, v.operator, v.limit):
                if v.resets:
                    times, entries = [], {}
                rows.append(self._row(i, value))
        return rows

    def _fire(self, timers: dict[int, tuple[int, Axis]], wm: int, axis: Axis, times: list[int],
              entries: dict[int, list[tuple[Any, int]]]) -> tuple[list[int], dict[int, list[tuple[Any, int]]]]:
        """Timers due before the fork at `axis`: registered under a lower watermark, now at or below it."""
        for timer in sorted(timers):
            reg_wm, reg_axis = timers[timer]
            if not (wm > reg_wm and wm >= timer):
                continue
            del timers[timer]
            widest = self._widest_at_firing(timer, reg_wm, reg_axis, axis)
            if widest is None:
                continue
            cut = bisect.bisect_left(times, timer - widest)
            for ts in times[:cut]:
                del entries[ts]
            times = times[cut:]
        return times, entries

    def _widest_at_firing(self, timer: int, reg_wm: int, reg_axis: Axis, axis: Axis) -> int | None:
        """The widest window when the timer fired: the watermark rise that fired it, placed among the
        widest-window changes between its registration and now."""
        for c_axis, c_wm, _ in self.timeline.widest:
            if reg_axis < c_axis < axis and c_wm > reg_wm and c_wm >= timer:
                return self.timeline.widest_before(c_axis)
        return self.timeline.widest_before(axis)

    # ------------------------------------------------------------------ fast path
    def fast_path_applies(self) -> bool:
        """Forks in event-time order and nothing that rewrites history."""
        if self.n == 0:
            return True
        if self.arrival and np.any(np.diff(self.t) < 0):
            return False
        active = [self.versions[j] for j in set(self.vidx.tolist())]
        if any(v.resets and v.active for v in active):
            return False
        if self.demo:  # field-equal transactions are one entry: only the forks of one record may repeat it
            tx = self.pdf[["txid", "partition", "offset"]].drop_duplicates()
            if tx["txid"].duplicated().any():
                return False
        if self.arrival:
            # a timer of a negative time rounds up (Java's division), so it can cut into a later window
            if self.timeline.clears_between(self.axes[0], self.axes[-1]) or self.t[0] < 0:
                return False
            widths = [v.window_ms for v in active if v.active]
            if widths:
                widest = self.timeline.widest_before(self.axes[0])
                if widest is None or max(widths) > widest or not self.timeline.never_narrows():
                    return False
        return True

    def fast(self) -> list[tuple[Any, ...]]:
        """Windows as ranges of the entries (one per record, in processing order = event-time order)."""
        record = self.part.astype(np.int64) * (1 << 40) + self.off.astype(np.int64)
        first = np.ones(self.n, dtype=bool)
        first[1:] = record[1:] != record[:-1]
        entry = np.cumsum(first) - 1  # the entry of each fork
        et = self.t[first]
        rows: list[tuple[Any, ...]] = []
        groups: dict[tuple[int, int, str], list[int]] = {}
        for i in range(self.n):
            v = self.versions[self.vidx[i]]
            if v.active:
                groups.setdefault((v.window_ms, v.field, v.aggregator), []).append(i)
        firsts = np.flatnonzero(first)
        by_field: dict[int, list[Decimal | None]] = {}
        for (window, field, aggregator), forks in groups.items():
            idx = np.asarray(forks)
            lo = np.searchsorted(et, self.t[idx] - window, side="left")
            hi = entry[idx]
            if field not in by_field:
                by_field[field] = [self._value(int(f), field) for f in firsts]
            values = by_field[field]
            results = self._windowed(aggregator, values, lo, hi)
            for k, i in enumerate(forks):
                v = self.versions[self.vidx[i]]
                value = results[k]
                if value is None:
                    members = [x for x in values[lo[k]:hi[k] + 1] if x is not None]
                    fail = self._fail(i, v, members)
                    if fail is not None:
                        return [self._row(i, None, fail)]
                    value = self._aggregate(v, members)
                if holds(value, v.operator, v.limit):
                    rows.append((i, self._row(i, value)))  # type: ignore[arg-type]
        rows.sort(key=lambda r: r[0])  # type: ignore[index]
        return [r for _, r in rows]  # type: ignore[misc]

    def _windowed(self, aggregator: str, values: list[Decimal | None], lo: np.ndarray, hi: np.ndarray
                  ) -> list[Decimal | None]:
        """Per fork, the aggregate of values[lo..hi]; None where it must be computed one by one."""
        if self.demo and aggregator != "SUM":
            return [None] * len(lo)  # the checks of compat: demo look at every member
        clean = [Decimal(0) if x is None else x for x in values]
        if aggregator in ("SUM", "AVG"):
            cum = [Decimal(0)]
            for x in clean:
                cum.append(cum[-1] + x)
            if aggregator == "SUM":
                return [cum[h + 1] - cum[lo_] for lo_, h in zip(lo.tolist(), hi.tolist())]
            counts = [0]
            for x in values:
                counts.append(counts[-1] + (x is not None))
            q = Decimal(1).scaleb(-AVG_PLACES)
            return [((cum[h + 1] - cum[lo_]) / (counts[h + 1] - counts[lo_])).quantize(q, ROUND_HALF_UP)
                    for lo_, h in zip(lo.tolist(), hi.tolist())]
        # MIN / MAX: both ends only move forward, so a monotone deque gives each window's extreme
        better = (lambda a, b: a >= b) if aggregator == "MAX" else (lambda a, b: a <= b)
        out: list[Decimal | None] = []
        window: deque[int] = deque()
        pushed = -1
        for lo_, h in zip(lo.tolist(), hi.tolist()):
            while pushed < h:
                pushed += 1
                x = values[pushed]
                if x is None:
                    continue
                while window and better(x, values[window[-1]]):  # type: ignore[arg-type]
                    window.pop()
                window.append(pushed)
            while window and window[0] < lo_:
                window.popleft()
            out.append(values[window[0]] if window else None)
        return out
