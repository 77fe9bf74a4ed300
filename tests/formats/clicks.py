"""The demo's clicks as JSON and in the registry formats (two Avro schema versions), for the format tests."""
from __future__ import annotations

import base64
import io
import json
import struct
from pathlib import Path
from typing import Any

import yaml

from backfill.demo import _clicks

REPO = Path(__file__).resolve().parents[2]
CLICK_V1 = {"type": "record", "name": "Click", "namespace": "demo", "fields": [
    {"name": "user", "type": "string"}, {"name": "page", "type": "string"},
    {"name": "amount", "type": ["null", "double"], "default": None}, {"name": "ts", "type": "long"}]}
# the second version adds a field with a default (a backward-compatible change)
CLICK_V2 = {**CLICK_V1, "fields": [*CLICK_V1["fields"], {"name": "device", "type": "string", "default": "web"}]}


def demo_records(n: int = 3000, partitions: int = 2, seed: int = 7) -> list[dict[str, Any]]:
    """The demo's click sample as records (JSON values as dicts), in production order."""
    cols, _ = _clicks(n, partitions, seed)
    return [{"topic": t, "partition": p, "offset": o, "key": k, "value": json.loads(v), "timestamp": ts}
            for t, p, o, k, v, ts in zip(cols["topic"], cols["partition"], cols["offset"], cols["key"], cols["value"],
                                         cols["timestamp"])]


def avro_bytes(schema: dict[str, Any], value: dict[str, Any], schema_id: int | None) -> bytes:
    """One Avro value, with the registry's header when `schema_id` is given."""
    import fastavro

    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), value)
    header = b"" if schema_id is None else b"\x00" + struct.pack(">I", schema_id)
    return header + out.getvalue()


def versioned(records: list[dict[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
    """(schema version, value): the first half written as v1, the rest as v2 (with `device`)."""
    half = len(records) // 2
    return [(1, r["value"]) if i < half else (2, {**r["value"], "device": "app"}) for i, r in enumerate(records)]


def write_jsonl(path: Path, records: list[dict[str, Any]], values: list[bytes | None] | None = None) -> Path:
    """Records as JSONL; with `values`, each value as base64 under value_b64."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for i, r in enumerate(records):
        row = {k: v for k, v in r.items() if k != "value"}
        if values is None:
            row["value"] = r["value"]
        elif values[i] is not None:
            row["value_b64"] = base64.b64encode(values[i]).decode()
        lines.append(json.dumps(row) + "\n")
    path.write_text("".join(lines))
    return path


def schema_folder(folder: Path, schemas: dict[int, dict[str, Any]]) -> Path:
    """An offline schema folder: <id>.avsc per id."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, s in schemas.items():
        (folder / f"{i}.avsc").write_text(json.dumps(s))
    return folder


def demo_job(path: Path, source: dict[str, Any], out: str) -> Path:
    """jobs/demo.yaml reading `source` (format, path or kafka, value), writing JSONL sinks under `out`."""
    spec = yaml.safe_load((REPO / "jobs" / "demo.yaml").read_text())
    spec["name"] = f"clicks-{out}"
    clicks = {k: v for k, v in spec["sources"]["clicks"].items() if k not in ("format", "path", "value")}
    clicks["value"] = {"format": "json", "schema": str(REPO / "schemas" / "click.json")}
    spec["sources"]["clicks"] = {**clicks, **source}
    spec["sinks"] = {s: {"format": "jsonl", "path": f"{out}/{s.lstrip('_')}.jsonl"} for s in spec["sinks"]}
    spec.pop("verify", None)
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def outputs(folder: Path) -> dict[str, list[str]]:
    """Every JSONL sink under `folder`, rows as sorted JSON text (an order-free comparison)."""
    out = {}
    for file in sorted(folder.glob("*.jsonl")):
        rows = [json.loads(line) for line in file.read_text().splitlines() if line.strip()]
        for r in rows:
            r.update({k: round(v, 9) for k, v in r.items() if isinstance(v, float)})
        out[file.stem] = sorted(json.dumps(r, sort_keys=True) for r in rows)
    return out
