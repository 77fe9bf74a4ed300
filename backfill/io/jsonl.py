"""Part: io. JSONL sources: one JSON object per line, every field type-checked, nothing coerced silently.

A line that is not a JSON object, or a field of the wrong JSON type (a timestamp that is a string, a key
that is a number where `key.format: string`), makes the record unreadable with the exact cause; the
source's `on_error` policy then fails the run (naming file and line) or sends it to the ledger.
The same rules, in plain Python, are in `backfill/reference/records.py`.
"""
from __future__ import annotations

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from backfill.jobspec.models import REGISTRY_FORMATS, SourceSpec

# the JSON type each record field must have (key and value depend on their declared format)
INTEGER_FIELDS = ("partition", "offset", "timestamp", "seq")
KEY_TYPES = {"string": "string", "bytes": "string", "long": "integer", "json": "any"}
KEY_B64 = "key_b64"  # where a JSONL line carries a binary key (a registry format's, or key.format: bytes) as base64
EXPECTED = {"topic": "a JSON string", "partition": "a JSON integer", "offset": "a JSON integer",
            "timestamp": "epoch milliseconds (a JSON integer)", "seq": "a JSON integer",
            "headers": "a JSON object of strings"}


def read_jsonl(spark: SparkSession, location: str, spec: SourceSpec) -> DataFrame:
    """Typed record columns, `_problem` (why unreadable) and, for an unreadable line, `_where` (file, text)."""
    lines = (spark.read.text(location).select(F.col("value").alias("_line"), F.col("_metadata.file_path").alias("_file"))
             .where(F.trim("_line") != ""))
    df = lines.withColumn("_v", F.expr("try_parse_json(_line)"))
    fields = {c: spec.columns.get(c, c) for c in ("topic", "partition", "offset", "key", "value", "timestamp",
                                                   "headers")}
    for c in ("key", "value"):  # binary keys and values (the registry formats) are base64 text: key_b64, value_b64
        if getattr(spec, c).format in REGISTRY_FORMATS:
            fields[c] = spec.columns.get(c, f"{c}_b64")
    fields = with_key_b64(fields, spec)
    if spec.order_by:
        fields["seq"] = spec.columns.get("seq", spec.order_by)
    types = {c: json_type(_field(name)) for c, name in fields.items()}
    df = df.select("*", *[t.alias(f"_t_{c}") for c, t in types.items()])
    problems = [F.when(F.col("_v").isNull() | ~F.expr("schema_of_variant(_v)").startswith("OBJECT"),
                       F.lit("unreadable record: the line is not a JSON object"))]
    problems += [_check(c, name, f"_t_{c}", spec) for c, name in fields.items()]
    problem = F.coalesce(*problems)
    values = {c: _value_of(c, name, f"_t_{c}", spec) for c, name in fields.items()}
    if "key_b64" in values:  # the key's bytes: decoded from key_b64, else the string under key (its UTF-8)
        values["key"] = F.coalesce(values.pop("key_b64"), values["key"].cast("binary"))
    out = [v.alias(c) for c, v in values.items()]
    file = F.regexp_replace(F.url_decode(F.col("_file")), "^file:(//)?", "")
    where = F.when(problem.isNotNull(), F.struct(file.alias("file"), F.col("_line").alias("text")))
    return df.select(*out, problem.alias("_problem"), where.alias("_where"))


def with_key_b64(fields: dict[str, str], spec: SourceSpec) -> dict[str, str]:
    """The fields of a JSONL line, with `key_b64` after `key` when `key.format: bytes` reads it: a bytes key
    is base64 text under `key_b64` (as a registry format's key) or, as before, a string under `key`. A key
    mapped by `columns:` is read as a string under that name. The reference engine reads the same fields."""
    if spec.key.format != "bytes" or "key" in spec.columns:
        return fields
    out: dict[str, str] = {}
    for c, name in fields.items():
        out[c] = name
        if c == "key":
            out["key_b64"] = KEY_B64
    return out


def json_type(variant: Column) -> Column:
    """The JSON type name of a variant: missing, null, string, integer, number, boolean, object, array."""
    t = F.schema_of_variant(variant)
    return (F.when(variant.isNull(), F.lit("missing")).when(t == "VOID", F.lit("null"))
            .when(t == "STRING", F.lit("string")).when(t.isin("BIGINT", "INT", "SMALLINT", "TINYINT"), F.lit("integer"))
            .when(t == "BOOLEAN", F.lit("boolean")).when(t.startswith("OBJECT"), F.lit("object"))
            .when(t.startswith("ARRAY"), F.lit("array")).otherwise(F.lit("number")))


def _field(name: str) -> Column:
    """The JSON field `name` of the line, as a variant (null when the line has no such field)."""
    return F.variant_get(F.col("_v"), f"$['{name}']", "variant")


def _check(column: str, name: str, type_col: str, spec: SourceSpec) -> Column:
    """Why this field makes the record unreadable (null when it is fine; missing and null are fine)."""
    t = F.col(type_col)
    present = ~t.isin("missing", "null")
    if column == "key_b64":  # key.format: bytes, as base64 text: one of key and key_b64
        both = present & ~F.col("_t_key").isin("missing", "null")
        return F.when(both, F.lit(f"unreadable key: the line has both key and {name}; key.format: bytes reads one "
                                  f"(base64 text under {name}, or a string under key)")
                      ).otherwise(_base64_check("key", name, t, "bytes"))
    if column in ("key", "value") and getattr(spec, column).format in REGISTRY_FORMATS:
        return _base64_check(column, name, t, getattr(spec, column).format)
    if column == "key":
        want = KEY_TYPES[spec.key.format]
        if want == "any":
            return F.lit(None).cast("string")
        hint = {"string": "declare key.format: long or json", "bytes": "declare key.format: long or json",
                "long": "declare key.format: string or json"}[spec.key.format]
        return F.when(present & (t != want), F.concat(
            F.lit("unreadable key: the key is a JSON "), t, F.lit(f"; key.format: {spec.key.format} wants a JSON "
                                                                  f"{want} ({hint})")))
    if column == "value":
        allowed = ("string", "object") if spec.value.format == "json" else ("string",)
        shown = "a JSON object or a string holding one" if spec.value.format == "json" else "a JSON string"
        hint = "" if spec.value.format == "json" else " (declare value.format: json for JSON values)"
        return F.when(present & ~t.isin(*allowed), F.concat(
            F.lit("unreadable value: the value is a JSON "), t, F.lit(f"; value.format: {spec.value.format} wants "
                                                                      f"{shown}{hint}")))
    want = "integer" if column in INTEGER_FIELDS else "object" if column == "headers" else "string"
    wrong = F.when(present & (t != want), F.concat(F.lit(f"unreadable record: {column} is a JSON "), t,
                                                   F.lit(f", not {EXPECTED[column]}")))
    if column == "partition":  # a partition number is a Java int
        return F.coalesce(wrong, F.when(present & F.try_variant_get(_field(name), "$", "int").isNull(), F.lit(
            "unreadable record: partition is out of the 32-bit integer range")))
    if column == "headers":  # Kafka header values are text (or null)
        values = F.map_values(F.try_variant_get(_field(name), "$", "map<string,variant>"))
        text = F.forall(values, lambda x: F.schema_of_variant(x).isin("STRING", "VOID"))
        return F.coalesce(wrong, F.when(present & ~text, F.lit(
            "unreadable record: headers is a JSON object, not a JSON object of strings")))
    return wrong


def _base64_check(column: str, name: str, t: Column, fmt: str) -> Column:
    """Why a binary key or value's field (base64 text) makes the record unreadable (null when it is fine)."""
    present = ~t.isin("missing", "null")
    base64 = F.try_to_binary(F.try_variant_get(_field(name), "$", "string"), F.lit("base64"))
    return F.when(present & (t != "string"), F.concat(
        F.lit(f"unreadable {column}: {name} is a JSON "), t, F.lit(f"; {column}.format: {fmt} reads base64 text")
    )).when(present & base64.isNull(), F.lit(f"unreadable {column}: {name} is not base64"))


def _value_of(column: str, name: str, type_col: str, spec: SourceSpec) -> Column:
    """The field as the record column's type, null when missing, null or of the wrong type."""
    v, t = _field(name), F.col(type_col)
    if column == "key_b64" or column in ("key", "value") and getattr(spec, column).format in REGISTRY_FORMATS:
        return F.try_to_binary(F.when(t == "string", F.variant_get(v, "$", "string")), F.lit("base64"))
    if column == "key":
        if spec.key.format == "json":  # a string holds the key's JSON text; any other token is that text
            return F.when(t == "string", F.variant_get(v, "$", "string")).when(~t.isin("missing", "null"), F.to_json(v))
        if spec.key.format == "long":
            return F.when(t == "integer", F.try_variant_get(v, "$", "bigint"))
        return F.when(t == "string", F.variant_get(v, "$", "string"))
    if column == "value":
        text = F.when(t == "string", F.variant_get(v, "$", "string"))
        return F.when(t == "object", F.to_json(v)).otherwise(text) if spec.value.format == "json" else text
    if column == "headers":
        return F.when(t == "object", F.try_variant_get(v, "$", "map<string,string>"))
    if column == "topic":
        return F.when(t == "string", F.variant_get(v, "$", "string"))
    kind = "int" if column == "partition" else "bigint"
    return F.when(t == "integer", F.try_variant_get(v, "$", kind))
