"""`plan` prints the strategies `run` takes (plan/strategy.py): how each task's records are ordered, and whether
the one pass runs the plan. The run reports the ways it took (`strategies` in `run --json`) as the ordering
itself chose them; the plan predicts them before any data is read, from the same rules. They must agree, and
when the run's conditions change (no JVM operator, an input above the size threshold), both move together."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from backfill.cli import app
from backfill.order import tasks
from tests.conftest import write_jsonl

pytestmark = [pytest.mark.spark]

SOURCES = """
sources:
  s: {format: jsonl, path: s.jsonl, value: {format: json}}
  r: {format: jsonl, path: r.jsonl, value: {format: json}}
"""
HOP = "{type: hopping, size: 4s, advance: 1s, grace: 0ms}"
OPERATORS = {
    # one source, a hopping aggregate emitting final windows: the one pass, by pane
    "one_pass": f"""
  - name: w
    aggregate: {{input: s, window: {HOP}, aggregations: {{n: count(), t: sum(value.amount)}}, emit: final}}""",
    # the same with a filter (KStream#filter before it): operator by operator
    "filtered": f"""
  - name: w
    aggregate: {{input: s, where: "value.amount > 3", window: {HOP}, aggregations: {{n: count()}}, emit: final}}""",
    # a join: two queues per task
    "join": """
  - name: j
    join: {left: s, right: r, how: left, window: {before: 1s, after: 1s, grace: 0ms},
           value: "concat(left.value.user, right.value.user)"}""",
    # a re-key, and an operator reading another's updates (a chain)
    "rekey_chain": f"""
  - name: by_user
    aggregate: {{input: s, group_by: value.user, window: {HOP}, aggregations: {{n: count()}}, emit: updates}}
  - name: busy
    aggregate: {{input: by_user, window: {HOP}, aggregations: {{n: count()}}, emit: updates}}""",
}


def _job(tmp: Path, kind: str) -> Path:
    for name in ("s", "r"):
        write_jsonl(tmp / f"{name}.jsonl", [
            {"topic": name, "partition": i % 2, "offset": i // 2, "key": f"k{i % 4}",
             "value": {"user": f"u{i % 4}", "amount": i}, "timestamp": 1_000 + 700 * i} for i in range(24)])
    sources = SOURCES if kind == "join" else SOURCES.split("  r:")[0]
    ops = OPERATORS[kind]
    sinks = "".join(f"  {line.split(':')[1].strip()}: {{format: none}}\n" for line in ops.splitlines()
                    if line.strip().startswith("- name:"))
    job = tmp / "job.yaml"
    job.write_text(f"name: strategy-{kind}\n{sources}operators:{ops}\nsinks:\n{sinks}")
    return job


def _planned(job: Path) -> dict[str, str]:
    got = CliRunner().invoke(app, ["plan", str(job), "--json"])
    assert got.exit_code == 0, got.stderr
    return {s["stage"]: s["how"] for s in json.loads(got.stdout)["strategies"]}


def _taken(job: Path) -> dict[str, str]:
    got = CliRunner().invoke(app, ["run", str(job), "--json"])
    assert got.exit_code == 0, got.stderr
    return json.loads(got.stdout)["strategies"]


@pytest.mark.parametrize("kind", sorted(OPERATORS))
def test_the_plan_names_the_strategies_the_run_takes(tmp_path: Path, spark: Any, kind: str) -> None:
    job = _job(tmp_path, kind)
    planned = _planned(job)
    assert _taken(job) == planned
    expected = {"one_pass": {"ordering": "streamed", "pass": "one_pass"},
                "filtered": {"ordering": "streamed", "pass": "by_operator"},
                "join": {"ordering": "merged", "pass": "by_operator"},
                "rekey_chain": {"ordering": "streamed", "ordering by_user (repartition topic)": "streamed",
                                "ordering busy (forwarded rows)": "streamed", "pass": "by_operator"}}[kind]
    assert planned == expected
    text = CliRunner().invoke(app, ["plan", str(job)]).stdout
    assert all(f"strategy: {stage}: {how} (" in text for stage, how in planned.items())


def test_without_the_operator_and_above_the_size_threshold_both_move(tmp_path: Path, spark: Any,
                                                                    monkeypatch: Any) -> None:
    """A large input (the threshold lowered below the test's bytes) spreads the one pass's pane groups; without
    backfill's JVM operator a one-queue input is then ordered in chunks. The plan, told the same, agrees."""
    from backfill.jobspec.load import load_job
    from backfill.plan import strategy
    from backfill.plan.builder import build_plan

    job = _job(tmp_path, "one_pass")
    monkeypatch.setattr(tasks, "CHUNKED_ABOVE", 1)
    assert _planned(job) == _taken(job) == {"ordering": "streamed", "pass": "one_pass_spread"}
    monkeypatch.setattr(tasks, "USE_OPERATOR", False)  # as in a session without backfill's jar
    taken = _taken(job)
    assert taken == {"ordering": "chunks", "pass": "one_pass_spread"}
    plan = build_plan(load_job(job), None, None)
    predicted = strategy.strategies(plan, operator=False, input_bytes=strategy.file_bytes(plan))
    assert {s.stage: s.how for s in predicted} == taken


def test_plan_names_them_without_a_spark_session(tmp_path: Path) -> None:
    """`plan` starts no JVM: in a fresh process, a filtered job's strategies are still named."""
    import subprocess
    import sys

    job = _job(tmp_path, "filtered")
    got = subprocess.run([sys.executable, "-m", "backfill.cli", "plan", str(job)], capture_output=True, text=True,
                         timeout=120)
    assert got.returncode == 0, got.stderr
    assert "strategy: pass: by_operator (" in got.stdout and "strategy: ordering: " in got.stdout
