"""Part: scheduling. One scan of the sources before a scheduled run: how far each partition's data reaches,
and each candidate interval's input fingerprint.

- reach: per source and partition, the newest valid timestamp (an interval is due only when every partition
  of every source read by an operator reaches past the interval's end + lag and the time its outputs settle);
- fingerprint: per interval, source and partition, over the records with a valid timestamp in the event-time
  range a run of that interval reads (its warm-up to its cool-down): the count, the largest offset and an
  order-free checksum of (offset, timestamp, key, value). The runs table keeps it with the published
  interval; `--restate` republishes an interval whose fingerprint changed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F

from backfill.io.sources import read_source
from backfill.jobspec.load import Job
from backfill.scheduling.intervals import Interval
from backfill.time.extract import raw_timestamp

Bounds = dict[str, tuple[int | None, int]]  # source -> [read_from, horizon) of one interval


@dataclass
class Survey:
    """What the scan found (see the module docstring)."""

    reach: dict[str, dict[int, int | None]] = field(default_factory=dict)
    earliest: int | None = None
    fingerprints: dict[Interval, dict[str, dict[str, list[int]]]] = field(default_factory=dict)

    def short_of(self, source: str, needed: int) -> list[tuple[int, int | None]]:
        """The partitions of `source` whose data does not reach `needed`: (partition, newest timestamp)."""
        return [(p, ts) for p, ts in sorted(self.reach.get(source, {}).items()) if ts is None or ts < needed]


CHUNK = 48  # intervals fingerprinted per scan (three aggregates each: a wider query compiles slowly)


def survey(spark: SparkSession, job: Job, sources: list[str], bounds: dict[Interval, Bounds],
           read_from: int | None) -> Survey:
    """Scan `sources` from `read_from` (None: all); fingerprints for every interval of `bounds` (one scan per
    source and 48 intervals)."""
    order = sorted(bounds)
    result = _scan(spark, job, sources, {iv: bounds[iv] for iv in order[:CHUNK]}, read_from)
    for i in range(CHUNK, len(order), CHUNK):
        part = order[i:i + CHUNK]
        lows = [lo for iv in part for lo, _ in bounds[iv].values()]
        more = _scan(spark, job, sources, {iv: bounds[iv] for iv in part},
                     None if any(lo is None for lo in lows) else min(lows))
        result.fingerprints.update(more.fingerprints)
    return result


def _scan(spark: SparkSession, job: Job, sources: list[str], bounds: dict[Interval, Bounds],
          read_from: int | None) -> Survey:
    result = Survey()
    order = list(bounds)
    for rank, name in enumerate(job.spec.sources):
        if name not in sources:
            continue
        spec = job.spec.sources[name]
        read = read_source(spark, job, name, rank, read_from, None)
        df = read.records
        ts = raw_timestamp(df, spec.timestamp, name)
        df = df.withColumn("_t", F.when(F.col("_problem").isNull() & (ts >= 0), ts))
        checksum = F.xxhash64(F.col("offset"), F.col("_t"), F.col("key").cast("string"),
                              F.to_json(F.struct(F.col("value").alias("v"))))
        aggs: list[Column] = [F.max("_t").alias("reach"), F.min("_t").alias("first")]
        for i, iv in enumerate(order):
            lo, hi = bounds[iv][name]
            inside = F.col("_t").isNotNull() & (F.col("_t") < F.lit(hi))
            if lo is not None:
                inside = inside & (F.col("_t") >= F.lit(lo))
            aggs += [F.count(F.when(inside, 1)).alias(f"n{i}"), F.max(F.when(inside, F.col("offset"))).alias(f"o{i}"),
                     F.bit_xor(F.when(inside, checksum)).alias(f"h{i}")]
        rows = df.groupBy("partition").agg(*aggs).collect()
        reach: dict[int, int | None] = {}
        expected = set(read.offsets or {}) | set(range(spec.partitions or 0))
        for p in expected:
            reach[p] = None  # a partition without a record reaches nothing
        for r in rows:
            if r["partition"] is None:
                continue
            reach[int(r["partition"])] = r["reach"]
            if r["first"] is not None:
                result.earliest = r["first"] if result.earliest is None else min(result.earliest, r["first"])
            for i, iv in enumerate(order):
                if r[f"n{i}"]:
                    result.fingerprints.setdefault(iv, {}).setdefault(name, {})[str(r["partition"])] = [
                        int(r[f"n{i}"]), int(r[f"o{i}"] if r[f"o{i}"] is not None else -1), int(r[f"h{i}"] or 0)]
        result.reach[name] = reach
    for iv in order:
        result.fingerprints.setdefault(iv, {})
    return result


def changed(recorded: Any, current: dict[str, dict[str, list[int]]]) -> list[str]:
    """What differs between a published interval's fingerprint and the current one (empty: nothing)."""
    import json

    before = json.loads(recorded) if isinstance(recorded, str) else recorded
    out = []
    for source in sorted(set(before) | set(current)):
        old, new = before.get(source, {}), current.get(source, {})
        for part in sorted(set(old) | set(new), key=int):
            a, b = old.get(part, [0, -1, 0]), new.get(part, [0, -1, 0])
            if a == b:
                continue
            if a[0] != b[0]:
                out.append(f"{source}/{part}: {b[0] - a[0]:+d} records ({a[0]} -> {b[0]})")
            elif a[1] != b[1]:
                out.append(f"{source}/{part}: offsets changed (max {a[1]} -> {b[1]})")
            else:
                out.append(f"{source}/{part}: {b[0]} records, contents changed")
    return out
