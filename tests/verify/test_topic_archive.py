"""Verify against an archived output topic: time-windowed keys and JSON values decoded into output rows."""
from __future__ import annotations

import struct

import pytest
from pyspark.sql import types as T

from backfill.errors import SourceError
from backfill.verify.tables import decode_window_topic, is_topic_archive

pytestmark = pytest.mark.spark
SCHEMA = T.StructType([T.StructField("topic", T.StringType()), T.StructField("partition", T.IntegerType()),
                       T.StructField("offset", T.LongType()), T.StructField("key", T.BinaryType()),
                       T.StructField("value", T.BinaryType()), T.StructField("timestamp", T.LongType())])
VALUES = T.StructType([T.StructField("clicks", T.LongType()), T.StructField("amount", T.DoubleType()),
                       T.StructField("pages", T.StringType())])


def _windowed(key: str, start: int) -> bytearray:
    """What WindowedSerdes.timeWindowedSerdeFrom(String.class, size) writes: the key's bytes, the start as 8 bytes."""
    return bytearray(key.encode() + struct.pack(">q", start))


def test_windowed_keys_and_json_values_become_output_rows(spark) -> None:
    df = spark.createDataFrame([
        ("out", 1, 7, _windowed("user-é", 1_704_067_200_000), bytearray(b'{"clicks": 3, "amount": null, "pages": "hp"}'),
         1_704_067_259_000),
        ("out", 0, 0, _windowed("u", 0), bytearray(b'{"clicks": 1, "amount": 2.5, "pages": "-", "extra": 1}'), 5),
    ], SCHEMA)
    assert is_topic_archive(df)
    rows = [r.asDict() for r in decode_window_topic(df, 60_000, VALUES, "--against x").orderBy("offset").collect()]
    assert rows == [
        {"key": "u", "window_start": 0, "window_end": 60_000, "clicks": 1, "amount": 2.5, "pages": "-", "ts": 5,
         "partition": 0, "offset": 0},
        {"key": "user-é", "window_start": 1_704_067_200_000, "window_end": 1_704_067_260_000, "clicks": 3,
         "amount": None, "pages": "hp", "ts": 1_704_067_259_000, "partition": 1, "offset": 7},
    ]


def test_a_key_without_a_window_is_refused_with_its_offset(spark) -> None:
    df = spark.createDataFrame([("out", 0, 0, _windowed("u", 0), bytearray(b"{}"), 1),
                                ("out", 0, 1, bytearray(b"user-1"), bytearray(b"{}"), 2)], SCHEMA)
    with pytest.raises(SourceError, match=r"^--against x: the record at partition 0 offset 1 has no time-windowed key"):
        decode_window_topic(df, 60_000, VALUES, "--against x")


def test_an_output_table_is_not_a_topic_archive(spark) -> None:
    df = spark.createDataFrame([("u", 0, 60_000, 1)], "key string, window_start long, window_end long, clicks long")
    assert not is_topic_archive(df)
