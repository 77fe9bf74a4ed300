"""Conservation is checked against the records' own fates, not derived from the ledger: a path that drops a
record's ledger row makes the run fail (exit 2, nothing published). Session and sliding windows count their
contributing and late records, and their late pairs, in the kernel; deriving them from the ledger's totals
made both checks true by construction. A join counts the records that reach it and takes away the expired ones
(their store refused them and they found nothing), counted apart from the ledger rows made of them. A rules
operator counts the transactions some rule version could read and the rule messages that parsed. A window
aggregate's null keys must all be in its ledger, and its late records are counted, not left over."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F
from typer.testing import CliRunner

from backfill.cli import app
from backfill.ledger import LATE
from tests.conftest import write_jsonl

pytestmark = [pytest.mark.spark]

JOB = """
name: conservation-{kind}
sources:
  s: {{format: jsonl, path: in.jsonl, value: {{format: string}}}}
operators:
  - name: w
    aggregate: {{input: s, window: {window}, aggregations: {{n: count()}}, emit: updates}}
sinks:
  w: {{format: jsonl, path: out/w.jsonl}}
  _ledger: {{format: jsonl, path: out/ledger.jsonl}}
"""
WINDOWS = {"session": "{type: session, gap: 5s, grace: 0ms}", "sliding": "{type: sliding, time_difference: 5s, grace: 0ms}"}
# a@1s, then a@30s moves stream time past every window of 1s, then a@2s is late (for every window it could join)
RECORDS = [("a", 1000), ("b", 1500), ("a", 30_000), ("a", 2000), ("b", 31_000)]


def _job(tmp: Path, kind: str) -> Path:
    write_jsonl(tmp / "in.jsonl", [{"topic": "t", "partition": 0, "offset": i, "key": k, "value": "v", "timestamp": t}
                                   for i, (k, t) in enumerate(RECORDS)])
    job = tmp / "job.yaml"
    job.write_text(JOB.format(kind=kind, window=WINDOWS[kind]))
    return job


def _fails_without_its_rows(job: Path, kind: str, reason: str, monkeypatch: Any) -> None:
    """A clean run ledgers `reason`; with backfill.ops.KIND losing those ledger rows, the run fails and publishes
    nothing."""
    out = job.parent / "out"
    clean = CliRunner().invoke(app, ["run", str(job), "--json"])
    assert clean.exit_code == 0, clean.stderr
    assert f'"{reason}"' in (out / "ledger.jsonl").read_text()  # the scenario has such a record

    module = __import__(f"backfill.ops.{kind}", fromlist=["ledger_rows"])
    original = module.ledger_rows

    def losing_rows(df: Any, *args: Any, **kwargs: Any) -> Any:  # the path under test, broken
        return original(df, *args, **kwargs).where(F.col("reason") != reason)

    monkeypatch.setattr(module, "ledger_rows", losing_rows)
    before = sorted(p.read_bytes() for p in out.rglob("*.jsonl"))
    broken = CliRunner().invoke(app, ["run", str(job), "--json"])
    assert broken.exit_code == 2 and "conservation check failed" in broken.stderr, (broken.exit_code, broken.stderr)
    assert sorted(p.read_bytes() for p in out.rglob("*.jsonl")) == before  # nothing published


@pytest.mark.parametrize("kind", ["session", "sliding"])
def test_a_late_record_without_its_ledger_row_fails_the_run(tmp_path: Path, kind: str, monkeypatch: Any) -> None:
    _fails_without_its_rows(_job(tmp_path, kind), kind, LATE, monkeypatch)


def test_a_null_key_record_of_a_window_aggregate_without_its_ledger_row_fails_the_run(tmp_path: Path,
                                                                                   monkeypatch: Any) -> None:
    """The aggregate's null keys were counted and never compared with its ledger; its late records were the
    remainder of the others."""
    job = _job(tmp_path, "session")
    write_jsonl(tmp_path / "in.jsonl", [{"topic": "t", "partition": 0, "offset": i, "key": k, "value": "v",
                                         "timestamp": t} for i, (k, t) in enumerate([*RECORDS, (None, 3000)])])
    job.write_text(JOB.format(kind="tumbling", window="{type: tumbling, size: 5s, grace: 0ms}"))
    _fails_without_its_rows(job, "aggregate", "null_key", monkeypatch)


JOIN_JOB = """
name: conservation-join
sources:
  l: {format: jsonl, path: l.jsonl, value: {format: string}}
  r: {format: jsonl, path: r.jsonl, value: {format: string}}
operators:
  - name: j
    join: {left: l, right: r, how: inner, window: {before: 1s, after: 1s, grace: 0ms},
           value: "concat(left.value, right.value)"}
sinks:
  j: {format: jsonl, path: out/j.jsonl}
  _ledger: {format: jsonl, path: out/ledger.jsonl}
"""


def test_an_expired_join_record_without_its_ledger_row_fails_the_run(tmp_path: Path, monkeypatch: Any) -> None:
    from backfill.ops.join import EXPIRED

    # l@100s moves the left store's time on, so l@2s is refused by its store; no right record is near it
    for name, rows in (("l", [("a", 1000), ("a", 100_000), ("a", 2000)]), ("r", [("a", 1500), ("a", 50_000)])):
        write_jsonl(tmp_path / f"{name}.jsonl", [{"topic": name, "partition": 0, "offset": i, "key": k, "value": "v",
                                                  "timestamp": t} for i, (k, t) in enumerate(rows)])
    job = tmp_path / "job.yaml"
    job.write_text(JOIN_JOB)
    _fails_without_its_rows(job, "join", EXPIRED, monkeypatch)


@pytest.mark.parametrize("reason", ["no_rule", "invalid_rule"])
def test_a_rules_record_without_its_ledger_row_fails_the_run(tmp_path: Path, reason: str, monkeypatch: Any) -> None:
    from tests.golden.test_rules import _tx, inputs, rules_job

    # a transaction before any rule (no_rule), a message that is no rule (invalid_rule), then a rule and a match
    events = [("transactions", _tx(1, "5"), 1), ("rules", "not a rule", 2),
              ("rules", "1,(active),(paymentType),,(paymentAmount),(SUM),(>),(0),(10)", 3),
              ("transactions", _tx(2, "5"), 4)]
    for name, rows in inputs(events).items():
        write_jsonl(tmp_path / "inputs" / f"{name}.jsonl", rows)
    job = tmp_path / "job.yaml"
    job.write_text(rules_job())
    _fails_without_its_rows(job, "rules", reason, monkeypatch)
