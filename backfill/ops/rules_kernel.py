"""Part: operators. The per-partition kernel of the lookback rule engine (docs/semantics.md §12.4-§12.7).

Spark hands it the forks of many state keys (the grouping-key string, and with `compat: intended` the rule
id too), sorted by state key and processing order, and the rule versions as plain tuples. Each state is
replayed in processing order: store the transaction (a set: demo stores field-equal transactions once),
evaluate ACTIVE versions over [t - W, t], clear the state after an alert of a COUNT_WITH_RESET_FLINK rule;
with `order: arrival` also the global events the driver knows (CLEAR_STATE_ALL, widest-window changes) and
the cleanup timers, which fire when the watermark rises past them and evict entries older than the timer
minus the widest window then.

The replay is compiled (`rules_replay.py`, integers at a fixed scale per field, O(log m) per fork); a
partition whose values do not fit 64-bit integers at that scale (or are written with an exponent) is replayed
with exact decimals here instead (`_Replay.exact`), state by state.
"""
from __future__ import annotations

import bisect
import re
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

JAVA_MIN = -2**63
NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")
DOUBLE_MIN = Decimal("4.9E-324")
DOUBLE_MAX = Decimal("1.7976931348623157E+308")
AVG_PLACES = 10
Axis = tuple[int, int, int, int]
PLAIN = r"[+-]?(\d+\.?\d*|\.\d+)"  # a number the compiled replay reads (no exponent)
AGGREGATORS = {"SUM": 0, "AVG": 1, "MIN": 2, "MAX": 3}
OPERATORS = {"EQUAL": 0, "NOT_EQUAL": 1, "GREATER": 2, "LESS": 3, "GREATER_EQUAL": 4, "LESS_EQUAL": 5}
COLUMNS = ["partition", "offset", "rule_id", "version", "key", "value", "o0", "o1", "o2", "o3", "fail"]

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
        fields = sorted(c for c in pdf.columns if re.fullmatch(r"v\d+", c))
        self.vals = list(zip(*[pdf[c].tolist() for c in fields])) if fields else [()] * self.n
        self.key = pdf["key"].iloc[0] if self.n else ""
        # with `explain`: per alert row (its fork index), the fork indices of the transactions it aggregated
        self.members: dict[int, list[int]] | None = None
        # a held watermark (docs/semantics.md §12.14): from fork `hold` on no timer fires; the replay stops after
        # evaluating fork `stop`, its evaluation in `outcome` (value, whether it alerted, compat: demo's failure)
        self.hold: int | None = None
        self.stop: int | None = None
        self.outcome: tuple[Decimal, bool, str | None] | None = None
        # with a list: the forks at which firing timers evicted entries, in processing order
        self.evicted_at: list[int] | None = None

    # ------------------------------------------------------------------ shared
    def _row(self, i: int, value: Decimal | None, fail: str | None = None) -> tuple[Any, ...]:
        v = self.versions[self.vidx[i]]
        a = self.axes[i]
        o = (a[0], a[2], a[3], 0) if self.arrival else (int(self.t[i]), a[0], a[2], a[3])
        return (int(self.part[i]), int(self.off[i]), v.rule_id, int(self.vidx[i]), self.key,
                None if value is None else plain(value), *(int(x) for x in o), fail)

    def _fail(self, i: int, v: Version, values: list[Decimal]) -> str | None:
        """compat: demo: where the published code throws (docs/semantics.md §12.7)."""
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
                if self.hold is None or i < self.hold:
                    held = len(times)
                    times, entries = self._fire(timers, int(wm[i]), axis, times, entries)
                    if self.evicted_at is not None and len(times) < held:
                        self.evicted_at.append(i)
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
            if self.members is not None:
                self.members[i] = [j for ts in times[lo:hi] for _, j in entries[ts]]
            fail = self._fail(i, v, values)
            if fail is not None:
                if i == self.stop:
                    self.outcome = (Decimal(0), False, fail)
                return [self._row(i, None, fail)]
            value = self._aggregate(v, values)
            alerted = holds(value, v.operator, v.limit)
            if alerted:
                if v.resets:
                    times, entries = [], {}
                rows.append(self._row(i, value))
            if i == self.stop:
                self.outcome = (value, alerted, None)
                return rows
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


def window_members(pdf: pd.DataFrame, versions: list[Version], timeline: Timeline, arrival: bool,
                   demo: bool) -> dict[tuple[int, int, int], list[tuple[int, int, int]]]:
    """One state's forks (as `run_partition` gets them, in processing order) replayed literally: per alert
    (rule id, transaction partition, offset), the transactions its window held when it was evaluated, as
    (partition, offset, event time), in event-time order (docs/semantics.md §12.13)."""
    replay = _Replay(pdf.reset_index(drop=True), versions, timeline, arrival, demo)
    replay.members = {}
    rows = replay.exact()
    # an alert row names its fork by (partition, offset, version): one look-up, not a scan per alert
    fork = {(int(replay.part[i]), int(replay.off[i]), int(replay.vidx[i])): i for i in replay.members}
    found = {}
    for row in rows:
        if row[-1] is not None:  # compat: demo, where the published job fails: no alert
            continue
        i = fork[(row[0], row[1], row[3])]
        found[(row[2], row[0], row[1])] = [(int(replay.part[j]), int(replay.off[j]), int(replay.t[j]))
                                           for j in replay.members[i]]
    return found


@dataclass(frozen=True)
class Held:
    """An evaluation replayed with the watermark held from one transaction on (docs/semantics.md §12.14)."""

    hold: tuple[int, int, int]  # the transaction (partition, offset, event time) from which no timer fired
    key: str  # the grouping key
    value: str | None  # the aggregate, in its plain form; None where the published job fails (compat: demo)
    alerted: bool
    at: tuple[int, int, int]  # the transaction evaluated
    kept: list[tuple[int, int, int]]  # transactions in the window that the per-element watermark had evicted
    window: list[tuple[int, int, int]]  # the window the evaluation aggregated, in event-time order


def held_watermarks(pdf: pd.DataFrame, versions: list[Version], timeline: Timeline, demo: bool,
                    wanted: list[tuple[int, int, int]], limit: int, budget: int
                    ) -> tuple[dict[tuple[int, int, int], list[Held]], int]:
    """One state's forks (as `run_partition` gets them, in processing order, `order: arrival`) and the evaluations
    asked for (rule id, transaction partition, offset): for each, the evaluation replayed with the watermark held
    from each of the `limit` latest forks before it at which timers evicted entries (latest first), as `Held`
    (docs/semantics.md §12.14). Holding from any other fork gives one of these states or the run's own. Replays
    stop once they would pass `budget` forks; an evaluation not replayed is absent. Returns the forks replayed."""
    if len(pdf) > budget:
        return {}, 0
    pdf = pdf.reset_index(drop=True)
    spent = len(pdf)
    base = _Replay(pdf, versions, timeline, True, demo)
    base.evicted_at, base.members = [], {}
    base.exact()
    fork = {(versions[int(base.vidx[i])].rule_id, int(base.part[i]), int(base.off[i])): i for i in range(base.n)}
    spot = lambda j: (int(base.part[j]), int(base.off[j]), int(base.t[j]))  # noqa: E731
    found: dict[tuple[int, int, int], list[Held]] = {}
    for w in wanted:
        stop = fork.get(w)
        if stop is None or not versions[int(base.vidx[stop])].active:
            continue
        if stop not in base.members:  # compat: demo failed before it: the published job stopped there
            continue
        own = set(base.members[stop])
        holds = [e for e in base.evicted_at if e <= stop][::-1][:limit]
        if spent + len(holds) * (stop + 1) > budget:
            continue
        spent += len(holds) * (stop + 1)
        tries = []
        for e in holds:
            held = _Replay(pdf, versions, timeline, True, demo)
            held.members, held.hold, held.stop = {}, e, stop
            held.exact()
            if held.outcome is None:
                continue
            value, alerted, fail = held.outcome
            window = held.members.get(stop, [])
            tries.append(Held(spot(e), str(base.key), None if fail else plain(value), alerted and fail is None,
                              spot(stop), [spot(j) for j in window if j not in own], [spot(j) for j in window]))
        found[w] = tries
    return found, spent


def fail_message(v: Version) -> str:
    """What the published code throws for this evaluation (compat: demo)."""
    if v.aggregator == "AVG":
        return f"rule {v.rule_id}: AVG would fail the published job (NullPointerException)"
    return f"rule {v.rule_id}: MAX of a value <= 0 would fail the published job (IllegalArgumentException)"


def run_partition(batches: Iterator[pd.DataFrame], versions: list[Version], timeline: Timeline, arrival: bool,
                  demo: bool, state_key: list[str]) -> Iterator[pd.DataFrame]:
    """mapInPandas: one Spark partition's forks, sorted by state key and processing order -> alert rows."""
    import pandas as pd  # in the Python worker; the CLI does not pay for pandas

    parts = [b for b in batches if len(b)]
    if not parts:
        return
    pdf = pd.concat(parts, ignore_index=True)
    scaled = _scaled(pdf, versions)
    if scaled is None:  # values beyond 64-bit integers: exact decimals, state by state
        for _, group in pdf.groupby(state_key, sort=False):
            rows = _Replay(group.reset_index(drop=True), versions, timeline, arrival, demo).exact()
            if rows:
                yield pd.DataFrame(rows, columns=COLUMNS)
        return
    found = _compiled(pdf, scaled, versions, timeline, arrival, demo, state_key)
    if len(found):  # an empty frame of object columns does not convert to the output's Arrow types
        yield found


def _scaled(pdf: pd.DataFrame, versions: list[Version]) -> tuple[np.ndarray, np.ndarray, list[int],
                                                                   np.ndarray] | None:
    """Values as integers at one scale per field (counting rules: a last field of ones), or None."""
    import pandas as pd  # in the Python worker; the CLI does not pay for pandas

    fields = sorted((c for c in pdf.columns if re.fullmatch(r"v\d+", c)), key=lambda c: int(c[1:]))
    n = len(pdf)
    count_field = len(fields)
    vals = np.zeros((n, count_field + 1), dtype=np.int64)
    valid = np.zeros((n, count_field + 1), dtype=bool)
    scales = []
    for j, col in enumerate(fields):
        text = pdf[col]
        plain_ = text.notna() & text.str.fullmatch(PLAIN).fillna(False).astype(bool)
        if bool((text.notna() & ~plain_ & text.str.fullmatch(NUMBER.pattern).fillna(False).astype(bool)).any()):
            return None  # a number with an exponent
        body = text.where(plain_, "0").astype(str)
        dot = body.str.find(".")
        decimals = np.where(dot >= 0, body.str.len() - dot - 1, 0)
        limits = [_decimals(v.limit) for v in versions if v.field == j]
        scale = int(max([int(decimals.max()) if n else 0, *limits]))
        digits = body.str.replace(".", "", regex=False).str.lstrip("+")
        if bool((digits.str.lstrip("-").str.len() > 17).any()) or scale > 17:
            return None
        ints = pd.to_numeric(digits.where(digits.str.strip("-") != "", "0")).to_numpy(dtype=np.int64)
        vals[:, j] = ints * (10 ** (scale - decimals)).astype(np.int64)
        valid[:, j] = plain_.to_numpy()
        scales.append(scale)
    count_scale = max([_decimals(v.limit) for v in versions if v.field < 0] or [0])
    vals[:, count_field] = 10 ** count_scale
    valid[:, count_field] = True
    scales.append(count_scale)
    bound = 2**62 // max(n, 1)
    if np.abs(vals).max(initial=0) >= bound:
        return None
    limits = np.zeros(len(versions), dtype=np.int64)
    for i, v in enumerate(versions):
        scaled_limit = v.limit.scaleb(scales[v.field if v.field >= 0 else count_field])
        if abs(scaled_limit) >= bound:
            return None
        limits[i] = int(scaled_limit)
    return vals, valid, scales, limits


def _decimals(d: Decimal) -> int:
    exp = d.normalize().as_tuple().exponent
    return max(0, -int(exp))


def _before(a: list[np.ndarray], point: Axis) -> np.ndarray:
    """Forks whose axis lies after `point` (the point is before them), vectorized over (a0, a1, a2, a3)."""
    a0, a1, a2, a3 = a
    c0, c1, c2, c3 = point
    return (a0 > c0) | ((a0 == c0) & ((a1 > c1) | ((a1 == c1) & ((a2 > c2) | ((a2 == c2) & (a3 > c3))))))


def _compiled(pdf: pd.DataFrame, scaled: tuple[np.ndarray, np.ndarray, list[int], np.ndarray],
              versions: list[Version], timeline: Timeline, arrival: bool, demo: bool,
              state_key: list[str]) -> pd.DataFrame:
    import pandas as pd

    from backfill.ops.rules_replay import replay

    vals, valid, scales, limits = scaled
    n = len(pdf)
    count_field = vals.shape[1] - 1
    keys = [pdf[c].to_numpy() for c in state_key]
    new_state = np.ones(n, dtype=bool)
    new_state[1:] = np.logical_or.reduce([k[1:] != k[:-1] for k in keys])
    bounds = np.append(np.flatnonzero(new_state), n).astype(np.int64)
    part, off = pdf["partition"].to_numpy(np.int64), pdf["offset"].to_numpy(np.int64)
    new_record = np.ones(n, dtype=bool)
    new_record[1:] = (part[1:] != part[:-1]) | (off[1:] != off[:-1]) | new_state[1:]
    rec = np.cumsum(new_record).astype(np.int64)
    ident = pd.factorize(pdf["txid"])[0].astype(np.int64) if demo else rec
    axes = [pdf[c].to_numpy(np.int64) for c in ("a0", "a1", "a2", "a3")]
    nclear = np.zeros(n, dtype=np.int64)
    cidx = np.zeros(n, dtype=np.int64)
    widest_now = np.full(n, -1 if timeline.initial_widest is None else timeline.initial_widest, dtype=np.int64)
    c_wm = np.zeros(len(timeline.widest), dtype=np.int64)
    c_before = np.zeros(len(timeline.widest), dtype=np.int64)
    if arrival:
        for point in timeline.clears:
            nclear += _before(axes, point)
        previous = timeline.initial_widest
        for i, (point, wm_c, after) in enumerate(timeline.widest):
            after_it = _before(axes, point)
            cidx += after_it
            widest_now[after_it] = -1 if after is None else after
            c_wm[i], c_before[i] = wm_c, -1 if previous is None else previous
            previous = after
    wm = pdf["wm"].to_numpy(np.int64) if "wm" in pdf.columns else np.zeros(n, dtype=np.int64)
    v_field = np.array([v.field if v.field >= 0 else count_field for v in versions], dtype=np.int64)
    out_alert = np.zeros(n, dtype=bool)
    out_value = np.zeros(n, dtype=np.int64)
    out_count = np.zeros(n, dtype=np.int64)
    failed = replay(bounds, pdf["t"].to_numpy(np.int64), rec, ident, pdf["version"].to_numpy(np.int64), vals,
                    valid, wm, nclear, cidx, widest_now, c_wm, c_before,
                    np.array([v.active for v in versions], dtype=bool),
                    np.array([v.window_ms for v in versions], dtype=np.int64), v_field,
                    np.array([AGGREGATORS[v.aggregator] for v in versions], dtype=np.int64),
                    np.array([OPERATORS[v.operator] for v in versions], dtype=np.int64), limits,
                    np.array([v.resets for v in versions], dtype=bool), arrival, demo, out_alert, out_value,
                    out_count)
    t = pdf["t"].to_numpy(np.int64)
    order = np.stack([axes[0], axes[2], axes[3], np.zeros(n, dtype=np.int64)]) if arrival else \
        np.stack([t, axes[0], axes[2], axes[3]])
    if failed >= 0:
        hit = np.array([failed])
        messages = [fail_message(versions[int(pdf["version"].iat[failed])])]
        texts: list[str | None] = [None]
    else:
        hit = np.flatnonzero(out_alert)
        messages = [None] * len(hit)
        texts = []
        q = Decimal(1).scaleb(-AVG_PLACES)
        for i in hit.tolist():
            v = versions[int(pdf["version"].iat[i])]
            scale = scales[int(v_field[int(pdf["version"].iat[i])])]
            value = Decimal(int(out_value[i])).scaleb(-scale)
            if v.aggregator == "AVG":
                value = (value / int(out_count[i])).quantize(q, ROUND_HALF_UP)
            texts.append(plain(value))
    return pd.DataFrame({"partition": part[hit].astype(np.int32), "offset": off[hit],
                         "rule_id": pdf["rule_id"].to_numpy()[hit].astype(np.int32),
                         "version": pdf["version"].to_numpy()[hit].astype(np.int32),
                         "key": pdf["key"].to_numpy()[hit], "value": texts, "o0": order[0][hit],
                         "o1": order[1][hit], "o2": order[2][hit], "o3": order[3][hit], "fail": messages})
