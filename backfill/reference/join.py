"""Part: reference engine. KStream-KStream join for one task, record at a time (docs/semantics.md §5), as
literally as the spec reads.

Both join processors of a task share one time tracker (join stream time ST_j and minTime, docs/semantics.md §5.3). Each side
has a window store with duplicates (retention R = before + after + G; a row is visible iff
ts > storeST - R; an expired write is dropped, 9). Left/outer joins with the spurious-result fix keep an
outer store of non-joined rows keyed (ts, side byte, key bytes) and emit them once their window has closed
(§5.3). The wall-clock throttle is taken as 0, as in TopologyTestDriver (unknowable, §5.6).
"""
from __future__ import annotations

import struct
from collections import defaultdict
from typing import Any

from backfill.jobspec.fields import JOINER_FIELDS
from backfill.jobspec import versions
from backfill.jobspec.models import OperatorSpec
from backfill.jobspec.rekeys import join_streams
from backfill.reference.expr import compile_scalar
from backfill.reference.records import ledger_row
from backfill.reference.rules import (IMMEDIATE, JAVA_MAX, JOINED, LEFT, RIGHT, TRIGGERED, JoinWindows,
                                      java_long, join_emit_seq)


def key_bytes(key: Any) -> bytes:
    """The serialized key the outer store sorts by (docs/semantics.md §5.3): UTF-8 text, 8-byte big-endian long, raw bytes."""
    if isinstance(key, bytes):
        return key
    if isinstance(key, int):
        return struct.pack(">q", key)
    return str(key).encode()


class StreamJoin:
    """Both join processors of one task (left and right), their window stores and the outer store."""

    def __init__(self, op: OperatorSpec, task: int, result: Any, rules: versions.Profile | None = None) -> None:
        spec = op.join
        assert spec is not None
        self.name, self.task, self.result = op.name, task, result
        self.left, self.right = join_streams(op)  # the sources, or a re-keyed join's streams
        self.windows = JoinWindows.of(op)
        self.outer_sides = {"inner": set(), "left": {LEFT}, "outer": {LEFT, RIGHT}}[spec.how]
        self.joiner = compile_scalar(spec.value)
        self.rules = rules or versions.profile(None)
        self.stream_time = -1  # ST_j, shared by both processors (docs/semantics.md §5.1)
        self.min_time = JAVA_MAX
        self.store_time = {LEFT: -1, RIGHT: -1}  # storeST per window store (9)
        self.stores: dict[int, dict[Any, list[tuple[int, int, dict[str, Any]]]]] = {
            LEFT: defaultdict(list), RIGHT: defaultdict(list)}
        # outer store: (ts, side byte, key bytes) -> [(record, seq)], only with the fix (docs/semantics.md §5.3, §5.4)
        self.outer: dict[tuple[int, int, bytes], list[tuple[dict[str, Any], int]]] | None = (
            {} if self.outer_sides and not self.windows.eager else None)

    def process(self, rec: dict[str, Any], seq: int) -> None:
        """docs/semantics.md §5.1-§5.5 for the processor of the record's side."""
        side = LEFT if rec["source"] == self.left else RIGHT
        t, key, value = rec["ts"], rec["key"], rec["value"]
        if not self.rules.join_null_keys_reach_join and key is None:
            # before 3.7 the join's window processor does not pass a null-key record on at all
            self._ledger(rec, "null_key", self.stream_time if self.stream_time >= 0 else None)
            return
        if not self.rules.join_time_before_null_check and value is None:  # before 3.7: dropped first
            self._ledger(rec, "null_value", self.stream_time if self.stream_time >= 0 else None)
            return
        self.stream_time = max(self.stream_time, t)  # step 1: before the null checks (3.7+)
        outer = side in self.outer_sides
        if outer and key is None and value is not None:  # step 2: forwarded at once with key null
            self._emit(None, rec, side, None, t, seq, IMMEDIATE, 0)
            return
        if key is None or value is None:  # step 3
            self._ledger(rec, "null_key" if key is None else "null_value", self.stream_time)
            return
        if self.outer is not None and t == self.stream_time:  # step 4: only the newest record triggers
            self._emit_closed(seq, side)
        matches = self._fetch(side, key, t)
        for idx, (o_ts, _, other) in enumerate(matches):  # step 5
            if self.outer is not None:
                self.outer.pop((o_ts, 1 - side, key_bytes(key)), None)
            self._emit(key, rec, side, other, max(t, o_ts), seq, JOINED, idx)
        if not matches and outer:  # step 6
            to = self.windows.bounds(side, t)[1]
            if self.outer is None or to < self.stream_time:
                self._emit(key, rec, side, None, t, seq, IMMEDIATE, 0)
            else:
                self.min_time = min(self.min_time, t)
                self.outer.setdefault((t, side, key_bytes(key)), []).append((rec, seq))
        self._write(rec, side, seq, joined=bool(matches) or outer)  # step 7

    def _fetch(self, side: int, key: Any, t: int) -> list[tuple[int, int, dict[str, Any]]]:
        """Other-side rows in [from, to] still retained (ts > storeST - R), by ts then arrival (9, 10.2 step 5)."""
        other = 1 - side
        lo, hi = self.windows.bounds(side, t)
        alive_after = self.store_time[other] - self.windows.retention
        rows = [r for r in self.stores[other].get(key, []) if lo <= r[0] <= hi and r[0] > alive_after]
        return sorted(rows, key=lambda r: (r[0], r[1]))

    def _write(self, rec: dict[str, Any], side: int, seq: int, joined: bool) -> None:
        """KStreamJoinWindow writes the record after the join processor ran; expired writes are dropped (9)."""
        t = rec["ts"]
        self.store_time[side] = max(self.store_time[side], t)
        if t <= self.store_time[side] - self.windows.retention:
            if not joined:  # no result and never joinable: refused by retention
                self._ledger(rec, "expired", self.store_time[side])
            return
        self.stores[side][rec["key"]].append((t, seq, rec))

    def _emit_closed(self, seq: int, side: int) -> None:
        """emitNonJoinedOuterRecords (docs/semantics.md §5.3), throttle 0: forward closed rows in outer-store order."""
        assert self.outer is not None
        w = self.windows
        ahead = w.after if side == LEFT else w.before  # the processor's joinAfterMs
        if not self.rules.outer_scan_per_side:  # before 3.8: the processor's own windows decide
            self._emit_closed_before_3_8(seq, side)
            return
        if java_long(self.min_time + ahead + w.grace) >= self.stream_time:  # step 1: cheap skip
            return
        self.min_time = JAVA_MAX
        open_sides: set[int] = set()
        idx = 0
        for entry in sorted(self.outer):
            ts, s, _ = entry
            emitted = False
            for rec, _ in self.outer[entry]:
                self.min_time = ts
                if len(open_sides) == 2:
                    return
                if ts + w.look_back(s) + w.grace >= self.stream_time:
                    open_sides.add(s)
                    continue
                self._emit(rec["key"], rec, s, None, ts, seq, TRIGGERED, idx)
                idx += 1
                emitted = True
            if emitted:
                del self.outer[entry]

    def _emit_closed_before_3_8(self, seq: int, side: int) -> None:
        """emitNonJoinedOuterRecords as 3.4 to 3.7 have it (before KAFKA-15417): the processing side's
        `before` in the cheap skip, its `after` for entries of both sides, the first open entry ends the scan."""
        assert self.outer is not None
        w = self.windows
        before, after = (w.before, w.after) if side == LEFT else (w.after, w.before)
        if self.min_time >= self.stream_time - before - w.grace:
            return
        self.min_time = JAVA_MAX
        idx = 0
        for entry in sorted(self.outer):
            ts, s, _ = entry
            for rec, _ in self.outer[entry]:
                self.min_time = ts
                if ts + after + w.grace >= self.stream_time:
                    return
                self._emit(rec["key"], rec, s, None, ts, seq, TRIGGERED, idx)
                idx += 1
            del self.outer[entry]

    def _emit(self, key: Any, rec: dict[str, Any], side: int, other: dict[str, Any] | None, ts: int,
              out_seq: int, phase: int, idx: int) -> None:
        this, that = _struct(rec), _struct(other)
        left, right = (this, that) if side == LEFT else (that, this)
        value = self.joiner({"key": key, "left": left, "right": right})
        self.result.outputs[self.name].append({"key": key, "value": value, "ts": ts,
                                               "emit_seq": join_emit_seq(out_seq, phase, idx), "task": self.task})

    def _ledger(self, rec: dict[str, Any], reason: str, stream_time: int | None) -> None:
        self.result.ledger.append(ledger_row(rec, self.name, reason, rec["ts"], stream_time, None,
                                              range_time=rec["ts"]))

    def finish(self) -> None:
        """Rows still waiting in the outer store at the end of the data: their window has not closed."""
        for (ts, side, _), values in sorted((self.outer or {}).items()):
            for rec, seq in values:
                self.result.incomplete[self.name].append(
                    {"key": rec["key"], "ts": ts, "side": "left" if side == LEFT else "right", "seq": seq,
                     "task": self.task})


def _struct(rec: dict[str, Any] | None) -> dict[str, Any] | None:
    """The joiner's view of one side: null on the unmatched side of a left/outer result."""
    return None if rec is None else {f: rec.get(f) for f in JOINER_FIELDS}
