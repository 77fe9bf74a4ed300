"""Part: reference engine. PartitionGroup, literally (docs/semantics.md §2.2-§2.5): the task's queues in a
`java.util.PriorityQueue` keyed by the head record's timestamp alone, polled for every record and offered
again while they hold records; first offered in topic-name order.

The heap is written out as Java's PriorityQueue writes it (siftUp moves an element up only past a strictly
larger parent; siftDown takes the right child only when it is strictly smaller than the left, and stops
when the element is no larger than the child), because on equal timestamps its layout is what decides.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Generic, Protocol, TypeVar


class HeadQueue(Protocol):
    """What the PartitionGroup reads of a queue: its head record (None: empty) and how to take it."""

    head: dict[str, Any] | None

    def poll(self) -> dict[str, Any]: ...


Q = TypeVar("Q", bound=HeadQueue)


class JavaPriorityQueue(Generic[Q]):
    """java.util.PriorityQueue with a comparator on one long: offer, poll, and nothing else."""

    def __init__(self, key: Callable[[Q], int]) -> None:
        self.key = key
        self.items: list[Q] = []

    def __len__(self) -> int:
        return len(self.items)

    def offer(self, x: Q) -> None:
        """PriorityQueue#offer: append, then siftUp while strictly smaller than the parent."""
        es, k, kx = self.items, len(self.items), self.key(x)
        es.append(x)
        while k > 0:
            parent = (k - 1) >> 1
            if kx >= self.key(es[parent]):
                break
            es[k] = es[parent]
            k = parent
        es[k] = x

    def poll(self) -> Q:
        """PriorityQueue#poll: take the root, move the last element there and siftDown."""
        es = self.items
        result = es[0]
        x = es.pop()
        n = len(es)
        if n == 0:
            return result
        k, kx, half = 0, self.key(x), n >> 1
        while k < half:
            child = 2 * k + 1
            c = es[child]
            if child + 1 < n and self.key(c) > self.key(es[child + 1]):
                child += 1
                c = es[child]
            if kx <= self.key(c):
                break
            es[k] = c
            k = child
        es[k] = x
        return result


def partition_group(queues: list[Q], topic: Callable[[Q], str], rank: Callable[[Q], int]
                    ) -> Iterator[tuple[Q, dict[str, Any]]]:
    """PartitionGroup#nextRecord until every queue is empty: (queue, record) in processing order.

    The queues are offered in the order the consumer hands over their first records, topic name first
    (then the source's declaration rank, for two sources of one topic); a queue that runs empty is never
    offered again (everything is buffered: its partition has no more records)."""
    heap: JavaPriorityQueue[Q] = JavaPriorityQueue(lambda q: q.head["ts"])  # type: ignore[index]
    for q in sorted(queues, key=lambda q: (topic(q), rank(q))):
        if q.head is not None:
            heap.offer(q)
    while len(heap):
        queue = heap.poll()
        record = queue.poll()
        if queue.head is not None:
            heap.offer(queue)
        yield queue, record
