#!/usr/bin/env bash
# Create (or refresh) the Airflow environment of the example in .venv-airflow at the project root.
# Airflow lives apart from backfill's .venv: the DAG calls the `backfill` command, it never imports it.
# Idempotent: does nothing when the environment already has this requirements file installed.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${AIRFLOW_VENV:-.venv-airflow}
STAMP="$VENV/.requirements"
if [ -x "$VENV/bin/airflow" ] && cmp -s examples/airflow/requirements.txt "$STAMP"; then
  exit 0
fi
PY=${PYTHON:-python3}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
if [ -x .venv/bin/uv ]; then  # scripts/setup.sh installs uv: Airflow's packages in seconds, pip takes 40 s
  .venv/bin/uv pip install --quiet --compile-bytecode --python "$VENV/bin/python" -r examples/airflow/requirements.txt
else
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r examples/airflow/requirements.txt
fi
cp examples/airflow/requirements.txt "$STAMP"
echo "Airflow installed in $VENV ($("$VENV/bin/airflow" version 2>/dev/null | tail -1))"
