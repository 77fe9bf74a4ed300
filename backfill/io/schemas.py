"""Part: io. Value schemas: a JSON Schema subset or a Spark schema (JSON), as a Spark StructType."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pyspark.sql import types as T

from backfill.errors import SpecError

_JSON_TYPES: dict[str, T.DataType] = {
    "string": T.StringType(), "integer": T.LongType(), "number": T.DoubleType(), "boolean": T.BooleanType(),
}


def load_value_schema(path: str) -> T.StructType:
    """Read schemas/*.json: JSON Schema (type object, properties) or Spark's StructType JSON."""
    file = Path(path)
    if not file.is_file():
        raise SpecError(f"{path}: value schema file not found; value.schema is relative to the job file")
    try:
        doc = json.loads(file.read_text())
    except json.JSONDecodeError as exc:
        raise SpecError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if doc.get("type") == "struct":
        return T.StructType.fromJson(doc)
    return _object_type(doc, path)


def object_type(doc: dict[str, Any], where: str) -> T.StructType:
    """A JSON Schema object (its `properties`) as a Spark struct."""
    return _object_type(doc, where)


def _object_type(doc: dict[str, Any], where: str) -> T.StructType:
    if doc.get("type") != "object" or not isinstance(doc.get("properties"), dict):
        raise SpecError(f"{where}: expected a JSON Schema object with `properties` (or a Spark struct schema)")
    return T.StructType([T.StructField(name, _json_type(sub, f"{where}#{name}"), True)
                         for name, sub in doc["properties"].items()])


def _json_type(doc: dict[str, Any], where: str) -> T.DataType:
    kind = doc.get("type")
    if isinstance(kind, list):  # ["number", "null"]: nullability is implicit
        kind = next((k for k in kind if k != "null"), "string")
    if kind == "object":
        return _object_type(doc, where)
    if kind == "array":
        return T.ArrayType(_json_type(doc.get("items", {"type": "string"}), where), True)
    if kind in _JSON_TYPES:
        return _JSON_TYPES[kind]
    raise SpecError(f"{where}: JSON type {kind!r} is not supported; use string, integer, number, boolean, object, array")
