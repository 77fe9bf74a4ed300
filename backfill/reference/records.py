"""Reference engine input: a source's records as plain Python dicts, read without Spark."""
from __future__ import annotations

import datetime as dt
import json
import os
from typing import Any

from backfill.errors import SourceError
from backfill.jobspec.load import Job
from backfill.jobspec.models import SourceSpec


def read_records(job: Job, name: str) -> list[dict[str, Any]]:
    """All records of one source: topic, partition, offset, key, value, timestamp, seq, _problem."""
    spec = job.spec.sources[name]
    location = job.resolve(spec.path or "")
    if not os.path.exists(location):
        raise SourceError(f"sources.{name}.path: {location} does not exist")
    rows = _raw_rows(spec, location)
    schema = _schema_fields(job, spec)
    return [_canonical(row, spec, name, schema) for row in rows]


def _raw_rows(spec: SourceSpec, location: str) -> list[dict[str, Any]]:
    if spec.format == "jsonl":
        return _jsonl(location)
    if spec.format == "parquet":
        import pyarrow.parquet as pq

        return pq.read_table(location).to_pylist()
    from deltalake import DeltaTable

    return DeltaTable(location, version=spec.version).to_pyarrow_table().to_pylist()


def _jsonl(location: str) -> list[dict[str, Any]]:
    files = [location] if os.path.isfile(location) else sorted(
        os.path.join(location, f) for f in os.listdir(location) if not f.startswith((".", "_")))
    rows = []
    for file in files:
        with open(file) as fh:
            for line in fh:
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    row = None
                rows.append(row if isinstance(row, dict) else {"_problem": "unreadable record: not a JSON record"})
    return rows


def _schema_fields(job: Job, spec: SourceSpec) -> dict[str, str] | None:
    """Top-level value fields -> JSON type, when the job names a schema."""
    if not spec.value.schema_:
        return None
    doc = json.loads(open(job.resolve(spec.value.schema_)).read())
    if doc.get("type") == "struct":
        return {f["name"]: str(f["type"]) for f in doc["fields"]}
    return {k: (v.get("type") if isinstance(v.get("type"), str) else "string") for k, v in doc["properties"].items()}


def _canonical(row: dict[str, Any], spec: SourceSpec, name: str, schema: dict[str, str] | None) -> dict[str, Any]:
    for record_col, table_col in spec.columns.items():
        if table_col in row:
            row[record_col] = row.pop(table_col)
    problem = row.get("_problem")
    if problem is None and (row.get("partition") is None or row.get("offset") is None):
        problem = "unreadable record: no partition or offset"
    key = _key(row.get("key"), spec.key.format)
    if key is _BAD:
        key, problem = None, problem or "unreadable key: not a long"
    value, value_problem = _value(row.get("value"), spec, schema)
    return {"source": name, "topic": row.get("topic") or spec.topic or name, "partition": row.get("partition"),
            "offset": row.get("offset"), "key": key, "value": value, "timestamp": _millis(row.get("timestamp")),
            "seq": row.get(spec.order_by) if spec.order_by else None, "_problem": problem or value_problem}


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
    if fmt in ("string", "json") and not isinstance(key, str):
        return json.dumps(key) if isinstance(key, (dict, list)) else str(key)
    return key


def _value(raw: Any, spec: SourceSpec, schema: dict[str, str] | None) -> tuple[Any, str | None]:
    if raw is None:
        return None, None
    if isinstance(raw, bytes):
        raw = raw.decode()
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
