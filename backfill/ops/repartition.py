"""Part: operators. Re-keying (`group_by`): the repartition topic Kafka Streams inserts before a re-keyed
aggregate or join (docs/semantics.md §13), as records of a derived source (jobspec/rekeys.py names them).

The upstream task evaluates the new key for each record it processes, in its order. A null new key never
reaches the repartition topic (Kafka Streams filters it silently; here it is a `null_key` ledger row of the
operator), except before a left or outer join (Kafka Streams 3.7+). Any other record is written to
partition `(murmur2(serialized key) & 0x7fffffff) % partitions` of the topic, keeping its value and
timestamp. The downstream task `q` reads partition `q` in offset order, with its own stream time; a join's
task merges it with partition `q` of the other input (re-keyed too, or read as it is: `as_is`).

What no batch can know is the order inside a repartition partition: every upstream task appends to it
and the broker interleaves their batches in arrival order. The model: records keep each upstream
task's order (what Kafka guarantees) and are interleaved by the upstream partition time at which they were
processed, ties by upstream partition, then offset. That is what a caught-up application does, with its
tasks moving through event time together; a replay from far behind interleaves by throughput instead.
Only records of the same new key that come from different upstream partitions are affected.

A derived record keeps its origin (source, topic, partition, offset) in `_origin`: the ledger names the
input record, not its copy in the repartition topic.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa
from numba import njit
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from backfill.errors import SpecError
from backfill.jobspec.models import GroupBySpec, OperatorSpec
from backfill.jobspec.rekeys import Rekey, repartition_count

# Spark type of the new key -> the Kafka serializer that writes it (its bytes are what is hashed)
FORMATS = {T.StringType: "string", T.LongType: "long", T.IntegerType: "int", T.BinaryType: "bytes"}


# ---------------------------------------------------------------------------------------------- murmur2
@njit(cache=True)
def _murmur2(data: np.ndarray, offsets: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover - compiled
    """Kafka's Utils#murmur2 over each slice data[offsets[i]:offsets[i+1]] (32-bit arithmetic, as ints)."""
    m = np.uint32(0x5BD1E995)
    for i in range(out.shape[0]):
        lo, hi = offsets[i], offsets[i + 1]
        length = hi - lo
        h = np.uint32(0x9747B28C) ^ np.uint32(length)
        blocks = length // 4
        for b in range(blocks):
            j = lo + 4 * b
            k = (np.uint32(data[j]) | (np.uint32(data[j + 1]) << np.uint32(8))
                 | (np.uint32(data[j + 2]) << np.uint32(16)) | (np.uint32(data[j + 3]) << np.uint32(24)))
            k = np.uint32(k * m)
            k ^= k >> np.uint32(24)
            k = np.uint32(k * m)
            h = np.uint32(h * m)
            h ^= k
        tail = lo + 4 * blocks
        rest = length % 4
        if rest == 3:
            h ^= np.uint32(data[tail + 2]) << np.uint32(16)
        if rest >= 2:
            h ^= np.uint32(data[tail + 1]) << np.uint32(8)
        if rest >= 1:
            h ^= np.uint32(data[tail])
            h = np.uint32(h * m)
        h ^= h >> np.uint32(13)
        h = np.uint32(h * m)
        h ^= h >> np.uint32(15)
        out[i] = np.int32(np.int64(h) - (np.int64(1) << 32) if h >= np.uint32(1 << 31) else np.int64(h))


def murmur2(values: pa.Array) -> np.ndarray:
    """murmur2 of each binary value (int32, Kafka's signed result); nulls give 0."""
    values = pa.array(values, type=pa.binary()) if not isinstance(values, pa.Array) else values
    values = values.cast(pa.binary()).fill_null(b"")
    if values.offset:  # a slice: its buffers start earlier
        values = pa.concat_arrays([values])
    _, offsets_buf, data_buf = values.buffers()
    n = len(values)
    offsets = np.frombuffer(offsets_buf, dtype=np.int32, count=n + 1)
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    out = np.empty(n, dtype=np.int32)
    _murmur2(data, offsets, out)
    return out


def partition_for(hashes: np.ndarray, partitions: int) -> np.ndarray:
    """BuiltInPartitioner#partitionForKey: toPositive (a bit mask, not abs) modulo the partition count."""
    return (hashes.astype(np.int64) & 0x7FFFFFFF) % partitions


def _partition_udf(partitions: int) -> Column:
    def partition(keys: pa.Array) -> pa.Array:
        return pa.array(partition_for(murmur2(keys), partitions).astype(np.int32), type=pa.int32())
    return F.arrow_udf(partition, T.IntegerType())  # type: ignore[return-value]


# ---------------------------------------------------------------------------------------------- new key
def key_bytes(key: Column, dtype: T.DataType, fmt: str) -> Column:
    """The new key as its Kafka serializer writes it (StringSerializer: UTF-8; Long/IntegerSerializer:
    big-endian two's complement; bytes as they are)."""
    if fmt == "string":
        return F.encode(key.cast("string"), "UTF-8")
    if fmt == "bytes":
        return key.cast("binary")
    if fmt == "long":
        return F.unhex(F.lpad(F.hex(key.cast("long")), 16, "0"))
    if fmt.startswith("avro:"):
        return _avro_key_udf(int(fmt[5:]), dtype)(key)
    # int: the low four bytes of the two's complement
    return F.unhex(F.substring(F.lpad(F.hex(key.cast("int").cast("long")), 16, "0"), 9, 8))


def _avro_key_udf(schema_id: int, dtype: T.DataType) -> Any:
    """A primitive key as an Avro serializer in the registry's wire format writes it: 0, the schema id (4 bytes,
    big-endian), then the Avro binary encoding (string: zig-zag length and UTF-8; long, int: zig-zag varint;
    boolean: one byte; double: 8 bytes little-endian)."""
    import struct

    header = b"\x00" + struct.pack(">I", schema_id)

    def varint(n: int) -> bytes:
        z, out = (n << 1) ^ (n >> 63), bytearray()
        z &= (1 << 64) - 1
        while z >= 0x80:
            out.append((z & 0x7F) | 0x80)
            z >>= 7
        out.append(z)
        return bytes(out)

    def encode(value: Any) -> bytes | None:
        if value is None:
            return None
        if isinstance(value, bool):
            return header + (b"\x01" if value else b"\x00")
        if isinstance(value, int):
            return header + varint(value)
        if isinstance(value, float):
            return header + struct.pack("<d", value)
        data = str(value).encode("utf-8")
        return header + varint(len(data)) + data

    return F.udf(encode, T.BinaryType())


def new_key_format(where: str, spec: GroupBySpec, dtype: T.DataType) -> str:
    """The serializer of the new key: declared, else by its Spark type; a type without one is an error."""
    if spec.format == "avro":
        if not isinstance(dtype, (T.StringType, T.LongType, T.IntegerType, T.BooleanType, T.DoubleType)):
            raise SpecError(f"{where}.format: avro serializes a primitive key here (string, long, int, boolean, "
                            f"double); {spec.key!r} gives {dtype.simpleString()}")
        return f"avro:{spec.schema_id}"
    if spec.format is not None:
        return spec.format
    for cls, fmt in FORMATS.items():
        if isinstance(dtype, cls):
            return fmt
    raise SpecError(f"{where}.key: {spec.key!r} gives {dtype.simpleString()}, "
                    "which has no Kafka serializer here; serialize it yourself (e.g. to_json(...) or "
                    f"cast(... as string)) or set {where}.format: string | long | int | bytes")


DERIVED_DROPS = ("task", "seq", "_partition_time", "_partition_time_before")


def _origin() -> Column:
    return F.struct(F.col("source"), F.col("topic"), F.col("partition"), F.col("offset"))


def repartition(rekey: Rekey, upstream: DataFrame, partitions: int, beyond: Column) -> DataFrame:
    """The records of a repartition topic, built from the upstream records in task order.

    `upstream`: the ordered records (with `_partition_time`); `beyond`: records past the run's cool-down
    (never processed upstream, so never re-keyed). Returns records of source `rekey.topic` with `partition`
    and `offset` in that topic; a null new key keeps partition and offset null, unless it passes
    (`keep_null`): then it goes to the upstream partition's number modulo the count.
    """
    mine = upstream.where((F.col("source") == rekey.input) & F.col("_drop").isNull() & ~beyond)
    spec = rekey.spec
    try:
        new_key = F.expr(spec.key)
        dtype = mine.select(new_key.alias("k")).schema["k"].dataType
    except Exception as exc:  # analysis errors: an unknown column, a bad expression
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SpecError(f"{rekey.where}.key: {spec.key!r} is not a valid Spark SQL expression over the record "
                        f"(key, value.<field>, ts, timestamp, partition, offset, headers): {first}") from None
    fmt = new_key_format(rekey.where, spec, dtype)
    q = F.when(F.col("_new_key").isNotNull(), _partition_udf(partitions)(key_bytes(F.col("_new_key"), dtype, fmt)))
    if rekey.keep_null:
        q = F.coalesce(q, F.col("partition") % F.lit(partitions))
    keyed = mine.withColumn("_origin", _origin()).withColumn("_new_key", new_key).withColumn("_q", q)
    # offset order in each repartition partition: the modelled interleaving (module docstring)
    arrival = Window.partitionBy("_q").orderBy("_partition_time", F.col("_origin.partition"),
                                               F.col("_origin.offset"))
    offset = F.when(F.col("_q").isNotNull(), F.row_number().over(arrival) - 1).cast("long")
    return (keyed.withColumn("offset", offset)
            .withColumn("partition", F.col("_q")).withColumn("key", F.col("_new_key"))
            .withColumn("source", F.lit(rekey.topic)).withColumn("topic", F.lit(rekey.topic))
            .drop("_new_key", "_q", *DERIVED_DROPS))


def as_is(upstream: DataFrame, source: str, stream: str, beyond: Column) -> DataFrame:
    """A join input read as it is by a re-keyed join's tasks: its records under the stream's name, with their
    own coordinates as origin."""
    mine = upstream.where((F.col("source") == source) & F.col("_drop").isNull() & ~beyond)
    return mine.withColumn("_origin", _origin()).withColumn("source", F.lit(stream)).drop(*DERIVED_DROPS)


def partitions_of(op: OperatorSpec, declared: Mapping[str, int | None], observed: Mapping[str, int]) -> int:
    """The repartition topics' partition count (jobspec/rekeys.py), input counts declared, else observed."""
    return repartition_count(op, lambda source: declared.get(source) or max(observed.get(source, 0), 1))
