"""Part: reference engine. Tables, one record at a time: KGroupedStream#aggregate (`KStreamAggregate`, docs/semantics.md
§15) and the KStream-KTable join (`KStreamKTableJoin`, §16), as literally as the rules read."""
from __future__ import annotations

from typing import Any

from backfill.jobspec.models import FoldAggregation, OperatorSpec
from backfill.reference.expr import compile_aggregate, compile_fold
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

