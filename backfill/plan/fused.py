"""Part: plan. The one pass: counts, ledger rows and output of a job whose only operator can take it, in ONE
aggregation over the ordered records, storing its groups (a few rows per window) instead of the records.

The general path (plan/evaluator.py) stores the ordered records and reads them three times: the counting
pass, the ledger candidates and the operator. Here the ordered records flow once through:

- an Observation, which counts them as the counting pass does (evaluator.stat_columns), per drop category
  of the job's one source;
- the operator's `fused_rows` (ops/aggregate.py), which explodes each record into rows tagged with what they
  are (`_g`): RECORD, one per record that may give a ledger row of its own (dropped by its source, null key);
  WINDOW, one per accepted (record, window); LATE, one per refused (record, window);
- one aggregation: WINDOW rows grouped by (task, key, window start) are the output, the others are ledger rows.
  A hopping window of size a multiple of its advance is aggregated by pane (`WindowAggregate.panes`): a
  record's accepted windows are ONE row, grouped by (key, pane, late windows), and the panes' partial
  aggregates are merged into their windows by a second aggregation over the (far fewer) pane groups. Both
  group by task too: the records are spread by task for ordering, so neither aggregation shuffles (a large
  input ordered in chunks shuffles pane groups twice: per chunk, then by (task, key) for the merge).

The group columns of a row are null except those of its kind, and the kind is part of the group, so a group
only ever holds rows of one kind: a window group aggregates its records, a ledger group copies of one record
(`_n` of them: a source may hold duplicates). The value is hidden from the rows that are not windows, so the
output aggregations (which read nothing but the value, `fuses()`) compute nothing on the other groups.

Measured at 10M records (benchmarks/README.md): storing the records, the three scans of them and the
garbage they make cost more than the aggregation itself.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql import Column, DataFrame, Observation
from pyspark.sql import functions as F

from backfill.errors import BackfillError
from backfill.ledger import CONFLICTING_OFFSET, UNREADABLE
from backfill.ops.aggregate import LATE_PAIR, RECORD, WINDOW, WindowAggregate, repeated
from backfill.ops.base import OperatorCounts, OperatorResult
from backfill.plan import offsets
from backfill.session import observed
from backfill.time.extract import INVALID

if TYPE_CHECKING:
    from backfill.plan.definition import Plan

# the columns of a ledger row's record
_LEDGER = ("source", "topic", "partition", "offset", "key", "ts")
_RECORD_ONLY = ("_drop", "_problem", "_where", "_raw_ts", "_partition_time", *offsets.COLUMNS)


def fusable(plan: Plan) -> WindowAggregate | None:
    """The plan's operator when the one pass can run it: one source, one operator that `fuses()`, in the
    merge order."""
    if plan.given_order or len(plan.operators) != 1 or len(plan.sources) != 1:
        return None
    op = plan.operators[0]
    return op if op.one_pass() and isinstance(op, WindowAggregate) else None


@dataclass(frozen=True)
class Counted:
    """The one pass's counts: observed while its groups are computed."""

    seen: Observation
    ordered: DataFrame
    columns: list[Column]

    def get(self) -> dict[str, Any]:
        """The counts; when Spark observed nothing (it skips the pass over an empty input), one aggregation."""
        return observed(self.seen, self.ordered, self.columns)


def one_pass(op: WindowAggregate, ordered: DataFrame, live: Column, counting: list[Column],
             spread: int | None = None) -> tuple[DataFrame, Counted]:
    """The groups of the one pass (not yet computed) and the counts of its records, observed when the groups
    are computed (`counting`: the counting pass's aggregations, over all records, reading the operator's
    `late_columns()`: computed once per record here, for the counts and the rows alike).

    `spread` (a large input: order/tasks.py spread_partitions): the pane groups are spread over this many
    Spark partitions by (task, key) before they are merged into windows."""
    unreadable = F.col("_drop").startswith("unreadable")
    conflicting = F.col("_drop") == CONFLICTING_OFFSET
    late = op.late_refs()
    columns = [F.struct(*counting).alias("_counts"),
               F.count(F.when(unreadable, 1)).alias("_unreadable"),
               F.count(F.when(conflicting, 1)).alias("_conflicting"),
               F.count(F.when(F.col("_drop").isNotNull() & ~unreadable & ~conflicting, 1)).alias("_invalid"),
               F.count(F.when(F.col("_fatal").isNotNull(), 1)).alias("_fatal"), op.fused_pairs(live, late)]
    ordered = ordered.withColumns(op.late_columns())
    counted = Counted(Observation(), ordered, columns)
    ordered = ordered.observe(counted.seen, *columns)
    # a record with copies left out or a gap before it has a row too, for the run's report (plan/offsets.py)
    record_row = F.col("_drop").isNotNull() | F.col("key").isNull() | F.col("_copies").isNotNull() \
        | F.col("_gap").isNotNull()
    panes = op.panes()
    rows = op.fused_rows(ordered, live, record_row, panes is not None, late)
    kind = F.col("_g")
    # a ledger row's record, one column: a window row's group has one null there instead of a dozen
    fields = list(dict.fromkeys(c for c in (*_LEDGER, op.stream_time, *_RECORD_ONLY) if c in rows.columns))
    groups = {"_group_key": F.when(kind == WINDOW, F.col("key")),
              "_group_window_start": F.when(kind.isin(WINDOW, LATE_PAIR), F.col("_mark")),
              "_group_record": F.when(kind.isin(RECORD, LATE_PAIR), F.struct(*fields))}
    if panes is not None:  # a pane's records of a key with as many late windows (the window start is the pane's)
        groups["_group_late"] = F.col("_late")
    keyed = rows.select(
        *[c for c in rows.columns if c != "value"],
        F.when(kind == WINDOW, F.col("value")).alias("value"),  # the output aggregations read only the value
        *[value.alias(name) for name, value in groups.items()])
    # grouped in their task too: the records are spread by task already, so no group is shuffled again, and
    # the panes of a window meet in its task (keys of one task only: a key in several tasks gives several
    # windows, which FinalWindows refuses to publish)
    by = ["task"]
    if panes is not None and "_chunk" in keyed.columns:
        # a large input ordered chunk by chunk is spread by (task, chunk): its panes are grouped in their chunk
        # first, then the parts of a key's panes meet by (task, key), spread over all shuffle partitions (by
        # task alone, a task's every window would be merged in one Spark task). Spark does not know how the
        # stored chunks are spread, so the chunk groups are shuffled too: two shuffles of pane groups, far
        # fewer rows than the records
        by.append("_chunk")
    out = keyed.groupBy("_g", *groups, *by).agg(F.count(F.lit(1)).alias("_n"), *op.fused_aggregations(panes))
    if panes is not None:
        if "_chunk" in by:
            out = out.drop("_chunk").repartition("task", "_group_key")
        elif spread:
            # by task alone, one Spark task merges a Kafka partition's every window: at 100M records, 10-20M
            # windows in one hash map, which spilled 3.5 GB and fell back to sorting (benchmarks/README.md).
            # Spread by (task, key), each merge holds a slice; the pane groups, a fifth of the records at
            # 100M, are shuffled once more
            out = out.repartition(spread, "task", "_group_key")
        out = panes.merge(out, ["_g", *groups, "task"])
    record = F.col("_group_record")
    named = {"key": F.coalesce(F.col("_group_key"), record["key"]), "window_start": F.col("_group_window_start"),
             **{c: record[c] for c in fields if c != "key"}}
    return (out.select("_g", *[value.alias(name) for name, value in named.items()],
                       *[c for c in out.columns if c != "_g" and c not in groups]), counted)


def stat_rows(plan: Plan, op: WindowAggregate, tasks: Tasks, seen: Counted) -> list[dict[str, Any]]:
    """The counting pass's rows (evaluator.apply_stats) from the observation: per drop category of the one
    source (not dropped, unreadable, invalid timestamp), and per task its operator's stream time at the end
    of the data, which is the newest `ts` of its windows (the record with the task's newest timestamp is
    always inside a window it is not late for)."""
    counted = seen.get()
    source = plan.sources[0].name
    rows: list[dict[str, Any]] = []
    # its sums are those of the counting pass's rows: the operator's counts are of records not dropped, and
    # how many records each drop category holds is counted on its own
    row = {**counted["_counts"].asDict(), "source": source, "_drop": None, "_fatal": None, "task": None,
           op.stat("st"): None}
    dropped = {UNREADABLE: counted["_unreadable"], INVALID: counted["_invalid"],
               CONFLICTING_OFFSET: counted["_conflicting"]}
    rows.append({**row, "n": row["n"] - sum(dropped.values())})
    nothing = {op.stat(k): 0 for k in ("in", "nullkey", "contrib", "all_late", "late")}
    rows += [{**row, **nothing, "_drop": drop, "n": n, "beyond": 0} for drop, n in dropped.items() if n]
    if counted["_fatal"]:
        rows.append({"source": source, "_drop": None, "_fatal": "fatal", "task": None})
        return rows  # apply_stats fails on it
    # the counts are accumulated as records pass: a stage that ran twice would have counted twice, which the
    # pairs its windows hold would show (never silently: nothing is published on a mismatch)
    pairs = sum(r["pairs"] for r in tasks.rows)
    if pairs != (counted["_accepted_pairs"] or 0):
        raise BackfillError(f"internal error: operators.{op.name}: the one pass counted "
                            f"{counted['_accepted_pairs'] or 0} accepted (record, window) pairs and its windows "
                            f"hold {pairs}; nothing was published (please report it)")
    for r in tasks.rows:
        rows.append({"source": source, "_drop": None, "_fatal": None, "task": r["task"], "n": 0, "beyond": 0,
                     **nothing, op.stat("st"): r["st"], "topic_lo": None, "topic_hi": None})
    return rows


@dataclass(frozen=True)
class Tasks:
    """Per task of the one pass: its windows' newest `ts` (`st`) and accepted pairs (`pairs`); `one_task_keys`:
    no key has windows in two tasks (then no window can be kept by two, whatever the range published)."""

    rows: list[Any]
    one_task_keys: bool


def window_tasks(groups: DataFrame) -> Tasks:
    """The windows per task, and whether each key's windows are in one task, in one job: grouped by key (the
    windows of a key in one task give one row), then by the key's lowest task. When a key is in several tasks
    (never with Kafka's partitioning: FinalWindows refuses to publish it) the rows are counted by task again."""
    windows = groups.where(F.col("_g") == WINDOW)
    found = windows.groupBy("key").agg(
        F.min("task").alias("task"), (F.min("task") != F.max("task")).alias("_split"),
        F.max("_window_ts").alias("st"), F.sum("_n").alias("pairs")).groupBy("task").agg(
        F.max("st").alias("st"), F.sum("pairs").alias("pairs"), F.max("_split").alias("_split")).collect()
    if not any(r["_split"] for r in found):
        return Tasks(found, True)
    return Tasks(windows.groupBy("task").agg(F.max("_window_ts").alias("st"), F.sum("_n").alias("pairs")).collect(),
                 False)


def results(op: WindowAggregate, groups: DataFrame, counts: OperatorCounts, stored: list[DataFrame] | None = None,
            one_task_keys: bool = False) -> tuple[dict[str, OperatorResult], DataFrame]:
    """The operator's result and the records that may give ledger rows (for the source drops).

    The ledger's groups (a few percent of the groups) are stored apart when first read, which appends them
    to `stored`: their three readers (source drops, null keys, late windows) then scan them, not every window
    again (at 100M records, three scans of 39M windows took 29 s)."""
    ledger_groups = groups.where(F.col("_g") != WINDOW).localCheckpoint(eager=False)
    if stored is not None:
        stored.append(ledger_groups)
    records = repeated(ledger_groups.where(F.col("_g") == RECORD))
    return {op.name: op.fused_result(groups, records, counts, ledger_groups, one_task_keys)}, records
