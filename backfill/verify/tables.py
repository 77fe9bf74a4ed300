"""Part: verify. Outputs to compare: a Delta table (optionally `path@version`), a parquet folder, a JSONL
file/folder, or a Kafka topic (`kafka://HOST:PORT/TOPIC`: read whole, committed records only, as its archive
would hold it)."""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from backfill.errors import SourceError, SpecError
from backfill.io.archive import committed_ranges
from backfill.jobspec.load import Job
from backfill.jobspec.models import REGISTRY_FORMATS, KeySpec, SecuritySpec, ValueSpec
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
    security: SecuritySpec | None = None  # a topic's cluster settings (`with_cluster_security`)

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


def with_cluster_security(ref: TableRef, job: Job) -> TableRef:
    """A `kafka://HOST:PORT/TOPIC` reference with the `kafka.security` of the job's sources on that cluster (the
    same bootstrap): the output topic is read with the settings the inputs are read with."""
    match = _TOPIC.match(ref.path) if ref.format == "kafka" else None
    if match is None:
        return ref
    found = [s.kafka.security for s in job.spec.sources.values()
             if s.kafka is not None and s.kafka.bootstrap == match["bootstrap"] and s.kafka.security is not None]
    return TableRef(ref.path, ref.format, ref.version, found[0]) if found else ref


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
    spec = KafkaSpec(bootstrap=match["bootstrap"], topic=match["topic"], start="earliest", security=ref.security)
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


def decode_window_topic(df: DataFrame, size_ms: int, values: T.StructType, where: str, session: bool = False,
                        key: KeySpec | None = None, value: ValueSpec | None = None, job: Job | None = None
                        ) -> DataFrame:
    """An archived output topic of a windowed aggregate, as output rows.

    The key as Kafka Streams' windowed serdes write it: the inner key's bytes, then the window start as an 8-byte
    big-endian long (time windows, `WindowedSerdes.timeWindowedSerdeFrom`; the end is start + size), or then the
    end and the start, 8 bytes each (session windows, `SessionWindowedSerde`; the end inclusive). The inner key
    and the value in `key` / `value`'s format (default: the key as text, the value a JSON object of the
    aggregations; the registry formats through io/formats.py); the record timestamp as `ts`; the topic's
    partition and offset give the emission order.
    """
    tail = 16 if session else 8
    df = df.withColumn("key", F.col("key").cast("binary"))
    short = df.where(F.col("key").isNull() | (F.length("key") <= tail)).limit(1).collect()
    if short:
        shape = ("the key's bytes, then the session's end and start as 8 bytes each, as SessionWindowedSerde "
                 "writes it" if session else "the key's bytes, then the window start as 8 bytes, as "
                 "WindowedSerdes.timeWindowedSerdeFrom writes it")
        raise SourceError(f"{where}: the record at partition {short[0]['partition']} offset {short[0]['offset']} has "
                          f"no {'session' if session else 'time'}-windowed key ({shape}); give the archive of the "
                          "aggregate's output topic")
    start = F.conv(F.hex(F.expr("substring(key, -8, 8)")), 16, 10).cast("long")
    end = F.conv(F.hex(F.expr("substring(key, -16, 8)")), 16, 10).cast("long") if session else start + F.lit(size_ms)
    df = df.withColumn("_start", start).withColumn("_end", end).withColumn(
        "key", F.expr(f"substring(key, 1, length(key) - {tail})"))
    inner, inner_bad = _inner_key(df, key, job, where)
    fields = [f.name for f in values.fields]
    if value is not None and value.format in REGISTRY_FORMATS:
        from backfill.io.formats import decode

        assert job is not None
        decoded, value_bad = decode(df, "value", value, value.format, job, f"{where}: value")
        parsed = decoded
    else:
        parsed, value_bad = F.from_json(F.col("value").cast("string"), values), F.lit(None).cast("string")
    df = df.withColumn("_bad", F.coalesce(inner_bad, value_bad))
    bad = df.where(F.col("_bad").isNotNull()).select("partition", "offset", "_bad").limit(1).collect()
    if bad:
        raise SourceError(f"{where}: the record at partition {bad[0]['partition']} offset {bad[0]['offset']} is "
                          f"unreadable ({bad[0]['_bad']}); declare the output topic's formats in verify.<operator>."
                          "key / value")
    return df.select(inner.alias("key"), F.col("_start").alias("window_start"), F.col("_end").alias("window_end"),
                     *[parsed[f].alias(f) for f in fields],
                     F.col("timestamp").cast("long").alias("ts"), "partition", "offset")


def _inner_key(df: DataFrame, key: KeySpec | None, job: Job | None, where: str) -> tuple[Column, Column]:
    """The windowed key's inner key as text (the backfill's keys are compared as text) and why it is unreadable."""
    none = F.lit(None).cast("string")
    if key is None or key.format in ("string", "json", "bytes"):
        return F.col("key").cast("string"), none
    if key.format == "long":
        parsed = F.when(F.length("key") == 8, F.conv(F.hex("key"), 16, -10))
        return parsed, F.when(parsed.isNull(), F.lit("the inner key is not an 8-byte long"))
    from backfill.io.formats import decode, decoded_type, key_column

    assert job is not None
    decoded, bad = decode(df, "key", key, key.format, job, f"{where}: key")
    return key_column(decoded, decoded_type(df, decoded)).cast("string"), bad


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
