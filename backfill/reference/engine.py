"""Part: reference engine. The reference engine (docs/architecture.md): one record at a time, as literally as the spec
reads.

RecordQueue per input partition (offset order, lazy timestamp extraction, docs/semantics.md §1),
PartitionGroup per task and sub-topology (Java's heap of queues keyed by head timestamp, §2.2-§2.5), and
each operator with its own stream time and per-task state (§3.1). It is the oracle of the property
tests and runs tiny jobs with `--engine reference`; it is never the fast path.
"""
from __future__ import annotations

import heapq
import time
from collections import defaultdict
from dataclasses import dataclass, field
from collections.abc import Callable, Iterator
from typing import Any

from backfill.errors import SourceError
from backfill.jobspec import versions
from backfill.jobspec.load import Job
from backfill.jobspec.models import FoldAggregation, OperatorSpec, TimestampSpec
from backfill.jobspec.rekeys import NOT_REPARTITIONED, copied, rekeys, subtopologies
from backfill.jobspec.topology import chain_order, in_task, task_count, upstream
from backfill.reference.expr import compile_aggregate, compile_fold
from backfill.reference.filters import Filters
from backfill.reference.chains import as_record, forwarded, release
from backfill.reference.flinkrules import run_rules
from backfill.reference import offsets
from backfill.reference.join import StreamJoin
from backfill.reference.partition_group import partition_group
from backfill.reference.records import json_object, ledger_row, read_records
from backfill.reference.repartition import AsIs, Repartition
from backfill.reference.rules import Windows, check_copartitioned, check_supported, read_bounds
from backfill.reference.session import SessionAggregate
from backfill.reference.sliding import SlidingAggregate
from backfill.reference.suppress import SuppressBuffer, key_bytes
from backfill.reference.table import TableAggregate, TableJoin


@dataclass
class ReferenceResult:
    """Outputs per operator (emission order), open windows, the ledger and the processing order."""

    job: str
    start: int | None
    end: int | None
    outputs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    incomplete: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    ledger: list[dict[str, Any]] = field(default_factory=list)
    order: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    # per re-keyed operator, each of its tasks' processing order: the input records (source, partition, offset)
    # behind what its repartition topics and the inputs it reads as they are gave it (docs/semantics.md §13)
    downstream_order: dict[str, dict[int, list[dict[str, Any]]]] = field(default_factory=dict)
    records_read: dict[str, int] = field(default_factory=dict)
    duplicates: dict[str, dict[str, int]] = field(default_factory=dict)  # docs/semantics.md §7.2
    gaps: dict[str, dict[str, Any]] = field(default_factory=dict)
    filtered: dict[str, int] = field(default_factory=dict)  # per operator: records its `where` dropped
    # per `emit: final` operator whose output rows carry no `emit_seq` (time windows; sliding and session windows
    # emitted on close): its rows as forwarded, with `task` and `emit_seq` (docs/semantics.md §18.2)
    released: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    duration_s: float = 0.0
    filters: Filters | None = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """Summary plus every output and ledger row (reference runs are small)."""
        reasons: dict[str, int] = defaultdict(int)
        for row in self.ledger:
            reasons[row["reason"]] += 1
        return {"engine": "reference", "job": self.job, "start": self.start, "end": self.end,
                "records_read": self.records_read, "records_in": sum(self.records_read.values()),
                "ledger": dict(reasons), "duplicates": self.duplicates, "gaps": self.gaps,
                "filtered": self.filtered, "outputs": self.outputs, "incomplete": self.incomplete,
                "ledger_rows": self.ledger, "duration_s": round(self.duration_s, 3)}


class Queue:
    """RecordQueue: one input partition, consumed in offset order; timestamps extracted at the head."""

    def __init__(self, source: str, rank: int, records: list[dict[str, Any]], spec: TimestampSpec,
                 on_error: str, result: ReferenceResult, start: int | None, until: int | None,
                 given_order: bool = False) -> None:
        self.source, self.rank = source, rank
        # offset order; an unreadable record after the readable copies of its offset (docs/semantics.md §7.2)
        self.items = sorted(records, key=lambda r: (r["offset"], r["_problem"] is not None))
        self.topic = str(self.items[0]["topic"]) if self.items else source
        self.spec, self.on_error, self.result = spec, on_error, result
        self.start, self.until = start, until
        self.given_order = given_order
        self.partition_time = -1  # max timestamp dequeued so far (RecordQueue#poll)
        # the same but for copies of an offset whose copies differ: what replaces an invalid timestamp (§7.2)
        self.replacement_time = -1
        self.processed_time = -1  # the same over the records this run processes (not those before --start)
        self.pos = 0
        self.head: dict[str, Any] | None = None
        self._advance()

    def _advance(self) -> None:
        """Make the next processable record the head, skipping (and ledgering) what never gets processed."""
        self.head = None
        while self.pos < len(self.items):
            rec = self.items[self.pos]
            self.pos += 1
            if self.until is not None and self.partition_time >= self.until:
                return  # beyond the cool-down: this partition is done for this range
            if rec.get("_conflict") is not None:  # its offset's copies differ (its source does not fail on it)
                self._ledger(rec, "conflicting_offset", f"its copies differ in {rec['_conflict']}", rec["_ts"])
                continue
            if rec["_problem"] is not None:
                if self.on_error == "fail":
                    raise SourceError(f"sources.{self.source}: record {rec['topic']}/{rec['partition']}@"
                                      f"{rec['offset']} is unreadable ({rec['_problem']})")
                self._ledger(rec, "unreadable", rec["_problem"], None)
                continue
            ts = self._extract(rec)
            if ts is None:
                continue
            rec["ts"] = ts
            if self.start is not None and ts < self.start:
                self._passed(rec, ts)
                continue  # before the warm-up bound: not part of this run
            self.head = rec
            return

    def _extract(self, rec: dict[str, Any]) -> int | None:
        raw = rec["timestamp"] if self.spec.extractor == "record" else _field(rec["value"], self.spec.field or "")
        if raw is not None and raw >= 0:
            return int(raw)
        where = f"sources.{self.source}: record {rec['topic']}/{rec['partition']}@{rec['offset']}"
        if self.spec.on_invalid == "fail":
            raise SourceError(f"{where} has an invalid timestamp ({raw})")
        if self.spec.on_invalid == "partition_time":
            if self.replacement_time < 0:
                raise SourceError(f"{where} has an invalid timestamp ({raw}) and no partition time yet")
            return self.replacement_time
        self._ledger(rec, "invalid_timestamp", None, raw)
        return None

    def _ledger(self, rec: dict[str, Any], reason: str, detail: str | None, raw: Any) -> None:
        ptime = self.partition_time if self.partition_time >= 0 else None
        self.result.ledger.append(ledger_row(rec, None, reason, raw, ptime, None, detail=detail, range_time=ptime))

    def _passed(self, rec: dict[str, Any], ts: int) -> None:
        self.partition_time = max(self.partition_time, ts)
        if not rec.get("_differs"):
            self.replacement_time = max(self.replacement_time, ts)

    def poll(self) -> dict[str, Any]:
        """Dequeue the head; partition time := max(partition time, ts)."""
        rec = self.head
        assert rec is not None
        self._passed(rec, rec["ts"])
        self.processed_time = max(self.processed_time, rec["ts"])
        self._advance()
        return rec


def _field(value: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


class WindowAggregate:
    """KStreamWindowAggregate for one task: own stream time, per-window state, emit updates or final."""

    def __init__(self, op: OperatorSpec, task: int, result: ReferenceResult) -> None:
        spec = op.aggregate
        assert spec is not None
        self.op, self.task, self.result = op, task, result
        self.windows = Windows.of(op)
        self.emit = spec.emit
        self.aggs = {name: (compile_fold(a.fold.init, a.fold.step) if isinstance(a, FoldAggregation)
                            else compile_aggregate(a)) for name, a in spec.aggregations.items()}
        self.stream_time = -1
        self.store: dict[tuple[Any, int], dict[str, Any]] = {}
        # emit: final: the rows in the order forwarded, numbered per task (docs/semantics.md §4.5, §18.2)
        self.released: list[dict[str, Any]] = []
        # emit on window close: at the record that closes them; False: every closed window at the end of the data,
        # with its last value (the demo's simulated stream, whose restarts update windows a clean run closed)
        self.release_at_close = True
        # emit: final by suppress(untilWindowCloses): every update goes through its buffer (duration: grace)
        self.suppress = (SuppressBuffer(self.windows.grace, self.released, task, numbered=True)
                         if self.emit == "final" and spec.close_mechanism == "suppress" else None)

    def process(self, rec: dict[str, Any], seq: int) -> None:
        """docs/semantics.md §4.2-§4.5, for one record."""
        if rec["key"] is None:  # step 1: dropped, stream time not advanced
            st = self.stream_time if self.stream_time >= 0 else None
            self.result.ledger.append(ledger_row(rec, self.op.name, "null_key", rec["ts"], st, None,
                                                  range_time=rec["ts"]))
            return
        t = rec["ts"]
        self.stream_time = max(self.stream_time, t)  # step 3
        close = self.stream_time - self.windows.grace
        for idx, start in enumerate(self.windows.starts_for(t)):
            end = start + self.windows.size
            if end <= close:  # step 5: end must be strictly greater than ST - G
                self.result.ledger.append(ledger_row(rec, self.op.name, "late", t, self.stream_time,
                                                      (start, end), range_time=start))
                continue
            state = self.store.get((rec["key"], start))
            if state is None:
                state = {"agg": {n: a.init() for n, a in self.aggs.items()}, "ts": t}
                self.store[(rec["key"], start)] = state
            state["ts"] = max(state["ts"], t)
            row = {"key": rec["key"], "value": rec["value"], "ts": t, "timestamp": rec["timestamp"],
                   "topic": rec["topic"], "partition": rec["partition"], "offset": rec["offset"]}
            state["agg"] = {n: a.add(state["agg"][n], row) for n, a in self.aggs.items()}
            if self.emit == "updates":
                self.result.outputs[self.op.name].append(
                    {**self._row(rec["key"], start, state), "emit_seq": seq * self.windows.per_record + idx,
                     "task": self.task})
            elif self.suppress is not None:  # buffer time: the window's end
                self.suppress.put((rec["key"], start), end, key_bytes(rec["key"]) + start.to_bytes(8, "big"),
                                  self._row(rec["key"], start, state), state["ts"])
        if self.emit == "final" and self.suppress is None and self.release_at_close:
            self._emit_closed()

    def _emit_closed(self) -> None:
        """emitStrategy(onWindowClose()): after each record that reached it, the windows of its store that closed
        (end <= stream time - G) since its last emission, by window start, then serialized key (§4.5)."""
        close = self.stream_time - self.windows.grace
        due = sorted((start, key_bytes(key), key) for key, start in self.store if start + self.windows.size <= close)
        for start, _, key in due:
            row = self._row(key, start, self.store.pop((key, start)))
            release(self.released, row, self.task)

    def _row(self, key: Any, start: int, state: dict[str, Any]) -> dict[str, Any]:
        return {"key": key, "window_start": start, "window_end": start + self.windows.size,
                **{n: a.result(state["agg"][n]) for n, a in self.aggs.items()}, "ts": state["ts"]}

    def finish(self) -> None:
        """At the end of the data: closed windows are final (ST >= end + G), the rest are incomplete; under
        suppress, what its buffer still holds is incomplete."""
        if self.emit != "final":
            return
        if self.suppress is None:
            self._emit_closed()
        self.result.released.setdefault(self.op.name, []).extend(self.released)
        self.result.outputs[self.op.name] += [{k: v for k, v in row.items() if k not in ("emit_seq", "task")}
                                              for row in self.released]
        pending = (self.suppress.pending() if self.suppress is not None else
                   [self._row(key, start, state) for (key, start), state in
                    sorted(self.store.items(), key=lambda kv: (kv[0][1], key_bytes(kv[0][0])))])
        self.result.incomplete[self.op.name] += [{**row, "stream_time": self.stream_time, "task": self.task}
                                                 for row in pending]


def run_reference(job: Job, start: int | None = None, end: int | None = None) -> ReferenceResult:
    """Replay `job` record by record; keep the outputs and ledger rows of the range [start, end)."""
    started = time.time()
    result = ReferenceResult(job=job.spec.name, start=start, end=end)
    result.filters = Filters(job.spec.operators, result.filtered)
    for op in job.spec.operators:
        check_supported(op)
        result.outputs[op.name], result.incomplete[op.name] = [], []
    if any(op.rules is not None for op in job.spec.operators):
        _run_rules(job, result)
        _apply_range(job, result)
        result.duration_s = time.time() - started
        return result
    bounds = read_bounds(job, start, end)
    queues_by_task: dict[int, list[Queue]] = defaultdict(list)
    partitions: dict[str, int] = {}
    for rank, (name, spec) in enumerate(job.spec.sources.items()):
        records, left_out = offsets.one_per_offset(read_records(job, name), name, spec.on_error, spec.timestamp,
                                                   bounds[name][0])
        result.records_read[name] = len(records)
        if left_out:
            result.duplicates[name] = left_out
        if bounds[name][0] is None:  # a run from a warm-up bound does not read the offsets before it
            found = offsets.gaps(records, offsets.covered(job.resolve(spec.path or "")) if spec.format == "delta"
                                 else None)
            if found:
                result.gaps[name] = found
        for rec in records:  # a record with a partition and an offset waits in its queue; the others cannot
            if rec["partition"] is not None and rec["offset"] is not None:
                continue
            if spec.on_error == "fail":
                raise SourceError(f"sources.{name}: a record is unreadable ({rec['_problem']})")
            result.ledger.append(ledger_row(rec, None, "unreadable", None, None, None, detail=rec["_problem"]))
        # a source is one topic: a record without a topic of its own is in its partition's queue (§7.2)
        by_partition: dict[Any, list[dict[str, Any]]] = defaultdict(list)
        for rec in records:
            if rec["partition"] is not None and rec["offset"] is not None:
                by_partition[rec["partition"]].append(rec)
        partitions[name] = spec.partitions or max((p + 1 for p in by_partition), default=0)
        read_from, read_until = bounds[name]
        for partition, recs in sorted(by_partition.items()):
            queues_by_task[partition].append(Queue(name, rank, recs, spec.timestamp, spec.on_error, result,
                                                   read_from, read_until, given_order=bool(spec.order_by)))
    for op in job.spec.operators:
        if op.join is not None and not rekeys(op):  # co-partitioned inputs (declared, else max partition + 1)
            check_copartitioned({s: partitions.get(s, 0) if op.reads_source(s) else
                                 task_count(job.spec.operator(s), job.spec.operators, lambda n: partitions.get(n, 0))
                                 for s in op.inputs}, op.name)
    repartitions = _routes(job, partitions)
    for task in sorted(queues_by_task):
        _run_task(job, task, queues_by_task[task], result, repartitions)
    for name, routes in repartitions.items():  # the downstream tasks, each reading its partitions
        if upstream(job.spec.operator(name), job.spec.operators) is None:
            _run_downstream(job, job.spec.operator(name), list(routes.values()), result)
    for op in chain_order(job.spec.operators):  # each after the operator it reads (docs/semantics.md §18)
        if in_task(op, job.spec.operators):
            continue  # run by _run_task, beside the records of its tasks (§18.7-§18.8)
        _run_chained(job, op, result, partitions, list(repartitions.get(op.name, {}).values()))
    _apply_range(job, result)
    result.duration_s = time.time() - started
    return result


def _run_rules(job: Job, result: ReferenceResult) -> None:
    """Rules operators (docs/semantics.md §12): every record of both sources, each source's ledger rows first."""
    records: dict[str, list[dict[str, Any]]] = {}
    for rank, (name, spec) in enumerate(job.spec.sources.items()):
        recs, left_out = offsets.one_per_offset(read_records(job, name, raw_json=True), name, spec.on_error,
                                                spec.timestamp)
        result.records_read[name] = len(recs)
        if left_out:
            result.duplicates[name] = left_out
        by_partition: dict[Any, list[dict[str, Any]]] = defaultdict(list)
        for rec in recs:
            if rec["partition"] is None or rec["offset"] is None:
                if spec.on_error == "fail":
                    raise SourceError(f"sources.{name}: a record is unreadable ({rec['_problem']})")
                result.ledger.append(ledger_row(rec, None, "unreadable", None, None, None, detail=rec["_problem"]))
                continue
            by_partition[rec["partition"]].append(rec)
        records[name] = []
        for recs_of_partition in by_partition.values():
            queue = Queue(name, rank, recs_of_partition, spec.timestamp, spec.on_error, result, None, None,
                          given_order=bool(spec.order_by))
            while queue.head is not None:
                records[name].append(queue.poll())
    given = all(spec.order_by for spec in job.spec.sources.values())
    for op in job.spec.operators:
        assert op.rules is not None
        tx = records[op.rules.input]
        if result.filters is not None:  # the condition reads the transaction's fields as JSON
            tx = [r for r in tx if result.filters.passes(op.name, op.rules.input, {**r, "value": json_object(r["value"])
                                                                                  if r["value"] is not None else None})]
        run_rules(op, tx, records[op.rules.rules], given, result)


def _routes(job: Job, partitions: dict[str, int]) -> dict[str, dict[str, Repartition | AsIs]]:
    """Per re-keyed operator, where each input's records go: a repartition topic, or (a join input kept as it
    is) the join's own tasks."""
    rules = versions.profile(job.spec.kafka_streams)
    ranks = {name: rank for rank, name in enumerate(job.spec.sources)}
    routes: dict[str, dict[str, Repartition | AsIs]] = {}
    for op in job.spec.operators:
        topics = rekeys(op, rules.join_null_keys_reach_join)
        if not topics:
            continue
        # a chained join: its source input's records are routed here, _run_chained writes the operator's rows
        n = task_count(op, job.spec.operators, lambda source: partitions.get(source) or 1)
        routes[op.name] = {r.input: Repartition(r, n, ranks[r.input]) for r in topics if r.input in ranks}
        routes[op.name].update({src: AsIs(name, ranks[src]) for src, name in copied(op)})
    return routes


def _run_task(job: Job, task: int, queues: list[Queue], result: ReferenceResult,
              repartitions: dict[str, dict[str, Repartition | AsIs]]) -> None:
    """PartitionGroup#nextRecord: pick the queue whose head has the smallest timestamp (ties: source rank).
    A re-keyed operator's records go to its repartition topic instead (12)."""
    rules = versions.profile(job.spec.kafka_streams)
    specs = job.spec.operators
    ops = {op.name: _processor(op, task, result, rules) for op in specs
           if op.name not in repartitions and (upstream(op, specs) is None or in_task(op, specs))}
    # the operators that read another in its task: each row it forwards goes through them at once (§18.7-§18.8)
    readers = {up.name: [op for op in specs if in_task(op, specs) and upstream(op, specs) is up]
               for up in specs}
    emitted: dict[str, int] = defaultdict(int)  # per upstream, its rows forwarded in this task so far
    seq = 0
    order = result.order.setdefault(task, [])
    groups = subtopologies(job.spec.operators, list(job.spec.sources))
    for queue, rec in _task_order(queues, given=any(q.given_order for q in queues),
                                  group=lambda q: groups.get(q.source, 0)):
        seq += 1
        # a join in its table aggregate's tasks comes last: when it reads the aggregate's own input, the record
        # reaches the aggregate first (its processor node was added first), so the join sees its update (§18.7)
        for op in sorted(specs, key=lambda o: in_task(o, specs)):
            if queue.source not in op.inputs or (upstream(op, specs) is not None and not in_task(op, specs)
                                                 and queue.source not in repartitions.get(op.name, {})):
                continue
            if result.filters is not None and not result.filters.passes(op.name, queue.source, rec):
                continue  # KStream#filter: it never reaches the operator (docs/semantics.md §15)
            if op.name in repartitions:
                _rekey(op, repartitions[op.name][queue.source], rec, queue.processed_time, result)
                continue
            before = len(result.outputs[op.name])
            ops[op.name].process(rec, seq)
            for pos, row in enumerate(result.outputs[op.name][before:] if readers[op.name] else []):
                # its place among the rows this record made (a stream-stream join forwards several, §18.8)
                forwarded_rec = {**as_record(op, task, emitted[op.name], row), "_pos": pos}
                emitted[op.name] += 1
                for down in readers[op.name]:  # its filter on the rows it reads (a `where.left` over them, §15)
                    if result.filters is None or result.filters.passes(down.name, op.name, forwarded_rec):
                        ops[down.name].process(forwarded_rec, seq)
        order.append({"task": task, "seq": seq, "source": rec["source"], "partition": rec["partition"],
                      "offset": rec["offset"], "key": rec["key"], "ts": rec["ts"],
                      **{f"stream_time_{name}": agg.stream_time if agg.stream_time >= 0 else None
                         for name, agg in ops.items()}})
    for agg in ops.values():
        agg.finish()


def _run_chained(job: Job, op: OperatorSpec, result: ReferenceResult, partitions: dict[str, int],
                 kept: list[Repartition | AsIs]) -> None:
    """An operator over another operator's forwarded rows (docs/semantics.md §18): in the task that forwarded
    them, in their order; a re-key writes them to its repartition topic from that task, the derived stream's own
    partition time standing for the upstream's (§18.3). `kept`: a join's source input as its tasks read it."""
    up = upstream(op, job.spec.operators)
    assert up is not None
    streams = forwarded(up, result.released.get(up.name, result.outputs[up.name]))
    rules = versions.profile(job.spec.kafka_streams)
    topics = rekeys(op, rules.join_null_keys_reach_join)
    if not topics:
        for task, records in streams.items():
            processor = _processor(op, task, result, rules)
            for seq, rec in enumerate(records, 1):  # a filtered row keeps its place in the task's order
                if result.filters is None or result.filters.passes(op.name, up.name, rec):
                    processor.process(rec, seq)
            processor.finish()
        return
    n = task_count(op, job.spec.operators, lambda source: partitions.get(source) or 1)
    (rekey,) = [r for r in topics if r.input == up.name]
    topic = Repartition(rekey, n, 0)
    for records in streams.values():
        partition_time = -1
        for rec in records:
            partition_time = max(partition_time, rec["ts"])
            if result.filters is None or result.filters.passes(op.name, up.name, rec):
                _rekey(op, topic, rec, partition_time, result)
    _run_downstream(job, op, [topic, *kept], result)


def _rekey(op: OperatorSpec, topic: Repartition | AsIs, rec: dict[str, Any], partition_time: int,
           result: ReferenceResult) -> None:
    """KStream#groupBy / selectKey: a null new key is filtered before the topic (a ledger row here) unless it
    passes (a left/outer join side, 3.7+); others are written. An input kept as it is goes on unchanged."""
    if isinstance(topic, AsIs):
        topic.write(rec, rec["key"], partition_time)
        return
    key = topic.new_key(rec)
    if key is None and not topic.rekey.keep_null:
        result.ledger.append(ledger_row({**rec, "key": None}, op.name, "null_key", rec["ts"], None, None,
                                        detail=NOT_REPARTITIONED, range_time=rec["ts"]))
        return
    topic.write(rec, key, partition_time)


class _Stream:
    """A downstream queue over records already extracted: one partition of a derived topic."""

    given_order = False

    def __init__(self, topic: str, rank: int, records: list[dict[str, Any]]) -> None:
        self.topic, self.rank, self.records, self.pos = topic, rank, records, 0
        self.head = records[0] if records else None

    def poll(self) -> dict[str, Any]:
        rec = self.records[self.pos]
        self.pos += 1
        self.head = self.records[self.pos] if self.pos < len(self.records) else None
        return rec


def _run_downstream(job: Job, op: OperatorSpec, topics: list[Repartition | AsIs], result: ReferenceResult) -> None:
    """Each downstream task reads its partition of every topic of the operator, merged by head timestamp."""
    rules = versions.profile(job.spec.kafka_streams)
    for q in sorted({q for t in topics for q in t.written}):
        processor = _processor(op, q, result, rules)
        streams = [_Stream(t.name if isinstance(t, Repartition) else _topic_of(t.partition(q), t.name), t.rank,
                           t.partition(q)) for t in topics]
        order = result.downstream_order.setdefault(op.name, {}).setdefault(q, [])
        for seq, (_, rec) in enumerate(_task_order(streams, given=False), 1):  # type: ignore[arg-type]
            processor.process(rec, seq)
            order.append(dict(rec.get("_origin") or {c: rec[c] for c in ("source", "partition", "offset")}))
        processor.finish()


Processor = WindowAggregate | SessionAggregate | SlidingAggregate | StreamJoin | TableAggregate | TableJoin
# the reference engine's own registry, by OperatorSpec.processor: the one place a new Kafka Streams processor
# registers here (the rules operator replays Flink on its own path)
PROCESSORS: dict[str, Callable[[OperatorSpec, int, ReferenceResult, versions.Profile], Processor]] = {
    "join": StreamJoin,
    "table_join": TableJoin,
    "tumbling": lambda op, task, result, _: WindowAggregate(op, task, result),
    "hopping": lambda op, task, result, _: WindowAggregate(op, task, result),
    "sliding": lambda op, task, result, _: SlidingAggregate(op, task, result),
    "session": lambda op, task, result, _: SessionAggregate(op, task, result),
    "table": lambda op, task, result, _: TableAggregate(op, task, result),
}


def _processor(op: OperatorSpec, task: int, result: ReferenceResult, rules: versions.Profile) -> Processor:
    """One operator instance per task, from the registry."""
    return PROCESSORS[op.processor](op, task, result, rules)


def _topic_of(records: list[dict[str, Any]], default: str) -> str:
    return str(records[0]["topic"]) if records else default


def _task_order(queues: list[Queue], given: bool, group: Callable[[Queue], int] = lambda q: 0
                ) -> Iterator[tuple[Queue, dict[str, Any]]]:
    """The task's processing order (docs/semantics.md §2): the recorded order (order_by), else one
    PartitionGroup per sub-topology (§2.5), their orders merged into one by partition time."""
    if given:
        drained = []
        for q in queues:
            while q.head is not None:
                drained.append((q, q.poll()))
        yield from sorted(drained, key=lambda qr: (qr[1]["seq"], qr[0].rank, qr[1]["offset"]))
        return
    by_group: dict[int, list[Queue]] = defaultdict(list)
    for q in queues:
        by_group[group(q)].append(q)
    orders = [_keyed(partition_group(qs, lambda q: q.topic, lambda q: q.rank), g) for g, qs in sorted(by_group.items())]
    # each sub-topology's records come in non-decreasing partition time (§2.5): one task order merges them
    for _, _, queue, rec in heapq.merge(*orders, key=lambda e: (e[0], e[1])):
        yield queue, rec


def _keyed(order: Iterator[tuple[Queue, dict[str, Any]]], group: int
           ) -> Iterator[tuple[int, int, Queue, dict[str, Any]]]:
    """Each record with its partition time (its queue's largest timestamp so far, its own included)."""
    times: dict[int, int] = {}
    for queue, rec in order:
        times[id(queue)] = max(times.get(id(queue), rec["ts"]), rec["ts"])
        yield times[id(queue)], group, queue, rec


def _apply_range(job: Job, result: ReferenceResult) -> None:
    start, end = result.start, result.end

    def inside(value: int | None) -> bool:
        v = -1 if value is None else value
        return (start is None or v >= start) and (end is None or v < end)

    for name in result.outputs:
        op = job.spec.operator(name)
        # join, alert and table rows: ts
        column = "ts" if op.join is not None or op.rules is not None or op.aggregate.window is None else "window_start"
        result.outputs[name] = [r for r in result.outputs[name] if inside(r[column])]
        result.incomplete[name] = [r for r in result.incomplete[name] if inside(r[column])]
    result.ledger = [r for r in result.ledger if inside(r["range_time"])]
