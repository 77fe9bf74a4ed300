"""`verify` reconciles what each operator kind says it can (`verified_as` in ops/registry.py's classes): window
aggregates, stream-stream joins and rules alerts. Any other kind (a table aggregation, a stream-table join) is
refused in one line that names the operator, its kind and what to use instead, before anything is read. A window
aggregate of a chain (it reads another operator's rows) is reconciled; only what the outputs show is a cause."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from backfill.cli import app
from backfill.ops.registry import OPERATORS
from tests.conftest import write_jsonl

JOB = """
name: kinds
sources:
  s: {{format: jsonl, path: in.jsonl, value: {{format: string}}}}
  t: {{format: jsonl, path: in.jsonl, value: {{format: string}}}}
operators:
  - name: op
    {operator}
sinks:
  op: {{format: jsonl, path: out/op.jsonl}}{extra}
  _ledger: {{format: jsonl, path: out/ledger.jsonl}}
"""
KINDS = {
    "table aggregation": "aggregate: {input: s, aggregations: {n: count()}}",
    "stream-table join": "join: {left: s, table: t, how: left, value: 'concat(left.value, right.value)'}",
}


def test_every_registered_kind_says_how_it_is_verified() -> None:
    assert {kind: cls.verified_as for kind, cls in OPERATORS.items()} == {
        "join": "join", "table_join": None, "rules": "alerts", "tumbling": "windows", "hopping": "windows",
        "sliding": "windows", "session": "windows", "table": None}


@pytest.mark.parametrize("noun", sorted(KINDS))
def test_a_kind_verify_cannot_reconcile_is_refused_in_one_line(tmp_path: Path, noun: str) -> None:
    write_jsonl(tmp_path / "in.jsonl", [{"topic": "t", "partition": 0, "offset": 0, "key": "a", "value": "v",
                                         "timestamp": 1}])
    job = tmp_path / "job.yaml"
    job.write_text(JOB.format(operator=KINDS[noun], extra=""))
    result = CliRunner().invoke(app, ["verify", str(job), "--against", f"op={tmp_path / 'in.jsonl'}"])
    assert result.exit_code == 2, (result.exit_code, result.stderr)
    lines = result.stderr.strip().splitlines()
    said = f"verify reconciles window aggregates, stream-stream joins and rules alerts; this operator is a {noun}"
    assert len(lines) == 1 and f"operators.op: {said}" in lines[0] and "backfill diff" in lines[0], lines


CHAIN = """
name: chained
sources:
  s: {format: jsonl, path: in.jsonl, value: {format: string}}
operators:
  - name: up
    aggregate: {input: s, window: {type: tumbling, size: 10s, grace: 0ms}, aggregations: {n: count()}, emit: updates}
  - name: busy
    aggregate: {input: up, where: "value.n > 1", window: {type: tumbling, size: 20s, grace: 0ms},
                aggregations: {updates: count()}, emit: final}
sinks:
  up: {format: none}
  busy: {format: jsonl, path: out/busy.jsonl}
  _ledger: {format: jsonl, path: out/ledger.jsonl}
  _runs: {format: jsonl, path: out/runs.jsonl}
"""


@pytest.mark.spark
@pytest.mark.slow
def test_a_chained_window_aggregate_is_reconciled_from_its_outputs(tmp_path: Path) -> None:
    """The last operator of a chain against the stream's output: equal rows match; an exact repeat is
    duplicate_delivery; a different value is unexplained (its input, another operator's rows, is not read)."""
    keys = ["a", "a", "b", "a", "b", "b", "a", "c", "a", "b", "a", "a"]
    write_jsonl(tmp_path / "in.jsonl", [{"topic": "t", "partition": 0, "offset": i, "key": k, "value": "v",
                                         "timestamp": 3000 * i} for i, k in enumerate(keys)])
    job = tmp_path / "job.yaml"
    job.write_text(CHAIN)
    assert CliRunner().invoke(app, ["run", str(job)]).exit_code == 0
    ours = [json.loads(line) for line in (tmp_path / "out" / "busy.jsonl").read_text().splitlines()]
    assert len(ours) >= 2, ours

    def verify(rows: list[dict[str, Any]]) -> tuple[int, dict[str, Any]]:
        stream = write_jsonl(tmp_path / "stream.jsonl", [{**r, "partition": 0, "offset": i} for i, r in enumerate(rows)])
        result = CliRunner().invoke(app, ["verify", str(job), "--json", "--against", f"busy={stream}"])
        assert result.exit_code in (0, 1), result.stderr
        [section] = json.loads(result.stdout)["sections"]
        return result.exit_code, section

    code, section = verify(ours)
    assert code == 0 and section["counts"]["match"] == len(ours) and sum(section["counts"].values()) == len(ours)
    assert any("a chain: this operator reads the rows operators.up forwards" in n for n in section["notes"])
    code, section = verify([ours[0], ours[0], {**ours[1], "updates": ours[1]["updates"] + 5}, *ours[2:]])
    assert code == 1
    assert {c: n for c, n in section["causes"].items() if n} == {"duplicate_delivery": 1, "unexplained": 1}
