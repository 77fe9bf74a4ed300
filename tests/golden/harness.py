"""Run a golden timeline through the public path: a job file, `backfill run`, and the sinks it writes."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from backfill.cli import app
from tests.conftest import read_jsonl, write_jsonl


@dataclass
class Outcome:
    """What one run produced: exit code, outputs per operator, ledger rows, summary, stderr."""

    code: int
    outputs: dict[str, list[dict[str, Any]]]
    ledger: list[dict[str, Any]]
    summary: dict[str, Any]
    stderr: str


def timeline(records: list[tuple], *, topic: str = "t", partition: int = 0) -> list[dict[str, Any]]:
    """(key, value, ts) tuples -> JSONL records with offsets in the given order."""
    return [{"topic": topic, "partition": partition, "offset": i, "key": k, "value": v, "timestamp": t}
            for i, (k, v, t) in enumerate(records)]


def run_job(tmp: Path, job_yaml: str, inputs: dict[str, list[dict[str, Any]]], *args: str,
            engine: str = "spark") -> Outcome:
    """Write inputs/<source>.jsonl and job.yaml, run it, read every jsonl sink back."""
    for name, rows in inputs.items():
        write_jsonl(tmp / "inputs" / f"{name}.jsonl", rows)
    job = tmp / "job.yaml"
    job.write_text(job_yaml)
    result = CliRunner().invoke(app, ["run", str(job), "--json", "--engine", engine, *args])
    stdout = result.stdout
    summary = json.loads(stdout) if result.exit_code == 0 and stdout.strip().startswith("{") else {}
    if engine == "reference" and summary:
        return Outcome(result.exit_code, summary["outputs"], summary["ledger_rows"], summary, result.stderr)
    outputs = {p.stem: read_jsonl(p) for p in sorted((tmp / "out").glob("*.jsonl")) if p.stem != "ledger"}
    return Outcome(result.exit_code, outputs, read_jsonl(tmp / "out" / "ledger.jsonl"), summary, result.stderr)


def aggregate_job(window: str, aggregations: str, emit: str, *, value_format: str = "string",
                  timestamp: str = "{extractor: record, on_invalid: fail}", extra_source: str = "") -> str:
    """A one-source, one-aggregate job writing JSONL sinks under out/."""
    return f"""
name: golden
sources:
  s: {{format: jsonl, path: inputs/s.jsonl, value: {{format: {value_format}}}, timestamp: {timestamp}{extra_source}}}
operators:
  - name: agg
    aggregate:
      input: s
      window: {window}
      aggregations: {aggregations}
      emit: {emit}
sinks:
  agg: {{format: jsonl, path: out/agg.jsonl}}
  _ledger: {{format: jsonl, path: out/ledger.jsonl}}
  _runs: {{format: jsonl, path: out/runs.jsonl}}
"""
