"""Part: reference engine. Tables, one record at a time: KGroupedStream#aggregate (`KStreamAggregate`, docs/semantics.md
§16) and the KStream-KTable join (`KStreamKTableJoin`, §17), as literally as the rules read."""
from __future__ import annotations

import heapq
from typing import Any

from backfill.jobspec.fields import JOINER_FIELDS
from backfill.errors import SourceError
from backfill.jobspec.models import FoldAggregation, OperatorSpec
from backfill.jobspec.rekeys import join_streams
from backfill.reference.expr import compile_aggregate, compile_fold, compile_scalar
from backfill.reference.join import key_bytes
from backfill.reference.records import ledger_row


class TableAggregate:
    """KStreamAggregate for one task: a key-value store of (aggregate, timestamp); every update forwarded."""

    def __init__(self, op: OperatorSpec, task: int, result: Any) -> None:
        spec = op.aggregate
        assert spec is not None
        self.op, self.task, self.result = op, task, result
        self.aggs = {name: (compile_fold(a.fold.init, a.fold.step) if isinstance(a, FoldAggregation)
                            else compile_aggregate(a)) for name, a in spec.aggregations.items()}
        # one fold alone is the store's value itself: a null result deletes the key
        self.deletes = len(self.aggs) == 1 and all(isinstance(a, FoldAggregation) for a in spec.aggregations.values())
        self.store: dict[Any, dict[str, Any]] = {}
        self.stream_time = -1  # a table has none; kept for the engine's order report

    def process(self, rec: dict[str, Any], seq: int) -> None:
        """KStreamAggregate#process: skip a null key or value; else aggregate and forward."""
        if rec["key"] is None or rec["value"] is None:
            reason = "null_key" if rec["key"] is None else "null_value"
            self.result.ledger.append(ledger_row(rec, self.op.name, reason, rec["ts"], None, None,
                                                  range_time=rec["ts"]))
            return
        t = rec["ts"]
        old = self.store.get(rec["key"])
        if old is None:  # no aggregate (never, or deleted): the initializer, the record's timestamp
            old = {"agg": {n: a.init() for n, a in self.aggs.items()}, "ts": t}
        row = {"key": rec["key"], "value": rec["value"], "ts": t, "timestamp": rec["timestamp"],
               "topic": rec["topic"], "partition": rec["partition"], "offset": rec["offset"],
               "headers": rec.get("headers")}
        state = {"agg": {n: a.add(old["agg"][n], row) for n, a in self.aggs.items()}, "ts": max(old["ts"], t)}
        values = {n: a.result(state["agg"][n]) for n, a in self.aggs.items()}
        if self.deletes and all(v is None for v in values.values()):
            self.store.pop(rec["key"], None)  # put(key, null): a delete, forwarded as a tombstone
        else:
            self.store[rec["key"]] = state
        self.result.outputs[self.op.name].append({"key": rec["key"], **values, "ts": state["ts"], "emit_seq": seq,
                                                  "task": self.task})

    def finish(self) -> None:
        """A table never closes: nothing is pending."""



class TableJoin:
    """KStreamKTableJoin for one task: the table's source processor and store, and the join processor (with its
    grace buffer when the table is versioned and the join has a grace period)."""

    def __init__(self, op: OperatorSpec, task: int, result: Any, rules: Any) -> None:
        spec = op.join
        assert spec is not None and spec.table is not None
        self.op, self.task, self.result, self.rules = op, task, result, rules
        self.stream, self.table = join_streams(op)  # a re-keyed stream: its repartition topic (§17.7)
        self.inner = spec.how == "inner"
        self.joiner = compile_scalar(spec.value)
        self.versioned = spec.versioned
        self.latest: dict[Any, dict[str, Any]] = {}  # a plain store: key -> the table record
        self.history: dict[Any, dict[int, dict[str, Any]]] = {}  # a versioned store: key -> ts -> record
        self.store_time = -1  # the versioned store's observed stream time (its accepted puts)
        self.stream_time = -1  # the join's own (the stream records it takes; the grace buffer's clock)
        self.buffer: list[tuple[int, bytes, int, dict[str, Any]]] = []  # (ts, key bytes, arrival, record)
        self.arrivals = 0

    def process(self, rec: dict[str, Any], seq: int) -> None:
        """A table record goes to the table's store; a stream record to the join processor."""
        if rec["source"] == self.table:
            self._put(rec)
        else:
            self._join_processor(rec, seq)

    def _put(self, rec: dict[str, Any]) -> None:
        """KTableSource#process and the store's put: a null key is skipped; a versioned put too old is refused."""
        key, t = rec["key"], rec["ts"]
        if key is None:
            self._ledger(rec, "null_key")
            return
        if self.versioned is None:
            self.latest[key] = rec  # a null value deletes: the record is kept, and reads find no value
            return
        if t < self.store_time - self.versioned.history_retention:
            self._ledger(rec, "expired", "a versioned table's put older than its history retention: refused")
            return
        self.store_time = max(self.store_time, t)
        versions = self.history.setdefault(key, {})
        if rec["value"] is None and len(versions) == 1 and t in versions and versions[t]["value"] is not None:
            del self.history[key]  # a delete of the key's only version, at its timestamp, leaves no trace (§17.4)
            return
        versions[t] = rec  # a version of the same timestamp is replaced

    def _join_processor(self, rec: dict[str, Any], seq: int) -> None:
        key, value, t = rec["key"], rec["value"], rec["ts"]
        forwarded = not self.inner and self.rules.join_null_keys_reach_join and key is None and value is not None
        if not forwarded and (key is None or value is None):
            self._ledger(rec, "null_key" if key is None else "null_value")
            return
        grace = self.versioned.grace if self.versioned is not None else 0
        if not grace:  # a row forwarded in the task: its place among its record's rows (docs/semantics.md §18.8)
            self._join(rec, seq, rec.get("_pos", 0))
            return
        if key is None:
            raise SourceError(f"operators.{self.op.name}: stream record {rec['topic']}/{rec['partition']}@"
                              f"{rec['offset']} has a null key and reaches a left join with a grace period, where "
                              "Kafka Streams 3.7+ fails (a NullPointerException in the join's buffer)")
        self.stream_time = max(self.stream_time, t)
        if t < self.stream_time - grace:  # too late to wait: joined at once
            self._join(rec, seq, 0)
            return
        self.arrivals += 1
        # the buffer's store is keyed (timestamp, serialized key, sequence number): ties go by key, then arrival
        heapq.heappush(self.buffer, (t, key_bytes(key), self.arrivals, rec))
        n = 0
        while self.buffer and self.buffer[0][0] <= self.stream_time - grace:
            self._join(heapq.heappop(self.buffer)[3], seq, n)
            n += 1

    def _join(self, rec: dict[str, Any], seq: int, pos: int) -> None:
        right = None if rec["key"] is None else self._read(rec["key"], rec["ts"])
        if right is None and self.inner:
            return  # no table value: no row, not counted as dropped by Kafka Streams
        left = {f: rec.get(f) for f in JOINER_FIELDS}
        value = self.joiner({"key": rec["key"], "left": left, "right": right})
        self.result.outputs[self.op.name].append({"key": rec["key"], "value": value, "ts": rec["ts"],
                                                  "emit_seq": seq * 2**20 + pos, "task": self.task})

    def _read(self, key: Any, t: int) -> dict[str, Any] | None:
        """The table's value for the join: the latest (plain), or as of `t` (versioned), as the joiner sees it."""
        if self.versioned is None:
            found = self.latest.get(key)
        else:
            versions = self.history.get(key, {})
            older = [ts for ts in versions if ts <= t]
            found = versions[max(older)] if older else None
            if t < self.store_time - self.versioned.history_retention:  # only the latest version never expires
                if found is not None and found["ts"] != max(versions):
                    found = None
        if found is None or found["value"] is None:
            return None
        return {f: found.get(f) for f in JOINER_FIELDS}

    def _ledger(self, rec: dict[str, Any], reason: str, detail: str | None = None) -> None:
        st = self.store_time if self.versioned is not None and self.store_time >= 0 else None
        self.result.ledger.append(ledger_row(rec, self.op.name, reason, rec["ts"], st, None, detail=detail,
                                              range_time=rec["ts"]))

    def finish(self) -> None:
        """Stream records still in the grace buffer at the end of the data: not joined yet."""
        for t, _, _, rec in sorted(self.buffer, key=lambda e: e[:3]):
            self.result.incomplete[self.op.name].append({"key": rec["key"], "ts": t, "task": self.task})
