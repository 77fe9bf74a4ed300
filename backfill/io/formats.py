"""Part: io. Keys and values in the schema registry's wire format, and plain Avro, decoded in Spark.

The wire format (job-spec "Real data formats"): a magic byte 0, the writer's schema id (4 bytes, big-endian),
then the payload; a protobuf payload starts with its message indexes (zig-zag varints: a count, then that many
indexes; a single 0 stands for the first message). Records are never collected: one small aggregation finds the
distinct schema ids of the input, the driver fetches each id's schema once (io/registry.py), and each record is
decoded by its own id on the executors:

- avro: spark-avro's `from_avro`, writer schema by id, read as the reader schema (`reader_schema`, else the
  newest writer schema: the highest id) by Avro's schema resolution (an added field takes its default);
- protobuf: a Python UDF with the `protobuf` package, the writer's descriptor set, the message type `message`
  (else the one the payload's message indexes name); the shape is the newest writer's message: a field the
  writer lacks is null, one it has without presence its protobuf default;
- json_schema: the payload is JSON text, parsed with the newest writer's schema (or `schema` types) as a JSON
  value is: every declared field must have its type.

A record that does not decode is unreadable, with the cause: no header (a magic byte other than 0, fewer than 5
bytes), a schema id the registry does not know, a payload that does not decode. An Avro key or value of a
record schema is a struct; a key is then its JSON text (as `key.format: json` keeps it).
"""
from __future__ import annotations

import hashlib
import json
import os
from decimal import Decimal
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from backfill.errors import SourceError, SpecError
from backfill.io.registry import WriterSchema, fetch_schemas, shown_url
from backfill.jobspec.load import Job
from backfill.jobspec.models import Encoded
from backfill.session import is_connect

HEADER = 5
CORRUPT = "_corrupt_record"
DECODED = "_backfill_decoded"


def decode(df: DataFrame, column: str, enc: Encoded, fmt: str, job: Job, where: str) -> tuple[Column, Column]:
    """The decoded column and why a record's `column` is unreadable (null when it reads)."""
    raw = F.col(column).cast("binary")
    part = column  # "key" or "value": the messages name it
    if fmt == "avro" and enc.schema_ is not None:
        writer = _text(job, enc.schema_, f"{where}.schema")
        reader = _text(job, enc.reader_schema, f"{where}.reader_schema") if enc.reader_schema else writer
        decoded = _from_avro(df, raw, writer, reader, f"{where}.schema")
        bad = F.when(raw.isNotNull() & decoded.isNull(), F.lit(
            f"unreadable {part}: the payload does not decode as the Avro schema {enc.schema_}"))
        return decoded, bad
    header = (F.length(raw) >= HEADER) & (F.substring(raw, 1, 1) == F.lit(b"\x00"))
    sid = F.when(header, F.conv(F.hex(F.substring(raw, 2, 4)), 16, 10).cast("long"))
    ids = sorted(r[0] for r in df.select(sid.alias("_id")).where("_id IS NOT NULL").distinct().collect())
    assert enc.registry is not None
    schemas = fetch_schemas(enc.registry, str(job.base), fmt, ids, where)
    known = {i: s for i, s in schemas.items() if s is not None}
    # ids none of which the registry knows: one line. No header at all: each record says so (by policy)
    if ids and not known and not (fmt == "avro" and enc.reader_schema):
        seen = f"schema ids {', '.join(map(str, ids))}"
        hint = "give reader_schema" if fmt == "avro" else "check the registry"
        raise SourceError(f"{where}: the input has {seen} and the registry knows none of them, so there is no "
                          f"schema to read the {column}s as; {hint}")
    payload = F.expr(f"substring({column}, {HEADER + 1})").cast("binary")
    if fmt == "avro":
        decoded = _avro_by_id(df, payload, sid, known, job, enc, where)
    elif fmt == "protobuf":
        decoded = _protobuf_by_id(payload, sid, known, enc, where)
    else:
        decoded = _json_by_id(df, payload, sid, known, where)
    unknown = [i for i, s in schemas.items() if s is None]
    source = shown_url(enc.registry.url) if enc.registry.url else enc.registry.schemas
    bad = (F.when(raw.isNotNull() & ~header, F.concat(
        F.lit(f"unreadable {part}: no schema registry header (magic byte 0x"),
        F.coalesce(F.lower(F.hex(F.substring(raw, 1, 1))), F.lit("")),
        F.lit(f", {HEADER} bytes at least; the wire format starts with 0 and a 4-byte schema id)")))
        .when(sid.isin(*unknown) if unknown else F.lit(False), F.concat(
            F.lit(f"unreadable {part}: schema id "), sid.cast("string"), F.lit(f" is not in the registry ({source})")))
        .when(raw.isNotNull() & decoded.isNull(), F.concat(
            F.lit(f"unreadable {part}: the payload does not decode as {fmt} with schema id "), sid.cast("string"))))
    return decoded, bad


def key_column(decoded: Column, dtype: T.DataType) -> Column:
    """A decoded key as the record's key: a struct (record, message, object) as its JSON text."""
    return F.to_json(decoded) if isinstance(dtype, (T.StructType, T.ArrayType, T.MapType)) else decoded


def decoded_type(df: DataFrame, col: Column) -> T.DataType:
    """The Spark type of a decoded column (analysis only)."""
    return df.limit(0).select(col.alias("_d")).schema["_d"].dataType


def _text(job: Job, path: str, where: str) -> str:
    file = job.resolve(path)
    if not os.path.isfile(file):
        raise SpecError(f"{where}: {file} not found; it is relative to the job file")
    with open(file) as fh:
        return fh.read()


# ----------------------------------------------------------------------------- Avro


def _from_avro(df: DataFrame, data: Column, writer: str, reader: str, where: str) -> Column:
    from pyspark.sql.avro.functions import from_avro

    if is_connect(df.sparkSession):
        _check_avro_here(writer, reader, where)
    else:
        _check_avro_jvm(df, writer, reader, where)
    doc = json.loads(reader)
    if not (isinstance(doc, dict) and doc.get("type") == "record"):
        return from_avro(data, writer, {"mode": "PERMISSIVE", "avroSchema": reader})  # a failure reads as null
    # PERMISSIVE reads a record that fails as a struct of nulls, like a record of null fields: a field the
    # writer never has, with a default, tells them apart (every record that decodes has it true)
    marked = {**doc, "fields": [*doc["fields"], {"name": DECODED, "type": "boolean", "default": True}]}
    out = from_avro(data, writer, {"mode": "PERMISSIVE", "avroSchema": json.dumps(marked)})
    return F.when(out[DECODED], F.struct(*[out[f["name"]].alias(f["name"]) for f in doc["fields"]]))


def _check_avro_jvm(df: DataFrame, writer: str, reader: str, where: str) -> None:
    """Parse both schemas and check Avro's resolution rules with Avro's own classes (through the JVM gateway)."""
    jvm = df.sparkSession._jvm
    parsed = {}
    for name, text in (("writer", writer), ("reader", reader)):
        try:
            parsed[name] = jvm.org.apache.avro.Schema.Parser().parse(text)
        except Exception as exc:  # noqa: BLE001 - Py4J: the parser's message is the cause
            raise SpecError(f"{where}: the {name} schema is not an Avro schema ({_java_message(exc)})") from None
    result = jvm.org.apache.avro.SchemaCompatibility.checkReaderWriterCompatibility(parsed["reader"], parsed["writer"])
    if str(result.getType().toString()) != "COMPATIBLE":
        shown = "; ".join(str(i.getMessage()) for i in result.getResult().getIncompatibilities())[:200]
        raise SpecError(f"{where}: the reader schema cannot read this writer schema by Avro's resolution rules "
                        f"({shown}); give a reader_schema whose added fields have defaults")


def _check_avro_here(writer: str, reader: str, where: str) -> None:
    """Over Spark Connect (no JVM gateway): parse both schemas with fastavro, and check the resolution rule a
    reader schema breaks most (a field the writer lacks needs a default); spark-avro applies the rest."""
    import fastavro

    docs = {}
    for name, text in (("writer", writer), ("reader", reader)):
        try:
            docs[name] = fastavro.parse_schema(json.loads(text))
        except Exception as exc:  # noqa: BLE001 - fastavro's message is the cause
            raise SpecError(f"{where}: the {name} schema is not an Avro schema ({str(exc)[:200]})") from None
    if not all(isinstance(d, dict) and d.get("type") == "record" for d in docs.values()):
        return
    written = {f["name"] for f in docs["writer"]["fields"]}
    missing = [f["name"] for f in docs["reader"]["fields"] if f["name"] not in written and "default" not in f]
    if missing:
        raise SpecError(f"{where}: the reader schema cannot read this writer schema by Avro's resolution rules "
                        f"(field {missing[0]} has no default value); give a reader_schema whose added fields have "
                        "defaults")


def _java_message(exc: Exception) -> str:
    text = str(getattr(exc, "java_exception", exc))
    return text.split(":", 1)[-1].strip().splitlines()[0][:200] if text else type(exc).__name__


def _avro_by_id(df: DataFrame, payload: Column, sid: Column, known: dict[int, WriterSchema], job: Job,
                enc: Encoded, where: str) -> Column:
    if enc.reader_schema:
        reader = _text(job, enc.reader_schema, f"{where}.reader_schema")
    elif known:
        reader = known[max(known)].text or ""
    else:
        return F.lit(None).cast("string")
    # no known id (every record unreadable): null values of the reader schema's type
    out: Column = _from_avro(df, F.lit(None).cast("binary"), reader, reader, f"{where}.reader_schema")
    first = True
    for i, ws in sorted(known.items()):
        col = _from_avro(df, payload, ws.text or "", reader, f"{where}: schema id {i}")
        out = F.when(sid == i, col) if first else out.when(sid == i, col)
        first = False
    return out


# ----------------------------------------------------------------------------- JSON Schema


def _json_by_id(df: DataFrame, payload: Column, sid: Column, known: dict[int, WriterSchema], where: str) -> Column:
    from jsonschema.exceptions import SchemaError
    from jsonschema.validators import validator_for

    from backfill.io.schemas import object_type

    shapes = {}
    for i, ws in known.items():
        try:
            doc = json.loads(ws.text or "")
            validator_for(doc).check_schema(doc)
        except (ValueError, SchemaError) as exc:
            raise SpecError(f"{where}: schema id {i} is not a JSON Schema ({str(exc).splitlines()[0][:200]})") from None
        shapes[i] = object_type(doc, f"{where}: schema id {i}")
    if not shapes:
        return F.lit(None).cast("string")
    shape = shapes[max(shapes)]
    text = payload.cast("string")
    parsed = F.from_json(text, T.StructType([*shape.fields, T.StructField(CORRUPT, T.StringType())]),
                         {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT})
    value = F.struct(*[parsed[f.name].alias(f.name) for f in shape.fields])
    ok = sid.isin(*shapes) & parsed.isNotNull() & parsed[CORRUPT].isNull()
    return F.when(ok, value)


# ----------------------------------------------------------------------------- Protobuf

# FieldDescriptor types (descriptor.proto): the Spark type each reads as
_PB_TYPES: dict[int, T.DataType] = {
    1: T.DoubleType(), 2: T.FloatType(), 3: T.LongType(), 4: T.DecimalType(20, 0), 5: T.IntegerType(),
    6: T.DecimalType(20, 0), 7: T.LongType(), 8: T.BooleanType(), 9: T.StringType(), 12: T.BinaryType(),
    13: T.LongType(), 14: T.StringType(), 15: T.IntegerType(), 16: T.LongType(), 17: T.IntegerType(),
    18: T.LongType(),
}


def _protobuf_by_id(payload: Column, sid: Column, known: dict[int, WriterSchema], enc: Encoded,
                    where: str) -> Column:
    if not known:
        return F.lit(None).cast("string")
    sets = {i: ws.descriptors or b"" for i, ws in known.items()}
    newest = _message(sets[max(sets)], enc.message, [0], f"{where}: schema id {max(sets)}")
    for i in sets:
        _message(sets[i], enc.message, [0], f"{where}: schema id {i}")  # every writer names the type
    shape = _struct_of(newest, where, ())
    message = enc.message

    def decode_one(schema_id: int | None, data: bytes | None) -> Any:
        if schema_id is None or data is None or schema_id not in sets:
            return None
        try:
            indexes, rest = _indexes(bytes(data))
            msg_type = _message(sets[schema_id], message, indexes, "")
            msg = _message_class(sets[schema_id], msg_type.full_name)()
            msg.ParseFromString(rest)
            return _row(msg, shape)
        except Exception:  # noqa: BLE001 - any failure to decode makes the record unreadable
            return None

    return F.udf(decode_one, shape)(sid, payload)


_POOLS: dict[str, Any] = {}


def _pool(descriptors: bytes) -> Any:
    """A descriptor pool of a serialized FileDescriptorSet (one per set, per process)."""
    key = hashlib.sha256(descriptors).hexdigest()
    if key not in _POOLS:
        from google.protobuf import descriptor_pb2, descriptor_pool

        pool = descriptor_pool.DescriptorPool()
        files = descriptor_pb2.FileDescriptorSet.FromString(descriptors).file
        for proto in files:
            pool.Add(proto)
        _POOLS[key] = (pool, [f.name for f in files])
    return _POOLS[key]


def _message(descriptors: bytes, name: str | None, indexes: list[int], where: str) -> Any:
    """The message type: `name` when given, else the one the indexes name in the set's last (main) file."""
    try:
        pool, files = _pool(descriptors)
    except Exception as exc:  # noqa: BLE001
        raise SpecError(f"{where}: not a protobuf descriptor set ({exc})") from None
    try:
        if name is not None:
            return pool.FindMessageTypeByName(name)
        found = pool.FindFileByName(files[-1]).message_types_by_name
        msg = list(found.values())[indexes[0]]
        for i in indexes[1:]:
            msg = msg.nested_types[i]
        return msg
    except (KeyError, IndexError):
        raise SpecError(f"{where}: the descriptor set has no message {name or indexes}; name it with message: "
                        "(its full name, e.g. demo.Click)") from None


def _message_class(descriptors: bytes, full_name: str) -> Any:
    from google.protobuf import message_factory

    pool, _ = _pool(descriptors)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(full_name))


def _indexes(data: bytes) -> tuple[list[int], bytes]:
    """The payload's message indexes (zig-zag varints) and the message bytes after them."""
    pos, values = 0, []
    count = None
    while count is None or len(values) < count:
        shift, raw = 0, 0
        while True:
            b = data[pos]
            pos += 1
            raw |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        n = (raw >> 1) ^ -(raw & 1)
        if count is None:
            count = n
            if count < 0 or count > 64:
                raise ValueError("bad message index count")
        else:
            values.append(n)
    return values or [0], data[pos:]


def _struct_of(msg: Any, where: str, seen: tuple[str, ...]) -> T.StructType:
    if msg.full_name in seen:
        raise SpecError(f"{where}: message {msg.full_name} is recursive, which a Spark struct cannot hold")
    fields = []
    for f in msg.fields:
        if f.type == 11:
            dtype: T.DataType = _struct_of(f.message_type, where, (*seen, msg.full_name))
        elif f.type in _PB_TYPES:
            dtype = _PB_TYPES[f.type]
        else:
            raise SpecError(f"{where}: field {msg.full_name}.{f.name} is a protobuf group, which is not read")
        fields.append(T.StructField(f.name, T.ArrayType(dtype) if _repeated(f) else dtype))
    return T.StructType(fields)


def _repeated(f: Any) -> bool:
    return bool(f.is_repeated if hasattr(f, "is_repeated") else f.label == 3)


def _row(msg: Any, shape: T.StructType) -> dict[str, Any]:
    by_name = msg.DESCRIPTOR.fields_by_name
    out: dict[str, Any] = {}
    for field in shape.fields:
        f = by_name.get(field.name)
        if f is None:
            out[field.name] = None
            continue
        value = getattr(msg, field.name)
        if _repeated(f):
            inner = field.dataType.elementType  # type: ignore[attr-defined]
            out[field.name] = [_scalar(f, v, inner) for v in value]
        elif f.has_presence and not msg.HasField(field.name):
            out[field.name] = None
        else:
            out[field.name] = _scalar(f, value, field.dataType)
    return out


def _scalar(f: Any, value: Any, dtype: T.DataType) -> Any:
    if f.type == 11:
        return _row(value, dtype) if isinstance(dtype, T.StructType) else None
    if f.type == 14:
        enum = f.enum_type.values_by_number.get(value)
        return enum.name if enum is not None else str(value)
    if isinstance(dtype, T.DecimalType):
        return Decimal(value)
    return value
