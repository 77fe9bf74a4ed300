"""Part: foundation. The dropped-records ledger (docs/semantics.md §7): every record not contributing says why."""
from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from backfill.jobspec.rekeys import NOT_REPARTITIONED

LEDGER_SCHEMA = T.StructType([
    T.StructField("source", T.StringType()), T.StructField("topic", T.StringType()),
    T.StructField("partition", T.IntegerType()), T.StructField("offset", T.LongType()),
    T.StructField("key", T.StringType()), T.StructField("timestamp", T.LongType()),
    T.StructField("operator", T.StringType()), T.StructField("reason", T.StringType()),
    T.StructField("detail", T.StringType()), T.StructField("stream_time", T.LongType()),
    T.StructField("window_start", T.LongType()), T.StructField("window_end", T.LongType()),
    T.StructField("range_time", T.LongType()),
])

# reasons (job-spec.md "Outputs"; documented in docs/semantics.md "Every record is accounted for")
INVALID_TIMESTAMP = "invalid_timestamp"
UNREADABLE = "unreadable"
NULL_KEY = "null_key"
LATE = "late"
BEYOND_RANGE = "beyond_range"
CONFLICTING_OFFSET = "conflicting_offset"  # a copy of an offset whose copies differ (docs/semantics.md §7.2)


def ledger_rows(df: DataFrame, *, reason: Column | str, operator: str | None = None,
                timestamp: Column | None = None, detail: Column | None = None,
                stream_time: Column | None = None, window_start: Column | None = None,
                window_end: Column | None = None, range_time: Column | None = None) -> DataFrame:
    """Project records (or record x window pairs) onto the ledger schema."""
    def lit_or(col: Column | str | None, dtype: str) -> Column:
        if col is None:
            return F.lit(None).cast(dtype)
        return F.lit(col) if isinstance(col, str) else col

    key = F.col("key")
    key_text = F.hex(key) if isinstance(df.schema["key"].dataType, T.BinaryType) else key.cast("string")
    names = ("source", "topic", "partition", "offset")
    where = [F.col(c) for c in names]
    if "_origin" in df.columns:  # a record of a repartition topic (or a copy): the row names its input record
        where = [F.coalesce(F.col(f"_origin.{c}"), F.col(c)).alias(c) for c in names]
        # a join input copied into a re-keyed join's tasks keeps its topic: nothing to say
        rekeyed = F.when(F.col("_origin").isNotNull() & ~F.col("topic").eqNullSafe(F.col("_origin.topic")), F.when(
            F.col("partition").isNull(), F.lit(NOT_REPARTITIONED)).otherwise(
            F.concat(F.lit("re-keyed to "), F.col("topic"), F.lit("/"), F.col("partition").cast("string"))))
        detail = rekeyed if detail is None else F.coalesce(detail, rekeyed)
    return df.select(
        *where, key_text.alias("key"),
        (timestamp if timestamp is not None else F.col("ts")).cast("long").alias("timestamp"),
        lit_or(operator, "string").alias("operator"), lit_or(reason, "string").alias("reason"),
        lit_or(detail, "string").alias("detail"), lit_or(stream_time, "long").alias("stream_time"),
        lit_or(window_start, "long").alias("window_start"), lit_or(window_end, "long").alias("window_end"),
        lit_or(range_time, "long").alias("range_time"),
    )
