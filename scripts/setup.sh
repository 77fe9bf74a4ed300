#!/usr/bin/env bash
# Set up (or refresh) the project's virtual environment in .venv. Idempotent; used by the README and CI.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v java >/dev/null 2>&1 || ! java -version 2>&1 | grep -qE 'version "(1[7-9]|2[0-9])'; then
  echo "backfill needs Java 17 or newer for Spark 4 (found: $(java -version 2>&1 | head -1 || echo none))." >&2
  echo "Install it, e.g. on Debian/Ubuntu: sudo apt-get install -y openjdk-17-jre-headless" >&2
  exit 2
fi
if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
  echo "note: the test suite renders the verify report in headless Chromium; install it before running the" >&2
  echo "tests, e.g. on Debian/Ubuntu: sudo apt-get install -y chromium (.ci/run does this when run as root)" >&2
fi
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[test]"
