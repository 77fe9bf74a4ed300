"""Part: commands. A bundled "streaming output" for the demo: what a live Kafka Streams app wrote for one operator.

Derived from the demo's own input, deterministically, by replaying the operator record by record
with the reference engine's window aggregate (docs/semantics.md §4) and three realistic defects:

- restarts: the task restarted right before a few records that a clean replay drops as late; a
  restarted task's processor-local stream time starts over (docs/semantics.md §9), so the live
  app accepted them (-> late_drop_differs);
- duplicates: a few results were written twice (a producer retry, at-least-once; -> duplicate_delivery);
- boundary: the stream kept running after the input archive ends, so it also emitted the windows
  still open at the archive's end (-> range_boundary).

Rows carry the output topic's partition (the key's partition) and offset, in emission order.
"""
from __future__ import annotations

import zlib
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa

from backfill.errors import SpecError
from backfill.jobspec.load import load_job
from backfill.reference.engine import ReferenceResult, WindowAggregate
from backfill.reference.records import read_records


def simulate(job_path: Path, operator: str, restarts: int = 3, duplicates: int = 2,
             partitions: int = 2) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The simulated streaming output of `operator` (final emission) and what was injected."""
    job = load_job(job_path)
    op = job.spec.operator(operator)
    if op.aggregate is None or op.aggregate.emit != "final" or job.spec.sources[
            op.aggregate.input].timestamp.extractor != "record":
        raise SpecError(f"operators.{operator}: the stream sample simulates a final window aggregate over record "
                        "timestamps")
    by_partition = _records(job, op.aggregate.input)
    clean = _replay(op, by_partition, {})
    late = sorted((r for r in clean.ledger if r["reason"] == "late"), key=lambda r: (r["partition"], r["offset"]))
    picked = [late[i * len(late) // restarts] for i in range(restarts)] if late and restarts else []
    restart_at = defaultdict(set)
    for r in picked:
        restart_at[r["partition"]].add(r["offset"])
    live = _replay(op, by_partition, restart_at)
    rows = list(live.outputs[operator]) + [{k: v for k, v in r.items() if k not in ("stream_time", "task")}
                                            for r in live.incomplete[operator]]
    rows = _with_offsets(rows, partitions, duplicates)
    facts = {"operator": operator, "rows": len(rows), "restarts_before": [f"{r['partition']}@{r['offset']}"
                                                                          for r in picked],
             "duplicated": duplicates, "still_open_at_archive_end": len(live.incomplete[operator])}
    return rows, facts


def write_stream_sample(job_path: Path, operator: str, path: Path) -> dict[str, Any]:
    """Simulate and write the streaming output as a Delta table (an archived output topic)."""
    from deltalake import write_deltalake

    rows, facts = simulate(job_path, operator)
    columns = list(rows[0].keys()) if rows else ["key", "window_start", "window_end", "ts", "partition", "offset"]
    table = pa.Table.from_pylist(rows, schema=_schema(rows, columns))
    write_deltalake(str(path), table, mode="overwrite")
    return {**facts, "path": str(path)}


def _records(job: Any, source: str) -> dict[int, list[dict[str, Any]]]:
    """Readable records per partition in offset order, with the record timestamp as `ts`."""
    out: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for rec in read_records(job, source):
        if rec["_problem"] is None and rec["timestamp"] is not None and rec["timestamp"] >= 0:
            out[rec["partition"]].append({**rec, "ts": rec["timestamp"]})
    for recs in out.values():
        recs.sort(key=lambda r: r["offset"])
    return out


def _replay(op: Any, by_partition: dict[int, list[dict[str, Any]]], restart_at: dict[int, set[int]]) -> ReferenceResult:
    """One task per partition; at a restart offset the processor's stream time starts over (state is kept)."""
    result = ReferenceResult(job="stream-sample", start=None, end=None)
    result.outputs[op.name], result.incomplete[op.name] = [], []
    for partition in sorted(by_partition):
        agg = WindowAggregate(op, partition, result)
        agg.release_at_close = False  # a window a restart re-opened is emitted once, with every record it took
        for seq, rec in enumerate(by_partition[partition], start=1):
            if rec["offset"] in restart_at.get(partition, ()):
                agg.stream_time = -1  # restored state, fresh processor-local stream time (docs/semantics.md §9)
            agg.process(rec, seq)
        agg.finish()
    return result


def partition_for(key: str, partitions: int) -> int:
    """A stable key -> partition map (crc32), so one key always lands in one partition like a producer's."""
    return zlib.crc32(key.encode()) % partitions


def _with_offsets(rows: list[dict[str, Any]], partitions: int, duplicates: int) -> list[dict[str, Any]]:
    """Output partition by key, offsets in emission order; a few rows written twice in a row."""
    rows = sorted(rows, key=lambda r: (r["window_end"], str(r["key"])))
    twice = {i * len(rows) // (duplicates + 1) for i in range(1, duplicates + 1)} if rows and duplicates else set()
    offsets = [0] * partitions
    out = []
    for i, row in enumerate(rows):
        for _ in range(2 if i in twice else 1):
            part = partition_for(str(row["key"]), partitions)
            out.append({**row, "partition": part, "offset": offsets[part]})
            offsets[part] += 1
    return out


def _schema(rows: list[dict[str, Any]], columns: list[str]) -> pa.Schema:
    """Longs for times, counts and offsets; doubles for numbers; strings otherwise."""
    fields = []
    for c in columns:
        values = [r.get(c) for r in rows if r.get(c) is not None]
        if c == "partition":
            kind = pa.int32()
        elif values and all(isinstance(v, bool) for v in values):
            kind = pa.bool_()
        elif values and all(isinstance(v, int) for v in values):
            kind = pa.int64()
        elif values and all(isinstance(v, (int, float)) for v in values):
            kind = pa.float64()
        else:
            kind = pa.string()
        fields.append(pa.field(c, kind))
    return pa.schema(fields)
