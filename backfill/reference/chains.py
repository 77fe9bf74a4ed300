"""Part: reference engine. Chains, one record at a time (docs/semantics.md §18): an operator that reads another
operator's output reads the rows that operator forwarded, per task, in the order it forwarded them.

Kafka Streams forwards depth-first: each row goes through the downstream processor right after the upstream
record that produced it, in the same task. The downstream keeps its own stream time over what reaches it, so
it sees exactly the upstream's emission order per task: replaying that order after the upstream ran is the same
replay. A re-keyed downstream (`group_by`) writes the rows to its repartition topic from the upstream task, as
a re-keyed source does (§13).
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any

from backfill.jobspec.models import OperatorSpec
from backfill.jobspec.topology import tombstones


def release(released: list[dict[str, Any]], row: dict[str, Any], task: int) -> None:
    """Keep an `emit: final` row as its operator forwards it: with its `task` and its place in that task's
    emission order (`emit_seq`, docs/semantics.md §18.2), for the operators that read it."""
    released.append({**row, "emit_seq": len(released), "task": task})


def forwarded(up: OperatorSpec, rows: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """Per task, the rows `up` forwarded as records of a derived source named after it (§18.1-§18.2): `partition`
    the task, `offset` the place in the task's emission order (by `emit_seq`), `ts` the output timestamp."""
    by_task: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in sorted(rows, key=lambda r: (r["task"], r["emit_seq"])):
        by_task[row["task"]].append(row)
    return {task: [as_record(up, task, i, row) for i, row in enumerate(task_rows)]
            for task, task_rows in sorted(by_task.items())}


def as_record(up: OperatorSpec, task: int, offset: int, row: dict[str, Any]) -> dict[str, Any]:
    """One forwarded row as a record of the derived source `up.name` (§18.1)."""
    return {"source": up.name, "topic": up.name, "partition": task, "offset": offset, "key": row["key"],
            "value": value_of(up, row), "timestamp": row["ts"], "ts": row["ts"], "headers": None, "_problem": None}


def value_of(up: OperatorSpec, row: dict[str, Any]) -> Any:
    """What the downstream reads as `value` (§18.2): a join's result as it is; an aggregate's window bounds and
    aggregation columns, null for a tombstone (a session merged away, a fold that deleted its key)."""
    if up.aggregate is None:
        return row["value"]
    names = list(up.aggregate.aggregations)
    if tombstones(up) and all(row[n] is None for n in names):
        return None
    bounds = ["window_start", "window_end"] if up.aggregate.window is not None else []
    return {c: row[c] for c in bounds + names}

