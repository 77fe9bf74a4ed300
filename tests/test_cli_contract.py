"""The command line's contract: every error path exits 2 with one line (1 for failed expectations),
options accepted but not implemented are refused, parquet sources and sinks work like JSONL and Delta."""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from backfill.cli import app
from tests.conftest import read_jsonl, write_jsonl

JOB = """
name: cli
semantics: {semantics}
sources:
  s: {{format: {fmt}, path: {path}}}
operators:
  - name: agg
    aggregate: {{input: s, window: {{type: tumbling, size: 10s, grace: 0ms}}, aggregations: {{n: count()}}, emit: updates}}
sinks:
  agg: {{format: {sink}, path: out/agg{ext}}}
  _ledger: {{format: {sink}, path: out/ledger{ext}}}
"""
RECORDS = [{"topic": "t", "partition": 0, "offset": i, "key": f"k{i % 2}", "value": "v", "timestamp": 1000 * i}
           for i in range(25)]


def _job(tmp: Path, *, fmt: str = "jsonl", sink: str = "jsonl", semantics: str = "kafka-streams") -> Path:
    if fmt == "jsonl":
        write_jsonl(tmp / "in.jsonl", RECORDS)
        path = "in.jsonl"
    else:
        (tmp / "in").mkdir(exist_ok=True)
        pq.write_table(pa.Table.from_pylist(RECORDS), tmp / "in" / "part-0.parquet")
        path = "in"
    job = tmp / "job.yaml"
    job.write_text(JOB.format(semantics=semantics, fmt=fmt, path=path, sink=sink,
                              ext=".jsonl" if sink == "jsonl" else ""))
    return job


def _one_line_error(result, *fragments: str) -> None:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.mark.parametrize("args,fragments", [
    (["--start", "yesterday"], ["--start 'yesterday' is not an instant", "ISO-8601"]),
    (["--end", "2024-13-01"], ["--end '2024-13-01' is not an instant"]),
    (["--start", "2000", "--end", "1000"], ["is not before --end"]),
    (["--engine", "flink"], ["--engine 'flink' is not an engine; use spark or reference"]),
    (["--profile", "nope"], ["--profile nope", "profiles are"]),
])
def test_run_options_that_cannot_work_are_one_line_errors(tmp_path, args, fragments):
    _one_line_error(CliRunner().invoke(app, ["run", str(_job(tmp_path)), *args]), *fragments)


@pytest.mark.parametrize("option,value,fragment", [
    ("--map", "key", "--map 'key': use col=source_col"),
    ("--map", "=x", "--map '=x': use col=source_col"),
    ("--tolerance", "n=3", "n=3"),
    ("--tolerance", "n=abs:x", "n=abs:x"),
])
def test_verify_options_that_do_not_parse_are_one_line_errors(tmp_path, option, value, fragment):
    result = CliRunner().invoke(app, ["verify", str(_job(tmp_path)), "--against", f"agg={tmp_path / 'in.jsonl'}",
                                      option, value])
    _one_line_error(result, fragment)


def test_verify_against_an_operator_that_does_not_exist(tmp_path):
    result = CliRunner().invoke(app, ["verify", str(_job(tmp_path)), "--against", f"nope={tmp_path / 'in.jsonl'}"])
    _one_line_error(result, "nope")


def test_a_missing_job_file_and_an_unknown_command(tmp_path):
    _one_line_error(CliRunner().invoke(app, ["run", str(tmp_path / "nope.yaml")]), "no such job file")
    assert CliRunner().invoke(app, ["frobnicate"]).exit_code == 2


def test_semantics_flink_is_refused_until_its_operators_exist(tmp_path):
    _one_line_error(CliRunner().invoke(app, ["plan", str(_job(tmp_path, semantics="flink"))]), "semantics: flink")


def test_an_internal_error_is_one_line_and_its_traceback_only_with_backfill_debug(tmp_path, monkeypatch):
    import backfill.plan.builder as builder

    def boom(*_: object, **__: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(builder, "build_plan", boom)
    job = str(_job(tmp_path))
    _one_line_error(CliRunner().invoke(app, ["plan", job]), "internal error (RuntimeError: boom)", "BACKFILL_DEBUG=1")
    debug = CliRunner().invoke(app, ["plan", job], env={"BACKFILL_DEBUG": "1"})
    assert debug.exit_code == 2 and "Traceback" in debug.stderr and "RuntimeError: boom" in debug.stderr


@pytest.mark.spark
def test_failed_expectations_exit_1_and_publish_nothing(tmp_path, spark, monkeypatch):
    from backfill.errors import ExpectationsFailed
    from backfill.checks import expectations

    def failing(self, op):  # what a failed window suite does: stop the publish of that output
        def audit(_staged):
            raise ExpectationsFailed(f"{op.name}.output: expectations failed before publish: window size; "
                                     "nothing was published")
        return audit

    monkeypatch.setattr(expectations.PublishChecks, "for_output", failing)
    result = CliRunner().invoke(app, ["run", str(_job(tmp_path))])
    assert result.exit_code == 1 and "expectations failed" in result.stderr
    assert not (tmp_path / "out" / "agg.jsonl").exists()
    # the ledger, staged beside the failing output, is not committed and its staging is removed
    assert not (tmp_path / "out" / "ledger.jsonl").exists() and not list((tmp_path / "out").glob("*.staging-*"))


@pytest.mark.spark
@pytest.mark.parametrize("sink", ["jsonl", "delta"])
def test_a_failed_conservation_check_exits_2_and_publishes_nothing(tmp_path, spark, monkeypatch, sink):
    """The ledger's rows against the counting pass (checks/conservation.py): when they disagree the run exits 2,
    and no sink is staged or committed."""
    from backfill.errors import PublishError
    from backfill.plan import evaluator

    checked = []

    def failing(operators, counts, ledger):
        checked.append(len(ledger))
        raise PublishError("operators.agg: conservation check failed (late ledger rows 1, late pairs 0); "
                           "nothing was published")

    job = _job(tmp_path, sink=sink)
    if sink == "delta":  # a table with a version already: it must stay at that version
        assert CliRunner().invoke(app, ["run", str(job)]).exit_code == 0

    def files() -> list[str]:  # a sink's lock file (io/lock.py) stays
        return sorted(p.name for p in (tmp_path / "out").rglob("*") if not p.name.endswith(".backfill-lock"))

    before = files()
    monkeypatch.setattr(evaluator, "check_conservation", failing)
    result = CliRunner().invoke(app, ["run", str(job)])
    assert checked and result.exit_code == 2 and "conservation check failed" in result.stderr
    assert files() == before  # no staging left, no commit
    assert not list((tmp_path / "out").glob("*.staging-*"))


@pytest.mark.spark
def test_parquet_sources_and_sinks_give_what_jsonl_gives(tmp_path, spark):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = CliRunner().invoke(app, ["run", str(_job(tmp_path / "a"))])
    assert first.exit_code == 0, first.stderr
    result = CliRunner().invoke(app, ["run", str(_job(tmp_path / "b", fmt="parquet", sink="parquet"))])
    assert result.exit_code == 0, result.stderr
    from_jsonl = sorted(read_jsonl(tmp_path / "a" / "out" / "agg.jsonl"), key=lambda r: r["emit_seq"])
    from_parquet = sorted(pq.read_table(tmp_path / "b" / "out" / "agg").to_pylist(), key=lambda r: r["emit_seq"])
    assert from_parquet == from_jsonl and len(from_jsonl) == 25


def test_plan_starts_no_jvm_and_imports_neither_pandas_nor_great_expectations():
    """`plan` stays quick (under a second on this project's 2-core machine): it reads no data, so it needs
    no JVM, and pandas (0.4 s) and great-expectations are only imported where a run or a Python worker uses them."""
    import subprocess
    import sys

    job = Path(__file__).resolve().parents[1] / "jobs" / "clicks_impressions.yaml"
    code = ("import sys\nfrom typer.testing import CliRunner\nfrom backfill.cli import app\n"
            f"result = CliRunner().invoke(app, ['plan', {str(job)!r}])\n"
            "assert result.exit_code == 0, result.output\n"
            "from pyspark import SparkContext\n"
            "print(sorted(m for m in ('pandas', 'great_expectations') if m in sys.modules),\n"
            "      SparkContext._active_spark_context is not None)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[] False"


def test_server_start_refuses_a_bad_idle_timeout_and_a_busy_port(tmp_path, monkeypatch):
    import socket

    monkeypatch.setenv("BACKFILL_SERVER_DIR", str(tmp_path / "server"))
    _one_line_error(CliRunner().invoke(app, ["server", "start", "--idle-timeout", "soon"]),
                    "--idle-timeout 'soon' is not a duration", "30m")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        _one_line_error(CliRunner().invoke(app, ["server", "start", "--port", str(port)]),
                        f"--port {port}: 127.0.0.1:{port} is in use", "--port")
    status = CliRunner().invoke(app, ["server", "status"])
    assert status.exit_code == 0 and status.stdout.startswith("resident engine: not running")
