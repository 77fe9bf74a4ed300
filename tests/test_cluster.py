"""The demo job on a real Spark standalone cluster (master + worker JVMs on 127.0.0.1) equals local mode, run by
backfill's own session and as a `spark-submit` application (the jars `backfill jars` prints, backfill/__main__.py
as the application file)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from deltalake import DeltaTable

from backfill.demo import generate_clicks
from tests.sparkcluster import cluster_processes, spark_home, standalone_cluster

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.cluster]
REPO = Path(__file__).resolve().parent.parent


def _demo_copy(root: Path) -> Path:
    (root / "jobs").mkdir(parents=True)
    (root / "schemas").mkdir()
    shutil.copy(REPO / "jobs" / "demo.yaml", root / "jobs" / "demo.yaml")
    shutil.copy(REPO / "schemas" / "click.json", root / "schemas" / "click.json")
    generate_clicks(str(root / "data" / "bronze" / "clicks"), n=6000)
    return root / "jobs" / "demo.yaml"


def _start(job: Path, env: dict[str, str], *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "backfill.cli", "run", str(job), "--json", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out)


def _table(path: Path) -> list[str]:
    """A table's rows, sorted. A sum of doubles depends on how Spark split the rows (8 shuffle partitions
    locally, 16 on the cluster here), in the last bits only: floats are compared to 9 digits."""
    rows = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    for r in rows:
        r.update({k: round(v, 9) for k, v in r.items() if isinstance(v, float)})
    return sorted(json.dumps(r, sort_keys=True, default=str) for r in rows)


def _submit(job: Path, env: dict[str, str], master: str) -> dict:
    """`spark-submit --master M --jars $(backfill jars) backfill/__main__.py run JOB`: the master and the jars are
    spark-submit's, the cluster profile leaves both to it."""
    jars = subprocess.run([sys.executable, "-m", "backfill.cli", "jars"], env=env, capture_output=True, text=True,
                          check=True).stdout.strip()
    command = [str(spark_home() / "bin" / "spark-submit"), "--master", master, "--jars", jars,
               "--conf", "spark.executor.memory=1g", str(REPO / "backfill" / "__main__.py"),
               "run", str(job), "--json", "--profile", "cluster"]
    submitted = {**env, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    done = subprocess.run(command, env=submitted, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout[done.stdout.index("{"):])


def test_demo_job_on_a_standalone_cluster_equals_local_mode(tmp_path):
    local_job, cluster_job = _demo_copy(tmp_path / "local"), _demo_copy(tmp_path / "cluster")
    submit_job = _demo_copy(tmp_path / "submit")
    env = {**os.environ, "PYTHONPATH": str(REPO), "SPARK_LOCAL_IP": "127.0.0.1"}
    running = _start(local_job, env, "--profile", "local")  # meanwhile the cluster starts
    # 16 shuffle partitions on the cluster (the profile's 64 are for large runs): still another split than local
    # mode's 8, at a quarter of the tasks on this 2-core machine
    clustered_env = {**env, "BACKFILL_SPARK_CONF": ",".join(filter(None, [env.get("BACKFILL_SPARK_CONF"),
                                                                          "spark.sql.shuffle.partitions=16"]))}
    with standalone_cluster(tmp_path / "spark") as master:
        local = _finish(running)
        clustered = _finish(_start(cluster_job, {**clustered_env, "BACKFILL_MASTER": master}, "--profile", "cluster"))
        submitted = _submit(submit_job, clustered_env, master)
    assert not cluster_processes(tmp_path / "spark")
    for run in ("cluster", "submit"):
        for name in ("clicks_per_user_1m", "clicks_per_user_5m_hop", "user_sessions"):  # sessions: a kernel per task
            assert _table(tmp_path / run / "data" / "gold" / name) == \
                _table(tmp_path / "local" / "data" / "gold" / name)
        assert _table(tmp_path / run / "data" / "ledger" / "clicks") == \
            _table(tmp_path / "local" / "data" / "ledger" / "clicks")
    assert clustered["operators"] == local["operators"] == submitted["operators"]
