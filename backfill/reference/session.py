"""Part: reference engine. KStreamSessionWindowAggregate for one task, record by record (docs/semantics.md §11).

Sessions live in a per-key store; a record finds the sessions with end >= t - gap and start <= t + gap that
the store still shows (end > store time - retention, retention = gap + grace), merges them with [t, t], and
is dropped as late if the merged end is below ST - grace - gap. A merge deletes the sessions it found and,
under `emit: updates`, forwards a tombstone for each (timestamp: its end) before the merged session
(timestamp: the merged end). `emit: final` emits the sessions closed by the end of the data
(ON_WINDOW_CLOSE: end < ST - grace - gap), or with `close: suppress` what suppress releases (its buffer
time the session's end, its duration gap + grace: released once its stream time reaches end + gap + grace;
tombstones dropped); the others are incomplete.

ON_WINDOW_CLOSE replays the store as Kafka Streams keeps it (docs/semantics.md §11.5): segments of
max(retention / 2, 60 s) by session end, created by puts, a segment dropped by the put that moves the store's
time past it; after each keyed record the sessions whose end lies in [last close, close) are read from the
live segments and emitted. A closed session whose segment is gone by then is never emitted.

Values: a fold merges the found sessions' values into the initializer in store order (`merge(a, b)`, a the
running value) and then steps the record; an SQL aggregate is evaluated over the session's records, in the
order of that merge tree (the found sessions' records, then the record).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from backfill.jobspec.models import FoldAggregation, OperatorSpec
from backfill.reference.expr import compile_aggregate, compile_fold, compile_scalar
from backfill.reference.chains import release
from backfill.reference.records import ledger_row
from backfill.reference.suppress import SuppressBuffer, key_bytes

# at most this many outputs per record (tombstones + the merged session): emit_seq = seq * SLOTS + position
SLOTS = 8


@dataclass
class Session:
    """One stored session: bounds, its records in merge-tree order, and each fold's value."""

    start: int
    end: int
    rows: list[dict[str, Any]] = field(default_factory=list)
    folds: dict[str, Any] = field(default_factory=dict)


class SessionAggregate:
    """Session windows of one operator in one task: own stream time, per-key sessions, updates or final."""

    def __init__(self, op: OperatorSpec, task: int, result: Any) -> None:
        spec = op.aggregate
        assert spec is not None
        self.op, self.task, self.result = op, task, result
        self.gap, self.grace = int(spec.window.gap or 0), spec.window.grace_ms
        self.emit = spec.emit
        self.folds = {n: (compile_fold(a.fold.init, a.fold.step), compile_scalar(a.fold.merge or "b"))
                      for n, a in spec.aggregations.items() if isinstance(a, FoldAggregation)}
        self.sqls = {n: compile_aggregate(a) for n, a in spec.aggregations.items()
                     if not isinstance(a, FoldAggregation)}
        self.names = list(spec.aggregations)
        self.stream_time = -1
        self.store_time: int | None = None  # max session end ever written (docs/semantics.md §11.1)
        self.store: dict[Any, list[Session]] = {}
        self.suppress = (SuppressBuffer(self.gap + self.grace, result.outputs[op.name], task, numbered=True)
                         if self.emit == "final" and spec.close_mechanism == "suppress" else None)
        # ON_WINDOW_CLOSE: the segmented store and what its emission read has done
        self.on_close = self.emit == "final" and self.suppress is None
        self.segment_ms = max((self.gap + self.grace) // 2, 60_000)
        self.segments: set[int] = set()
        self.last_emit: int | None = None  # the close time of the last emission read
        self.released: list[dict[str, Any]] = []  # what it emitted, numbered per task (§18.2)

    def _segment(self, t: int) -> int:
        """A segment's id: the timestamp divided by the segment length, truncated as Java's long division."""
        return t // self.segment_ms if t >= 0 else -((-t) // self.segment_ms)

    def _put(self, sessions: list[Session], merged: Session) -> None:
        """The store's put: into a live segment (created if needed), then every earlier segment is dropped."""
        self.store_time = merged.end if self.store_time is None else max(self.store_time, merged.end)
        if not self.on_close:
            sessions.append(merged)
            return
        live = self._segment(self.store_time - (self.gap + self.grace))
        if self._segment(merged.end) >= live:
            self.segments.add(self._segment(merged.end))
            sessions.append(merged)
        for gone in [sid for sid in self.segments if sid < live]:
            self.segments.discard(gone)
            for held in self.store.values():
                held[:] = [x for x in held if self._segment(x.end) != gone]

    def _emit_closed(self) -> None:
        """The emission read after a keyed record: the sessions ending in [last close, close - 1], from the
        live segments, by end, then start and key (their values never change once closed)."""
        close = self.stream_time - self.grace - self.gap
        if self.last_emit is not None and self.last_emit >= close:
            return
        low, high = max(0, -1 if self.last_emit is None else self.last_emit), close - 1
        if high < 0 or high < low:
            return
        due = [(key, x) for key, held in self.store.items() for x in held if low <= x.end <= high]
        for key, x in sorted(due, key=lambda kx: (kx[1].end, kx[1].start, key_bytes(kx[0]))):
            row = self._row(key, x)
            self.result.outputs[self.op.name].append(row)
            release(self.released, row, self.task)
        self.last_emit = close

    def process(self, rec: dict[str, Any], seq: int) -> None:
        """docs/semantics.md §11.1-§11.3, for one record; then emit-on-close's read (§11.5)."""
        self._process(rec, seq)
        if self.on_close and rec["key"] is not None:
            self._emit_closed()

    def _process(self, rec: dict[str, Any], seq: int) -> None:
        if rec["key"] is None:  # step 1 (null values are aggregated)
            st = self.stream_time if self.stream_time >= 0 else None
            self.result.ledger.append(ledger_row(rec, self.op.name, "null_key", rec["ts"], st, None,
                                                  range_time=rec["ts"]))
            return
        t, key = rec["ts"], rec["key"]
        self.stream_time = max(self.stream_time, t)  # step 2
        close = self.stream_time - self.grace - self.gap
        sessions = self.store.setdefault(key, [])
        alive_after = None if self.store_time is None else self.store_time - (self.gap + self.grace)
        found = sorted((s for s in sessions if s.end >= t - self.gap and s.start <= t + self.gap
                        and (alive_after is None or s.end > alive_after)), key=lambda s: (s.end, s.start))
        start = min([t, *[s.start for s in found]])
        end = max([t, *[s.end for s in found]])
        if end < close:  # step 4: the merged end is what is tested
            self.result.ledger.append(ledger_row(rec, self.op.name, "late", t, self.stream_time, (start, end),
                                                  range_time=start))
            return
        out = 0
        if (start, end) != (t, t):  # step 5: tombstones for every found session, in store order
            for s in found:
                self._emit({"key": key, "window_start": s.start, "window_end": s.end,
                            **{n: None for n in self.names}, "ts": s.end}, seq, out, tombstone=True)
                out += 1
        row = {"key": key, "value": rec["value"], "ts": t, "timestamp": rec["timestamp"], "topic": rec["topic"],
               "partition": rec["partition"], "offset": rec["offset"]}
        merged = Session(start, end, rows=[r for s in found for r in s.rows] + [row])
        for name, (fold, merge) in self.folds.items():
            value = fold.init()
            for s in found:
                value = merge({"a": value, "b": s.folds[name]})
            merged.folds[name] = fold.add(value, row)
        for s in found:
            sessions.remove(s)
        # the store is keyed by (key, end, start): a put replaces a session with the same bounds that the store
        # no longer shows (one that ended exactly at the close time, docs/semantics.md §11.6)
        sessions[:] = [s for s in sessions if (s.start, s.end) != (start, end)]
        self._put(sessions, merged)
        self._emit(self._row(key, merged), seq, out)

    def _emit(self, row: dict[str, Any], seq: int, position: int, tombstone: bool = False) -> None:
        if self.emit == "updates":
            assert position < SLOTS
            self.result.outputs[self.op.name].append({**row, "emit_seq": seq * SLOTS + position, "task": self.task})
        elif self.suppress is not None:  # a session's windowed key: key, end, start
            start, end = row["window_start"], row["window_end"]
            self.suppress.put((row["key"], start, end), end, key_bytes(row["key"]) + end.to_bytes(8, "big")
                              + start.to_bytes(8, "big"), None if tombstone else row, end)

    def _row(self, key: Any, s: Session) -> dict[str, Any]:
        values: dict[str, Any] = dict(s.folds)
        for name, agg in self.sqls.items():
            state = agg.init()
            for r in s.rows:
                state = agg.add(state, r)
            values[name] = agg.result(state)
        return {"key": key, "window_start": s.start, "window_end": s.end, **{n: values[n] for n in self.names},
                "ts": s.end}

    def finish(self) -> None:
        """emit: final: a session is final once end < ST - grace - gap; the others are incomplete."""
        if self.emit != "final":
            return
        if self.suppress is not None:
            self.result.incomplete[self.op.name] += [{**row, "stream_time": self.stream_time, "task": self.task}
                                                     for row in self.suppress.pending()]
            return
        self.result.released.setdefault(self.op.name, []).extend(self.released)
        close = self.stream_time - self.grace - self.gap
        every = [(key, s) for key, sessions in self.store.items() for s in sessions]
        for key, s in sorted(every, key=lambda ks: (ks[1].end, ks[1].start, str(ks[0]))):
            if s.end >= close:  # the closed ones were emitted by the records that closed them (_emit_closed)
                self.result.incomplete[self.op.name].append({**self._row(key, s), "stream_time": self.stream_time,
                                                             "task": self.task})
