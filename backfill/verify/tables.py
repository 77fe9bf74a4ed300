"""Part: verify. Outputs to compare: a Delta table (optionally `path@version`), a parquet folder, a JSONL
file/folder, or a Kafka topic (`kafka://HOST:PORT/TOPIC`: read whole, committed records only, as its archive
would hold it)."""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from backfill.errors import SourceError, SpecError
from backfill.io.archive import committed_ranges
from backfill.io.sources import content_fingerprint
from backfill.plan.definition import Plan

_VERSIONED = re.compile(r"^(?P<path>.+)@(?P<version>\d+)$")
_TOPIC = re.compile(r"^kafka://(?P<bootstrap>[^/]+)/(?P<topic>[^/]+)$")


@dataclass(frozen=True)
class TableRef:
    """Where an output lives: path, format (delta | parquet | jsonl) and a Delta version (time travel)."""

    path: str
    format: str
    version: int | None = None

    def __str__(self) -> str:
        return self.path + (f"@{self.version}" if self.version is not None else "")


def parse_ref(text: str, base: str | None = None) -> TableRef:
    """`path`, `path@version` (Delta), relative to `base` when given; the format is detected from the path.
    `kafka://HOST:PORT/TOPIC` names a topic."""
    if text.startswith("kafka:"):
        if not _TOPIC.match(text):
            raise SpecError(f"{text}: a topic is kafka://HOST:PORT/TOPIC, e.g. kafka://127.0.0.1:9092/clicks-per-user")
        return TableRef(path=text, format="kafka")
    match = _VERSIONED.match(text)
    path, version = (match["path"], int(match["version"])) if match else (text, None)
    if base is not None and not os.path.isabs(path):
        path = os.path.normpath(os.path.join(base, path))
    if not os.path.exists(path):
        raise SourceError(f"{path}: no such table or file (give a Delta table, a parquet folder or a JSONL "
                          "file/folder; path@version reads a Delta version)")
    fmt = detect_format(path)
    if version is not None and fmt != "delta":
        raise SpecError(f"{text}: @{version} selects a Delta version, but {path} is {fmt}, not a Delta table")
    return TableRef(path=path, format=fmt, version=version)


def detect_format(path: str) -> str:
    """delta when a `_delta_log` is there, jsonl for *.jsonl/*.json files or folders of them, else parquet."""
    if os.path.isdir(os.path.join(path, "_delta_log")):
        return "delta"
    if os.path.isfile(path):
        return "jsonl" if path.endswith((".jsonl", ".json")) else "parquet"
    names = [n for n in os.listdir(path) if not n.startswith((".", "_"))]
    if names and all(n.endswith((".json", ".jsonl")) or (n.startswith("part-") and ".parquet" not in n)
                     for n in names):
        return "jsonl"
    return "parquet"


def read_table(spark: SparkSession, ref: TableRef, fallback: T.StructType | None = None) -> DataFrame:
    """The output as a DataFrame (Delta through the project's Delta module).

    An empty JSONL output has no columns to infer: it reads as an empty frame with `fallback`'s columns.
    """
    if ref.format == "delta":
        from backfill.io.delta import read_delta

        return read_delta(spark, ref.path, version=ref.version)
    if ref.format == "kafka":
        return read_whole_topic(spark, ref)
    if ref.format == "jsonl":
        df = spark.read.json(ref.path)
        if not df.columns or df.columns == ["_corrupt_record"]:
            return spark.createDataFrame([], fallback or T.StructType([]))
        return df
    return spark.read.parquet(ref.path)


def read_whole_topic(spark: SparkSession, ref: TableRef) -> DataFrame:
    """Every committed record of a topic, in the Kafka-archive shape (`backfill archive`'s columns)."""
    from backfill.io.kafka import read_kafka, resolve
    from backfill.jobspec.models import KafkaSpec

    match = _TOPIC.match(ref.path)
    assert match is not None
    spec = KafkaSpec(bootstrap=match["bootstrap"], topic=match["topic"], start="earliest")
    try:
        ranges = resolve(spec, "kafka", None, None, by_time=False)
    except SourceError as exc:  # "kafka.topic: ... has no topic": said of the reference instead
        raise SourceError(f"--against {ref.path}: {str(exc).split(': ', 1)[-1]}") from None
    return read_kafka(spark, spec, ranges).select(
        "topic", "partition", "offset", "key", "value", F.unix_millis("timestamp").alias("timestamp"),
        "timestamp_type", "headers")


def apply_mapping(df: DataFrame, mapping: dict[str, str], where: str) -> DataFrame:
    """Rename source columns to ours: mapping is {our column: source column} (`--map col=source_col`)."""
    for ours, theirs in mapping.items():
        if theirs not in df.columns:
            raise SourceError(f"{where}: --map {ours}={theirs}: no column {theirs!r} (columns: {', '.join(df.columns)})")
    renamed = df.select(*[F.col(f"`{c}`").alias(_target(c, mapping)) for c in df.columns])
    return renamed


def _target(column: str, mapping: dict[str, str]) -> str:
    """The name a source column takes: ours when mapped, else unchanged (unless a mapped name shadows it)."""
    for ours, theirs in mapping.items():
        if theirs == column:
            return ours
    return column if column not in mapping else f"_unmapped_{column}"


ARCHIVE_COLUMNS = ("topic", "partition", "offset", "key", "value", "timestamp")


def is_topic_archive(df: DataFrame) -> bool:
    """A Kafka-archive table (what `backfill archive` writes): the record columns, key and value as bytes."""
    return (all(c in df.columns for c in ARCHIVE_COLUMNS)
            and isinstance(df.schema["value"].dataType, T.BinaryType))


def decode_window_topic(df: DataFrame, size_ms: int, values: T.StructType, where: str) -> DataFrame:
    """An archived output topic of a windowed aggregate, as output rows.

    The key as Kafka Streams' time-windowed serde writes it (`WindowedSerdes.timeWindowedSerdeFrom`: the
    key's bytes, then the window start as an 8-byte big-endian long), the value a JSON object of the
    aggregations, the record timestamp as `ts`; the topic's partition and offset give the emission order.
    """
    df = df.withColumn("key", F.col("key").cast("binary"))
    short = df.where(F.col("key").isNull() | (F.length("key") < 9)).limit(1).collect()
    if short:
        raise SourceError(f"{where}: the record at partition {short[0]['partition']} offset {short[0]['offset']} has "
                          "no time-windowed key (the key's bytes, then the window start as 8 bytes, as "
                          "WindowedSerdes.timeWindowedSerdeFrom writes it); give the archive of the aggregate's "
                          "output topic")
    start = F.conv(F.hex(F.expr("substring(key, -8, 8)")), 16, 10).cast("long")
    inner = F.expr("substring(key, 1, length(key) - 8)")
    parsed = F.from_json(F.col("value").cast("string"), values)
    return df.select(inner.cast("string").alias("key"), start.alias("window_start"),
                     (start + F.lit(size_ms)).alias("window_end"),
                     *[parsed[f.name].alias(f.name) for f in values.fields],
                     F.col("timestamp").cast("long").alias("ts"), "partition", "offset")


def source_committed_ranges(spark: SparkSession, plan: Plan, source: str) -> DataFrame | None:
    """io/archive.py `committed_ranges` of a source of the job: where an offset gap is no record missing."""
    spec = plan.job.spec.sources[source]
    location = "" if spec.format == "kafka" else plan.job.resolve(spec.path or "")
    return committed_ranges(spark, spec, location)


def without_committed_gaps(gaps: DataFrame, committed: DataFrame, partition: str = "partition") -> DataFrame:
    """`gaps` (gap_from, gap_to, per `partition`) but those inside a range read as committed (`committed_ranges`):
    commit markers and aborted records, which the application never saw either."""
    c = F.broadcast(committed.select(F.col("partition").alias("_cp"), "c_from", "c_to"))
    inside = ((F.col("_cp").isNull() | (F.col(partition) == F.col("_cp")))
              & (F.col("gap_from") >= F.col("c_from")) & (F.col("gap_to") < F.col("c_to")))
    return gaps.join(c, inside, "left_anti")


def recorded_gaps(spark: SparkSession, plan: Plan, source: str, run: dict[str, Any] | None) -> DataFrame | None:
    """The offset gaps of `source` as the run that published the output recorded them (plan/offsets.py; what a
    read_committed consumer never sees is left out already): (partition, gap_from, gap_to, ts_before: the
    newest timestamp before the gap, ts_after: the record's after it). None when that record cannot stand for
    the input as verify reads it: no run, a run that did not check gaps (one from a warm-up bound), one that
    lists fewer ranges than it found, or an input changed since (its fingerprint, io/sources.py)."""
    counts = (run or {}).get("counts") or {}
    if run is None or "gaps" not in counts or source in (counts.get("gaps_not_checked") or {}):
        return None
    found = (counts.get("gaps") or {}).get(source) or {}
    if any(int(g["gaps"]) > len(g["ranges"]) for g in found.values()):
        return None
    try:
        then = (json.loads(run.get("inputs") or "{}").get(source) or {}).get("content")
    except (TypeError, ValueError, AttributeError):
        return None
    if then is None or then != current_fingerprint(plan, source):
        return None
    rows = [(int(p), int(r["from"]), int(r["to"]), r.get("ts_before"), r.get("ts_after"))
            for p, g in found.items() for r in g["ranges"]]
    return spark.createDataFrame(rows, "partition int, gap_from long, gap_to long, ts_before long, ts_after long")


def current_fingerprint(plan: Plan, source: str) -> str | None:
    """io/sources.py `content_fingerprint` of a file or Delta source as it is now (None: it has none)."""
    from backfill.io.delta import table_version

    spec = plan.job.spec.sources[source]
    if spec.format == "kafka" or spec.as_of:
        return None
    location = plan.job.resolve(spec.path or "")
    version = (spec.version if spec.version is not None else table_version(location)) if spec.format == "delta" \
        else None
    return content_fingerprint(plan.job, source, location, version)
