"""Part: io. Sources -> records: topic, partition, offset, key, value, timestamp, headers (job-spec.md "Records").

Every source yields the same columns, plus `source`, `source_rank` (declaration order: the documented
tie-break of the task order) and `_problem` (why a record is unreadable, else null).
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from backfill.errors import SourceError
from backfill.io.schemas import load_value_schema
from backfill.jobspec.load import Job
from backfill.jobspec.models import REGISTRY_FORMATS, SourceSpec
from backfill.session import is_connect, json_schema

HEADERS_TYPE = T.ArrayType(T.StructType([T.StructField("key", T.StringType()),
                                         T.StructField("value", T.BinaryType())]))
KEY_TYPES: dict[str, T.DataType] = {"string": T.StringType(), "json": T.StringType(),
                                    "long": T.LongType(), "bytes": T.BinaryType()}
CORRUPT = "_corrupt_record"
# where an unreadable record came from, when the source is a file of lines (JSONL): the file and the line
WHERE_TYPE = T.StructType([T.StructField("file", T.StringType()), T.StructField("text", T.StringType())])


def decoded(df: DataFrame) -> DataFrame:
    """The `decode` of a read whose values are decoded already: the frame as it is."""
    return df


@dataclass(frozen=True)
class SourceRead:
    """Records of one source and what was read (for the plan and the run manifest)."""

    name: str
    records: DataFrame
    location: str
    version: int | None = None
    offsets: dict[int, tuple[int, int]] | None = None  # Kafka: [start, end) per partition, as read
    partitions: int | None = None  # Kafka: the topic's partition count
    content: str | None = None  # the input's fingerprint (`content_fingerprint`), when it has one
    # with `raw_values`: turns a frame's undecoded `value` column into the decoded one (else: identity)
    decode: Callable[[DataFrame], DataFrame] = decoded
    table: str | None = None  # the catalog table's name, when the job named one

    def manifest(self, fmt: str) -> dict[str, object]:
        """What the run manifest records about this input (enough to read the same records again)."""
        out: dict[str, object] = {"format": fmt, "location": self.location, "version": self.version}
        if self.table is not None:
            out["table"] = self.table
        if self.offsets is not None:
            out["offsets"] = {str(p): list(r) for p, r in sorted(self.offsets.items())}
            out["partitions"] = self.partitions
        if self.content is not None:
            out["content"] = self.content
        return out


def content_fingerprint(job: Job, name: str, location: str, version: int | None) -> str | None:
    """A file or Delta source's input as one hash: the source's settings (with its value schema's text) and
    what is stored (a Delta table's version; else every file's path, size and modification time). Equal
    fingerprints: the same records, decoded by the same rules. None for a Kafka source (a topic grows and is
    compacted under the same name) and a Delta table read as of a timestamp."""
    spec = job.spec.sources[name]
    if spec.format == "kafka" or (spec.format == "delta" and version is None):
        return None
    parts: list[object] = [spec.model_dump(mode="json", by_alias=True)]
    for enc in (spec.key, spec.value):  # the schemas that decode it (a registry's ids never change)
        for path in (enc.schema_, enc.reader_schema):
            if path:
                with open(job.resolve(path)) as fh:
                    parts.append(fh.read())
        if enc.registry is not None and enc.registry.schemas:
            parts.append(_listing(job.resolve(enc.registry.schemas)))
    if spec.format == "delta":
        parts.append(["version", version])
    else:
        parts.append(_listing(location))
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _listing(location: str) -> list[tuple[str, int, int]]:
    """Every file under `location` (or the file itself): relative path, size, modification time (ns)."""
    if os.path.isfile(location):
        st = os.stat(location)
        return [(os.path.basename(location), st.st_size, st.st_mtime_ns)]
    out = []
    for folder, _, files in os.walk(location):
        for f in files:
            st = os.stat(os.path.join(folder, f))
            out.append((os.path.relpath(os.path.join(folder, f), location), st.st_size, st.st_mtime_ns))
    return sorted(out)


def read_source(spark: SparkSession, job: Job, name: str, rank: int, read_from: int | None = None,
                read_until: int | None = None, value_fields: set[str] | None = None, headers: bool = True,
                raw_values: bool = False) -> SourceRead:
    """Read one source of the job as canonical records (`read_from/until`: the plan's event-time bounds).

    `value_fields`: the JSON value's fields a run reads (None: all). Every value is still checked against the
    whole schema; only the fields no one reads are not kept. Without `headers`, a Kafka source leaves them
    out (null), as a run whose operators never read them does. `raw_values`: values are left as stored,
    neither decoded nor checked (no record is unreadable for its value); the read's `decode` decodes them
    later, for the records that need it."""
    spec = job.spec.sources[name]
    if spec.format == "kafka":
        from backfill.io.kafka import read_topic

        assert spec.kafka is not None
        raw, ranges = read_topic(spark, spec, name, read_from, read_until, headers)
        records = _canonical(raw, spec, name, rank, job, value_fields)
        return SourceRead(name=name, records=records, location=f"kafka {spec.kafka.bootstrap}/{spec.kafka.topic}",
                          offsets={r.partition: (r.start, r.end) for r in ranges}, partitions=len(ranges))
    location = job.resolve(spec.path or "")
    if not os.path.exists(location):
        raise SourceError(f"sources.{name}.path: {location} does not exist; paths are relative to {job.path.name}")
    raw, version = _read_raw(spark, spec, location)
    if spec.format != "jsonl":  # a JSONL reader maps the fields itself (they are JSON fields, not columns)
        raw = _map_columns(raw, spec, name, location)
        _check_key_column(raw, spec, name, location)
    records = _canonical(raw, spec, name, rank, job, value_fields, raw_values)
    content = content_fingerprint(job, name, location, version)
    if not raw_values:
        return SourceRead(name=name, records=records, location=location, version=version, content=content,
                          table=spec.table)

    def decode(df: DataFrame) -> DataFrame:
        decoded, value, _ = _value(df, spec, job, name)
        return decoded.withColumn("value", value).drop("__parsed", "__text")

    return SourceRead(name=name, records=records, location=location, version=version, content=content,
                      decode=decode, table=spec.table)


def _read_raw(spark: SparkSession, spec: SourceSpec, location: str) -> tuple[DataFrame, int | None]:
    if spec.format == "jsonl":
        from backfill.io.jsonl import read_jsonl

        return read_jsonl(spark, location, spec), None
    if spec.format == "parquet":
        return spark.read.parquet(location), None
    from backfill.io.delta import read_delta, table_version

    if spec.as_of:
        return read_delta(spark, location, timestamp=spec.as_of), None
    version = spec.version if spec.version is not None else table_version(location)
    return read_delta(spark, location, version=version), version  # the version the manifest names


def _map_columns(df: DataFrame, spec: SourceSpec, name: str, location: str) -> DataFrame:
    for record_col, table_col in spec.columns.items():
        if table_col not in df.columns:
            raise SourceError(f"sources.{name}.columns.{record_col}: column {table_col!r} is not in {location} "
                              f"(columns: {', '.join(df.columns)})")
        df = df.withColumnRenamed(table_col, f"__{record_col}")
    for record_col in spec.columns:
        df = df.withColumnRenamed(f"__{record_col}", record_col)
    required = ["partition", "offset", "value", "timestamp"] + (["seq"] if spec.order_by else [])
    missing = [c for c in required if c not in df.columns and not (c == "seq" and spec.order_by in df.columns)]
    if missing:
        raise SourceError(f"sources.{name}: {location} has no {missing[0]!r} column; map it with "
                          f"`columns: {{{missing[0]}: <table column>}}` (columns: {', '.join(df.columns)})")
    return df


def _canonical(df: DataFrame, spec: SourceSpec, name: str, rank: int, job: Job,
               value_fields: set[str] | None = None, raw_values: bool = False) -> DataFrame:
    problem = F.col("_problem") if "_problem" in df.columns else F.lit(None).cast("string")
    problem = F.coalesce(problem, F.when(F.col("partition").isNull() | F.col("offset").isNull(),
                                         F.lit("unreadable record: no partition or offset")))
    where = F.col("_where") if "_where" in df.columns else F.lit(None).cast(WHERE_TYPE)
    key, key_problem = _key(df, spec, job, name)
    if raw_values:
        value, value_problem = F.col("value"), F.lit(None).cast("string")
    else:
        df, value, value_problem = _value(df, spec, job, name, value_fields)
    seq_col = spec.order_by if spec.order_by and spec.order_by in df.columns else "seq"
    out = df.select(
        F.lit(name).alias("source"), F.lit(rank).cast("int").alias("source_rank"),
        # a Kafka source reads the one topic it subscribes to: a constant, which Spark never has to carry
        (F.lit(spec.kafka.topic) if spec.kafka is not None and spec.format == "kafka" else F.col("topic").cast("string")
         if "topic" in df.columns else F.lit(None).cast("string")).alias("_topic"),
        F.col("partition").cast("int").alias("partition"), F.col("offset").cast("long").alias("offset"),
        key.alias("key"), value.alias("value"), _millis(df.schema["timestamp"].dataType, "timestamp").alias("timestamp"),
        _headers(df).alias("headers"),
        (F.col(seq_col).cast("long") if spec.order_by else F.lit(None).cast("long")).alias("seq"),
        F.coalesce(problem, key_problem, value_problem).alias("_problem"), where.alias("_where"),
        # an unreadable record, or one without a place, is no copy of an offset: a ledger row of its own
        F.when(F.coalesce(problem, key_problem, value_problem).isNull() & F.col("partition").cast("int").isNotNull()
               & F.col("offset").cast("long").isNotNull(), _copy(df, spec)).alias("_copy"),
    )
    topic = F.coalesce(F.col("_topic"), F.lit(spec.topic or name))
    return out.withColumn("topic", topic).drop("_topic").select(
        "source", "source_rank", "topic", "partition", "offset", "key", "value", "timestamp", "headers", "seq", "_problem",
        "_where", "_copy")


def _copy(df: DataFrame, spec: SourceSpec) -> Column:
    """What makes two rows of one offset the same record (docs/semantics.md §7.2): a hash of the key, value,
    timestamp and headers as stored, each with whether it is null. None for a Kafka topic, which holds one
    record per offset itself."""
    if spec.format == "kafka":
        return F.lit(None).cast("long")
    parts = [F.col(c) for c in ("key", "value") if c in df.columns]
    parts += [_millis(df.schema["timestamp"].dataType, "timestamp"), _headers(df)]
    return F.xxhash64(*[x for p in parts for x in (p, p.isNull())])


def _check_key_column(df: DataFrame, spec: SourceSpec, name: str, location: str) -> None:
    """A table's key column must fit the declared key format: nothing is turned into text silently."""
    if "key" not in df.columns:
        return
    dtype = df.schema["key"].dataType
    text = isinstance(dtype, (T.StringType, T.BinaryType))
    integral = isinstance(dtype, (T.ByteType, T.ShortType, T.IntegerType, T.LongType))
    fits = {"string": text, "bytes": text, "json": text, "long": text or integral}.get(
        spec.key.format, isinstance(dtype, T.BinaryType))  # the registry formats: bytes
    if not fits:
        shown = dtype.simpleString()
        hint = "key: {format: long}" if integral else "a string or binary key column (e.g. its JSON text)"
        raise SourceError(f"sources.{name}.key.format: {location} has a {shown} key column, which key.format: "
                          f"{spec.key.format} does not read; declare {hint} (docs/job-spec.md#sources)")


def _millis(dtype: T.DataType, col: str) -> Column:
    """Kafka record timestamp as long epoch ms, whether stored as long or as a timestamp."""
    if isinstance(dtype, (T.TimestampType, T.TimestampNTZType)):
        return F.unix_millis(F.col(col).cast("timestamp"))
    return F.col(col).cast("long")


def _key(df: DataFrame, spec: SourceSpec, job: Job, name: str) -> tuple[Column, Column]:
    if "key" not in df.columns:
        return F.lit(None).cast(KEY_TYPES.get(spec.key.format, T.StringType())), F.lit(None).cast("string")
    if spec.key.format in REGISTRY_FORMATS:  # the schema registry's wire format, or plain Avro (io/formats.py)
        from backfill.io.formats import decode, decoded_type, key_column

        key, bad = decode(df, "key", spec.key, spec.key.format, job, f"sources.{name}.key")
        return key_column(key, decoded_type(df, key)), bad
    raw = F.col("key")
    dtype = df.schema["key"].dataType
    if isinstance(dtype, T.BinaryType) and spec.key.format != "bytes":
        raw = raw.cast("string")
    if spec.key.format == "long" and isinstance(dtype, T.BinaryType):
        # Kafka's LongSerializer: 8 bytes, big-endian, two's complement
        key = F.col("key")
        parsed = F.when(F.length(key) == 8, F.conv(F.hex(key), 16, -10).cast("long"))
        return parsed, F.when(key.isNotNull() & parsed.isNull(), F.concat(
            F.lit("unreadable key: "), F.length(key).cast("string"), F.lit(" bytes, not an 8-byte long")))
    if spec.key.format == "long":
        parsed = F.expr("try_cast(key AS bigint)")
        return parsed, F.when(raw.isNotNull() & parsed.isNull(), F.lit("unreadable key: not a long"))
    return raw.cast(KEY_TYPES[spec.key.format]), F.lit(None).cast("string")


def read_as_text(job: Job, name: str) -> bool:
    """A source of a rules operator keeps its value as JSON text: the rules name its fields, as data."""
    return any(op.rules is not None and name in op.inputs for op in job.spec.operators)


def _value(df: DataFrame, spec: SourceSpec, job: Job, name: str, wanted: set[str] | None = None
           ) -> tuple[DataFrame, Column, Column]:
    """The decoded value and why it is unreadable; JSON is parsed once, into a column both read.

    With `wanted`, the value keeps those fields (and the timestamp field). Parsing still checks the whole
    value: a text field accepts any JSON (Spark writes a non-string as its JSON text), so the fields that
    can make a value unreadable, and are parsed whether read or not, are those of every other type."""
    dtype = df.schema["value"].dataType
    none = F.lit(None).cast("string")
    if spec.value.format in REGISTRY_FORMATS:  # the schema registry's wire format, or plain Avro (io/formats.py)
        from backfill.io.formats import decode

        return df, *decode(df, "value", spec.value, spec.value.format, job, f"sources.{name}.value")
    if read_as_text(job, name):
        text = F.to_json("value") if isinstance(dtype, T.StructType) else F.col("value").cast("string")
        if spec.value.format != "json":
            return df, text, none
        is_object = F.coalesce(F.schema_of_variant(F.expr("try_parse_json(__text)")).startswith("OBJECT"),
                               F.lit(False))
        df = df.withColumn("__text", text)
        return df, F.col("__text"), F.when(F.col("__text").isNotNull() & ~is_object,
                                           F.lit("unreadable value: not a JSON object"))
    if spec.value.format == "string" or isinstance(dtype, T.StructType):
        if isinstance(dtype, T.StructType) and spec.value.format == "string":
            return df, F.to_json("value"), none
        return df, (F.col("value").cast("string") if not isinstance(dtype, T.StructType) else F.col("value")), none
    text = F.col("value").cast("string")
    if spec.value.schema_:
        schema = load_value_schema(job.resolve(spec.value.schema_))
    else:
        schema = _infer_schema(df, text)
    if wanted is not None:  # names in lower case, as Spark SQL resolves them
        wanted = wanted | ({spec.timestamp.field.lower()} if spec.timestamp.field else set())
        schema = T.StructType([f for f in schema.fields
                               if f.name.lower() in wanted or not isinstance(f.dataType, T.StringType)]
                              or schema.fields[:1])  # a value read for nothing but its presence
    df = df.withColumn("__parsed", F.from_json(text, _with_corrupt(schema),
                                               {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}))
    parsed = F.col("__parsed")
    fields = [f.name for f in schema.fields if f.name != CORRUPT and (wanted is None or f.name.lower() in wanted)]
    fields = fields or [f.name for f in schema.fields][:1]
    value = F.when(text.isNull(), F.lit(None)).otherwise(F.struct(*[parsed[f].alias(f) for f in fields]))
    bad = F.when(text.isNotNull() & (parsed.isNull() | parsed[CORRUPT].isNotNull()),
                 F.lit("unreadable value: not a JSON object matching the value schema"))
    return df, value, bad


def _with_corrupt(schema: T.StructType) -> T.StructType:
    """A copy of `schema` with the corrupt-record column (StructType.add mutates in place)."""
    return T.StructType([*schema.fields, T.StructField(CORRUPT, T.StringType())])


def _infer_schema(df: DataFrame, text: Column) -> T.StructType:
    """Without value.schema, infer the JSON value schema from the data (one extra pass)."""
    spark = df.sparkSession
    if is_connect(spark):
        inferred = json_schema(df.select(text.alias("v")).where("v IS NOT NULL"))
        return T.StructType([f for f in inferred.fields if f.name != CORRUPT])
    rows = df.select(text.alias("v")).where("v IS NOT NULL")._jdf
    strings = getattr(rows, "as")(spark._jvm.org.apache.spark.sql.Encoders.STRING())  # no row goes through Python
    inferred = T.StructType.fromJson(json.loads(spark._jsparkSession.read().json(strings).schema().json()))
    return T.StructType([f for f in inferred.fields if f.name != CORRUPT])


def _headers(df: DataFrame) -> Column:
    if "headers" not in df.columns:
        return F.lit(None).cast(HEADERS_TYPE)
    dtype = df.schema["headers"].dataType
    if isinstance(dtype, T.MapType):  # JSONL: {"name": "text"}
        return F.transform(F.map_entries("headers"), lambda e: F.struct(
            e["key"].alias("key"), e["value"].cast("binary").alias("value"))).cast(HEADERS_TYPE)
    return F.col("headers").cast(HEADERS_TYPE)
