"""Chains as the job declares them (docs/semantics.md §18): what is refused before the run (one line, exit 2,
naming the operator and the fix), what `plan` says of who reads whom, and the count that ties a chained
operator to its upstream's output (breaking it fails the run)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from backfill.cli import app
from tests.conftest import write_jsonl

AGG = "{{input: {input}, window: {{type: tumbling, size: 1m, grace: 0ms}}, aggregations: {{n: count()}}, emit: {emit}}}"


def _job(tmp: Path, operators: dict[str, str]) -> Path:
    """A one-source job with the given operators (name -> its `aggregate:` or `join:` mapping), sinks counted only."""
    write_jsonl(tmp / "s.jsonl", [{"topic": "t", "partition": 0, "offset": i, "key": "a", "value": "v", "timestamp": t}
                                  for i, t in enumerate([1_000, 2_000, 70_000])])
    ops = "".join(f"  - name: {name}\n    {body}\n" for name, body in operators.items())
    sinks = "".join(f"  {name}: {{format: none}}\n" for name in operators)
    job = tmp / "job.yaml"
    job.write_text(f"name: chain\nsources:\n  s: {{format: jsonl, path: s.jsonl, value: {{format: string}}}}\n"
                   f"operators:\n{ops}sinks:\n{sinks}")
    return job


def _agg(input: str, emit: str = "updates") -> str:
    return "aggregate: " + AGG.format(input=input, emit=emit)


def _refused(job: Path, *args: str) -> str:
    """The one line a refused job gives, from `plan` and from a reference run alike."""
    lines = []
    for command in (["plan", str(job)], ["run", str(job), "--engine", "reference"]):
        got = CliRunner().invoke(app, [*command, *args])
        assert got.exit_code == 2, (command, got.exit_code, got.stdout, got.stderr)
        assert len(got.stderr.strip().splitlines()) == 1, got.stderr
        lines.append(got.stderr.strip())
    assert lines[0] == lines[1]
    return lines[0]


def test_a_cycle_of_operators_is_refused_naming_it(tmp_path):
    line = _refused(_job(tmp_path, {"a": _agg("b"), "b": _agg("c"), "c": _agg("a"), "d": _agg("s")}))
    assert "operators.a: the operators read each other in a cycle (a -> b -> c -> a)" in line


def test_an_operator_reading_itself_is_a_cycle(tmp_path):
    line = _refused(_job(tmp_path, {"a": _agg("a")}))
    assert "cycle (a -> a)" in line


def test_an_input_named_like_a_source_and_an_operator_reads_the_source(tmp_path):
    """A job written before chains: operators named after the sources they read (the join property test's
    generator names its joins `left`, `inner`, ...). Such an input is the source, so nothing here is a chain."""
    job = _job(tmp_path, {"s": _agg("s"), "b": _agg("s")})
    got = CliRunner().invoke(app, ["run", str(job), "--engine", "reference", "--json"])
    assert got.exit_code == 0, got.stderr
    outputs = json.loads(got.stdout)["outputs"]
    assert len(outputs["s"]) == 3 and outputs["s"] == outputs["b"]  # both count the 3 records of source s


def test_an_input_that_is_neither_a_source_nor_an_operator_is_refused(tmp_path):
    line = _refused(_job(tmp_path, {"a": _agg("s"), "b": _agg("nosuch")}))
    assert "operators[1].aggregate: 'b' reads 'nosuch', which is neither a source nor an operator" in line
    assert "sources are: s; operators are: a, b" in line


def test_a_join_over_an_operator_it_does_not_rekey_is_refused(tmp_path):
    join = ("join: {left: a, right: s, how: inner, window: {before: 1s, after: 1s, grace: 0ms}, "
            "value: \"concat(left.value, right.value)\"}")
    line = _refused(_job(tmp_path, {"a": _agg("s"), "j": join}))
    assert ("operators.j.join.left: reads operator 'a' without a re-key; in the upstream's tasks a stream-stream "
            "join reads a stream-table join's or a table aggregate's rows only (a windowed aggregate's keys are "
            "windows, not the other side's keys): re-key it (group_by: {left: <new key>})") in line


def test_a_join_of_two_operators_is_refused(tmp_path):
    join = ("join: {left: a, right: b, how: inner, group_by: key, window: {before: 1s, after: 1s, grace: 0ms}, "
            "value: \"concat(left.value, right.value)\"}")
    line = _refused(_job(tmp_path, {"a": _agg("s"), "b": _agg("s"), "j": join}))
    assert "operators.j.join: both inputs are operators; a join may read one operator, the other input a source" in line


@pytest.mark.parametrize("close", ["on_window_close", "suppress"])
def test_final_session_windows_are_read_as_released(tmp_path, close):
    """A session emitted final (gap 1m: [1000, 2000] closes at the record of 70,000) reaches the operator reading
    it once, by either mechanism, with the session's end as its timestamp."""
    session = ("aggregate: {input: s, window: {type: session, gap: 1m, grace: 0ms}, aggregations: {n: count()}, "
               f"emit: final, close: {close}}}")
    job = _job(tmp_path, {"a": session, "b": "aggregate: {input: a, aggregations: {sessions: count(), records: "
                                              "sum(value.n)}, emit: updates}"})
    got = CliRunner().invoke(app, ["run", str(job), "--engine", "reference", "--json"])
    assert got.exit_code == 0, got.stderr
    outputs = json.loads(got.stdout)["outputs"]
    assert [(r["key"], r["sessions"], r["records"], r["ts"]) for r in outputs["b"]] == [("a", 1, 2, 2_000)]


def test_final_time_windows_are_read_once_each_as_released(tmp_path):
    """A tumbling window's final rows (1m: [0, 60000) closes when the record at 70,000 arrives) reach the
    operator reading them once each, with their last value; the window still open at the end is not forwarded."""
    job = _job(tmp_path, {"a": _agg("s", "final"), "b": "aggregate: {input: a, aggregations: {windows: count(), "
                                                      "records: sum(value.n)}, emit: updates}"})
    got = CliRunner().invoke(app, ["run", str(job), "--engine", "reference", "--json"])
    assert got.exit_code == 0, got.stderr
    outputs = json.loads(got.stdout)["outputs"]
    assert [(r["window_start"], r["n"]) for r in outputs["a"]] == [(0, 2)]
    assert [(r["key"], r["windows"], r["records"], r["ts"]) for r in outputs["b"]] == [("a", 1, 2, 2_000)]


def test_plan_says_which_operator_reads_which(tmp_path):
    job = _job(tmp_path, {"a": _agg("s"), "b": _agg("a"), "c": _agg("b"), "d": _agg("a"), "e": _agg("s")})
    text = CliRunner().invoke(app, ["plan", str(job)])
    assert text.exit_code == 0, text.stderr
    assert "topology: a -> (b -> c, d)" in text.stdout
    assert "operator b: aggregate tumbling size 1m grace 0ms, emit updates over a; tasks = the tasks of a" \
        in text.stdout
    # the source of an operator that others read is read whole (its forwarded rows must be complete)
    ranged = CliRunner().invoke(app, ["plan", str(job), "--json", "--start", "60000", "--end", "120000"])
    plan = json.loads(ranged.stdout)
    assert plan["chains"] == {"b": "a", "c": "b", "d": "a"}
    assert plan["sources"][0]["reads_all"] is True and plan["sources"][0]["read_from"] is None


@pytest.mark.spark
def test_forwarded_rows_lost_on_the_way_fail_the_run(tmp_path: Path, spark: Any, monkeypatch: Any) -> None:
    job = _job(tmp_path, {"a": _agg("s"), "b": _agg("a")})
    clean = CliRunner().invoke(app, ["run", str(job), "--json"])
    assert clean.exit_code == 0, clean.stderr
    assert json.loads(clean.stdout)["chained"]["b"] == {"from": "a", "records": 3, "forwarded": 3}

    import backfill.plan.evaluator as evaluator

    original = evaluator.forwarded

    def losing_a_row(up: Any, output: Any) -> Any:  # the path under test, broken: the first row never arrives
        return original(up, output).where("offset > 0")

    monkeypatch.setattr(evaluator, "forwarded", losing_a_row)
    broken = CliRunner().invoke(app, ["run", str(job), "--json"])
    assert broken.exit_code == 2, (broken.exit_code, broken.stderr)
    assert "operators.b: conservation check failed (2 records in, 3 rows forwarded by operators.a)" in broken.stderr
