"""Part: operators. Sliding-window aggregation (docs/semantics.md §10), on records already in task order.

Which windows exist and what each holds depends on the store: a new window copies the aggregate of the
window the backward read stopped at, and an update is refused once the window's end is before ST - grace.
A per-task kernel (docs/architecture.md, step 5) replays exactly that on (key, ts, stream time), keeping for each
window the records it holds, in the order they were aggregated, and for each update the number of records
the window held then. Spark computes the values from those member lists: a running aggregate per window
(`emit: updates`, one output per update) or one aggregate per window (`emit: final`: the windows closed by
the end of the data, end < ST - grace, ON_WINDOW_CLOSE; with `close: suppress` each value suppress released,
the kernel replaying its buffer). The work is one row per (window, member): the
size of the output of `emit: updates`, and what Kafka Streams itself does per record.
"""
from __future__ import annotations

import bisect
import heapq
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from backfill.jobspec.fields import FOLD_FIELDS
from backfill.jobspec.durations import format_duration
from backfill.jobspec.models import OperatorSpec
from backfill.ledger import LATE, NULL_KEY, ledger_rows
from backfill.ops.aggregate import FinalWindows, close_why, final_columns, numbered_finals
from backfill.jobspec.rekeys import rekey_why, stream_name
from backfill.ops.base import Check, OperatorCounts, OperatorResult, OutputSuite, check_null_drops
from backfill.ops.expressions import CompiledAggregation, compile_aggregations
from backfill.ops.join import NULL_VALUE
from backfill.ops.kernel import KernelAggregate, SuppressBuffer, key_bytes
from backfill.ops.windows import SlidingWindows
from backfill.session import computed_once

if TYPE_CHECKING:
    import pandas as pd
    from backfill.jobspec.load import Job

STRIDE = 2**31  # emit_seq = seq * STRIDE + position of the update among this record's outputs
# kernel row kinds (JOINED: a record aggregated somewhere; RELEASED, PENDING: suppress's releases, and what it still
# buffers at the end)
WINDOW, UPDATE, REFUSED, COPY, JOINED, RELEASED, PENDING = 0, 1, 2, 3, 4, 5, 6
KERNEL_SCHEMA = ("task int, kind int, wid long, key_seq long, window_start long, members array<long>, ts long, "
                 "held long, emit_seq long, seq long")


@dataclass(frozen=True)
class SlidingAggregate(KernelAggregate):
    """Sliding windows [start, start + D] by the record key, `emit: updates` or `final`."""

    drops_null_values = True

    @classmethod
    def from_job(cls, job: Job, spec: OperatorSpec, index: int, sink: str | None, start: int | None,
                 end: int | None) -> SlidingAggregate:
        """Warm-up of 2D (what the store reads back from a record); cool-down to the close of the last window."""
        agg = spec.aggregate
        assert agg is not None
        compile_aggregations(agg.aggregations, f"{job.path}: operators.{spec.name}.aggregate")
        windows = SlidingWindows.of(agg.window)
        diff, grace = windows.diff, windows.grace
        why = rekey_why(spec) + close_why(spec)
        if start is not None:
            why.append(f"warm-up: records with timestamp >= {start - 2 * diff} are read (2 x time difference before "
                       "--start): a record reads the windows starting up to 2 x time difference before it, and a new "
                       "window copies one of them")
        last_start = close = None
        if end is not None:
            last_start = end - 1
            close = windows.close(last_start + diff) + 1  # the first stream time past its close
            why.append(f"cool-down: windows up to start {last_start} close when stream time passes their end + grace "
                       f"(reaches {close}); each partition is processed up to its first record at or after it")
        return cls(name=spec.name, kind="aggregate", inputs=(agg.input,), emit=agg.emit, sink=sink, spec=spec,
                   index=index, window=f"sliding time difference {format_duration(diff)} grace "
                                       f"{format_duration(grace)}",
                   warmup_ms=2 * diff, cooldown_ms=diff + grace, last_window_start=last_start, close_time=close,
                   why=tuple(why))

    @property
    def diff(self) -> int:
        """The time difference D."""
        assert self.spec is not None and self.spec.aggregate is not None
        return int(self.spec.aggregate.window.time_difference or 0)

    def run(self, processed: DataFrame, dropped: DataFrame, counts: OperatorCounts) -> OperatorResult:
        """The kernel's windows and updates, then their values; refused updates to the ledger."""
        assert self.spec is not None
        return sliding(self.spec, processed, self.stream_time, counts.final_stream_time, counts)

    def settle(self, counts: OperatorCounts, ledger: Mapping[str, int]) -> None:
        """Null drops must all be in the ledger; contributing and late records, and the refused updates (late
        pairs), were counted by the kernel (run), so `in == contributing + dropped` checks that each record is
        exactly one of them, and `late rows == late pairs` that each refused update is one ledger row."""
        check_null_drops(self.name, counts, ledger, self.null_reasons)

    def output_suite(self, output: DataFrame) -> OutputSuite | None:
        """window_end - window_start == D, ts inside the window (both ends), keys not null; unique keys."""
        d = self.diff
        frame = output.withColumn("_window_length", F.col("window_end") - F.col("window_start")).withColumn(
            "_ts_in_window", (F.col("ts") >= F.col("window_start")) & (F.col("ts") <= F.col("window_end")))
        checks = [Check("ExpectColumnValuesToNotBeNull", {"column": "key"}, "keys not null"),
                  Check("ExpectColumnValuesToBeInSet", {"column": "_window_length", "value_set": [d]},
                        f"window_end - window_start == time difference ({d} ms)"),
                  Check("ExpectColumnValuesToBeInSet", {"column": "_ts_in_window", "value_set": [True]},
                        "ts inside [window_start, window_end] (both ends inclusive)")]
        assert self.spec is not None
        final = self.emit == "final" and not numbered_finals(self.spec)
        return OutputSuite(frame, checks, ("key", "window_start") if final else ("task", "emit_seq"))


# ---------------------------------------------------------------------------------------------- the kernel
class _Window:
    """A stored window: its members (record seqs, in aggregation order), value timestamp, id, start, key."""

    __slots__ = ("members", "ts", "wid", "start", "key_seq")

    def __init__(self, members: list[int], ts: int, wid: int, start: int, key_seq: int) -> None:
        self.members, self.ts, self.wid, self.start, self.key_seq = members, ts, wid, start, key_seq


class _Replay:
    """One task's sliding-window store replayed on (key, ts, stream time) (docs/semantics.md §10.1-§10.3)."""

    def __init__(self, windows: SlidingWindows, updates: bool, suppress: bool = False, on_close: bool = False
                 ) -> None:
        self.rule, self.diff, self.updates = windows, windows.diff, updates
        self.closed = windows.closed  # the close rule (docs/semantics.md §10.2), bound once for the per-record loop
        self.buffer = SuppressBuffer(windows.grace) if suppress else None  # its buffer time: the inclusive end
        # emit-on-close (docs/semantics.md §10.5): a time-ordered store (it shows starts >= store time - retention),
        # the closed windows it shows emitted after each record that reaches the end of processing
        self.on_close = on_close
        self.closing: list[tuple[int, bytes, int, Any, _Window]] = []  # every window put, by start then key
        self.emitted: list[_Window] = []
        self.last_emit: int | None = None
        self.retention = windows.retention
        self.store_time: int | None = None
        self.starts: dict[Any, list[int]] = {}  # key -> sorted starts still visible
        self.windows: dict[Any, dict[int, _Window]] = {}  # key -> start -> visible window
        self.stored: dict[tuple[Any, int], _Window] = {}  # the window now stored per (key, start)
        self.every: list[_Window] = []  # every window ever created (updates of a replaced one were emitted)
        self.rows: list[tuple] = []  # UPDATE, COPY, REFUSED and JOINED rows
        self.seq = self.out = 0
        self.joined = False

    def _fetch(self, key: Any, lo: int, hi: int) -> list[int]:
        """Visible starts of `key` in [lo, hi], ascending (a start <= store time - retention is gone)."""
        starts = self.starts.setdefault(key, [])
        if self.store_time is not None and starts and not self._shows(starts[0]):
            oldest = self.store_time - self.retention
            cut = bisect.bisect_left(starts, oldest) if self.on_close else bisect.bisect_right(starts, oldest)
            for s in starts[:cut]:
                del self.windows[key][s]
            del starts[:cut]
        return starts[bisect.bisect_left(starts, lo):bisect.bisect_right(starts, hi)]

    def _shows(self, start: int) -> bool:
        """Whether the store still shows a window start (retention 2D + grace from the largest start written)."""
        if self.store_time is None:
            return True
        oldest = self.store_time - self.retention
        return start >= oldest if self.on_close else start > oldest

    def emit_closed(self, st: int) -> None:
        """maybeForwardFinalResult (throttle 0) after a record: the closed windows (start up to stream time - G -
        D - 1) the store shows, by start, then key; a closed window the store no longer shows is never emitted."""
        upper = self.rule.last_closed_start(st)
        if self.last_emit is not None and upper <= self.last_emit:
            return
        if upper < 0:
            return
        while self.closing and self.closing[0][0] <= upper:
            start, _, _, key, window = heapq.heappop(self.closing)
            if self.stored.get((key, start)) is window and self._shows(start):
                self.emitted.append(window)
        self.last_emit = upper

    def _put(self, key: Any, start: int, members: list[int], ts: int) -> _Window:
        windows = self.windows.setdefault(key, {})
        if start not in windows:
            bisect.insort(self.starts.setdefault(key, []), start)
        window = windows[start] = self.stored[(key, start)] = _Window(members, ts, len(self.every), start, self.seq)
        self.every.append(window)
        if self.on_close:
            heapq.heappush(self.closing, (start, key_bytes(key), window.wid, key, window))
        self.store_time = start if self.store_time is None else max(self.store_time, start)
        return window

    def _forward(self, key: Any, window: _Window, kind: int) -> None:
        if self.updates or kind != UPDATE:
            self.rows.append((kind, window.wid, None, window.start, None, window.ts, len(window.members),
                              self.seq * STRIDE + self.out, self.seq))
        if self.buffer is not None:
            self.buffer.put((key, window.start), window.start + self.diff, key_bytes(key) + _long(window.start),
                            (window.wid, window.start, window.ts, len(window.members)), window.ts)
        self.out += 1

    def suppressed(self, st: int | None) -> list[tuple]:
        """RELEASED rows (emit_seq: the place in the task's releases or emissions) and PENDING rows (still
        buffered, or open at the end): the window, its start, timestamp and member count at the update kept."""
        if self.on_close:
            now = st if st is not None else 0
            return ([(RELEASED, w.wid, None, w.start, None, w.ts, len(w.members), place, None)
                     for place, w in enumerate(self.emitted)]
                    + [(PENDING, w.wid, None, w.start, None, w.ts, len(w.members), None, None)
                       for w in self.stored.values() if not self.closed(w.start + self.diff, now)])
        if self.buffer is None:
            return []
        return ([(RELEASED, wid, None, start, None, ts, held, place, None)
                 for place, (wid, start, ts, held) in enumerate(self.buffer.released)]
                + [(PENDING, wid, None, start, None, ts, held, None, None)
                   for wid, start, ts, held in self.buffer.pending()])

    def _update(self, key: Any, start: int, window: _Window | None, seed: list[int], st: int, t: int) -> None:
        """updateWindowAndForward (docs/semantics.md §10.2): the record joins the window unless it has closed at
        stream time `st`; a new window (`window` None) starts from `seed` with timestamp t."""
        if self.closed(start + self.diff, st):
            self.rows.append((REFUSED, None, None, start, None, None, None, None, self.seq))
            return
        if window is None:
            window = self._put(key, start, list(seed), t)
        window.members.append(self.seq)
        window.ts = max(t, window.ts)
        self.joined = True
        self._forward(key, window, UPDATE)

    def process(self, seq: int, key: Any, t: int, st: int) -> None:
        """docs/semantics.md §10.2-§10.3 for one record with a key and a value; then, emitting on close,
        §10.5 (not after an early record or one dropped at once)."""
        if self._process(seq, key, t, st) and self.on_close:
            self.emit_closed(st)

    def _process(self, seq: int, key: Any, t: int, st: int) -> bool:
        """§10.2-§10.3; whether the record reached the end of processing."""
        d = self.diff
        self.seq, self.out = seq, 0
        if self.rule.expired(t, st):  # one ledger row, for the window Kafka Streams' skipped-record log names
            self.rows.append((REFUSED, None, None, t, None, None, None, None, seq))
            return False
        if t < d:
            self._early(key, t, st)
            return False
        windows = self.windows.get(key, {})
        left: _Window | None = None
        right: tuple[list[int], int] | None = None
        left_done = right_done = False
        prev = None
        seen = set()
        for start in reversed(self._fetch(key, max(0, t - 2 * d), t + 1)):  # the backward read
            seen.add(start)
            window = windows[start]
            end = start + d
            if start == t + 1:
                right_done = True
            elif end > t:
                if right is None:
                    right = (list(window.members), window.ts)
                self._update(key, start, window, [], st, t)
            elif end == t:
                left_done = True
                before = window.ts
                self._update(key, start, window, [], st, t)
                if before < t:
                    prev = before
                else:
                    return True
            else:
                left, prev = window, window.ts
                break
        if prev is not None and prev + 1 not in seen and prev + 1 + d >= t:  # the previous record's right window
            self._update(key, prev + 1, None, [], st, t)
        if not left_done:
            copied = left is not None and prev is not None and t - d <= prev
            self._update(key, t - d, None, left.members if copied and left is not None else [], st, t)
        if not right_done and right is not None and right[1] > t:  # this record's right window, without it
            self._forward(key, self._put(key, t + 1, right[0], right[1]), COPY)
        return True

    def _early(self, key: Any, t: int, st: int) -> None:
        """docs/semantics.md §10.1: records before D share [0, D]; right windows as usual (forward read)."""
        windows = self.windows.get(key, {})
        combined: _Window | None = None
        right: tuple[list[int], int] | None = None
        right_done = False
        prev = None
        seen = set()
        for start in self._fetch(key, 0, t + 1):
            seen.add(start)
            window = windows[start]
            if start == 0:
                combined = window
                if window.ts < t:
                    prev = window.ts
            elif start <= t:
                right = (list(window.members), window.ts)
                self._update(key, start, window, [], st, t)
            elif start == t + 1:
                right_done = True
        if right is None and combined is not None and combined.ts > t:
            right = (list(combined.members), combined.ts)
        if not right_done and right is not None and right[1] > t:
            self._forward(key, self._put(key, t + 1, right[0], right[1]), COPY)
        if prev is not None and prev + 1 not in seen:
            self._update(key, prev + 1, None, [], st, t)
        self._update(key, 0, combined, [], st, t)


def replay_sliding(seq: list[int], keys: list[Any], ts: list[int], st: list[int], windows: SlidingWindows,
                   updates: bool, suppress: bool = False, on_close: bool = False) -> list[tuple]:
    """Replay one task in processing order. Rows (KERNEL_SCHEMA without task): WINDOW (every window stored, its
    members in aggregation order; `held` 1 unless a later window replaced it under its start), UPDATE (emit:
    updates; how many members the window held), COPY (a right
    window created without the record), REFUSED (an update refused as late, by window start) and JOINED (the
    record was aggregated into at least one window)."""
    replay = _Replay(windows, updates, suppress, on_close)
    rows = replay.rows
    for i in range(len(seq)):
        replay.joined = False
        replay.process(seq[i], keys[i], ts[i], st[i])
        if replay.joined:
            rows.append((JOINED, None, None, None, None, None, None, None, seq[i]))
    current = {w.wid for w in replay.stored.values()}
    return [(WINDOW, w.wid, w.key_seq, w.start, w.members, w.ts, int(w.wid in current), None, None)
            for w in replay.every] + rows + replay.suppressed(max(st) if st else None)


def _long(value: int) -> bytes:
    return value.to_bytes(8, "big", signed=True)


def _kernel(windows: SlidingWindows, updates: bool, suppress: bool, on_close: bool) -> Any:
    """The applyInPandas function: one task's records with a key and a value -> kernel rows."""
    def run(pdf: pd.DataFrame) -> pd.DataFrame:
        import pandas as pd  # in the Python worker; the CLI does not pay for pandas

        pdf = pdf.sort_values("seq", kind="stable")
        rows = replay_sliding(pdf["seq"].tolist(), pdf["key"].tolist(), pdf["ts"].tolist(), pdf["st"].tolist(),
                              windows, updates, suppress, on_close)
        frame = pd.DataFrame(rows, columns=["kind", "wid", "key_seq", "window_start", "members", "ts", "held",
                                            "emit_seq", "seq"])
        frame.insert(0, "task", int(pdf["task"].iloc[0]))
        for c in ("wid", "key_seq", "window_start", "ts", "held", "emit_seq", "seq"):
            frame[c] = frame[c].astype("Int64")
        return frame
    return run


# ---------------------------------------------------------------------------------------------- Spark side
def sliding(op: OperatorSpec, ordered: DataFrame, st: str, final_st: Mapping[int, int],
            counts: OperatorCounts) -> OperatorResult:
    """Run one sliding aggregate over task-ordered records; `st` names its stream-time column. Counts in
    `counts` the records aggregated into a window (contributing) and those refused by every window (late)."""
    spec = op.aggregate
    assert spec is not None
    windows = SlidingWindows.of(spec.window)
    aggs = compile_aggregations(spec.aggregations, f"operators.{op.name}.aggregate")
    recs = ordered.where((F.col("source") == stream_name(op)) & F.col("_drop").isNull())
    ledger = ledger_rows(recs.where(F.col("key").isNull()), reason=NULL_KEY, operator=op.name,
                         stream_time=F.col(st), range_time=F.col("ts")).unionByName(
        ledger_rows(recs.where(F.col("key").isNotNull() & F.col("value").isNull()), reason=NULL_VALUE,
                    operator=op.name, stream_time=F.col(st), range_time=F.col("ts")))
    live = recs.where(F.col("key").isNotNull() & F.col("value").isNotNull())
    updates = spec.emit == "updates"
    suppress = not updates and spec.close_mechanism == "suppress"
    kernel = (live.select("task", "seq", "key", "ts", F.col(st).alias("st")).groupBy("task")
              .applyInPandas(_kernel(windows, updates, suppress, not updates and not suppress), KERNEL_SCHEMA)
              .transform(computed_once))
    refused = kernel.where(F.col("kind") == REFUSED).select("task", "seq", "window_start")
    ledger = ledger.unionByName(ledger_rows(
        live.join(refused, ["task", "seq"]), reason=LATE, operator=op.name, stream_time=F.col(st),
        window_start=F.col("window_start"), window_end=F.col("window_start") + F.lit(windows.diff),
        range_time=F.col("window_start")))
    per_record = kernel.where(F.col("kind").isin(JOINED, REFUSED)).groupBy("task", "seq").agg(
        F.max((F.col("kind") == JOINED).cast("int")).alias("joined")).groupBy("joined").count().collect()
    found = {r["joined"]: r["count"] for r in per_record}
    counts.dropped["late"], counts.contributing = found.get(0, 0), found.get(1, 0)
    counts.late_pairs = refused.count()  # one ledger row each
    fields = [c for c in FOLD_FIELDS if c in live.columns and c not in ("task", "seq")]
    members = kernel.where(F.col("kind") == WINDOW).select(
        "task", "wid", "window_start", F.col("ts").alias("_wts"), (F.col("held") == 1).alias("_current"),
        F.posexplode("members").alias("pos", "seq")
    ).join(live.select("task", "seq", *fields), ["task", "seq"])
    if updates:
        return OperatorResult(output=_updates(members, kernel, aggs, windows.diff), ledger=ledger,
                              range_column="window_start", cached=(kernel,))
    finals = _suppressed(members, kernel, aggs, windows.diff)
    if not suppress:  # emitted on close: each window once, in no order the output keeps
        finals = finals.drop("emit_seq")
    return FinalWindows(output=finals.where("_closed").select(*final_columns(finals)), ledger=ledger,
                        range_column="window_start", windows=finals, operator=op.name, cached=(kernel,))


def _running(aggs: list[CompiledAggregation]) -> list[Column]:
    """Each aggregation over the window's members up to this one, in aggregation order."""
    upto = Window.partitionBy("task", "wid").orderBy("pos").rowsBetween(Window.unboundedPreceding,
                                                                        Window.currentRow)
    return [F.collect_list(_record()).over(upto).alias(f"_trail_{a.name}") if a.is_fold
            else a.aggregate().over(upto).alias(a.name) for a in aggs]


def _record() -> Column:
    return F.struct(*[F.col(c) for c in FOLD_FIELDS])


def _folded(rows: DataFrame, aggs: list[CompiledAggregation]) -> DataFrame:
    for agg in aggs:
        if agg.is_fold:
            rows = rows.withColumn(agg.name, agg.fold_over(f"_trail_{agg.name}")).drop(f"_trail_{agg.name}")
    return rows


def _updates(members: DataFrame, kernel: DataFrame, aggs: list[CompiledAggregation], diff: int) -> DataFrame:
    """One output per update (and per right window created as a copy): the window's values when it held
    `held` members, in emission order."""
    valued = _folded(members.select("task", "wid", "pos", "key", *_running(aggs)), aggs)
    emitted = kernel.where(F.col("kind").isin(UPDATE, COPY)).select(
        "task", "wid", (F.col("held") - 1).alias("pos"), "window_start", "ts", "emit_seq")
    return emitted.join(valued, ["task", "wid", "pos"]).select(
        "key", "window_start", (F.col("window_start") + F.lit(diff)).alias("window_end"), *[a.name for a in aggs],
        "ts", "emit_seq", "task")


def _suppressed(members: DataFrame, kernel: DataFrame, aggs: list[CompiledAggregation], diff: int) -> DataFrame:
    """emit: final: every window value suppress released, or emit-on-close emitted (`emit_seq`: the place in the
    task's releases or emissions, `_closed`), and the windows still buffered or open at the end (not `_closed`),
    with `_split` (kept by two tasks)."""
    valued = _folded(members.select("task", "wid", "pos", "key", *_running(aggs)), aggs)
    kept = kernel.where(F.col("kind").isin(RELEASED, PENDING)).select(
        "task", "wid", (F.col("held") - 1).alias("pos"), "window_start", "ts", "emit_seq",
        (F.col("kind") == RELEASED).alias("_closed"))
    tasks = Window.partitionBy("key", "window_start")
    return kept.join(valued, ["task", "wid", "pos"]).select(
        "key", "window_start", (F.col("window_start") + F.lit(diff)).alias("window_end"), *[a.name for a in aggs],
        "ts", "emit_seq", "task", "_closed", (F.min("task").over(tasks) != F.max("task").over(tasks)).alias("_split"))
