"""Part: order. The merge of a task's queues in plain Python, for a session without backfill's operator
(docs/semantics.md §2.2-§2.5): the same rule as jvm/ops `MergedQueues`, over one task's rows at a time.

Kafka Streams keeps a task's non-empty queues in a `java.util.PriorityQueue` keyed by head timestamp; on
equal timestamps the heap's layout decides. `JavaHeap` replays Java's sift rules. A row that does not take
part in the merge (dropped, no timestamp, past the cool-down) follows the row of its queue before it.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from backfill.order import cooldown


class JavaHeap:
    """java.util.PriorityQueue over small ints with a comparator on `key(x)`: offer and poll."""

    def __init__(self, key: Callable[[int], int]) -> None:
        self.key = key
        self.es: list[int] = []

    def offer(self, x: int) -> None:
        es, k = self.es, len(self.es)
        es.append(x)
        while k > 0:  # siftUp: past strictly larger parents only
            parent = (k - 1) >> 1
            if self.key(x) >= self.key(es[parent]):
                break
            es[k] = es[parent]
            k = parent
        es[k] = x

    def poll(self) -> int:
        es = self.es
        result, x = es[0], es.pop()
        n = len(es)
        if n:
            k = 0
            while k < n >> 1:  # siftDown: the right child only when strictly smaller; stop when not larger
                child = 2 * k + 1
                if child + 1 < n and self.key(es[child]) > self.key(es[child + 1]):
                    child += 1
                if self.key(x) <= self.key(es[child]):
                    break
                es[k] = es[child]
                k = child
            es[k] = x
        return result


@dataclass
class _Queue:
    topic: str
    index: int
    group: int
    units: list[list[int]] = field(default_factory=list)  # a merging row and the rows that follow it
    heads: list[int] = field(default_factory=list)  # each unit's timestamp
    keys: list[int] = field(default_factory=list)  # each unit's merge key
    taken: int = 0


def task_order(rows: Sequence[dict[str, Any]], until: Sequence[int | None]) -> list[int]:
    """The positions of one task's rows in its processing order.

    `rows`: dicts with `queue` (index into `until`), `group`, `topic`, `offset`, `ts`, `counted`."""
    by_queue: dict[int, list[int]] = {}
    for i in sorted(range(len(rows)), key=lambda i: (rows[i]["queue"] is None, rows[i]["queue"] or 0,
                                                     rows[i]["offset"])):
        by_queue.setdefault(rows[i]["queue"], []).append(i)
    leading: list[tuple[int, int, int, int]] = []  # rows before their queue's first merging row
    queues: list[_Queue] = []
    for q, members in by_queue.items():
        first = rows[members[0]]
        queue = _Queue(str(first["topic"] or ""), -1 if q is None else q, int(first["group"] or 0))
        partition_time: int | None = None
        for i in members:
            r = rows[i]
            before = partition_time
            if r["ts"] is not None:
                partition_time = r["ts"] if partition_time is None else max(partition_time, r["ts"])
            beyond = cooldown.beyond_record(before, until[q] if q is not None and q < len(until) else None)
            if r["ts"] is not None and r["counted"] and q is not None and not beyond:
                queue.units.append([i])
                queue.heads.append(r["ts"])
                queue.keys.append(max(queue.keys[-1], r["ts"]) if queue.keys else r["ts"])
            elif queue.units:
                queue.units[-1].append(i)
            else:
                leading.append((queue.group, queue.index, r["offset"], i))
        if queue.units:
            queues.append(queue)
    order = [i for *_, i in sorted(leading)]
    taken: list[tuple[int, int, int, list[int]]] = []
    for group in sorted({q.group for q in queues}):
        members_of = [q for q in queues if q.group == group]
        heap = JavaHeap(lambda x: members_of[x].heads[members_of[x].taken])
        for x in sorted(range(len(members_of)), key=lambda x: (members_of[x].topic, members_of[x].index)):
            heap.offer(x)
        step = 0
        while heap.es:
            x = heap.poll()
            queue = members_of[x]
            taken.append((queue.keys[queue.taken], group, step, queue.units[queue.taken]))
            queue.taken += 1
            step += 1
            if queue.taken < len(queue.units):
                heap.offer(x)
    for *_, unit in sorted(taken, key=lambda t: t[:3]):
        order.extend(unit)
    position = [0] * len(rows)
    for pos, i in enumerate(order):
        position[i] = pos
    return position
