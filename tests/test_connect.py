"""Spark Connect for real: `backfill server` runs a resident engine on 127.0.0.1, and the demo job (tumbling,
hopping and session windows over Delta), the stream-stream join example and its `verify`, through the CLI's
--remote and through the Python API on a Connect session, give outputs and ledgers equal to a local-mode run.
The local-mode runs are the same commands in the test's own process (its session, the CLI's code): a second
process would only start a second cold driver."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from typer.testing import CliRunner

from backfill.io.broker import free_port
from backfill.session import CONNECT_MARKS
from tests.conftest import REPO, read_jsonl, restore_env

pytestmark = [pytest.mark.spark, pytest.mark.slow]
DEMO_TABLES = ("gold/clicks_per_user_1m", "gold/clicks_per_user_5m_hop", "gold/user_sessions", "ledger/clicks")
JOIN_FILES = ("click_attribution", "impression_outcome", "ledger")
# what differs between any two runs of one job: their ids and clocks, not their data
# what differs between two runs of the same job (the strategies too: Connect has no JVM operator, checked apart)
PER_RUN = {"run_id", "pass_id", "duration_s", "records_per_s", "code_version", "published_at", "warnings",
           "sinks", "inputs", "fingerprint", "report_dir", "report", "generated_at", "run", "strategies"}


def cli(args: list[str], env: dict[str, str], timeout: int = 900) -> subprocess.CompletedProcess[str]:
    """`backfill ARGS` in a new process, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "backfill.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One resident engine for the test session, started and stopped by `backfill server` itself; its folder
    is the test's own (BACKFILL_SERVER_DIR), so no other checkout or test sees it."""
    folder = tmp_path_factory.mktemp("server")
    env = {**os.environ, "PYTHONPATH": str(REPO), "BACKFILL_SERVER_DIR": str(folder), "COLUMNS": "200"}
    env.pop("SPARK_REMOTE", None)
    port = free_port()
    started = cli(["server", "start", "--port", str(port), "--idle-timeout", "30m"], env, timeout=300)
    assert started.returncode == 0, started.stderr[-2000:]
    try:
        yield {"url": f"sc://127.0.0.1:{port}", "env": env, "folder": folder, "start": started}
    finally:
        stopped = cli(["server", "stop"], env, timeout=120)
        assert stopped.returncode == 0, stopped.stderr[-2000:]


def _local_cli(args: list[str]) -> subprocess.CompletedProcess[str]:
    """`backfill ARGS` in local mode, in this process: the CLI on the test's session, never the resident engine."""
    from backfill.cli import app

    saved = {key: os.environ.get(key) for key in ("BACKFILL_SERVER", "COLUMNS")}
    os.environ.update({"BACKFILL_SERVER": "0", "COLUMNS": "200"})
    try:
        done = CliRunner().invoke(app, args)
    finally:
        restore_env(saved)
    return subprocess.CompletedProcess(args, done.exit_code, done.stdout, done.stderr)


@pytest.fixture
def local(spark: Any) -> Any:
    """_local_cli, with the test's session started."""
    return _local_cli


@pytest.fixture(scope="module")
def local_join(spark_module: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The join example and its verify, run once in local mode for the module's comparisons."""
    folder = tmp_path_factory.mktemp("local_join")
    job = _join_example(folder)
    done = _local_cli(["verify", str(job), "--run", "--json", "--report", str(folder / "report")])
    assert done.returncode in (0, 1) and done.stdout.strip(), f"{done.stdout[-1000:]} {done.stderr[-2000:]}"
    return {"job": job, "code": done.returncode, "out": json.loads(done.stdout)}


def _same_data(summary: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in summary.items() if k not in PER_RUN}


def _rounded(value: Any) -> Any:
    """Floats to 12 significant digits: a sum of doubles depends on the order Spark adds them in, which the
    jar-less plan's layout changes (1808.75 against 1808.7499999999998); every other value is compared exactly."""
    if isinstance(value, float):
        return float(f"{value:.12g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def _rows(rows: list[dict[str, Any]]) -> list[str]:
    return sorted(json.dumps(_rounded({k: v for k, v in r.items() if k not in PER_RUN}), sort_keys=True,
                             default=str) for r in rows)


def _delta_rows(path: Path) -> list[str]:
    return _rows(DeltaTable(str(path)).to_pyarrow_table().to_pylist())


def _jsonl_rows(path: Path) -> list[str]:
    return _rows(read_jsonl(path))


def _demo(folder: Path) -> Path:
    from backfill.demo import SOURCE, WORK_DIR, generate_clicks, install_job

    work = folder / WORK_DIR
    generate_clicks(str(work / SOURCE))
    return install_job(work)


def _join_example(folder: Path) -> Path:
    shutil.copytree(REPO / "jobs" / "samples", folder / "jobs" / "samples")
    shutil.copy(REPO / "jobs" / "clicks_impressions.yaml", folder / "jobs")
    shutil.copytree(REPO / "schemas", folder / "schemas")
    return folder / "jobs" / "clicks_impressions.yaml"


def test_server_status_start_twice_and_stop(server: dict[str, Any], tmp_path: Path) -> None:
    assert f"resident engine: ready at {server['url']}" in server["start"].stdout
    status = cli(["server", "status"], server["env"])
    assert status.returncode == 0 and status.stdout.count("\n") == 1
    assert status.stdout.startswith(f"resident engine: ready at {server['url']} (pid ")
    state = json.loads((server["folder"] / "server.json").read_text())
    assert {"url", "pid", "profile", "started", "log", "status"} <= set(state) and state["status"] == "ready"
    again = cli(["server", "start", "--port", str(free_port())], server["env"])
    assert again.returncode == 0 and again.stdout.startswith("already running: ") and server["url"] in again.stdout
    elsewhere = {**server["env"], "BACKFILL_SERVER_DIR": str(tmp_path / "none")}
    assert cli(["server", "status"], elsewhere).stdout.startswith("resident engine: not running")
    assert cli(["server", "stop"], elsewhere).stdout.strip() == "resident engine: not running"


def test_plan_says_the_jar_less_plan_in_one_line(server: dict[str, Any], tmp_path: Path) -> None:
    planned = cli(["plan", str(_join_example(tmp_path)), "--remote", server["url"]], server["env"])
    assert planned.returncode == 0, planned.stderr[-2000:]
    notes = [line for line in planned.stdout.splitlines() if line.startswith("note: ordering:")]
    assert len(notes) == 1 and "a Spark Connect session" in notes[0] and "jar-less plan" in notes[0]


def test_demo_job_through_the_resident_engine_equals_local_mode(server: dict[str, Any], tmp_path: Path,
                                                                local: Any) -> None:
    local_job = _demo(tmp_path / "local")
    shutil.copytree(tmp_path / "local", tmp_path / "connect")
    connect_job = tmp_path / "connect" / local_job.relative_to(tmp_path / "local")
    ran = local(["run", str(local_job), "--json"])
    assert ran.returncode == 0, ran.stderr[-2000:]
    resident = cli(["run", str(connect_job), "--json"], server["env"])  # no --remote: the resident engine
    assert resident.returncode == 0, resident.stderr[-2000:]
    assert f"using the resident engine at {server['url']}" in resident.stderr
    ours, theirs = json.loads(ran.stdout), json.loads(resident.stdout)
    assert _same_data(theirs) == _same_data(ours)
    assert any("jar-less plan" in w for w in theirs["warnings"])
    assert (ours["strategies"]["ordering"], theirs["strategies"]["ordering"]) == ("streamed", "windows")
    for table in DEMO_TABLES:
        found = _delta_rows(connect_job.parent.parent / "data" / table)
        assert found and found == _delta_rows(local_job.parent.parent / "data" / table), table


def test_join_example_and_its_verify_over_remote_equal_local_mode(server: dict[str, Any], tmp_path: Path,
                                                                  local_join: dict[str, Any]) -> None:
    connect_job = _join_example(tmp_path / "connect")
    done = cli(["verify", str(connect_job), "--run", "--json", "--report", str(tmp_path / "connect" / "report"),
                "--remote", server["url"]], server["env"])
    assert done.returncode in (0, 1) and done.stdout.strip(), f"{done.stdout[-1000:]} {done.stderr[-2000:]}"
    connect_out, local_out = json.loads(done.stdout), local_join["out"]
    assert done.returncode == local_join["code"]
    for key in ("verdict", "operators", "counts", "causes"):
        if key in local_out:
            assert connect_out[key] == local_out[key], key
    for name in JOIN_FILES:
        found = _jsonl_rows(connect_job.parent.parent / "out" / "clicks_impressions" / f"{name}.jsonl")
        assert found and found == _jsonl_rows(local_join["job"].parent.parent / "out" / "clicks_impressions" /
                                              f"{name}.jsonl")


def test_python_api_on_a_connect_session_equals_local_mode(server: dict[str, Any], tmp_path: Path,
                                                          local: Any) -> None:
    from pyspark.sql import SparkSession

    import backfill

    local_job = _join_example(tmp_path / "local")
    ran = local(["run", str(local_job), "--json"])
    assert ran.returncode == 0, ran.stderr[-2000:]
    connect_job = _join_example(tmp_path / "connect")
    marks = {key: os.environ.get(key) for key in CONNECT_MARKS}
    session = SparkSession.builder.remote(server["url"]).create()
    try:
        job = backfill.load_job(connect_job)
        planned = job.plan(spark=session)
        assert any("a Spark Connect session" in n for n in planned.notes)
        summary = job.run(spark=session).to_dict()
        # the plan on that session names the jar-less strategies the run takes (plan/strategy.py)
        assert {s.stage: s.how for s in planned.strategies} == summary["strategies"]
        assert summary["strategies"]["ordering"] == "merged_by_task"
    finally:
        session.stop()
        restore_env(marks)  # PySpark leaves the process marked as a Connect client
    assert _same_data(json.loads(json.dumps(summary, default=str))) == _same_data(json.loads(ran.stdout))
    for name in JOIN_FILES:
        found = _jsonl_rows(connect_job.parent.parent / "out" / "clicks_impressions" / f"{name}.jsonl")
        assert found and found == _jsonl_rows(local_job.parent.parent / "out" / "clicks_impressions" / f"{name}.jsonl")


def test_an_idle_engine_ends_itself(tmp_path: Path) -> None:
    """A second engine, of its own folder: after its idle timeout without a client, its supervisor ends it."""
    import time

    env = {**os.environ, "PYTHONPATH": str(REPO), "BACKFILL_SERVER_DIR": str(tmp_path), "COLUMNS": "200"}
    started = cli(["server", "start", "--port", str(free_port()), "--idle-timeout", "5s"], env, timeout=300)
    assert started.returncode == 0, started.stderr[-2000:]
    pid = json.loads((tmp_path / "server.json").read_text())["pid"]
    deadline = time.monotonic() + 90
    while cli(["server", "status"], env).stdout.startswith("resident engine: ready") and time.monotonic() < deadline:
        time.sleep(3)
    assert cli(["server", "status"], env).stdout.startswith("resident engine: not running")
    assert "resident engine ended: idle for 5s" in (tmp_path / "server.log").read_text()
    assert not Path(f"/proc/{pid}").exists()  # the JVM is gone too
