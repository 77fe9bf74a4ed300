"""Part: reference engine. Keys and values in the schema registry's wire format, and plain Avro, one record at a
time: fastavro for Avro, the protobuf package for Protobuf, json for JSON Schema (job-spec "Real data formats").

Its own code from end to end (the Spark engine decodes in io/formats.py with spark-avro): the header (magic byte
0, a 4-byte big-endian schema id), the schemas by id (a registry's `GET /schemas/ids/N` or a folder of `<id>.avsc`,
`<id>.desc`, `<id>.json`), the shape every version is read as (the reader schema, else the newest writer schema
of the source: its highest id), and why a record is unreadable.
"""
from __future__ import annotations

import base64
import io
import json
import os
import struct
import urllib.error
import urllib.request
from decimal import Decimal
from typing import Any

from backfill.errors import SourceError
from backfill.jobspec.load import Job
from backfill.jobspec.models import Encoded

FILES = {"avro": ".avsc", "protobuf": ".desc", "json_schema": ".json"}


class Decoder:
    """Decodes one source's keys or values; built from every raw value of the source (for the newest id)."""

    def __init__(self, job: Job, enc: Encoded, fmt: str, part: str, raws: list[bytes | None], where: str) -> None:
        self.job, self.enc, self.fmt, self.part, self.where = job, enc, fmt, part, where
        self.plain = fmt == "avro" and enc.schema_ is not None
        self.schemas: dict[int, Any] = {}
        if self.plain:
            self.writer = _avro(self._file(enc.schema_ or ""))
            self.reader = _avro(self._file(enc.reader_schema)) if enc.reader_schema else self.writer
            return
        ids = sorted({struct.unpack(">I", r[1:5])[0] for r in raws if r is not None and len(r) >= 5 and r[0] == 0})
        for i in ids:
            schema = self._fetch(i)
            if schema is not None:
                self.schemas[i] = schema
        if ids and not self.schemas and not (fmt == "avro" and enc.reader_schema):
            raise SourceError(f"{where}: the input has schema ids {ids} and the registry knows none of them, so "
                              f"there is no schema to read the {part}s as")
        newest = self.schemas[max(self.schemas)] if self.schemas else None
        if fmt == "avro":
            self.reader = _avro(self._file(enc.reader_schema)) if enc.reader_schema else newest
        elif fmt == "protobuf" and newest is not None:
            self.shape = _pb_message(newest, enc.message, [0])
        elif fmt == "json_schema" and newest is not None:
            self.shape = newest["properties"]

    def decode(self, raw: bytes | None) -> tuple[Any, str | None]:
        """The decoded key or value and why it is unreadable."""
        if raw is None:
            return None, None
        if self.plain:
            try:
                return _read_avro(raw, self.writer, self.reader), None
            except Exception:  # noqa: BLE001 - any failure is a payload that does not decode
                return None, f"unreadable {self.part}: the payload does not decode as the Avro schema {self.enc.schema_}"
        if len(raw) < 5 or raw[0] != 0:
            magic = raw[:1].hex()
            return None, (f"unreadable {self.part}: no schema registry header (magic byte 0x{magic}, 5 bytes at "
                          "least; the wire format starts with 0 and a 4-byte schema id)")
        sid = struct.unpack(">I", raw[1:5])[0]
        if sid not in self.schemas:
            registry = self.enc.registry
            assert registry is not None
            url = registry.url or ""
            source = f"{url.partition('://')[0]}://{url.partition('://')[2].rsplit('@', 1)[-1]}" if url \
                else registry.schemas
            return None, f"unreadable {self.part}: schema id {sid} is not in the registry ({source})"
        try:
            return self._payload(raw[5:], self.schemas[sid]), None
        except Exception:  # noqa: BLE001
            return None, f"unreadable {self.part}: the payload does not decode as {self.fmt} with schema id {sid}"

    def _payload(self, data: bytes, writer: Any) -> Any:
        if self.fmt == "avro":
            return _read_avro(data, writer, self.reader)
        if self.fmt == "protobuf":
            return _read_protobuf(data, writer, self.enc.message, self.shape)
        return _read_json(data, self.shape)

    def _file(self, path: str | None) -> str:
        with open(self.job.resolve(path or "")) as fh:
            return fh.read()

    def _fetch(self, schema_id: int) -> Any:
        registry = self.enc.registry
        assert registry is not None
        if registry.schemas is not None:
            path = os.path.join(self.job.resolve(registry.schemas), f"{schema_id}{FILES[self.fmt]}")
            if not os.path.isfile(path):
                return None
            if self.fmt == "protobuf":
                with open(path, "rb") as fh:
                    return _pb_pool(fh.read())
            with open(path) as fh:
                text = fh.read()
        else:
            assert registry.url is not None
            try:
                with urllib.request.urlopen(f"{registry.url.rstrip('/')}/schemas/ids/{schema_id}", timeout=10) as r:
                    text = json.loads(r.read())["schema"]
            except urllib.error.HTTPError as exc:
                if exc.code == 404:
                    return None
                raise SourceError(f"{self.where}.registry.url: HTTP {exc.code} for schema id {schema_id}") from None
            except OSError as exc:
                raise SourceError(f"{self.where}.registry.url: no schema registry answered ({exc})") from None
            if self.fmt == "protobuf":
                from google.protobuf import descriptor_pb2

                fdp = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(text))
                return _pb_pool(descriptor_pb2.FileDescriptorSet(file=[fdp]).SerializeToString())
        return _avro(text) if self.fmt == "avro" else json.loads(text)


# ----------------------------------------------------------------------------- Avro (fastavro)


def _avro(text: str) -> Any:
    import fastavro

    return fastavro.parse_schema(json.loads(text))


def _read_avro(data: bytes, writer: Any, reader: Any) -> Any:
    import fastavro

    return fastavro.schemaless_reader(io.BytesIO(data), writer, reader)


# ----------------------------------------------------------------------------- JSON Schema


def _read_json(data: bytes, properties: dict[str, Any]) -> dict[str, Any]:
    doc = json.loads(data.decode())
    if not isinstance(doc, dict):
        raise ValueError("not an object")
    return {name: _json_field(doc.get(name), sub) for name, sub in properties.items()}


def _json_field(value: Any, sub: dict[str, Any]) -> Any:
    """A declared field's value as Spark's from_json reads it: of its type, else the record does not decode."""
    kind = sub.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    if value is None:
        return None
    if kind == "string":
        return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    if kind == "integer" and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind == "number" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if kind == "boolean" and isinstance(value, bool):
        return value
    if kind == "object" and isinstance(value, dict):
        return {n: _json_field(value.get(n), s) for n, s in sub.get("properties", {}).items()}
    if kind == "array" and isinstance(value, list):
        return [_json_field(v, sub.get("items", {"type": "string"})) for v in value]
    raise ValueError(f"not a JSON {kind}")


# ----------------------------------------------------------------------------- Protobuf


def _pb_pool(descriptors: bytes) -> Any:
    from google.protobuf import descriptor_pb2, descriptor_pool

    pool = descriptor_pool.DescriptorPool()
    files = descriptor_pb2.FileDescriptorSet.FromString(descriptors).file
    for proto in files:
        pool.Add(proto)
    return pool, files[-1].name


def _pb_message(writer: Any, name: str | None, indexes: list[int]) -> Any:
    pool, main = writer
    if name is not None:
        return pool.FindMessageTypeByName(name)
    msg = list(pool.FindFileByName(main).message_types_by_name.values())[indexes[0]]
    for i in indexes[1:]:
        msg = msg.nested_types[i]
    return msg


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return (result >> 1) ^ -(result & 1), pos


def _read_protobuf(data: bytes, writer: Any, name: str | None, shape: Any) -> dict[str, Any]:
    from google.protobuf import message_factory

    count, pos = _varint(data, 0)
    if not 0 <= count <= 64:
        raise ValueError("bad message indexes")
    indexes = []
    for _ in range(count):
        index, pos = _varint(data, pos)
        indexes.append(index)
    descriptor = _pb_message(writer, name, indexes or [0])
    msg = message_factory.GetMessageClass(descriptor)()
    msg.ParseFromString(data[pos:])
    return _pb_dict(msg, shape)


def _pb_dict(msg: Any, shape: Any) -> dict[str, Any]:
    """The message as the newest writer's message type reads it: a field the writer lacks is null."""
    out: dict[str, Any] = {}
    own = msg.DESCRIPTOR.fields_by_name
    for field in shape.fields:
        mine = own.get(field.name)
        if mine is None or (not _is_list(mine) and mine.has_presence and not msg.HasField(field.name)):
            out[field.name] = None
            continue
        value = getattr(msg, field.name)
        if _is_list(mine):
            out[field.name] = [_pb_value(mine, v, field) for v in value]
        else:
            out[field.name] = _pb_value(mine, value, field)
    return out


def _is_list(field: Any) -> bool:
    return bool(field.is_repeated if hasattr(field, "is_repeated") else field.label == 3)


def _pb_value(mine: Any, value: Any, target: Any) -> Any:
    if mine.type == 11:
        return _pb_dict(value, target.message_type) if target.message_type is not None else None
    if mine.type == 14:
        enum = mine.enum_type.values_by_number.get(value)
        return enum.name if enum is not None else str(value)
    if mine.type in (4, 6):  # uint64, fixed64: a decimal(20, 0) in Spark
        return Decimal(value)
    return value


def key_text(value: Any) -> Any:
    """A decoded key as the record's key: a record (dict) as compact JSON text without its null fields, as
    Spark's to_json writes a struct."""
    if isinstance(value, dict):
        return json.dumps(_no_nulls(value), separators=(",", ":"))
    return value


def _no_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _no_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_no_nulls(v) for v in value]
    return value
