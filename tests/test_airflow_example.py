"""The Airflow example (examples/airflow) runs: `airflow dags test` with a throwaway SQLite metadata database,
Airflow in its own virtual environment, the DAG's tasks calling the real `backfill` command."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from backfill.demo import generate_clicks, install_job
from backfill.io.runs import read_runs

pytestmark = [pytest.mark.spark, pytest.mark.slow]
REPO = Path(__file__).resolve().parent.parent
AIRFLOW = REPO / ".venv-airflow" / "bin" / "airflow"


def test_the_example_dag_publishes_what_is_due_then_restates(tmp_path):
    setup = subprocess.run([str(REPO / "examples" / "airflow" / "setup.sh")], capture_output=True, text=True,
                           timeout=1200)
    assert setup.returncode == 0, setup.stderr[-2000:]
    generate_clicks(str(tmp_path / "data" / "bronze" / "clicks"), n=9000, partitions=2, seed=5)  # ~30 minutes
    install_job(tmp_path)
    job = tmp_path / "jobs" / "scheduled_clicks.yaml"
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path / "airflow"),
           "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "examples" / "airflow"),
           "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "BACKFILL_BIN": str(Path(sys.executable).parent / "backfill"),
           "BACKFILL_JOB": str(job), "PYSPARK_PYTHON": sys.executable}
    migrate = subprocess.run([str(AIRFLOW), "db", "migrate"], env=env, capture_output=True, text=True, timeout=300)
    assert migrate.returncode == 0, migrate.stderr[-2000:]
    test = subprocess.run([str(AIRFLOW), "dags", "test", "backfill_scheduled"], env=env, capture_output=True,
                          text=True, timeout=900)
    log = test.stdout + test.stderr
    assert test.returncode == 0, log[-4000:]
    assert "publish_due" in log and "restate_late_data" in log
    runs = [r for r in read_runs(str(tmp_path / "data" / "ledger" / "scheduled_runs"))
            if r["job"] == "clicks-scheduled"]
    # ~30 minutes of clicks from 00:00: [00:00, 00:10) and [00:10, 00:20) are complete (data past end + 1m)
    assert [(r["range_end"] - r["range_start"], r["status"], r["mode"]) for r in runs] == \
        [(600_000, "published", "due")] * 2
    assert "0 to restate" in log  # the restate task found nothing changed
