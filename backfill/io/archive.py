"""Part: io. `backfill archive`: copy a Kafka topic into a Kafka-archive Delta table, incrementally.

The table has the columns of a Kafka record (topic, partition, offset, key, value as bytes, timestamp in
epoch ms, timestamp_type, headers). Each run appends, in one Delta commit, the offsets after the highest
one already archived per partition, up to the end offsets read at its start: running it again archives
only what is new, and a run killed before its commit leaves the table as it was (run it again).
Backfills that read the archive stay reproducible after Kafka's retention has deleted the records.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from backfill.errors import SourceError
from backfill.io.delta import append_delta, history, is_delta_table, read_delta
from backfill.io.kafka import (READ_COMMITTED, TIMEOUT_S, OffsetRange, client_config, compacted, partitions,
                               read_kafka)
from backfill.jobspec.models import KafkaSpec, SecuritySpec, SourceSpec

COLUMNS = ("topic", "partition", "offset", "key", "value", "timestamp", "timestamp_type", "headers")
COVERED = "backfill.archive.offsets"  # commit metadata: {partition: [start, end)} the commit read


def covered_offsets(path: str) -> dict[tuple[str, int], list[tuple[int, int]]] | None:
    """Per (topic, partition) of an archive written by `archive_topic` only, the offset ranges [start, end) its
    commits read from the broker (a read_committed consumer: inside them, an offset without a record is a
    commit marker or an aborted record). None when that is not known for every commit: a table another writer
    changed (a delete, an append), or whose first commits the log no longer holds."""
    try:
        commits = history(None, path, None)
    except Exception:  # noqa: BLE001 - not a table deltalake reads: nothing known
        return None
    if not commits or min(c.get("version", 0) for c in commits) != 0:
        return None
    out: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for commit in commits:
        operation = commit.get("operation")
        if operation in ("VACUUM START", "VACUUM END", "OPTIMIZE"):  # files rewritten, the rows are the same
            continue
        try:
            meta = json.loads(commit.get("userMetadata") or "{}")
            ranges = json.loads(meta[COVERED])
            topic = meta["backfill.archive"]
        except (ValueError, KeyError, TypeError):
            return None
        for partition, (start, end) in ranges.items():
            out.setdefault((topic, int(partition)), []).append((int(start), int(end)))
    return out


def archive_topic(spark: SparkSession, bootstrap: str, topic: str, path: str,
                  progress: Callable[[str], None] = lambda _: None, security: SecuritySpec | None = None
                  ) -> dict[str, Any]:
    """Append the topic's new records to the archive at `path`; returns what was archived per partition."""
    spec = KafkaSpec(bootstrap=bootstrap, topic=topic, security=security)
    where = "--topic"
    parts = partitions(bootstrap, topic, where, security)
    done = _archived(spark, path, topic)
    ranges, gaps = _ranges(spec, parts, done)
    for r in ranges:
        gap = f"; offsets {gaps[r.partition][0]}..{gaps[r.partition][1] - 1} were deleted by retention before they " \
              "were archived" if r.partition in gaps else ""
        progress(f"partition {r.partition}: offsets {r.start}..{r.end - 1} ({r.records:,} new offsets){gap}"
                 if r.records else f"partition {r.partition}: up to date at offset {r.end}{gap}")
    total = sum(r.records for r in ranges)
    version, rows = None, 0
    if total:
        records = read_kafka(spark, spec, [r for r in ranges if r.records]).select(
            "topic", "partition", "offset", "key", "value", F.unix_millis("timestamp").alias("timestamp"),
            "timestamp_type", "headers")
        # the offsets this commit covers: an offset inside them that is not archived is a transaction's marker or
        # an aborted record, never a record lost (`covered_offsets`, for verify's `missing_input`). Not recorded
        # for a compacted topic (compaction removes records the application may have seen) or when unknown.
        metadata = {"backfill.archive": topic}
        if compacted(bootstrap, topic, security) is False:
            covered = {str(r.partition): [r.start, r.end] for r in ranges if r.records}
            metadata[COVERED] = json.dumps(covered, sort_keys=True)
        version = append_delta(spark, records, path, metadata=metadata)
        rows = _rows_added(path, version)
    # offsets and records differ on transactional topics: commit markers and aborted records hold offsets
    return {"topic": topic, "path": path, "records": rows, "offsets": total, "version": version,
            "partitions": {str(r.partition): {"from": r.start, "to": r.end, "records": r.records} for r in ranges},
            "gaps": {str(p): list(g) for p, g in gaps.items()}}


def _archived(spark: SparkSession, path: str, topic: str) -> dict[int, int]:
    """The highest archived offset per partition of `topic` (nothing when there is no table yet)."""
    if not is_delta_table(path):
        return {}
    table = read_delta(spark, path)
    missing = [c for c in ("topic", "partition", "offset") if c not in table.columns]
    if missing:
        raise SourceError(f"--to {path}: a Delta table that is not a Kafka archive (no {missing[0]} column); "
                          "archive into a new path")
    rows = table.where(F.col("topic") == topic).groupBy("partition").agg(F.max("offset").alias("o")).collect()
    return {r["partition"]: r["o"] for r in rows}


def _ranges(spec: KafkaSpec, parts: list[int], done: dict[int, int]
            ) -> tuple[list[OffsetRange], dict[int, tuple[int, int]]]:
    """Per partition, the offsets after the archived ones up to the end; and the gaps retention made."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**client_config(spec.bootstrap, spec.security), **READ_COMMITTED})
    try:
        marks = {p: consumer.get_watermark_offsets(TopicPartition(spec.topic, p), timeout=TIMEOUT_S) for p in parts}
    finally:
        consumer.close()
    ranges, gaps = [], {}
    for p in parts:
        low, high = marks[p]
        start = done.get(p, -1) + 1
        if start < low:  # deleted before an archive run saw them: say so, archive what is left
            gaps[p] = (start, low)
            start = low
        ranges.append(OffsetRange(p, start, max(high, start), low, high))
    return ranges, gaps


def _rows_added(path: str, version: int) -> int:
    """The rows a commit appended, from its metrics in the Delta log (no Spark job)."""
    from deltalake import DeltaTable

    commit = next(h for h in DeltaTable(path).history(5) if h.get("version") == version)
    return int(commit.get("operationMetrics", {}).get("numOutputRows", 0))


def committed_spans(spec: SourceSpec, location: str) -> dict[int | None, list[tuple[int, int]]] | None:
    """The offsets of a source read as a read_committed consumer reads them: per partition (None: every
    partition), the merged ranges [from, to). An offset inside them without a record is a commit marker or an
    aborted record, not a record missing. A Kafka source: every offset it read (unless the topic is compacted:
    compaction removes records the application may have seen); an archive `archive_topic` wrote: what its
    commits read (`covered_offsets`); anything else: None (nothing known)."""
    if spec.format == "kafka":
        assert spec.kafka is not None
        if compacted(spec.kafka.bootstrap, spec.kafka.topic, spec.kafka.security) is not False:  # compaction gaps: records maybe seen
            return None
        return {None: [(-(2**62), 2**62)]}
    if spec.format != "delta":
        return None
    covered = covered_offsets(location)
    if not covered or len({topic for topic, _ in covered}) != 1:  # one topic: a partition names one log
        return None
    return {p: _merged(spans) for (_, p), spans in covered.items()}


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Ranges [from, to) merged where they touch or overlap (an archive's commits read one after the other)."""
    out: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def committed_ranges(spark: SparkSession, spec: SourceSpec, location: str) -> DataFrame | None:
    """`committed_spans` as (partition, c_from, c_to): [c_from, c_to) of partition (null: every partition)."""
    spans = committed_spans(spec, location)
    if spans is None:
        return None
    return spark.createDataFrame([(p, a, b) for p, ranges in spans.items() for a, b in ranges],
                                 "partition int, c_from long, c_to long")
