"""`verify` reconciles what each operator kind says it can (`verified_as` in ops/registry.py's classes): window
aggregates and stream-stream joins. Any other kind (a table aggregation, a stream-table join, a rules operator) is
refused in one line that names the operator, its kind and what to use instead, before anything is read; so is an
operator of a chain (its evidence would be the rows its upstream forwards)."""
from __future__ import annotations

from pathlib import Path

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
    # a chain: op reads the updates of up
    "chain": "aggregate: {input: up, window: {type: tumbling, size: 1m, grace: 0ms}, aggregations: {n: count()}, "
             "emit: updates}\n  - name: up\n    aggregate: {input: s, window: {type: tumbling, size: 1m, grace: 0ms}, "
             "aggregations: {n: count()}, emit: updates}",
}


def test_every_registered_kind_says_how_it_is_verified() -> None:
    assert {kind: cls.verified_as for kind, cls in OPERATORS.items()} == {
        "join": "join", "table_join": None, "rules": None, "tumbling": "windows", "hopping": "windows",
        "sliding": "windows", "session": "windows", "table": None}


@pytest.mark.parametrize("noun", sorted(KINDS))
def test_a_kind_verify_cannot_reconcile_is_refused_in_one_line(tmp_path: Path, noun: str) -> None:
    write_jsonl(tmp_path / "in.jsonl", [{"topic": "t", "partition": 0, "offset": 0, "key": "a", "value": "v",
                                         "timestamp": 1}])
    job = tmp_path / "job.yaml"
    job.write_text(JOB.format(operator=KINDS[noun], extra="\n  up: {format: none}" if noun == "chain" else ""))
    result = CliRunner().invoke(app, ["verify", str(job), "--against", f"op={tmp_path / 'in.jsonl'}"])
    assert result.exit_code == 2, (result.exit_code, result.stderr)
    lines = result.stderr.strip().splitlines()
    said = "it reads the rows operators.up forwards (a chain)" if noun == "chain" else \
        f"verify reconciles window aggregates and stream-stream joins; this operator is a {noun}"
    assert len(lines) == 1 and f"operators.op: {said}" in lines[0] and "backfill diff" in lines[0], lines
