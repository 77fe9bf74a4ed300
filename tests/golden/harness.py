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


def partitioned(topic: str, rows: list[tuple[int, Any, Any, int]]) -> list[dict[str, Any]]:
    """(partition, key, value, ts) tuples -> JSONL records of `topic`, offsets in each partition's order."""
    offsets: dict[int, int] = {}
    out = []
    for p, k, v, ts in rows:
        out.append({"topic": topic, "partition": p, "offset": offsets.setdefault(p, 0), "key": k, "value": v,
                    "timestamp": ts})
        offsets[p] += 1
    return out


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


JOINER = "concat(coalesce(cast(left.value as string), 'null'), '+', coalesce(cast(right.value as string), 'null'))"


def sided_timeline(inputs: list[dict[str, Any]], partition: int = 0) -> dict[str, list[dict[str, Any]]]:
    """Example inputs with `side` -> left/right JSONL records; `seq` keeps the example's processing order."""
    out: dict[str, list[dict[str, Any]]] = {"left": [], "right": []}
    for seq, r in enumerate(x for x in inputs if "side" in x):
        rows = out[r["side"]]
        rows.append({"topic": r["side"], "partition": partition, "offset": len(rows),
                     "key": None if r["key"] is None else str(r["key"]),
                     "value": None if r["value"] is None else str(r["value"]),
                     "timestamp": 0 if r["ts"] == "auto" else r["ts"], "seq": seq})  # auto: the driver's clock
    return out


def join_job(how: str, window: str, *, key_format: str = "long", eager: bool = False, value: str = JOINER,
             order_by: str = "order_by: seq, ", partitions: int = 1) -> str:
    """A two-source, one-join job writing JSONL sinks under out/ (processing order from `seq`)."""
    sources = "".join(
        f"  {side}: {{format: jsonl, path: inputs/{side}.jsonl, key: {{format: {key_format}}}, {order_by}"
        f"partitions: {partitions}}}\n" for side in ("left", "right"))
    return f"""
name: golden-join
sources:
{sources}operators:
  - name: j
    join:
      left: left
      right: right
      how: {how}
      window: {window}
      eager: {str(eager).lower()}
      value: "{value}"
sinks:
  j: {{format: jsonl, path: out/j.jsonl}}
  _ledger: {{format: jsonl, path: out/ledger.jsonl}}
  _runs: {{format: jsonl, path: out/runs.jsonl}}
"""


def judged_rows(scenarios: list[Any], folder: Path, versions: tuple[str, ...] = ("4.4.0", "3.6.2")
                ) -> dict[str, list[tuple]]:
    """Kafka Streams of each version on a batch of scenarios, fed in the reference engine's order (the job of each
    version written to `folder/<version>`): asserts that they agree with the reference engine, and returns every
    row each version forwarded (key, window, value, timestamp)."""
    from backfill.conformance import check, harness

    rows = {}
    for version in versions:
        harness.check_version(version)
        differ, judged = check.judge_batch(scenarios, version, folder / version)
        assert [d.scenario.id for d in differ] == [], version
        rows[version] = [r for sc in scenarios for r in judged[sc.id].rows]
    return rows
