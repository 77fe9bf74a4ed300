"""Part: operators. Time-windowed aggregation (docs/semantics.md §4) on records already in task order.

Per record reaching the operator (key not null; null values are aggregated), for each window of
windowsFor(ts) in ascending start: accepted iff window end > ST - G, with ST the operator's own stream
time including this record (§4.2); else a `late` ledger row for that window. State is per task.
`updates` emits every accepted update (cache off, docs/semantics.md §4.5); `final` emits each window once it is closed
(ST >= end + G at the end of the data: suppress untilWindowCloses / ON_WINDOW_CLOSE, 4.4 and 7).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql import Column, DataFrame, Observation, Window
from pyspark.sql import functions as F

from backfill.errors import PublishError
from backfill.jobspec.durations import format_duration
from backfill.jobspec.fields import FOLD_FIELDS
from backfill.jobspec.models import OperatorSpec
from backfill.ledger import LATE, NULL_KEY, ledger_rows
from backfill.session import observation_done
from backfill.ops.chained import release_order
from backfill.ops.base import (Check, InRange, Operator, OperatorCounts, OperatorResult, OutputSuite, Publishable,
                               aggregate_expressions, check_null_drops, in_source, task_stream_time)
from backfill.ops.expressions import CompiledAggregation, compile_aggregations
from backfill.jobspec.rekeys import rekey_why, rekeys, stream_name
from backfill.ops.windows import TimeWindows

if TYPE_CHECKING:
    from backfill.jobspec.load import Job



@dataclass(frozen=True)
class WindowAggregate(Operator):
    """A tumbling or hopping window aggregate by the record key, `emit: updates` or `final`."""

    noun = "window aggregate"
    verified_as = "windows"

    @classmethod
    def from_job(cls, job: Job, spec: OperatorSpec, index: int, sink: str | None, start: int | None,
                 end: int | None) -> WindowAggregate:
        """Compiles the aggregations; the cool-down is what closes the last window starting before `end`."""
        agg = spec.aggregate
        assert agg is not None
        compile_aggregations(agg.aggregations, f"{job.path}: operators.{spec.name}.aggregate")
        w = agg.window
        base = {"name": spec.name, "kind": "aggregate", "inputs": (agg.input,), "emit": agg.emit, "sink": sink,
                "spec": spec, "index": index}
        size, advance, grace = w.size_ms, w.advance_ms, w.grace_ms
        text = (f"{w.type} size {format_duration(size)}" + (f" advance {format_duration(advance)}"
                                                            if w.type == "hopping" else "")
                + f" grace {format_duration(grace)}")
        why = rekey_why(spec) + close_why(spec)
        if start is not None:
            why.append(f"warm-up: records with timestamp >= {start} are read; an older record cannot fall into a "
                       "window starting at or after --start, nor raise stream time above a record that does")
        last_start = close = None
        if end is not None:
            last_start = (end - 1) // advance * advance
            close = last_start + size + grace
            why.append(f"cool-down: windows up to start {last_start} close when stream time reaches {close} "
                       f"(start + size + grace); each partition is processed up to its first record at or after it")
        return cls(**base, window=text, cooldown_ms=size + grace, last_window_start=last_start, close_time=close,
                   why=tuple(why))

    @property
    def windows(self) -> TimeWindows:
        """Size, advance and grace."""
        assert self.spec is not None and self.spec.aggregate is not None
        return TimeWindows.of(self.spec.aggregate.window)

    def stream_time_columns(self) -> dict[str, Column]:
        """Its own stream time, over the records that reach it (docs/semantics.md §3.1)."""
        assert self.spec is not None
        return {self.stream_time: reaches(self.spec)}

    def reads(self) -> frozenset[str] | None:
        """`seq` for order-dependent results (emit: updates, folds, first/last/...); `timestamp` and `headers`
        for folds, or where an aggregation names them (a textual test: a mention in a string literal keeps
        the column, harmless)."""
        assert self.spec is not None and self.spec.aggregate is not None
        aggs = compile_aggregations(self.spec.aggregate.aggregations, f"operators.{self.name}.aggregate")
        read = set()
        if self.emit == "updates" or any(a.order_sensitive for a in aggs):
            read.add("seq")
        texts = [t for a in aggs for t in (a.sql, a.init, a.step) if t] + [r.spec.key for r in rekeys(self.spec)]
        for column in ("timestamp", "headers"):
            if any(a.is_fold for a in aggs) or any(column in t for t in texts):  # a fold sees whole records
                read.add(column)
        return frozenset(read)

    def ledger_candidates(self) -> Column | None:
        """Records with at least one late window."""
        return F.coalesce(late_windows(self.windows, self.stream_time)["late"] > 0, F.lit(False))

    def count_columns(self, live: Column, late: dict[str, Column] | None = None) -> list[Column]:
        """Records in, null keys, contributing records, late (record, window) pairs, last stream time per task
        (`late`: `late_windows` of each record, when computed already: `late_refs()`)."""
        assert self.spec is not None and self.spec.aggregate is not None
        mine = in_source(stream_name(self.spec)) & live
        wc = late or late_windows(self.windows, self.stream_time)
        reach = mine & F.col("key").isNotNull()
        return [F.count(F.when(mine, 1)).alias(self.stat("in")),
                F.count(F.when(mine & F.col("key").isNull(), 1)).alias(self.stat("nullkey")),
                F.count(F.when(reach & wc["contributing"], 1)).alias(self.stat("contrib")),
                F.count(F.when(reach & ~wc["contributing"], 1)).alias(self.stat("all_late")),
                F.sum(F.when(reach, wc["late"]).otherwise(0)).alias(self.stat("late")),
                F.max(F.when(live, F.col(self.stream_time))).alias(self.stat("st"))]

    def counts(self, rows: list[Any]) -> OperatorCounts:
        """A record with a null key is dropped; one whose every window is late is dropped as late. Each is
        counted from its own fate, so `in == contributing + dropped` can fail (docs/semantics.md §7.1)."""
        counts = OperatorCounts(dropped={"null_key": 0, "late": 0})
        for r in rows:
            if r[self.stat("st")] is not None and r["task"] is not None:
                counts.final_stream_time[r["task"]] = max(counts.final_stream_time.get(r["task"], -1),
                                                          r[self.stat("st")])
            counts.records_in += r[self.stat("in")]
            counts.contributing += r[self.stat("contrib")]
            counts.late_pairs += int(r[self.stat("late")] or 0)
            counts.dropped["null_key"] += r[self.stat("nullkey")]
            counts.dropped["late"] += r[self.stat("all_late")]
        return counts

    def settle(self, counts: OperatorCounts, ledger: Mapping[str, int]) -> None:
        """Null keys counted per record must all be in the ledger; a late record's rows are its (record, window)
        pairs, checked against `late_pairs`."""
        check_null_drops(self.name, counts, ledger, ("null_key",))

    def run(self, processed: DataFrame, dropped: DataFrame, counts: OperatorCounts) -> OperatorResult:
        """Updates in processing order, or the windows closed at the end of the data."""
        assert self.spec is not None
        return aggregate(self.spec, processed, self.stream_time, counts.final_stream_time, dropped)

    def expressions(self) -> list[str] | None:
        """Its aggregations, re-keys and filters (ops/base.py `aggregate_expressions`)."""
        assert self.spec is not None
        return aggregate_expressions(self.spec)

    def one_pass(self) -> bool:
        """Whether it can run in the one pass (plan/fused.py): emit final, not re-keyed, aggregations that
        neither depend on processing order nor read any record column but `value` (the pass hides the value
        from the rows that are not windows, so their groups aggregate nothing but nulls)."""
        assert self.spec is not None and self.spec.aggregate is not None
        if self.emit != "final" or rekeys(self.spec):
            return False
        aggs = compile_aggregations(self.spec.aggregate.aggregations, f"operators.{self.name}.aggregate")
        return not any(a.order_sensitive for a in aggs) and all(a.reads_only_value for a in aggs)

    def late_columns(self) -> dict[str, Column]:
        """The one pass's per-record `late_windows`, computed once for its counts and rows (`late_refs()`)."""
        wc = late_windows(self.windows, self.stream_time)
        return {"_late_n": wc["late"], "_contributing": wc["contributing"]}

    @staticmethod
    def late_refs() -> dict[str, Column]:
        """`late_windows` as the columns of `late_columns()`."""
        return {"late": F.col("_late_n"), "contributing": F.col("_contributing")}

    def fused_rows(self, ordered: DataFrame, live: Column, record_row: Column, panes: bool = False,
                   late: dict[str, Column] | None = None) -> DataFrame:
        """Each record as the rows of the one pass (plan/fused.py): one ledger row when `record_row` holds
        (RECORD), and for a record reaching the operator one row per window of windowsFor(ts), WINDOW when
        accepted (4.1 step 5), LATE_PAIR otherwise; only `live` records (not cut by the cool-down) have rows.
        `_mark` is the window start (RECORD_MARK: none).

        With `panes` (see `panes()`), a record has ONE WINDOW row for all its accepted windows: `_mark` is
        its pane's start and `_late` how many of its windows (the oldest) are late, each a LATE_PAIR row
        (`late`: `late_refs()` when the frame has `late_columns()`)."""
        assert self.spec is not None
        w, st = self.windows, self.stream_time
        none = F.array().cast("array<bigint>")
        record = F.when(live & record_row, F.array(F.lit(_RECORD_MARK))).otherwise(none)
        reaching = live & reaches(self.spec)
        mark = F.col("_mark")
        if not panes:
            # never null: concat with a null array would lose the record's every row
            marks = F.concat(record, F.coalesce(F.when(reaching, w.starts("ts")), none))
            kind = (F.when(mark == _RECORD_MARK, F.lit(RECORD))
                    .when(w.accepts(mark, F.col(st)), F.lit(WINDOW))
                    .otherwise(F.lit(LATE_PAIR)))
            return ordered.select("*", F.explode(marks).alias("_mark")).withColumn("_g", kind)
        counted = late or late_windows(w, st)
        pane = F.expr(f"(ts div {w.advance}L) * {w.advance}L")
        late_marks = F.coalesce(F.when(reaching, F.slice(w.starts("ts"), 1, counted["late"].cast("int"))), none)
        accepted = F.coalesce(F.when(reaching & counted["contributing"], F.array(pane)), none)
        # a late window starts before the newest window, which starts at or before the pane: when the record
        # has a pane row, no late mark equals the pane's start
        kind = (F.when(mark == _RECORD_MARK, F.lit(RECORD))
                .when(counted["contributing"] & (mark == pane), F.lit(WINDOW)).otherwise(F.lit(LATE_PAIR)))
        return (ordered.select("*", F.explode(F.concat(record, late_marks, accepted)).alias("_mark"))
                .withColumn("_g", kind).withColumn("_late", F.when(F.col("_g") == WINDOW, counted["late"])))

    def panes(self) -> Panes | None:
        """How the one pass aggregates by pane, or None. A hopping window of size S, a multiple of its advance
        A, is S / A panes of A ms (records of a key in one pane fall into the same windows): a record gives
        one row, not S / A, and each pane's partial aggregates are merged into its windows'. Only when every
        aggregation splits (`CompiledAggregation.split`)."""
        assert self.spec is not None and self.spec.aggregate is not None
        w = self.windows
        if w.size <= w.advance or w.size % w.advance:
            return None
        aggs = compile_aggregations(self.spec.aggregate.aggregations, f"operators.{self.name}.aggregate")
        splits = [a.split(f"_pane_{i}_") for i, a in enumerate(aggs)]
        if any(s is None for s in splits):
            return None
        return Panes(w, tuple(s for s in splits if s is not None))

    def fused_pairs(self, live: Column, late: dict[str, Column] | None = None) -> Column:
        """Aggregation: the accepted (record, window) pairs, counted per record without exploding (the one pass
        checks its count against its windows' records)."""
        w = self.windows
        assert self.spec is not None
        count = (w.last_start("ts") - w.first_start("ts")) / F.lit(w.advance) + 1
        accepted = count.cast("long") - (late or late_windows(w, self.stream_time))["late"].cast("long")
        return F.sum(F.when(live & reaches(self.spec), accepted)).alias("_accepted_pairs")

    def fused_aggregations(self, panes: Panes | None = None) -> list[Column]:
        """Its aggregations in the one pass: the output columns (with `panes`, their partial aggregates), and
        the window's max ts (the one pass groups by task too)."""
        assert self.spec is not None and self.spec.aggregate is not None
        aggs = compile_aggregations(self.spec.aggregate.aggregations, f"operators.{self.name}.aggregate")
        # by position: an output name may be one of the counting pass's ("n", ...)
        outputs = ([F.expr(sql).alias(f"_pane_{i}_{j}") for i, (parts, _) in enumerate(panes.splits)
                    for j, (sql, _) in enumerate(parts)] if panes is not None
                   else [a.aggregate().alias(f"_output_{i}") for i, a in enumerate(aggs)])
        return [*outputs, F.max("ts").alias("_window_ts")]

    def fused_result(self, groups: DataFrame, records: DataFrame, counts: OperatorCounts,
                     ledger_groups: DataFrame | None = None, one_task_keys: bool = False) -> OperatorResult:
        """Its output and ledger rows from the one pass's groups (`records`: its RECORD rows, one per record;
        `ledger_groups`: the groups that are not windows, if stored apart; `one_task_keys`: known that no key
        has windows in two tasks)."""
        assert self.spec is not None and self.spec.aggregate is not None
        w, st = self.windows, self.stream_time
        aggs = compile_aggregations(self.spec.aggregate.aggregations, f"operators.{self.name}.aggregate")
        mine = records.where(in_source(stream_name(self.spec)) & F.col("key").isNull())
        null_keys = ledger_rows(mine, reason=NULL_KEY, operator=self.name, stream_time=F.col(st),
                                range_time=F.col("ts"))
        pairs = repeated((groups if ledger_groups is None else ledger_groups).where(F.col("_g") == LATE_PAIR))
        late = ledger_rows(pairs, reason=LATE, operator=self.name, stream_time=F.col(st),
                           window_start=F.col("window_start"), window_end=F.col("window_start") + F.lit(w.size),
                           range_time=F.col("window_start"))
        task_st = task_stream_time(counts.final_stream_time)
        windows = groups.where(F.col("_g") == WINDOW).select(
            "key", "window_start", (F.col("window_start") + F.lit(w.size)).alias("window_end"),
            *[F.col(f"_output_{i}").alias(a.name) for i, a in enumerate(aggs)], F.col("_window_ts").alias("ts"),
            "task", F.lit(False).alias("_split"))
        windows = windows.withColumn("_closed", F.coalesce(w.closed(F.col("window_start"), task_st), F.lit(False)))
        return FinalWindows(output=windows.where("_closed").select(*final_columns(windows)),
                            ledger=null_keys.unionByName(late), range_column="window_start", windows=windows,
                            operator=self.name, per_task=True, one_task_keys=one_task_keys)

    def output_suite(self, output: DataFrame) -> OutputSuite | None:
        """The window suite and (key, window_start) or (task, emit_seq) uniqueness."""
        final = self.emit == "final"
        return OutputSuite(window_frame(output, self.windows), window_checks(self.windows, output.columns),
                           ("key", "window_start") if final else ("task", "emit_seq"),
                           self.windows.advance if final else 1)


def close_why(spec: OperatorSpec) -> list[str]:
    """What `plan` says about an `emit: final` operator's mechanism (docs/semantics.md §4.5, §10.4, §11.5)."""
    agg = spec.aggregate
    if agg is None or agg.emit != "final":
        return []
    if agg.close_mechanism == "suppress":
        return ["emit: final by suppress(untilWindowCloses): a window is released once suppress's stream time "
                "reaches its end + grace (sessions: + gap); a sliding or session window updated after its "
                "release is released again (rows numbered by emit_seq)"]
    return ["emit: final by emitStrategy(onWindowClose()): a window is emitted once stream time reaches its end "
            "+ grace (sliding and session windows: passes it, + gap for sessions)"]


def numbered_finals(spec: OperatorSpec) -> bool:
    """Whether its final rows carry `emit_seq` and `task`: suppress on sliding or session windows, which may
    release a window more than once."""
    agg = spec.aggregate
    return (agg is not None and agg.emit == "final" and agg.close_mechanism == "suppress"
            and agg.window.type in ("sliding", "session"))


def window_checks(w: TimeWindows, columns: list[str]) -> list[Check]:
    """The row checks of a window output (docs/semantics.md §4.1), for the columns the table has."""
    checks = [Check("ExpectColumnValuesToNotBeNull", {"column": "key"}, "keys not null"),
              Check("ExpectColumnValuesToBeInSet", {"column": "_window_length", "value_set": [w.size]},
                    f"window_end - window_start == size ({w.size} ms)"),
              Check("ExpectColumnValuesToBeInSet", {"column": "_start_offset", "value_set": [0]},
                    f"window starts aligned to the advance ({w.advance} ms) from epoch 0")]
    if "ts" in columns:
        checks.append(Check("ExpectColumnValuesToBeInSet", {"column": "_ts_in_window", "value_set": [True]},
                            "ts inside [window_start, window_end)"))
    return checks


def window_frame(df: DataFrame, w: TimeWindows) -> DataFrame:
    """The table plus the derived columns the window checks read."""
    end = F.col("window_end") if "window_end" in df.columns else F.col("window_start") + F.lit(w.size)
    out = df.withColumn("_window_length", end - F.col("window_start")).withColumn(
        "_start_offset", F.pmod(F.col("window_start"), F.lit(w.advance)))
    if "ts" in df.columns:
        out = out.withColumn("_ts_in_window", (F.col("ts") >= F.col("window_start")) & (F.col("ts") < end))
    return out


@dataclass(frozen=True)
class FinalWindows(OperatorResult):
    """emit: final: `windows` holds every window with `_closed` and `_split`. The pass that writes the closed
    ones also counts the open ones and the windows kept by several tasks (Observation metrics), instead of
    caching every window for several passes.

    `per_task`: `windows` has one row per task that kept a window (the one pass, plan/fused.py), `_split` is
    never set, and the windows kept by several tasks are looked for after the write (`split_windows`), unless
    `one_task_keys`: the one pass found every key's windows in one task."""

    windows: DataFrame | None = None
    operator: str = ""
    per_task: bool = False
    one_task_keys: bool = False
    release_by: tuple[str, ...] = ("window_start",)  # sessions emitted on close: window_end, window_start

    def forwarded_rows(self) -> DataFrame:
        """The closed windows as the aggregate forwards them (docs/semantics.md §18.2): numbered already
        (suppress on sliding and session windows), or in the order they are released (ops/chained.py)."""
        assert self.windows is not None
        if "emit_seq" in self.windows.columns:
            return self.output
        return release_order(self.windows.where("_closed").select(
            *[c for c in self.windows.columns if c not in ("_closed", "_split")]), self.release_by)

    def publishable(self, in_range: InRange) -> Publishable:
        """The closed windows in range; the open ones counted; a window kept by two tasks refused."""
        assert self.windows is not None
        seen = Observation()
        observed = self.windows.where(in_range(self.range_column)).observe(
            seen, F.count(F.when(~F.col("_closed"), 1)).alias("incomplete"),
            F.count(F.when(F.col("_split"), 1)).alias("split"),
            F.max(F.when(F.col("_split"), F.col("key"))).alias("key"))
        output = observed.where("_closed").select(*final_columns(self.windows))

        def metrics() -> dict[str, Any]:
            # filled by the first action on `output` (the sink's write); a sink that audits before it
            # writes (delta-spark) gets them from one extra pass
            if not observation_done(seen):
                output.write.format("noop").mode("overwrite").save()
            return seen.get

        def refuse_split(staged: DataFrame) -> None:
            found = metrics()
            split, key = found["split"], found["key"]
            if self.per_task and not self.one_task_keys:
                split, key = split_windows(self.windows.where(in_range(self.range_column)))
            if split:
                raise PublishError(f"operators.{self.operator}: key {key!r} occurs in several partitions, "
                                   f"so several tasks kept a window for it ({split} windows) and the final "
                                   "output would not be unique per (key, window_start); nothing was published")

        return Publishable(output, lambda: int(metrics()["incomplete"]), refuse_split)


def split_windows(windows: DataFrame) -> tuple[int, Any]:
    """The windows kept by several tasks, in a frame of one row per (task, window): how many, and the
    greatest key among them. One aggregation by key finds the keys of several tasks (normally none, and
    then nothing more is read); only their windows are grouped by window."""
    keys = windows.groupBy("key").agg(F.min("task").alias("_lo"), F.max("task").alias("_hi")).where(
        F.col("_lo") != F.col("_hi")).select("key")
    if not keys.take(1):
        return 0, None
    kept = windows.join(F.broadcast(keys), "key", "left_semi").groupBy("key", "window_start").agg(
        F.count(F.lit(1)).alias("_tasks")).where(F.col("_tasks") > 1)
    found = kept.agg(F.count(F.lit(1)).alias("split"), F.max("key").alias("key")).first()
    return (found["split"], found["key"]) if found is not None else (0, None)


# the one pass (plan/fused.py): what a row of a record is; the mark of a row that is not a window
WINDOW, LATE_PAIR, RECORD = 0, 1, 2
_RECORD_MARK = -1  # window starts are >= 0


@dataclass(frozen=True)
class Panes:
    """The one pass by pane (WindowAggregate.panes): its windows and each aggregation's split."""

    windows: TimeWindows
    splits: tuple[tuple[list[tuple[str, str]], str], ...]

    def merge(self, groups: DataFrame, keys: list[str]) -> DataFrame:
        """The pane groups (WINDOW: key, pane start in `_group_window_start`, `_group_late`) merged into window
        groups, with the columns of the one pass without panes. The other groups go through the same
        aggregation one to one (a union of two filters of `groups` would compute it twice)."""
        w = self.windows
        starts = w.starts("_group_window_start")
        late = F.col("_group_late").cast("int")
        # a pane's windows are its records' (the same windowsFor); its records' `_late` oldest ones are late
        marks = F.when(F.col("_g") == WINDOW, F.slice(starts, late + 1, F.size(starts) - late)).otherwise(
            F.array(F.col("_group_window_start")))
        types = {f.name: f.dataType for f in groups.schema.fields}
        exploded = groups.withColumn("_group_window_start", F.explode(marks)).withColumn(
            "_group_late", F.lit(None).cast(types["_group_late"]))
        merged = []
        for i, (parts, _) in enumerate(self.splits):
            for j, (_, how) in enumerate(parts):
                name = f"_pane_{i}_{j}"
                # a sum of sums is cast back: Spark widens a decimal sum's precision at each step
                merged.append(getattr(F, how)(name).cast(types[name]).alias(name))
        merged += [F.sum("_n").alias("_n"), F.max("_window_ts").alias("_window_ts")]
        outputs = [F.expr(sql).alias(f"_output_{i}") for i, (_, sql) in enumerate(self.splits)]
        return (exploded.groupBy(*keys).agg(*merged)
                .select(*keys, "_n", *outputs, "_window_ts"))


def repeated(groups: DataFrame) -> DataFrame:
    """Ledger groups back to rows: a group holds `_n` copies of one record (a source may hold duplicates)."""
    return groups.select("*", F.explode(F.array_repeat(F.lit(0), F.col("_n").cast("int"))).alias("_copy"))


def reaches(op: OperatorSpec) -> Column:
    """Records that reach the window aggregate: its input, key not null (4.1 step 1)."""
    assert op.aggregate is not None
    return (F.col("source") == stream_name(op)) & F.col("key").isNotNull() & F.col("_drop").isNull()


def late_windows(windows: TimeWindows, st: str) -> dict[str, Column]:
    """Per record, without exploding: how many of its windows are late, and whether any is accepted."""
    first, last = windows.first_start("ts"), windows.last_start("ts")
    threshold = windows.last_closed_start(F.col(st))  # a window is late iff its start is at most this
    late = F.when(threshold < first, F.lit(0)).otherwise(
        F.floor((F.least(last, threshold) - first) / F.lit(windows.advance)) + 1)
    return {"late": late, "contributing": last > threshold}


def aggregate(op: OperatorSpec, ordered: DataFrame, st: str, final_st: dict[int, int] | None = None,
              dropped: DataFrame | None = None) -> OperatorResult:
    """Run one aggregate operator over task-ordered records; `st` names its stream-time column.

    `final_st` maps each task to its stream time at the end of the data (needed by emit: final).
    `dropped`, if given, is a subset of `ordered` holding at least every record with a null key or a
    late window: the ledger rows are built from it (one small cached frame instead of two scans).
    """
    spec = op.aggregate
    assert spec is not None
    windows = TimeWindows.of(spec.window)
    aggs = compile_aggregations(spec.aggregations, f"operators.{op.name}.aggregate")
    reaching = (F.col("source") == stream_name(op)) & F.col("_drop").isNull()
    mine = ordered.where(reaching)
    ledger_input = mine if dropped is None else dropped.where(reaching)
    null_keys = ledger_rows(ledger_input.where(F.col("key").isNull()), reason=NULL_KEY, operator=op.name,
                            stream_time=F.col(st), range_time=F.col("ts"))
    keyed = mine.where(F.col("key").isNotNull())
    # only records with a late window are exploded for the ledger (a few percent, not all)
    late_records = ledger_input.where(F.col("key").isNotNull() & (late_windows(windows, st)["late"] > 0))
    late = ledger_rows(_pairs(late_records, windows, st).where(~F.col("_accepted")), reason=LATE, operator=op.name,
                       stream_time=F.col(st), window_start=F.col("window_start"),
                       window_end=F.col("window_end"), range_time=F.col("window_start"))
    accepted = _pairs(keyed, windows, st).where("_accepted")
    if spec.emit == "updates":
        return OperatorResult(output=_updates(accepted, aggs, windows), ledger=null_keys.unionByName(late),
                              range_column="window_start")
    all_windows = _final(accepted, aggs, windows, final_st or {})
    return FinalWindows(output=all_windows.where("_closed").select(*final_columns(all_windows)),
                        ledger=null_keys.unionByName(late), range_column="window_start", windows=all_windows,
                        operator=op.name)


def _pairs(records: DataFrame, windows: TimeWindows, st: str) -> DataFrame:
    """(record, window) pairs of windowsFor(ts), each marked accepted or late against the stream time."""
    return (records.select("*", F.posexplode(windows.starts("ts")).alias("widx", "window_start"))
            .withColumn("window_end", F.col("window_start") + F.lit(windows.size))
            .withColumn("_accepted", windows.accepts(F.col("window_start"), F.col(st))))


def _record_struct() -> Column:
    return F.struct(*[F.col(c) for c in FOLD_FIELDS])


def _updates(accepted: DataFrame, aggs: list[CompiledAggregation], w: TimeWindows) -> DataFrame:
    """One row per accepted (record, window), emitted in processing order (docs/semantics.md §4.5, cache off)."""
    state = (Window.partitionBy("task", "key", "window_start").orderBy("seq")
             .rowsBetween(Window.unboundedPreceding, Window.currentRow))
    cols, folds = [], []
    for agg in aggs:
        if agg.is_fold:  # the records so far, in order; folded in a second projection
            cols.append(F.collect_list(_record_struct()).over(state).alias(f"_trail_{agg.name}"))
            folds.append(agg)
        else:
            cols.append(agg.aggregate().over(state).alias(agg.name))
    # emission order within a task: by record, then ascending window start
    emit_seq = F.col("seq") * F.lit(w.per_record) + F.col("widx")
    rows = accepted.select(
        "key", "window_start", "window_end", *cols, F.max("ts").over(state).alias("ts"),
        emit_seq.cast("long").alias("emit_seq"), F.col("task"))
    for agg in folds:
        rows = rows.withColumn(agg.name, agg.fold_over(f"_trail_{agg.name}")).drop(f"_trail_{agg.name}")
    return rows.select("key", "window_start", "window_end", *[a.name for a in aggs], "ts", "emit_seq", "task")


def _final(accepted: DataFrame, aggs: list[CompiledAggregation], w: TimeWindows,
           final_st: dict[int, int]) -> DataFrame:
    """Every window with `_closed` (closed by the end of the data: emitted) and `_split` (kept by two
    tasks). Nothing is cached: the publish step reads it once, writing the closed windows and
    counting the open ones, which are reported, never emitted.
    """
    # final once the task's stream time >= end + G (docs/semantics.md §4.5)
    task_st = task_stream_time(final_st)
    windows = _windows(accepted, aggs, w).withColumn(
        "_closed", F.coalesce(w.closed(F.col("window_start"), task_st), F.lit(False)))
    cols = ["key", "window_start", "window_end", *[a.name for a in aggs], "ts"]
    return windows.select(*cols, "task", "_closed", "_split")


def final_columns(windows: DataFrame) -> list[str]:
    """The output columns of an `emit: final` windows frame (without `_closed`, `_split`, and `task` unless the
    rows are numbered by `emit_seq`: suppress may release a sliding or session window more than once)."""
    numbered = "emit_seq" in windows.columns
    return [c for c in windows.columns if c not in ("_closed", "_split") and (c != "task" or numbered)]


def _windows(accepted: DataFrame, aggs: list[CompiledAggregation], w: TimeWindows) -> DataFrame:
    """One row per (key, window): its aggregates over the records it accepted, ts = their max.

    Grouped by (key, window_start), so the output is unique by construction; `task` is the task that
    kept the window and `_split` marks a window kept by several tasks (a key in several partitions),
    which the publish step refuses (checked in the pass that writes the output).
    """
    if any(a.order_sensitive and not a.is_fold for a in aggs):
        last = _updates(accepted, aggs, w)
        names = [a.name for a in aggs] + ["ts", "window_end"]
        return (last.groupBy("key", "window_start")
                .agg(F.max_by(F.struct(*names), "emit_seq").alias("_last"), *_task_span())
                .select("key", "window_start", *[F.col(f"_last.{n}").alias(n) for n in names], "task", "_split"))
    return accepted.groupBy("key", "window_start").agg(
        *[_final_column(a) for a in aggs], F.max("ts").alias("ts"), *_task_span()).withColumn(
        "window_end", F.col("window_start") + F.lit(w.size))


def _task_span() -> list[Column]:
    return [F.min("task").alias("task"), (F.min("task") != F.max("task")).alias("_split")]


def _final_column(agg: CompiledAggregation) -> Column:
    if not agg.is_fold:
        return agg.aggregate().alias(agg.name)
    # fold in processing order: sort the window's records by seq, then aggregate (Kafka Streams aggregate)
    fields = ", ".join(FOLD_FIELDS)
    by_seq = "(l, r) -> CASE WHEN l.seq < r.seq THEN -1 WHEN l.seq > r.seq THEN 1 ELSE 0 END"
    ordered = f"array_sort(collect_list(struct({fields})), {by_seq})"
    return agg.fold_over(ordered).alias(agg.name)
