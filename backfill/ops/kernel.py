"""Part: operators. What the kernel-backed window aggregates (sliding, session) share: they replay each task's
store in processing order in a per-task kernel (docs/architecture.md, step 5), so they read `seq`, count their inputs
and null drops in the counting pass, and learn the late records from the kernel."""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any, ClassVar

from pyspark.sql import Column
from pyspark.sql import functions as F

from backfill.ops.aggregate import reaches
from backfill.ops.base import Operator, OperatorCounts, aggregate_expressions, in_source
from backfill.ops.expressions import compile_aggregations
from backfill.jobspec.rekeys import rekeys, stream_name


@dataclass(frozen=True)
class KernelAggregate(Operator):
    """A window aggregate by the record key whose windows come from a per-task kernel."""

    noun = "window aggregate"
    verified_as = "windows"

    # sliding windows skip records with a null value (docs/semantics.md §10.2); sessions aggregate them (§11.2)
    drops_null_values: ClassVar[bool] = False
    session: ClassVar[bool] = False  # folds need `merge`

    def stream_time_columns(self) -> dict[str, Column]:
        """Its own stream time, over the records that reach it."""
        assert self.spec is not None
        reach = reaches(self.spec)
        return {self.stream_time: reach & F.col("value").isNotNull() if self.drops_null_values else reach}

    def expressions(self) -> list[str] | None:
        """Its aggregations, re-keys and filters (ops/base.py `aggregate_expressions`)."""
        assert self.spec is not None
        return aggregate_expressions(self.spec)

    def reads(self) -> frozenset[str] | None:
        """`seq` always (the kernel replays the task order); `timestamp` and `headers` for folds or when named."""
        assert self.spec is not None and self.spec.aggregate is not None
        aggs = compile_aggregations(self.spec.aggregate.aggregations, f"operators.{self.name}.aggregate",
                                    self.session)
        texts = [t for a in aggs for t in (a.sql, a.init, a.step, a.merge) if t]
        texts += [r.spec.key for r in rekeys(self.spec)]
        read = {"seq"}
        for column in ("timestamp", "headers"):
            if any(a.is_fold for a in aggs) or any(column in t for t in texts):
                read.add(column)
        return frozenset(read)

    @property
    def null_reasons(self) -> tuple[str, ...]:
        """The ledger reasons of records skipped before the store."""
        return ("null_key", "null_value") if self.drops_null_values else ("null_key",)

    def count_columns(self, live: Column, late: dict[str, Column] | None = None) -> list[Column]:
        """Records in, null drops, the last stream time per task; late records come from the kernel."""
        assert self.spec is not None and self.spec.aggregate is not None
        mine = in_source(stream_name(self.spec)) & live
        cols = [F.count(F.when(mine, 1)).alias(self.stat("in")),
                F.count(F.when(mine & F.col("key").isNull(), 1)).alias(self.stat("null_key"))]
        if self.drops_null_values:
            cols.append(F.count(F.when(mine & F.col("key").isNotNull() & F.col("value").isNull(), 1)
                                ).alias(self.stat("null_value")))
        return [*cols, F.max(F.when(live, F.col(self.stream_time))).alias(self.stat("st"))]

    def counts(self, rows: list[Any]) -> OperatorCounts:
        """Inputs, null drops and the final stream time per task."""
        counts = OperatorCounts(dropped={reason: 0 for reason in self.null_reasons})
        for r in rows:
            if r[self.stat("st")] is not None and r["task"] is not None:
                counts.final_stream_time[r["task"]] = max(counts.final_stream_time.get(r["task"], -1),
                                                          r[self.stat("st")])
            counts.records_in += r[self.stat("in")]
            for reason in self.null_reasons:
                counts.dropped[reason] += r[self.stat(reason)]
        return counts



def key_bytes(key: Any) -> bytes:
    """A key as its serializer writes it (text: UTF-8, long: 8 bytes big-endian, bytes as they are): the
    suppress buffer orders equal buffer times by the serialized windowed key."""
    if isinstance(key, (bytes, bytearray)):
        return bytes(key)
    if isinstance(key, int) and not isinstance(key, bool):
        return key.to_bytes(8, "big", signed=True)
    return str(key).encode("utf-8")


class SuppressBuffer:
    """suppress(untilWindowCloses) replayed inside a kernel (docs/semantics.md §4.5): its own stream
    time (the largest timestamp forwarded to it), the latest update per window, released once its buffer time
    is at or before stream time - `duration`, in buffer order (buffer time, serialized key). Updates are the
    kernel's own references (None: a tombstone, dropped when released); `released` lists them in release order.
    A window's buffer time never changes, so a heap holds each buffered window once."""

    def __init__(self, duration: int) -> None:
        self.duration = duration
        self.stream_time: int | None = None
        self.latest: dict[Any, Any] = {}  # buffered window -> its latest update
        self.heap: list[tuple[int, bytes, int, Any]] = []
        self.released: list[Any] = []

    def put(self, window: Any, buffer_time: int, serialized: bytes, update: Any, ts: int) -> None:
        """One forwarded update and its timestamp; then release what is due."""
        self.stream_time = ts if self.stream_time is None else max(self.stream_time, ts)
        if window not in self.latest:
            heapq.heappush(self.heap, (buffer_time, serialized, len(self.heap), window))
        self.latest[window] = update
        expiry = self.stream_time - self.duration
        while self.heap and self.heap[0][0] <= expiry:
            update = self.latest.pop(heapq.heappop(self.heap)[3])
            if update is not None:
                self.released.append(update)

    def pending(self) -> list[Any]:
        """The updates still buffered (tombstones aside)."""
        return [u for u in self.latest.values() if u is not None]
