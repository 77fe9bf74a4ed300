"""The cool-down cut (docs/semantics.md §6.2) in its two forms gives the same records: over the partition time
before each record (the evaluator, the jar-less merge) and over each partition's offsets (verify)."""
from __future__ import annotations

import random

import pytest

from backfill.order import cooldown

pytestmark = pytest.mark.spark


def _records(rng: random.Random) -> list[dict]:
    """Partitions in offset order with ties, regressions and invalid timestamps (None), around a bound of 50."""
    rows = []
    for partition in range(rng.randint(1, 5)):
        for offset in range(rng.randint(0, 30)):
            ts = None if rng.random() < 0.1 else rng.choice([0, 10, 30, 49, 50, 51, 70, rng.randint(0, 100)])
            rows.append({"partition": partition, "offset": offset, "ts": ts})
    return rows


def _with_partition_time_before(rows: list[dict]) -> list[dict]:
    time: dict[int, int | None] = {}
    out = []
    for r in sorted(rows, key=lambda r: (r["partition"], r["offset"])):
        before = time.get(r["partition"])
        out.append({**r, "before": before})
        if r["ts"] is not None:
            time[r["partition"]] = r["ts"] if before is None else max(before, r["ts"])
    return out


def test_both_forms_of_the_cut_keep_the_same_records(spark) -> None:
    rng = random.Random(6)
    cases = [_with_partition_time_before(_records(rng)) for _ in range(60)]
    # each case's partitions numbered apart, so one input holds them all
    rows = [{**r, "partition": 10 * i + r["partition"]} for i, case in enumerate(cases) for r in case]
    rows += [{"partition": 999, "offset": 0, "ts": 50, "before": None},  # a first record at the bound
             {"partition": 999, "offset": 1, "ts": 0, "before": 50}]
    df = spark.createDataFrame(rows, "partition int, offset long, ts long, before long")
    by_column = {(r["partition"], r["offset"]) for r in df.where(~cooldown.beyond(df["before"], 50)).collect()}
    by_offsets = {(r["partition"], r["offset"]) for r in cooldown.up_to_cut(df, 50).collect()}
    by_record = {(r["partition"], r["offset"]) for r in rows if not cooldown.beyond_record(r["before"], 50)}
    assert by_column == by_offsets == by_record
    # not vacuous: many records are cut; a partition's first record at the bound is kept, the next one cut
    assert len(rows) - len(by_record) > 100
    assert (999, 0) in by_record and (999, 1) not in by_record
    assert not cooldown.beyond_record(None, 50) and not cooldown.beyond_record(99, None)
