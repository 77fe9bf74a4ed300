"""Part: reference engine. `suppress(untilWindowCloses)` for one task, record by record (docs/semantics.md §4.5,
§10.4, §11.5).

The suppress processor sits after the window aggregate and sees every update it forwards (caching off). It
has its own stream time: the largest timestamp of those updates. Each update is buffered under its window
(the latest value per window is kept) with the window's end as its buffer time; after each update, every
entry whose buffer time is at or before `stream time - duration` is released, in buffer order (buffer time,
then the serialized windowed key), with the value and timestamp of its last buffered update. A tombstone (a
session merged away) is buffered like a value and dropped when released. `duration` is the grace (time and
sliding windows) or gap + grace (sessions). An update to a window already released is buffered again and,
stream time being past its buffer time, released at once: a window can be released more than once.
"""
from __future__ import annotations

import struct
from typing import Any


def key_bytes(key: Any) -> bytes:
    """The key as its serializer writes it: text as UTF-8, a long as 8 bytes big-endian, bytes as they are."""
    if isinstance(key, bytes):
        return key
    if isinstance(key, bool) or not isinstance(key, int):
        return str(key).encode("utf-8")
    return struct.pack(">q", key)


class SuppressBuffer:
    """The suppress processor's buffer and stream time; released rows go to `out` with `emit_seq` and `task`
    (`numbered`: sliding and session windows, whose windows can be released more than once)."""

    def __init__(self, duration: int, out: list[dict[str, Any]], task: int, numbered: bool) -> None:
        self.duration, self.out, self.task, self.numbered = duration, out, task, numbered
        self.stream_time = -1
        self.released = 0
        # window -> (buffer time, serialized windowed key, row or None for a tombstone)
        self.entries: dict[tuple[Any, ...], tuple[int, bytes, dict[str, Any] | None]] = {}

    def put(self, window: tuple[Any, ...], buffer_time: int, serialized: bytes, row: dict[str, Any] | None,
            ts: int) -> None:
        """One forwarded update (`row` None: a tombstone) with its timestamp; then release what is due."""
        self.stream_time = max(self.stream_time, ts)
        self.entries[window] = (buffer_time, serialized, row)
        due = sorted((entry[0], entry[1], w) for w, entry in self.entries.items()
                     if entry[0] <= self.stream_time - self.duration)
        for _, _, w in due:
            _, _, released = self.entries.pop(w)
            if released is None:
                continue
            if self.numbered:
                released = {**released, "emit_seq": self.released, "task": self.task}
            self.out.append(released)
            self.released += 1

    def pending(self) -> list[dict[str, Any]]:
        """The rows still buffered at the end of the data (tombstones aside), in buffer order."""
        return [row for _, _, row in sorted(self.entries.values(), key=lambda e: (e[0], e[1])) if row is not None]
