"""Stream time at arrival for the few records a cause needs (verify/evidence.py `stream_times`).

The attribution no longer orders the whole input: per-block maxima give the stream time before a block,
and only the blocks holding the wanted records are ordered. Checked against the plain prefix maximum
(docs/semantics.md §4.2) on out-of-order timestamps, blocks crossed and rows wanted twice.
"""
from __future__ import annotations

import random
from typing import Any

from backfill.verify import evidence as causes


def test_stream_times_are_the_prefix_maximum_of_the_partition(spark: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr(causes, "STAMP_BLOCK", 8)  # many blocks in a small input
    rng = random.Random(7)
    rows = []
    for partition in (0, 1):
        for offset in range(3, 150):  # the first offsets are not 0: blocks start part-way
            rows.append((partition, offset, 1_000 + offset * 10 + rng.randint(-400, 400)))
    records = spark.createDataFrame(rows, "partition int, offset long, ts long")
    ev = causes.Evidence(raw=records, records=records, partitions=records, gaps=records, late=records,
                         ledger_read=False)
    wanted = [r for r in rows if rng.random() < 0.15]
    wanted += wanted[:5]  # a record in two windows: wanted twice
    frame = spark.createDataFrame(wanted, "partition int, offset long, ts long")
    got = sorted((r["partition"], r["offset"], r["st"]) for r in causes.stream_times(ev, frame).collect())
    expected = []
    for p, o, _ in wanted:
        expected.append((p, o, max(ts for q, off, ts in rows if q == p and off <= o)))
    assert got == sorted(expected)
