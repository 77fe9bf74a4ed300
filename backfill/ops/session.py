"""Part: operators. Session-window aggregation (docs/semantics.md §11), on records already in task order.

Merging is sequential: whether a record bridges two sessions depends on what the store held when it came.
A per-task kernel (docs/architecture.md, step 5) replays only that structure on (key, ts, stream time): which
sessions each record found, whether it was late, the merge tree. Spark then computes the values:

* every accepted record makes one node of a merge tree: its children are the sessions it found (store
  order: end, then start), its leaf is the record itself, placed after them;
* numbering the leaves in post-order makes each node's records a contiguous run of positions
  [lo, own position], so a session's value after that record is a running aggregate over a group of rows
  ordered by position. A leaf needs one group per distinct `lo` among its ancestors: one for a session
  that only grows, one more each time it is merged into another session as a later part;
* a fold runs its merge tree as a small stack program (init, the children's programs each followed by a
  merge, the record's step) in Spark's `aggregate`.

`emit: updates` emits, per record, a tombstone for each merged-away session and then the merged session;
`emit: final` emits the sessions closed by the end of the data (end < ST - grace - gap, ON_WINDOW_CLOSE), or
with `close: suppress` each session value suppress released (the kernel replays its buffer).
"""
from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sqlglot
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from sqlglot import exp

from backfill.jobspec.fields import FOLD_FIELDS
from backfill.jobspec.durations import format_duration
from backfill.jobspec.models import OperatorSpec
from backfill.ledger import LATE, NULL_KEY, ledger_rows
from backfill.ops.aggregate import FinalWindows, close_why, final_columns, numbered_finals
from backfill.jobspec.rekeys import rekey_why, stream_name
from backfill.ops.base import Check, OperatorCounts, OperatorResult, OutputSuite, check_null_drops, task_stream_time
from backfill.ops.expressions import CompiledAggregation, compile_aggregations
from backfill.ops.kernel import KernelAggregate, SuppressBuffer, key_bytes
from backfill.ops.windows import SessionWindows
from backfill.sqldialect import SparkSQL
from backfill.session import computed_once

if TYPE_CHECKING:
    import pandas as pd
    from backfill.jobspec.load import Job

SLOTS = 8  # outputs per record at most (tombstones + the merged session): emit_seq = seq * SLOTS + position
KERNEL_SCHEMA = ("task int, seq long, late boolean, window_start long, window_end long, pos long, node_lo long, "
                 "root_lo long, is_root boolean, groups array<long>, tomb array<struct<start:long,end:long>>, "
                 "init_idx long, step_idx long, merge_idx long, replaced boolean, released long, pending boolean, "
                 "lost boolean")
INIT, MERGE, STEP = 0, 1, 2


@dataclass(frozen=True)
class SessionAggregate(KernelAggregate):
    """Session windows by the record key, `emit: updates` or `final`; sessions are (key, start, end)."""

    session = True

    @classmethod
    def from_job(cls, job: Job, spec: OperatorSpec, index: int, sink: str | None, start: int | None,
                 end: int | None) -> SessionAggregate:
        """Warm-up of one gap; no cool-down cut: a session starting before `end` may grow through a chain."""
        agg = spec.aggregate
        assert agg is not None
        compile_aggregations(agg.aggregations, f"{job.path}: operators.{spec.name}.aggregate", session=True)
        gap, grace = int(agg.window.gap or 0), agg.window.grace_ms
        why = rekey_why(spec) + close_why(spec)
        if start is not None:
            why.append(f"warm-up: records with timestamp >= {start - gap} are read (one gap before --start): a "
                       "record further back can only reach a session at or after --start through a record within "
                       "a gap of it, which would make that session start before --start")
        if end is not None:
            why.append("cool-down: every record after --end is read: a session starting before --end grows "
                       "through any chain of records each within a gap of the next, and closes only when stream "
                       "time passes its end + gap + grace")
        return cls(name=spec.name, kind="aggregate", inputs=(agg.input,), emit=agg.emit, sink=sink, spec=spec,
                   index=index, window=f"session gap {format_duration(gap)} grace {format_duration(grace)}",
                   warmup_ms=gap, why=tuple(why))

    def settled_by(self, end: int) -> int:
        """A session starting before `end` with no record within a gap after `end` ends by `end`, so it has closed
        once stream time passes the close of a session ending at `end`: end + gap + grace (docs/semantics.md
        §11.2)."""
        return self.windows.close(end)

    @property
    def windows(self) -> SessionWindows:
        """The gap and grace, and their close rule."""
        assert self.spec is not None and self.spec.aggregate is not None
        return SessionWindows.of(self.spec.aggregate.window)

    def run(self, processed: DataFrame, dropped: DataFrame, counts: OperatorCounts) -> OperatorResult:
        """The kernel's merge trees, then values, tombstones and late ledger rows."""
        assert self.spec is not None
        return sessions(self.spec, processed, self.stream_time, counts.final_stream_time, counts)

    def settle(self, counts: OperatorCounts, ledger: Mapping[str, int]) -> None:
        """Null keys counted per record must all be in the ledger. The kernel counted the records merged into a
        session (contributing) and the late ones (late pairs) record by record (run); the late drops are the
        ledger's rows, so `in == contributing + dropped` and `late rows == late pairs` check the ledger against
        the records' own fates."""
        check_null_drops(self.name, counts, ledger, self.null_reasons)
        counts.dropped["late"] = ledger.get("late", 0)

    def output_suite(self, output: DataFrame) -> OutputSuite | None:
        """Sessions: start <= ts == end (tombstones too), keys not null; unique per (key, start, end) or emit_seq."""
        frame = output.withColumn("_bounds_ok", (F.col("window_start") <= F.col("window_end"))
                                  & (F.col("ts") == F.col("window_end")))
        checks = [Check("ExpectColumnValuesToNotBeNull", {"column": "key"}, "keys not null"),
                  Check("ExpectColumnValuesToBeInSet", {"column": "_bounds_ok", "value_set": [True]},
                        "window_start <= window_end == ts (a session's timestamp is its end)")]
        assert self.spec is not None
        final = self.emit == "final" and not numbered_finals(self.spec)
        unique = ("key", "window_start", "window_end") if final else ("task", "emit_seq")
        return OutputSuite(frame, checks, unique)


# ---------------------------------------------------------------------------------------------- the kernel
def replay_sessions(keys: list[Any], ts: list[int], st: list[int], windows: SessionWindows, groups: bool,
                    suppress: bool = False) -> dict[str, list[Any]]:
    """Replay one task's session store in processing order (docs/semantics.md §11.1-§11.3).

    Returns one list per KERNEL_SCHEMA column (without task and seq), one entry per record. With `suppress`,
    also what suppress(untilWindowCloses) does with the forwarded updates (`released`: the node's place in
    the task's releases; `pending`: still buffered at the end), docs/semantics.md §11.5.
    """
    n = len(ts)
    gap, retention, closed = windows.gap, windows.retention, windows.closed
    store: dict[Any, tuple[list[int], list[int], list[int]]] = {}  # key -> starts, ends, nodes (disjoint, sorted)
    store_time: int | None = None
    late = [False] * n
    w_start, w_end = [0] * n, [0] * n
    children: list[list[int] | None] = [None] * n
    tomb: list[list[tuple[int, int]] | None] = [None] * n
    has_parent = [False] * n
    replaced = [False] * n
    bounds: dict[tuple[Any, int, int], int] = {}  # (key, start, end) -> the node the store holds there
    buffer = SuppressBuffer(retention) if suppress else None  # released once stream time reaches end + P + G
    for i in range(n):
        t, key = ts[i], keys[i]
        entry = store.get(key)
        if entry is None:
            entry = store[key] = ([], [], [])
        starts, ends, nodes = entry
        if store_time is not None and ends and ends[0] <= store_time - retention:
            cut = bisect.bisect_right(ends, store_time - retention)  # no longer visible: never found again
            del starts[:cut], ends[:cut], nodes[:cut]
        j = bisect.bisect_left(ends, t - gap)
        m = j
        while m < len(starts) and starts[m] <= t + gap:
            m += 1
        lo, hi = (min(t, starts[j]), max(t, ends[m - 1])) if m > j else (t, t)
        w_start[i], w_end[i] = lo, hi
        if closed(hi, st[i]):  # the merged session has closed: late (docs/semantics.md §11.2)
            late[i] = True
            continue
        if m > j:
            if (lo, hi) != (t, t):
                tomb[i] = list(zip(starts[j:m], ends[j:m]))
                if m - j >= SLOTS:
                    raise RuntimeError(f"a record merged {m - j} sessions; emit_seq orders at most {SLOTS - 1}")
                if buffer is not None:
                    for a, b in tomb[i]:
                        buffer.put((key, a, b), b, key_bytes(key) + _long(b) + _long(a), None, b)
            children[i] = nodes[j:m]
            for c in nodes[j:m]:
                has_parent[c] = True
        starts[j:m], ends[j:m], nodes[j:m] = [lo], [hi], [i]
        old = bounds.get((key, lo, hi))
        if old is not None and not has_parent[old]:  # a put replaces a hidden session with the same bounds
            replaced[old] = True
        bounds[(key, lo, hi)] = i
        store_time = hi if store_time is None else max(store_time, hi)
        if buffer is not None:
            buffer.put((key, lo, hi), hi, key_bytes(key) + _long(hi) + _long(lo), i, hi)
    out = _merge_trees(n, late, children, has_parent, groups)
    gone = {out["root_lo"][i] for i in range(n) if replaced[i]}  # every node of a replaced session's tree
    released: list[int | None] = [None] * n
    pending = [False] * n
    if buffer is not None:
        for place, node in enumerate(buffer.released):
            released[node] = place
        for node in buffer.pending():
            pending[node] = True
    # emit-on-close: a session whose segment the record that closed it dropped is never emitted (§11.5); the
    # closing record is the first whose stream time passes the session's close (stream time never falls)
    unseen = set()
    for i in range(n):
        if not late[i] and not has_parent[i] and out["root_lo"][i] is not None:
            k = bisect.bisect_right(st, windows.close(w_end[i]))
            if k < n and not windows.emitted_on_close(w_end[i], st[k]):
                unseen.add(out["root_lo"][i])
    out.update(late=late, window_start=w_start, window_end=w_end, tomb=tomb,
               replaced=[lo is not None and lo in gone for lo in out["root_lo"]], released=released, pending=pending,
               lost=[lo is not None and lo in unseen for lo in out["root_lo"]])
    return out


def _long(value: int) -> bytes:
    return value.to_bytes(8, "big", signed=True)


def _merge_trees(n: int, late: list[bool], children: list[list[int] | None], has_parent: list[bool],
                 groups: bool) -> dict[str, list[Any]]:
    """Post-order positions, group lists and fold program indexes of every accepted record's node."""
    pos: list[int | None] = [None] * n
    node_lo: list[int | None] = [None] * n
    root_lo: list[int | None] = [None] * n
    is_root = [False] * n
    grp: list[tuple[int, ...] | None] = [None] * n
    init_idx: list[int | None] = [None] * n
    step_idx: list[int | None] = [None] * n
    merge_idx: list[int | None] = [None] * n
    p = q = 0
    for root in range(n):
        if late[root] or has_parent[root]:
            continue
        is_root[root] = True
        first = p
        init_idx[root], q = q, q + 1
        stack = [[root, 0]]
        while stack:
            top = stack[-1]
            node, ci = top
            kids = children[node] or ()
            if ci < len(kids):
                top[1] += 1
                child = kids[ci]
                init_idx[child], q = q, q + 1
                stack.append([child, 0])
                continue
            pos[node], p = p, p + 1
            if node_lo[node] is None:
                node_lo[node] = pos[node]
            step_idx[node], q = q, q + 1
            root_lo[node] = first
            stack.pop()
            if stack:
                merge_idx[node], q = q, q + 1
                parent = stack[-1][0]
                if node_lo[parent] is None:
                    node_lo[parent] = node_lo[node]
        if groups:
            _groups(root, children, node_lo, grp)
    return {"pos": pos, "node_lo": node_lo, "root_lo": root_lo, "is_root": is_root,
            "groups": [list(g) if g is not None else None for g in grp] if groups else [None] * n,
            "init_idx": init_idx, "step_idx": step_idx, "merge_idx": merge_idx}


def _groups(root: int, children: list[list[int] | None], node_lo: list[int | None],
            grp: list[tuple[int, ...] | None]) -> None:
    """The distinct `lo` of each node and its ancestors: a first child shares its parent's, a later one adds its own."""
    grp[root] = (node_lo[root],)  # type: ignore[assignment]
    todo = [root]
    while todo:
        node = todo.pop()
        mine = grp[node]
        assert mine is not None
        for ci, child in enumerate(children[node] or ()):
            grp[child] = mine if ci == 0 else mine + (node_lo[child],)  # type: ignore[operator]
            todo.append(child)


def _kernel(windows: SessionWindows, groups: bool, suppress: bool) -> Any:
    """The applyInPandas function: one task's keyed records -> the kernel's columns per record."""
    def run(pdf: pd.DataFrame) -> pd.DataFrame:
        import pandas as pd  # in the Python worker; the CLI does not pay for pandas

        pdf = pdf.sort_values("seq", kind="stable")
        cols = replay_sessions(pdf["key"].tolist(), pdf["ts"].tolist(), pdf["st"].tolist(), windows, groups,
                               suppress)
        frame = pd.DataFrame({"task": pdf["task"].to_numpy(), "seq": pdf["seq"].to_numpy(), **cols})
        for c in ("pos", "node_lo", "root_lo", "init_idx", "step_idx", "merge_idx", "released"):
            frame[c] = frame[c].astype("Int64")
        frame["tomb"] = [None if x is None else [{"start": a, "end": b} for a, b in x] for x in frame["tomb"]]
        return frame
    return run


# ---------------------------------------------------------------------------------------------- Spark side
def sessions(op: OperatorSpec, ordered: DataFrame, st: str, final_st: Mapping[int, int],
             counts: OperatorCounts | None = None) -> OperatorResult:
    """Run one session aggregate over task-ordered records; `st` names its stream-time column. Counts in
    `counts` the records the kernel merged into a session (contributing) and those it found late."""
    spec = op.aggregate
    assert spec is not None
    windows = SessionWindows.of(spec.window)
    aggs = compile_aggregations(spec.aggregations, f"operators.{op.name}.aggregate", session=True)
    recs = ordered.where((F.col("source") == stream_name(op)) & F.col("_drop").isNull())
    null_keys = ledger_rows(recs.where(F.col("key").isNull()), reason=NULL_KEY, operator=op.name,
                            stream_time=F.col(st), range_time=F.col("ts"))
    keyed = recs.where(F.col("key").isNotNull())
    updates = spec.emit == "updates"
    suppress = not updates and spec.close_mechanism == "suppress"
    kernel = (keyed.select("task", "seq", "key", "ts", F.col(st).alias("st")).groupBy("task")
              .applyInPandas(_kernel(windows, updates or suppress, suppress), KERNEL_SCHEMA)
              .transform(computed_once))
    if counts is not None:  # one kernel row per keyed record: its fate
        fates = {r["late"]: r["count"] for r in kernel.groupBy("late").count().collect()}
        counts.contributing, counts.late_pairs = fates.get(False, 0), fates.get(True, 0)
    late = ledger_rows(keyed.join(kernel.where("late"), ["task", "seq"]), reason=LATE, operator=op.name,
                       stream_time=F.col(st), window_start=F.col("window_start"), window_end=F.col("window_end"),
                       range_time=F.col("window_start"))
    fields = [c for c in FOLD_FIELDS if c in keyed.columns and c not in ("task", "seq")]
    nodes = kernel.where(~F.col("late")).join(keyed.select("task", "seq", *fields), ["task", "seq"])
    ledger = null_keys.unionByName(late)
    if updates:
        return OperatorResult(output=_updates(nodes, aggs), ledger=ledger, range_column="window_start",
                              cached=(kernel,))
    roots = _suppressed(nodes, aggs) if suppress else _final(nodes, aggs, windows, final_st)
    return FinalWindows(output=roots.where("_closed").select(*final_columns(roots)), ledger=ledger,
                        range_column="window_start", windows=roots, operator=op.name, cached=(kernel,),
                        release_by=("window_end", "window_start"))


def _values(rows: DataFrame, aggs: list[CompiledAggregation], group: str) -> list[Column]:
    """Running SQL aggregates over `group`, in post-order (one row per leaf and group)."""
    running = (Window.partitionBy("task", group).orderBy("pos")
               .rowsBetween(Window.unboundedPreceding, Window.currentRow))
    return [a.aggregate().over(running).alias(a.name) for a in aggs if not a.is_fold]


def _merged(nodes: DataFrame, aggs: list[CompiledAggregation]) -> DataFrame:
    """Per accepted record (task, seq): the merged session with the values after it, and the kernel's columns."""
    sql = [a for a in aggs if not a.is_fold]
    sessions_ = nodes.select("task", "seq", "key", "window_start", "window_end", "node_lo", "tomb")
    if sql:
        leaves = nodes.select("*", F.explode("groups").alias("_grp"))
        valued = leaves.select("task", "seq", "_grp", "node_lo", *_values(leaves, sql, "_grp")) \
            .where(F.col("_grp") == F.col("node_lo")).drop("_grp", "node_lo")
        sessions_ = sessions_.join(valued, ["task", "seq"])
    for agg in aggs:
        if agg.is_fold:
            sessions_ = sessions_.join(_fold_values(nodes, agg, every=True), ["task", "seq"])
    return sessions_


def _suppressed(nodes: DataFrame, aggs: list[CompiledAggregation]) -> DataFrame:
    """emit: final by suppress: every session value it released (`emit_seq`: the place in the task's releases,
    `_closed`), and those still buffered at the end (not `_closed`), with `_split` (kept by two tasks)."""
    flags = nodes.select("task", "seq", "released", "pending")
    rows = _merged(nodes.drop("released", "pending"), aggs).join(flags, ["task", "seq"]).where(
        F.col("released").isNotNull() | F.col("pending"))
    tasks = Window.partitionBy("key", "window_start", "window_end")
    return rows.select("key", "window_start", "window_end", *[a.name for a in aggs], F.col("window_end").alias("ts"),
                       F.col("released").alias("emit_seq"), "task", F.col("released").isNotNull().alias("_closed"),
                       (F.min("task").over(tasks) != F.max("task").over(tasks)).alias("_split"))


def _updates(nodes: DataFrame, aggs: list[CompiledAggregation]) -> DataFrame:
    """Per accepted record: its tombstones, then the merged session with the values after it."""
    sessions_ = _merged(nodes, aggs)
    ntomb = F.coalesce(F.size("tomb"), F.lit(0))
    merged = sessions_.select("key", "window_start", "window_end", *[a.name for a in aggs],
                              F.col("window_end").alias("ts"),
                              (F.col("seq") * F.lit(SLOTS) + ntomb).alias("emit_seq"), "task")
    types = dict(merged.dtypes)
    tombs = nodes.where(F.col("tomb").isNotNull()).select(
        "key", "task", "seq", F.posexplode("tomb").alias("_i", "_t")).select(
        "key", F.col("_t.start").alias("window_start"), F.col("_t.end").alias("window_end"),
        *[F.lit(None).cast(types[a.name]).alias(a.name) for a in aggs], F.col("_t.end").alias("ts"),
        (F.col("seq") * F.lit(SLOTS) + F.col("_i")).alias("emit_seq"), "task")
    return merged.unionByName(tombs)


def _final(nodes: DataFrame, aggs: list[CompiledAggregation], windows: SessionWindows,
           final_st: Mapping[int, int]) -> DataFrame:
    """Every session (a merge tree's root) with its values, `_closed` and `_split` (kept by two tasks)."""
    sql = [a for a in aggs if not a.is_fold]
    # in a tree whose root a later session replaced: not in the store; lost: its segment was gone when it closed
    nodes = nodes.where(~F.col("replaced") & ~F.col("lost"))
    root_cols = [F.max_by(F.struct("key", "window_start", "window_end"), F.col("is_root").cast("int")).alias("_r")]
    if sql and any(a.order_sensitive for a in sql):
        valued = nodes.select("task", "root_lo", "is_root", "key", "window_start", "window_end",
                              *_values(nodes, sql, "root_lo")).where("is_root").drop("is_root")
    else:
        valued = nodes.groupBy("task", "root_lo").agg(*root_cols, *[a.aggregate().alias(a.name) for a in sql]) \
            .select("task", "root_lo", "_r.*", *[a.name for a in sql])
    for agg in aggs:
        if agg.is_fold:
            valued = valued.join(_fold_values(nodes, agg, every=False), ["task", "root_lo"])
    task_st = task_stream_time(final_st)
    tasks = Window.partitionBy("key", "window_start", "window_end")
    return valued.select(
        "key", "window_start", "window_end", *[a.name for a in aggs], F.col("window_end").alias("ts"), "task",
        F.coalesce(windows.closed(F.col("window_end"), task_st), F.lit(False)).alias("_closed"),
        (F.min("task").over(tasks) != F.max("task").over(tasks)).alias("_split"))


def _fold_values(nodes: DataFrame, agg: CompiledAggregation, every: bool) -> DataFrame:
    """A fold over each merge tree as a stack program: (task, seq, value) per node if `every`, else
    (task, root_lo, value) per session."""
    record = F.struct(*[F.col(c) for c in FOLD_FIELDS if c in nodes.columns])
    null_record = F.lit(None).cast(nodes.select(record.alias("r")).schema["r"].dataType)
    program = nodes.select("task", "root_lo", F.col("init_idx").alias("i"), F.lit(INIT).alias("op"),
                           null_record.alias("r")).unionByName(
        nodes.select("task", "root_lo", F.col("step_idx").alias("i"), F.lit(STEP).alias("op"), record.alias("r"))
    ).unionByName(nodes.where(F.col("merge_idx").isNotNull()).select(
        "task", "root_lo", F.col("merge_idx").alias("i"), F.lit(MERGE).alias("op"), null_record.alias("r")))
    by_index = "(l, r) -> CASE WHEN l.i < r.i THEN -1 WHEN l.i > r.i THEN 1 ELSE 0 END"
    trees = program.groupBy("task", "root_lo").agg(
        F.expr(f"array_sort(collect_list(struct(i, op, r)), {by_index})").alias("_prog"))
    value = F.expr(stack_program(agg, "_prog", every))
    if not every:
        return trees.select("task", "root_lo", value.alias(agg.name))
    return trees.select("task", F.explode(value).alias("_o")).select(
        "task", F.col("_o.seq").alias("seq"), F.col("_o.v").alias(agg.name))


def stack_program(agg: CompiledAggregation, program: str, every: bool) -> str:
    """Spark SQL evaluating a merge-tree program (INIT, MERGE, STEP r) with a stack of fold values;
    `every`: the value after each STEP as array<struct<seq, v>>, else the final value."""
    assert agg.init is not None and agg.step is not None and agg.merge is not None
    top, below = "element_at(__s.stk, -1)", "element_at(__s.stk, -2)"
    step = _substitute(agg.step, {"acc": top, "__r": "__i.r"})
    merge = _substitute(agg.merge, {"a": below, "b": top})
    init = agg.init
    outs_empty = f"slice(array(named_struct('seq', 0L, 'v', {init})), 1, 0)"
    stepped = f"concat(__s.outs, array(named_struct('seq', __i.r.seq, 'v', {step})))" if every else "__s.outs"
    return (f"aggregate({program}, named_struct('stk', slice(array({init}), 1, 0), 'outs', {outs_empty}), "
            f"(__s, __i) -> CASE WHEN __i.op = {INIT} THEN named_struct('stk', concat(__s.stk, array({init})), "
            f"'outs', __s.outs) "
            f"WHEN __i.op = {MERGE} THEN named_struct('stk', concat(slice(__s.stk, 1, size(__s.stk) - 2), "
            f"array({merge})), 'outs', __s.outs) "
            f"ELSE named_struct('stk', concat(slice(__s.stk, 1, size(__s.stk) - 1), array({step})), "
            f"'outs', {stepped}) END, "
            f"__s -> {'__s.outs' if every else 'element_at(__s.stk, -1)'})")


def _substitute(sql: str, names: dict[str, str]) -> str:
    """Replace the free column names of `sql` (not lambda variables) by SQL expressions."""
    tree = sqlglot.parse_one(sql, read=SparkSQL)
    lambdas = {p.name for lam in tree.find_all(exp.Lambda) for p in lam.expressions}

    def swap(node: exp.Expression) -> exp.Expression:
        if not isinstance(node, exp.Column):
            return node
        parts = [p.name for p in node.parts]
        if parts[0] not in names or parts[0] in lambdas:
            return node
        head = sqlglot.parse_one(names[parts[0]], read=SparkSQL)
        return exp.Dot.build([head, *[exp.to_identifier(p) for p in parts[1:]]]) if len(parts) > 1 else head

    return tree.transform(swap).sql(dialect="spark")
