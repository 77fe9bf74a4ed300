"""Part: time. Timestamp extraction with Kafka Streams' rules (docs/semantics.md §1).

A record's extracted timestamp `ts` is the Kafka record timestamp (`record`) or a value field (`field`).
Invalid means null or negative. Policies: fail (FailOnInvalidTimestamp), skip
(LogAndSkipOnInvalidTimestamp: to the ledger as `invalid_timestamp`), partition_time
(UsePartitionTimeOnInvalidTimestamp: the max valid timestamp dequeued earlier from the same partition;
none yet -> fail). Unreadable records are skipped before extraction and never move partition time.
"""
from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from backfill.errors import SpecError
from backfill.jobspec.models import TimestampSpec

# `_drop`: why a record never reaches an operator (null when it does); `_fatal`: a policy says fail.
INVALID = "invalid_timestamp"
NO_PARTITION_TIME = "invalid_timestamp_no_partition_time"


def raw_timestamp(records: DataFrame, spec: TimestampSpec, source: str) -> Column:
    """The extractor's result as long ms (null when the value has no such field)."""
    if spec.extractor == "record":
        return F.col("timestamp")
    value_type = records.schema["value"].dataType
    if not isinstance(value_type, T.StructType):
        raise SpecError(f"sources.{source}.timestamp.field: extractor: field needs value.format: json "
                        "(a string value has no fields)")
    assert spec.field is not None
    parts = spec.field.split(".")
    dtype: T.DataType = value_type
    for part in parts:
        if not isinstance(dtype, T.StructType) or part not in dtype.fieldNames():
            raise SpecError(f"sources.{source}.timestamp.field: {spec.field!r} is not a value field "
                            f"(fields: {', '.join(value_type.fieldNames())})")
        dtype = dtype[part].dataType
    col = F.col("value." + spec.field)
    if isinstance(dtype, (T.TimestampType, T.TimestampNTZType)):
        return F.unix_millis(col.cast("timestamp"))
    if isinstance(dtype, T.StringType):  # epoch ms as text, else an ISO-8601 instant
        return F.coalesce(col.try_cast("long"), F.unix_millis(F.to_timestamp(col)))
    return col.try_cast("long")


def _conflicting(df: DataFrame) -> Column:
    """A copy of an offset whose copies differ (io/sources.py `_copy`): it gives no partition time. Partitioned
    by the offset within the window below, which sorts the same way: no sort of its own."""
    if "_copy" not in df.columns:
        return F.lit(False)
    copies = Window.partitionBy("source", "topic", "partition", "offset")
    return F.coalesce(F.min("_copy").over(copies) != F.max("_copy").over(copies), F.lit(False))


def extract(records: DataFrame, spec: TimestampSpec, source: str) -> DataFrame:
    """Add `ts` (extracted, policy applied) and `_drop` ('unreadable...', invalid_timestamp) / `_fatal`."""
    raw = raw_timestamp(records, spec, source)
    readable = F.col("_problem").isNull()
    df = records.withColumn("_raw_ts", F.when(readable, raw))
    invalid = readable & (F.col("_raw_ts").isNull() | (F.col("_raw_ts") < 0))
    if spec.on_invalid == "partition_time":
        # max of earlier valid timestamps of this partition in offset order (RecordQueue#poll)
        # (by offset: the copies of an offset are not earlier than each other; docs/semantics.md §7.2)
        earlier = (Window.partitionBy("source", "topic", "partition").orderBy("offset")
                   .rangeBetween(Window.unboundedPreceding, -1))
        valid_ts = F.when(readable & (F.col("_raw_ts") >= 0) & ~_conflicting(df), F.col("_raw_ts"))
        df = df.withColumn("_ptime", F.max(valid_ts).over(earlier))
        ts = F.when(invalid, F.col("_ptime")).otherwise(F.col("_raw_ts"))
        fatal = F.when(invalid & F.col("_ptime").isNull(), F.lit(NO_PARTITION_TIME))
        drop = F.when(~readable, F.col("_problem"))
        return df.withColumn("ts", ts).withColumn("_fatal", fatal).withColumn("_drop", drop).drop("_ptime")
    fatal = F.when(invalid, F.lit(INVALID)) if spec.on_invalid == "fail" else F.lit(None).cast("string")
    drop = F.when(~readable, F.col("_problem")).when(invalid, F.lit(INVALID))
    return (df.withColumn("ts", F.when(~invalid & readable, F.col("_raw_ts")))
            .withColumn("_fatal", fatal).withColumn("_drop", drop))
