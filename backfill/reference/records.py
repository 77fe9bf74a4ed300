"""Part: reference engine. Reference engine input: a source's records as plain Python dicts, read without Spark."""
from __future__ import annotations

import datetime as dt
import json
import os
from decimal import Decimal
from typing import Any

from backfill.errors import SourceError
from backfill.jobspec.load import Job
from backfill.jobspec.models import REGISTRY_FORMATS, SourceSpec
from backfill.reference.wire import Decoder, key_text


def read_records(job: Job, name: str, raw_json: bool = False) -> list[dict[str, Any]]:
    """All records of one source: topic, partition, offset, key, value, timestamp, seq, _problem.

    `raw_json`: the value stays JSON text (a rules operator reads fields the rules name, exactly): a string
    as it is, an object of a JSONL line as compact JSON with sorted keys; not an object: unreadable.
    """
    spec = job.spec.sources[name]
    location = job.resolve(spec.path or "")
    if not os.path.exists(location):
        raise SourceError(f"sources.{name}.path: {location} does not exist")
    rows = _raw_rows(spec, location, name, exact=raw_json)
    schema = _schema_fields(job, spec)
    decoders = {c: Decoder(job, getattr(spec, c), getattr(spec, c).format, c, [_binary(r, c, spec) for r in rows],
                           f"sources.{name}.{c}") for c in ("key", "value") if getattr(spec, c).format in REGISTRY_FORMATS}
    records = [_canonical(row, spec, name, schema, raw_json, decoders) for row in rows]
    if raw_json and job.spec.sources[name].value.format == "json":
        for rec in records:
            if rec["_problem"] is None and rec["value"] is not None and json_object(rec["value"]) is None:
                rec["_problem"] = "unreadable value: not a JSON object"
    return records


def _raw_rows(spec: SourceSpec, location: str, name: str, exact: bool = False) -> list[dict[str, Any]]:
    if spec.format == "jsonl":
        return _jsonl(location, exact)
    if spec.format == "parquet":
        import pyarrow.parquet as pq

        table = pq.read_table(location)
    else:
        import pyarrow.fs as pafs
        from deltalake import DeltaTable

        # pyarrow's local filesystem: through deltalake's own bridge the interpreter may abort at exit
        local = pafs.SubTreeFileSystem(os.path.abspath(location), pafs.LocalFileSystem())
        table = DeltaTable(location, version=spec.version).to_pyarrow_dataset(filesystem=local).to_table()
    _check_key_column(table.schema, spec, name, location)
    return table.to_pylist()


def _check_key_column(schema: Any, spec: SourceSpec, name: str, location: str) -> None:
    """A table's key column must fit the declared key format (the Spark reader refuses the same)."""
    import pyarrow.types as pat

    key = spec.columns.get("key", "key")
    if key not in schema.names:
        return
    dtype = schema.field(key).type
    text = pat.is_string(dtype) or pat.is_large_string(dtype) or pat.is_binary(dtype) or pat.is_large_binary(dtype)
    fits = text or (spec.key.format == "long" and pat.is_integer(dtype))
    if not fits:
        raise SourceError(f"sources.{name}.key.format: {location} has a {dtype} key column, which key.format: "
                          f"{spec.key.format} does not read")


def _jsonl(location: str, exact: bool = False) -> list[dict[str, Any]]:
    files = [location] if os.path.isfile(location) else sorted(
        os.path.join(location, f) for f in os.listdir(location) if not f.startswith((".", "_")))
    rows = []
    for file in files:
        with open(file) as fh:
            for line in fh:
                if not line.strip():
                    continue
                try:
                    row = json.loads(line, parse_float=_exact_number) if exact else json.loads(line)
                except json.JSONDecodeError:
                    row = None
                rows.append(row if isinstance(row, dict) else {"_problem": "unreadable record: the line is not a JSON "
                                                                           "object"})
    return rows


def _binary(row: dict[str, Any], column: str, spec: SourceSpec) -> bytes | None:
    """A registry-format key or value's bytes: base64 text under `<column>_b64` in a JSONL line, else bytes."""
    if spec.format != "jsonl":
        raw = row.get(spec.columns.get(column, column))
        return bytes(raw) if isinstance(raw, (bytes, bytearray)) else None
    text = row.get(column) if column in spec.columns else row.get(f"{column}_b64")
    return _b64(text) if isinstance(text, str) else None


def _with_key_b64(fields: dict[str, str], spec: SourceSpec) -> dict[str, str]:
    """The JSONL fields read, with `key_b64` after `key` for `key.format: bytes` (unless `columns:` maps the key):
    a bytes key is base64 text under `key_b64` or, as before, a string under `key` (backfill/io/jsonl.py)."""
    if spec.key.format != "bytes" or "key" in spec.columns:
        return fields
    out: dict[str, str] = {}
    for column, name in fields.items():
        out[column] = name
        if column == "key":
            out["key_b64"] = "key_b64"
    return out


def _b64(text: str) -> bytes | None:
    import base64
    import binascii

    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None


def _exact_number(text: str) -> Any:
    """A JSON number with a fraction as Spark's variant reads it: exact, unless written with an exponent."""
    import decimal

    return float(text) if "e" in text.lower() else decimal.Decimal(text)


# JSONL field types (the same rules as backfill/io/jsonl.py): nothing is coerced; a wrong type is unreadable
_EXPECTED = {"topic": ("string", "a JSON string"), "partition": ("integer", "a JSON integer"),
             "offset": ("integer", "a JSON integer"), "seq": ("integer", "a JSON integer"),
             "timestamp": ("integer", "epoch milliseconds (a JSON integer)"),
             "headers": ("object", "a JSON object of strings")}
_KEY_WANTS = {"string": "string", "bytes": "string", "long": "integer", "json": None}
_KEY_HINT = {"string": "declare key.format: long or json", "bytes": "declare key.format: long or json",
             "long": "declare key.format: string or json"}


def json_type(value: Any) -> str:
    """JSON type name of a parsed value: null, string, integer, number, boolean, object, array."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer" if -2**63 <= value < 2**63 else "number"
    return {str: "string", float: "number", dict: "object", list: "array"}.get(type(value), "string")


def jsonl_problem(row: dict[str, Any], spec: SourceSpec, fields: dict[str, str]) -> str | None:
    """Why a JSONL line is unreadable (the first field, in record order, of the wrong JSON type)."""
    for column, name in fields.items():
        if name not in row or row[name] is None:
            continue
        found = json_type(row[name])
        if column == "key_b64":  # key.format: bytes as base64 text: one of key and key_b64
            if row.get("key") is not None:
                return (f"unreadable key: the line has both key and {name}; key.format: bytes reads one (base64 "
                        f"text under {name}, or a string under key)")
            problem = _base64_problem("key", name, row[name], "bytes")
            if problem is not None:
                return problem
            continue
        if column in ("key", "value") and getattr(spec, column).format in REGISTRY_FORMATS:
            problem = _base64_problem(column, name, row[name], getattr(spec, column).format)
            if problem is not None:
                return problem
            continue
        if column == "key":
            want = _KEY_WANTS[spec.key.format]
            if want is not None and found != want:
                return (f"unreadable key: the key is a JSON {found}; key.format: {spec.key.format} wants a JSON "
                        f"{want} ({_KEY_HINT[spec.key.format]})")
        elif column == "value":
            if spec.value.format == "json" and found not in ("string", "object"):
                return (f"unreadable value: the value is a JSON {found}; value.format: json wants a JSON object or "
                        "a string holding one")
            if spec.value.format == "string" and found != "string":
                return (f"unreadable value: the value is a JSON {found}; value.format: string wants a JSON string "
                        "(declare value.format: json for JSON values)")
        else:
            want, shown = _EXPECTED[column]
            if found != want:
                return f"unreadable record: {column} is a JSON {found}, not {shown}"
            if column == "partition" and not -2**31 <= row[name] < 2**31:
                return "unreadable record: partition is out of the 32-bit integer range"
            if column == "headers" and not all(v is None or isinstance(v, str) for v in row[name].values()):
                return "unreadable record: headers is a JSON object, not a JSON object of strings"
    return None


def _base64_problem(column: str, name: str, text: Any, fmt: str) -> str | None:
    """Why a binary key or value's JSONL field (base64 text) makes the record unreadable (None: it is fine)."""
    found = json_type(text)
    if found != "string":
        return f"unreadable {column}: {name} is a JSON {found}; {column}.format: {fmt} reads base64 text"
    if _b64(text) is None:
        return f"unreadable {column}: {name} is not base64"
    return None


def _schema_fields(job: Job, spec: SourceSpec) -> dict[str, str] | None:
    """Top-level value fields -> JSON type, when the job names a JSON schema."""
    if not spec.value.schema_ or spec.value.format != "json":
        return None
    doc = json.loads(open(job.resolve(spec.value.schema_)).read())
    if doc.get("type") == "struct":
        return {f["name"]: str(f["type"]) for f in doc["fields"]}
    return {k: (v.get("type") if isinstance(v.get("type"), str) else "string") for k, v in doc["properties"].items()}


def _canonical(row: dict[str, Any], spec: SourceSpec, name: str, schema: dict[str, str] | None,
               raw_json: bool = False, decoders: dict[str, Decoder] | None = None) -> dict[str, Any]:
    decoders = decoders or {}
    binary = {c: _binary(row, c, spec) for c in decoders}
    if spec.format == "jsonl" and "_problem" not in row:
        fields = {c: spec.columns.get(c, c) for c in ("topic", "partition", "offset", "key", "value", "timestamp",
                                                       "headers")}
        fields.update({c: spec.columns.get(c, f"{c}_b64") for c in decoders})
        fields = _with_key_b64(fields, spec)
        if spec.order_by:
            fields["seq"] = spec.columns.get("seq", spec.order_by)
        problem = jsonl_problem(row, spec, fields)
        if problem is not None:  # the fields still read are those of the right type (as Spark reads them)
            row = {name_: (row[name_] if name_ in row and jsonl_problem({name_: row[name_]}, spec,
                                                                         {c: name_}) is None else None)
                   for c, name_ in fields.items()} | {"_problem": problem}
    for record_col, table_col in spec.columns.items():
        if table_col in row:
            row[record_col] = row.pop(table_col)
    if spec.format == "jsonl" and "key_b64" in _with_key_b64({"key": "key"}, spec):
        raw_key = _binary(row, "key", spec)  # key_b64's bytes, as a registry format's key; else the key as before
        if raw_key is not None:
            row["key"] = raw_key
    problem = row.get("_problem")
    if problem is None and (row.get("partition") is None or row.get("offset") is None):
        problem = "unreadable record: no partition or offset"
    if "key" in decoders:
        key, key_problem = decoders["key"].decode(binary["key"] if problem is None else None)
        key, problem = key_text(key), problem or key_problem
    else:
        key = _key(row.get("key"), spec.key.format)
        if key is _BAD:
            key, problem = None, problem or "unreadable key: not a long"
    if "value" in decoders:
        value, value_problem = decoders["value"].decode(binary["value"] if problem is None else None)
    else:
        value, value_problem = _value(row.get("value"), spec, schema, raw_json)
    stamp = _millis(row.get("timestamp"))
    return {"source": name, "topic": row.get("topic") or spec.topic or name, "partition": row.get("partition"),
            "offset": row.get("offset"), "key": key, "value": value, "timestamp": stamp,
            "seq": row.get(spec.order_by) if spec.order_by else None, "_problem": problem or value_problem,
            "_copy": _identity(row, stamp), "_ts": stamp if spec.timestamp.extractor == "record" else
            _path(value, spec.timestamp.field or "")}


def _identity(row: dict[str, Any], stamp: int | None) -> tuple[Any, ...]:
    """What makes two rows of one offset the same record: key, value, timestamp and headers as stored (JSON as
    its text with sorted keys)."""
    def stored(v: Any) -> Any:
        # exact decimals (a rules source's amounts) as their text: str(Decimal) keeps every digit
        return json.dumps(v, sort_keys=True, separators=(",", ":"), default=str) if isinstance(v, (dict, list)) \
            else v

    headers = row.get("headers")
    if isinstance(headers, dict):
        headers = tuple(sorted(headers.items()))
    elif isinstance(headers, list):
        headers = tuple((h.get("key"), h.get("value")) if isinstance(h, dict) else h for h in headers)
    return stored(row.get("key")), stored(row.get("value")), stamp, headers


def _path(value: Any, path: str) -> Any:
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


_BAD = object()


def _key(key: Any, fmt: str) -> Any:
    if key is None:
        return None
    if isinstance(key, bytes) and fmt != "bytes":
        key = key.decode()
    if fmt == "long":
        try:
            return int(key)
        except (TypeError, ValueError):
            return _BAD
    if fmt == "json" and not isinstance(key, str):  # the token's JSON text, as Spark's variant prints it
        return json.dumps(key, separators=(",", ":"), sort_keys=True)
    return key


def _value(raw: Any, spec: SourceSpec, schema: dict[str, str] | None, raw_json: bool = False
           ) -> tuple[Any, str | None]:
    if raw is None:
        return None, None
    if isinstance(raw, bytes):
        raw = raw.decode()
    if raw_json:
        return (raw if isinstance(raw, str) else json_text(raw)), None
    if spec.value.format == "string":
        return (raw if isinstance(raw, str) else json.dumps(raw, separators=(",", ":"))), None
    try:
        doc = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError:
        doc = None
    if not isinstance(doc, dict):
        return None, "unreadable value: not a JSON object matching the value schema"
    if schema is None:
        return doc, None
    return {f: _coerce(doc.get(f), kind) for f, kind in schema.items()}, None


def _coerce(value: Any, kind: str) -> Any:
    """Spark's from_json casts per schema type: integers read as doubles for `number`."""
    if value is None:
        return None
    if kind in ("number", "double") and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return value


def _millis(value: Any) -> int | None:
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.timezone.utc)
        return int(value.timestamp() * 1000)
    return None if value is None else int(value)


def ledger_row(rec: dict[str, Any], operator: str | None, reason: str, timestamp: Any, stream_time: int | None,
                window: tuple[int, int] | None, detail: str | None = None, range_time: int | None = None
                ) -> dict[str, Any]:
    """One row of the dropped-records ledger (LEDGER_SCHEMA's columns) for `rec`."""
    key = rec.get("key")
    origin = rec.get("_origin")
    if origin is not None:  # a record of a repartition topic (or a copy): the row names its input record
        if rec["topic"] != origin["topic"]:
            detail = detail or f"re-keyed to {rec['topic']}/{rec['partition']}"
        rec = {**rec, **origin}
    return {"source": rec["source"], "topic": rec["topic"], "partition": rec["partition"], "offset": rec["offset"],
            # a binary key as Spark's hex() writes it (upper case), as the Spark engine's ledger does
            "key": None if key is None else (key.hex().upper() if isinstance(key, bytes) else str(key)),
            "timestamp": timestamp, "operator": operator, "reason": reason, "detail": detail,
            "stream_time": stream_time, "window_start": window[0] if window else None,
            "window_end": window[1] if window else None, "range_time": range_time}


# ------------------------------------------------------------------ JSON values read exactly (rules operators)
def json_object(value: Any) -> dict[str, Any] | None:
    if isinstance(value, dict):
        return value
    if not isinstance(value, str):
        return None
    try:
        doc = json.loads(value, parse_float=_exact_number, parse_int=int)
    except json.JSONDecodeError:
        return None
    return doc if isinstance(doc, dict) else None


def _number(text: str) -> Any:
    """JSON numbers with a fraction are exact decimals; in exponent notation they are doubles (as Spark reads)."""
    return float(text) if "e" in text.lower() else Decimal(text)


def plain(d: Decimal) -> str:
    """A decimal in its shortest plain form: no exponent, no trailing zeros."""
    out = format(d.normalize(), "f")
    return "0" if out in ("-0", "0") else out


def json_text(value: Any) -> str:
    """Compact JSON with sorted keys and exact numbers (as Spark's to_json of a parsed value)."""
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(k)}:{json_text(v)}" for k, v in sorted(value.items())) + "}"
    if isinstance(value, list):
        return "[" + ",".join(json_text(v) for v in value) + "]"
    if isinstance(value, Decimal):
        return plain(value)
    return json.dumps(value)


