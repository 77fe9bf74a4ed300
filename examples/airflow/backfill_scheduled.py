"""An Airflow DAG that keeps a backfill job's output published: every hour, the intervals that are due, then the
published intervals of the last two days whose input changed (late data).

backfill decides what to run from its runs table, so the DAG needs no catch-up of its own (`catchup=False`):
after an outage, the next run publishes every missed interval, oldest first, in one pass. Two DAG runs that
overlap cannot publish twice: the second finds the job's scheduler lock held and succeeds doing nothing.

Settings (environment of the Airflow worker):
- BACKFILL_BIN: the `backfill` command (the project's virtual environment, e.g. /opt/backfill/.venv/bin/backfill)
- BACKFILL_JOB: the job file, with a `schedule:` (docs/job-spec.md#schedule)
- BACKFILL_RESTATE: how far back late data is looked for (default 2d)
"""
from __future__ import annotations

import os
from datetime import timedelta

import pendulum
from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import DAG

BACKFILL = os.environ.get("BACKFILL_BIN", "backfill")
JOB = os.environ.get("BACKFILL_JOB", "jobs/hourly_clicks.yaml")
RESTATE = os.environ.get("BACKFILL_RESTATE", "2d")

with DAG(
    dag_id="backfill_scheduled",
    description="Publish the due intervals of a backfill job, then restate those whose input changed",
    schedule="15 * * * *",  # a quarter past each hour: the job's lag decides what is complete
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    catchup=False,  # backfill catches up itself, from its runs table
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": timedelta(minutes=5)},
    tags=["backfill"],
) as dag:
    # exit 0: published what was due, nothing was due, or another scheduler holds the lock; 2: an error
    due = BashOperator(task_id="publish_due", bash_command=f"{BACKFILL} run {JOB} --due --max-intervals 48")
    restate = BashOperator(task_id="restate_late_data", bash_command=f"{BACKFILL} run {JOB} --restate {RESTATE}")
    due >> restate
