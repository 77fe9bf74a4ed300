"""Part: reference engine. KStreamSlidingWindowAggregate for one task, record by record (docs/semantics.md §10).

A window [start, start + D] exists only where records make it: the left window [t - D, t] of each record,
the right window [t + 1, t + 1 + D] of a record when a later one falls into it, and [0, D] for every
early record (t < D). The store is read backwards from the latest start (the reverse iterator of RocksDB
and in-memory stores); a new window copies the aggregate of the window the reading stopped at, which is
why the values depend on what the store held, not only on the records. A window is updated only while
its end >= ST - grace (a `late` ledger row per refused update); a record whose own right window would
end at or before that time is dropped at once. `emit: final` emits the windows closed by the end of the
data (ON_WINDOW_CLOSE: end < ST - grace), or with `close: suppress` what suppress releases (buffer time: the
inclusive end start + D, duration: grace; a window updated at end == ST - grace after its release is released
again); the others are incomplete.
"""
from __future__ import annotations

from typing import Any

from backfill.jobspec.models import FoldAggregation, OperatorSpec
from backfill.reference.expr import compile_aggregate, compile_fold
from backfill.reference.chains import release
from backfill.reference.records import ledger_row
from backfill.reference.suppress import SuppressBuffer, key_bytes

STRIDE = 2**31  # emit_seq = seq * STRIDE + position of the update among this record's outputs


class SlidingAggregate:
    """Sliding windows of one operator in one task: own stream time, a per-key window store, updates or final."""

    def __init__(self, op: OperatorSpec, task: int, result: Any) -> None:
        spec = op.aggregate
        assert spec is not None
        self.op, self.task, self.result = op, task, result
        self.diff, self.grace = int(spec.window.time_difference or 0), spec.window.grace_ms
        self.emit = spec.emit
        self.aggs = {n: (compile_fold(a.fold.init, a.fold.step) if isinstance(a, FoldAggregation)
                         else compile_aggregate(a)) for n, a in spec.aggregations.items()}
        self.stream_time = -1
        self.store_time: int | None = None  # max window start ever written (docs/semantics.md §10.5)
        self.store: dict[Any, dict[int, tuple[dict[str, Any], int]]] = {}
        self.out = 0
        self.seq = 0
        self.rec: dict[str, Any] = {}
        self.suppress = (SuppressBuffer(self.grace, result.outputs[op.name], task, numbered=True)
                         if self.emit == "final" and spec.close_mechanism == "suppress" else None)
        # emit-on-close (5.4): its time-ordered store shows starts >= store time - retention (the others: >);
        # after each record that reaches the end of processing, the closed windows the store shows are emitted
        self.on_close = self.emit == "final" and spec.close_mechanism == "on_window_close"
        self.last_emit: int | None = None
        self.released: list[dict[str, Any]] = []  # what it emitted on close, numbered per task (§18.2)

    # ------------------------------------------------------------------ store
    def _fetch(self, key: Any, lo: int, hi: int) -> list[tuple[int, tuple[dict[str, Any], int]]]:
        """Visible windows of `key` with start in [lo, hi], latest start first (backwardFetch)."""
        windows = self.store.get(key, {})
        return sorted(((s, v) for s, v in windows.items() if lo <= s <= hi and self._shows(s)), key=lambda sv: -sv[0])

    def _shows(self, start: int) -> bool:
        """Whether the store still shows a window (9: retention 2D + grace from the largest start written)."""
        if self.store_time is None:
            return True
        alive = self.store_time - (2 * self.diff + self.grace)
        return start >= alive if self.on_close else start > alive

    def _put(self, key: Any, start: int, value: tuple[dict[str, Any], int]) -> None:
        self.store.setdefault(key, {})[start] = value
        self.store_time = start if self.store_time is None else max(self.store_time, start)

    def _forward(self, key: Any, start: int, state: dict[str, Any], ts: int) -> None:
        if self.emit == "updates":
            self.result.outputs[self.op.name].append(
                {**self._row(key, start, state, ts), "emit_seq": self.seq * STRIDE + self.out, "task": self.task})
        elif self.suppress is not None:  # a time-windowed key: key, start
            self.suppress.put((key, start), start + self.diff, key_bytes(key) + start.to_bytes(8, "big"),
                              self._row(key, start, state, ts), ts)
        self.out += 1

    def _row(self, key: Any, start: int, state: dict[str, Any], ts: int) -> dict[str, Any]:
        return {"key": key, "window_start": start, "window_end": start + self.diff,
                **{n: a.result(state[n]) for n, a in self.aggs.items()}, "ts": ts}

    def _init(self) -> dict[str, Any]:
        return {n: a.init() for n, a in self.aggs.items()}

    # ------------------------------------------------------------------ processing
    def process(self, rec: dict[str, Any], seq: int) -> None:
        """docs/semantics.md §10.2-§10.3; then, emitting on close, §10.5 (not after an early record or one
        dropped at once)."""
        if self._process(rec, seq) and self.on_close:
            self._emit_closed()

    def _emit_closed(self) -> None:
        """maybeForwardFinalResult (throttle 0): windows with start in [lower, close - D - 1] the store shows,
        by start, then key; a window the store no longer shows is never emitted."""
        close = self.stream_time - self.grace
        if self.last_emit is not None and close <= self.last_emit:
            return
        upper = close - self.diff - 1
        if upper < 0:
            return
        lower = 0 if self.last_emit is None else max(0, self.last_emit - self.diff)
        due = sorted((start, key_bytes(key), key) for key, windows in self.store.items() for start in windows
                     if lower <= start <= upper and self._shows(start))
        for start, _, key in due:
            state, ts = self.store[key][start]
            row = self._row(key, start, state, ts)
            self.result.outputs[self.op.name].append(row)
            release(self.released, row, self.task)
        self.last_emit = close

    def _process(self, rec: dict[str, Any], seq: int) -> bool:
        """§10.2-§10.3, for one record; whether it reached the end (emission follows)."""
        if rec["key"] is None or rec["value"] is None:  # step 1
            st = self.stream_time if self.stream_time >= 0 else None
            reason = "null_key" if rec["key"] is None else "null_value"
            self.result.ledger.append(ledger_row(rec, self.op.name, reason, rec["ts"], st, None, range_time=rec["ts"]))
            return False
        t, key, d = rec["ts"], rec["key"], self.diff
        self.stream_time = max(self.stream_time, t)  # step 2
        close = self.stream_time - self.grace
        self.seq, self.out, self.rec = seq, 0, rec
        if t + 1 + d <= close:  # step 3: even its right window would have ended; the window its log names
            self._late(t, t + d)
            return False
        if t < d:
            self._early(key, t, close)
            return False
        left_agg = right_agg = None
        left_done = right_done = False
        prev: int | None = None
        starts: set[int] = set()
        for start, (state, wts) in self._fetch(key, max(0, t - 2 * d), t + 1):
            starts.add(start)
            end = start + d
            if start == t + 1:
                right_done = True
            elif end > t:
                if right_agg is None:
                    right_agg = (state, wts)
                self._update(key, start, (state, wts), close)
            elif end == t:
                left_done = True
                self._update(key, start, (state, wts), close)
                if wts < t:
                    prev = wts
                else:
                    return True
            else:
                left_agg, prev = (state, wts), wts
                break
        if prev is not None and prev + 1 not in starts and prev + 1 + d >= t:  # the previous record's right window
            self._update(key, prev + 1, (self._init(), t), close)
        if not left_done:
            seeded = left_agg[0] if left_agg is not None and prev is not None and t - d <= prev else self._init()
            self._update(key, t - d, (seeded, t), close)
        if not right_done and right_agg is not None and right_agg[1] > t:  # this record's right window
            self._put(key, t + 1, right_agg)
            self._forward(key, t + 1, right_agg[0], right_agg[1])
        return True

    def _early(self, key: Any, t: int, close: int) -> None:
        """docs/semantics.md §10.1: records before D share the window [0, D]; right windows as usual."""
        combined = right_agg = None
        right_done = False
        prev: int | None = None
        starts: set[int] = set()
        for start, (state, wts) in sorted(self._fetch(key, 0, t + 1)):  # forward iteration
            starts.add(start)
            if start == 0:
                combined = (state, wts)
                if wts < t:
                    prev = wts
            elif start <= t:
                right_agg = (state, wts)
                self._update(key, start, (state, wts), close)
            elif start == t + 1:
                right_done = True
        if right_agg is None and combined is not None and combined[1] > t:
            right_agg = combined
        if not right_done and right_agg is not None and right_agg[1] > t:
            self._put(key, t + 1, right_agg)
            self._forward(key, t + 1, right_agg[0], right_agg[1])
        if prev is not None and prev + 1 not in starts:
            self._update(key, prev + 1, (self._init(), t), close)
        self._update(key, 0, combined if combined is not None else (self._init(), t), close)

    def _update(self, key: Any, start: int, value: tuple[dict[str, Any], int], close: int) -> None:
        """updateWindowAndForward (docs/semantics.md §10.2): aggregate the record in while the window's end >= close time."""
        t = self.rec["ts"]
        if start + self.diff < close:
            self._late(start, start + self.diff)
            return
        state, wts = value
        row = {"key": key, "value": self.rec["value"], "ts": t, "timestamp": self.rec["timestamp"],
               "topic": self.rec["topic"], "partition": self.rec["partition"], "offset": self.rec["offset"]}
        new = {n: a.add(state[n], row) for n, a in self.aggs.items()}
        ts = max(t, wts)
        self._put(key, start, (new, ts))
        self._forward(key, start, new, ts)

    def _late(self, start: int, end: int) -> None:
        self.result.ledger.append(ledger_row(self.rec, self.op.name, "late", self.rec["ts"], self.stream_time,
                                              (start, end), range_time=start))

    def finish(self) -> None:
        """emit: final: the windows still open (end >= ST - grace) are incomplete; the closed ones were emitted
        (docs/semantics.md §10.4, §10.5)."""
        if self.emit != "final":
            return
        if self.suppress is not None:
            self.result.incomplete[self.op.name] += [{**row, "stream_time": self.stream_time, "task": self.task}
                                                     for row in self.suppress.pending()]
            return
        self.result.released.setdefault(self.op.name, []).extend(self.released)
        close = self.stream_time - self.grace
        every = [(key, s, v) for key, windows in self.store.items() for s, v in windows.items()]
        for key, start, (state, ts) in sorted(every, key=lambda e: (e[1], str(e[0]))):
            if start + self.diff >= close:  # emitted as they closed (a closed window the store lost: never)
                row = self._row(key, start, state, ts)
                self.result.incomplete[self.op.name].append({**row, "stream_time": self.stream_time,
                                                             "task": self.task})
