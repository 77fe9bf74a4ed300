"""Part: reference engine. One record per offset (docs/semantics.md §7.2), as literally as it reads.

The records of a partition, by offset: copies of an offset that are equal in key, value, timestamp and headers
(as stored) are one record, read once and counted as duplicates; copies that differ make the offset unreadable
(each copy is a `conflicting_offset` ledger row, or the run stops). Offsets missing between two offsets read are
a gap, unless the source read them as a read_committed consumer does (an archive `backfill archive` wrote).
"""
from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

from backfill.errors import SourceError
from backfill.jobspec.models import TimestampSpec

RANGES = 10  # gap ranges reported per partition, the first in offset order
COMPARED = (("key", "key"), ("_ts", "timestamp"), ("value", "value"))


def one_per_offset(records: list[dict[str, Any]], source: str, on_error: str, stamps: TimestampSpec,
                   read_from: int | None = None) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The records with identical copies read once (the first in the input), each copy of an offset whose
    copies differ marked with `_conflict` (what differs); and the copies left out per partition.

    Only the copies a run reads are compared: with a warm-up bound (`read_from`), not those whose timestamp
    (the extractor's, with the `on_invalid` policy) lies before it (docs/semantics.md §7.4)."""
    # a source is one topic: a copy without a topic of its own (it has the source's name) is a copy all the same
    by_offset: dict[tuple[Any, Any], list[dict[str, Any]]] = defaultdict(list)
    for rec in records:
        # an unreadable record, or one without a place, is no copy of an offset: a ledger row of its own
        if rec["partition"] is not None and rec["offset"] is not None and rec["_problem"] is None:
            by_offset[(rec["partition"], rec["offset"])].append(rec)
    read = _read(by_offset, stamps, read_from)
    for copies in by_offset.values():  # a copy of an offset whose copies differ gives no partition time (1.2)
        if len({c["_copy"] for c in copies}) > 1:
            for c in copies:
                c["_differs"] = True
    left_out: dict[str, int] = defaultdict(int)
    dropped: set[int] = set()
    conflicts = []
    for (partition, offset), every in sorted(by_offset.items()):
        copies = [c for c in every if id(c) in read]
        topic = str(every[0]["topic"])
        if len(copies) < 2:
            continue
        if all(c["_copy"] == copies[0]["_copy"] for c in copies):
            left_out[str(partition)] += len(copies) - 1
            dropped.update(id(c) for c in copies[1:])
            continue
        what = differences(copies)
        conflicts.append((partition, offset, topic, what))
        for c in copies:
            c["_conflict"] = what
    if conflicts and on_error == "fail":
        partition, offset, topic, what = min(conflicts)
        raise SourceError(f"sources.{source}: offset {offset} of {topic}/{partition} is in the input more than once "
                          f"and its copies differ in {what}; Kafka holds one record per offset: fix the input, or "
                          "set on_error: skip to send every copy to the ledger as conflicting_offset")
    return [r for r in records if id(r) not in dropped], dict(left_out)


def _read(by_offset: dict[tuple[Any, Any], list[dict[str, Any]]], stamps: TimestampSpec,
          read_from: int | None) -> set[int]:
    """The records a run reads: all of them, or from a warm-up bound those without a timestamp (a dropped or an
    unreadable one) and those at or after it. A timestamp is the extractor's if valid, else per `on_invalid`:
    none, or the partition time (the largest valid timestamp at an earlier offset whose copies agree)."""
    every = [r for copies in by_offset.values() for r in copies]
    if read_from is None:
        return {id(r) for r in every}
    out: set[int] = set()
    partition_time: dict[Any, int | None] = {}
    for (partition, _), copies in sorted(by_offset.items()):
        before = partition_time.get(partition)
        valid = [_raw(c, stamps) for c in copies if c["_problem"] is None]
        for c in copies:
            raw = _raw(c, stamps) if c["_problem"] is None else None
            ts = raw if _valid(raw) else (before if stamps.on_invalid == "partition_time" and c["_problem"] is None
                                          else None)
            if ts is None or ts >= read_from:
                out.add(id(c))
        if len({c["_copy"] for c in copies}) == 1:  # a copy of an offset whose copies differ gives no time
            times = [v for v in valid if _valid(v)]
            if times:
                partition_time[partition] = max(times + ([before] if before is not None else []))
    return out


def _raw(rec: dict[str, Any], stamps: TimestampSpec) -> Any:
    if stamps.extractor == "record":
        return rec["timestamp"]
    value: Any = rec["value"]
    for part in (stamps.field or "").split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _valid(raw: Any) -> bool:
    return isinstance(raw, (int, float)) and not isinstance(raw, bool) and raw >= 0


def differences(copies: list[dict[str, Any]]) -> str:
    """What the copies of one offset differ in: key, timestamp (with its values), value."""
    parts = []
    for column, label in COMPARED:
        values = [_comparable(c.get(column)) for c in copies]
        if len(set(values)) == 1:
            continue
        if column == "_ts":
            label += " (" + ", ".join(str(v) for v in sorted({v for v in values if v is not None})) + ")"
        parts.append(label)
    return ", ".join(parts) or "headers or value fields this job does not read"


def _comparable(value: Any) -> Any:
    return json.dumps(value, sort_keys=True, default=str) if isinstance(value, (dict, list)) else value


def gaps(records: list[dict[str, Any]], covered: dict[int, list[tuple[int, int]]] | None) -> dict[str, Any]:
    """Per partition with offsets missing between offsets read: how many gaps, how many offsets, the first
    ranges (from, to). An offset inside what a read_committed consumer read (`covered`) is no gap."""
    offsets: dict[int, set[int]] = defaultdict(set)
    for rec in records:
        if rec["partition"] is not None and rec["offset"] is not None:
            offsets[rec["partition"]].add(rec["offset"])
    out: dict[str, Any] = {}
    for partition, seen in sorted(offsets.items()):
        ordered = sorted(seen)
        found = [(a + 1, b - 1) for a, b in zip(ordered, ordered[1:]) if b - a > 1
                 and not _inside(a + 1, b, (covered or {}).get(partition, []))]
        if found:
            out[str(partition)] = {"gaps": len(found), "offsets": sum(b - a + 1 for a, b in found),
                                   "ranges": [{"from": a, "to": b} for a, b in found[:RANGES]]}
    return out


def _inside(start: int, end: int, spans: list[tuple[int, int]]) -> bool:
    """Whether the offsets [start, end) lie inside one of `spans` (merged where they touch)."""
    merged: list[list[int]] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return any(a <= start and end <= b for a, b in merged)


def covered(location: str) -> dict[int, list[tuple[int, int]]] | None:
    """Per partition, the offset ranges an archive written by `backfill archive` alone read from the broker (each
    commit says so in its metadata: `backfill.archive.offsets`); None when not every commit says it."""
    from deltalake import DeltaTable

    try:
        commits = DeltaTable(location).history()
    except Exception:  # noqa: BLE001 - not a Delta table
        return None
    if not commits or min(c.get("version", 0) for c in commits) != 0:
        return None
    out: dict[int, list[tuple[int, int]]] = defaultdict(list)
    topics = set()
    for commit in commits:
        if commit.get("operation") in ("VACUUM START", "VACUUM END", "OPTIMIZE"):
            continue
        try:
            meta = json.loads(commit.get("userMetadata") or "{}")
            ranges = json.loads(meta["backfill.archive.offsets"])
            topics.add(meta["backfill.archive"])
        except (ValueError, KeyError, TypeError):
            return None
        for partition, (start, end) in ranges.items():
            out[int(partition)].append((int(start), int(end)))
    return dict(out) if len(topics) == 1 else None
