"""A wheel that installs anywhere: built from the repository's files, installed into a fresh virtual environment
outside the checkout, it runs `backfill --version` and the demo from an empty folder. Its bundle carries the
Spark profiles, the demo's jobs and schemas and backfill's own jars; the pinned jars are resolved on first use
through Spark's own resolver, into a folder of the test's (BACKFILL_HOME)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from deltalake import DeltaTable

REPO = Path(__file__).resolve().parents[1]
OWN_JARS = ("ops", "harness", "flink-harness")
pytestmark = [pytest.mark.slow, pytest.mark.spark]


def _run(command: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: int = 900
         ) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, f"{' '.join(command)}: {done.stderr[-3000:]}"
    return done


def _source_tree(target: Path) -> Path:
    """The files git tracks (what a clone has), and the jars scripts/setup.sh built: what a wheel is built from."""
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for name in filter(None, tracked.decode().split("\0")):
        if (REPO / name).is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, target / name)
    for jars in OWN_JARS:
        if (REPO / "jvm" / "lib" / jars).is_dir():
            shutil.copytree(REPO / "jvm" / "lib" / jars, target / "jvm" / "lib" / jars)
    return target


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment with the wheel installed (uv where setup installed it, else pip)."""
    work = tmp_path_factory.mktemp("wheel")
    src = _source_tree(work / "src")
    uv = Path(sys.executable).parent / "uv"
    venv = work / "venv"
    if uv.is_file():
        _run([str(uv), "build", "--wheel", "--out-dir", str(work / "dist")], cwd=src)
        _run([str(uv), "venv", "-q", "--python", sys.executable, str(venv)], cwd=work)
        [wheel] = (work / "dist").glob("backfill-*.whl")
        _run([str(uv), "pip", "install", "-q", "--python", str(venv / "bin" / "python"), str(wheel)], cwd=work)
    else:
        _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(work / "dist"), str(src)], cwd=work)
        _run([sys.executable, "-m", "venv", str(venv)], cwd=work)
        [wheel] = (work / "dist").glob("backfill-*.whl")
        _run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)], cwd=work)
    return venv


def _env(home: Path) -> dict[str, str]:
    """The environment of a user with no checkout: nothing of the repository on the path, a home of its own."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith(("BACKFILL_", "SPARK_"))}
    return {**env, "BACKFILL_HOME": str(home), "COLUMNS": "160"}


def test_the_wheel_carries_the_bundle_and_knows_it_is_no_checkout(installed: Path, tmp_path: Path) -> None:
    env = _env(tmp_path / "home")
    python = str(installed / "bin" / "python")
    done = _run([python, "-c", "import backfill.resources as r; print(r.checkout()); "
                 "print(r.bundled('jobs/demo.yaml')); print(r.jvm_file('ops/backfill-ops.jar'))"], tmp_path, env)
    checkout, demo, ops = done.stdout.split()
    assert checkout == "None"
    assert Path(demo).is_file() and "/_bundle/" in demo and not demo.startswith(str(REPO))
    assert Path(ops).is_file() and "/_bundle/" in ops
    version = _run([str(installed / "bin" / "backfill"), "--version"], tmp_path, env).stdout
    assert version.startswith("backfill 0.1.0") and "pyspark 4.1.1" in version


def test_the_installed_wheel_runs_the_demo_from_an_empty_folder(installed: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    done = _run([str(installed / "bin" / "backfill"), "demo"], run, _env(tmp_path / "home"), timeout=1500)
    # the pinned jars were missing from the fresh home: resolved once, through Spark's resolver, with a notice
    assert "resolving them once with Spark's resolver" in done.stderr
    assert any((tmp_path / "home" / "jvm" / "lib" / "spark").glob("delta-spark*.jar"))
    assert "What was dropped, and why" in done.stdout
    gold = run / "demo-output" / "data" / "gold"
    for name in ("clicks_per_user_1m", "clicks_per_user_5m_hop", "user_sessions"):
        assert DeltaTable(str(gold / name)).to_pyarrow_table().num_rows > 0, name
    # the topology of the PageViewRegion shape, from the bundled jobs/pageviews_per_region.yaml and its samples
    regions = run / "demo-output" / "out" / "pageviews_per_region" / "views_per_region.jsonl"
    assert regions.is_file() and regions.read_text().strip()
