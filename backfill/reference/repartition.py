"""Part: reference engine. Re-keying (`group_by`) one record at a time: the new key, its serialized bytes,
Kafka's murmur2 partitioner, and the modelled order inside each repartition partition
(docs/semantics.md §13; the Spark side is ops/repartition.py, whose docstring states the model). A re-keyed
join also reads the input it keeps as it is, merged with the repartition partitions in its own tasks.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any

from backfill.errors import SpecError
from backfill.jobspec.rekeys import Rekey
from backfill.reference.expr import compile_scalar

MASK = 0xFFFFFFFF
M = 0x5BD1E995


def murmur2(data: bytes) -> int:
    """Utils#murmur2: 32-bit MurmurHash2, seed 0x9747b28c, little-endian blocks; Java's signed int result."""
    length = len(data)
    h = (0x9747B28C ^ length) & MASK
    blocks = length // 4
    for i in range(blocks):
        k = int.from_bytes(data[4 * i:4 * i + 4], "little")
        k = (k * M) & MASK
        k ^= k >> 24
        k = (k * M) & MASK
        h = (h * M) & MASK
        h ^= k
    rest = data[4 * blocks:]
    if len(rest) == 3:
        h ^= rest[2] << 16
    if len(rest) >= 2:
        h ^= rest[1] << 8
    if len(rest) >= 1:
        h ^= rest[0]
        h = (h * M) & MASK
    h ^= h >> 13
    h = (h * M) & MASK
    h ^= h >> 15
    return h - (1 << 32) if h >= 1 << 31 else h


def partition_for(key_bytes: bytes, partitions: int) -> int:
    """The producer's partition of a keyed record: toPositive(murmur2) % partitions."""
    return (murmur2(key_bytes) & 0x7FFFFFFF) % partitions


def serialize(key: Any, fmt: str | None, schema_id: int | None = None) -> bytes:
    """The new key as Kafka's String/Long/Integer serializer (or as bytes) writes it; the format, when not
    declared, follows the value's type (a whole number is a long, as JSON numbers are read). `avro`: fastavro's
    encoding of the primitive after the registry's header (magic byte 0, `schema_id` as 4 bytes)."""
    if fmt == "avro":
        import io

        import fastavro

        kind = "boolean" if isinstance(key, bool) else "long" if isinstance(key, int) else \
            "double" if isinstance(key, float) else "string"
        out = io.BytesIO()
        fastavro.schemaless_writer(out, fastavro.parse_schema(kind), key if kind != "string" else str(key))
        return b"\x00" + int(schema_id or 0).to_bytes(4, "big") + out.getvalue()
    if fmt is None:
        fmt = "bytes" if isinstance(key, bytes | bytearray) else "long" if isinstance(key, int) and not \
            isinstance(key, bool) else "string"
    if fmt == "bytes":
        return bytes(key) if isinstance(key, bytes | bytearray) else str(key).encode("utf-8")
    if fmt == "long":
        return int(key).to_bytes(8, "big", signed=True)
    if fmt == "int":
        return ((int(key) + (1 << 31)) % (1 << 32) - (1 << 31)).to_bytes(4, "big", signed=True)
    if isinstance(key, bool):
        return b"true" if key else b"false"
    return str(key).encode("utf-8")


class Repartition:
    """One repartition topic: filled by the upstream tasks, read by the downstream ones."""

    def __init__(self, rekey: Rekey, partitions: int, rank: int) -> None:
        self.rekey, self.partitions, self.rank = rekey, partitions, rank
        self.name = rekey.topic
        self.spec = rekey.spec
        try:
            self.key = compile_scalar(self.spec.key)
        except SpecError as exc:
            raise SpecError(f"{rekey.where}.key: {exc}") from None
        self.written: dict[int, list[tuple[int, int, int, dict[str, Any]]]] = defaultdict(list)

    def new_key(self, rec: dict[str, Any]) -> Any:
        """The record's new key (None: it is filtered before the topic, unless the rekey lets it pass)."""
        return self.key(rec)

    def write(self, rec: dict[str, Any], key: Any, partition_time: int) -> None:
        """Append the re-keyed record, remembering where the upstream task was (the interleaving model). A
        null key that passes goes to the upstream partition's number (the real producer picks one)."""
        q = rec["partition"] % self.partitions if key is None else \
            partition_for(serialize(key, self.spec.format, self.spec.schema_id), self.partitions)
        origin = {c: rec[c] for c in ("source", "topic", "partition", "offset")}
        self.written[q].append((partition_time, rec["partition"], rec["offset"],
                                {**rec, "key": key, "_origin": origin}))

    def partition(self, q: int) -> list[dict[str, Any]]:
        """Partition q in offset order: by upstream partition time, upstream partition, offset."""
        rows = sorted(self.written.get(q, []), key=lambda w: w[:3])
        return [{**rec, "source": self.name, "topic": self.name, "partition": q, "offset": i}
                for i, (*_, rec) in enumerate(rows)]


class AsIs:
    """A join input that a re-keyed join reads as it is: its processed records, per partition, in offset order."""

    def __init__(self, name: str, rank: int) -> None:
        self.name, self.rank = name, rank
        self.written: dict[int, list[dict[str, Any]]] = defaultdict(list)

    def write(self, rec: dict[str, Any], key: Any, partition_time: int) -> None:
        origin = {c: rec[c] for c in ("source", "topic", "partition", "offset")}
        self.written[rec["partition"]].append({**rec, "source": self.name, "_origin": origin})

    def partition(self, q: int) -> list[dict[str, Any]]:
        return self.written.get(q, [])
