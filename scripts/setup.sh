#!/usr/bin/env bash
# Set up (or refresh) the project: the virtual environment in .venv and the pinned JVM jars in jvm/lib.
# Idempotent; used by the README and CI. After one run with network access, runs and tests work offline.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v java >/dev/null 2>&1 || ! java -version 2>&1 | grep -qE 'version "(1[7-9]|2[0-9])'; then
  echo "backfill needs Java 17 or newer for Spark 4 (found: $(java -version 2>&1 | head -1 || echo none))." >&2
  echo "Install it, e.g. on Debian/Ubuntu: sudo apt-get install -y openjdk-17-jdk-headless" >&2
  exit 2
fi
if ! command -v mvn >/dev/null 2>&1; then
  echo "backfill resolves its pinned jars (Delta, Spark's Kafka source, the Kafka broker) with Maven;" >&2
  echo "install it, e.g. on Debian/Ubuntu: sudo apt-get install -y maven" >&2
  exit 2
fi
if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
  echo "note: the test suite renders the verify report in headless Chromium; install it before running the" >&2
  echo "tests, e.g. on Debian/Ubuntu: sudo apt-get install -y chromium (.ci/run does this when run as root)" >&2
fi
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# uv installs the same pinned packages as pip does, faster (a new .venv here: 22 s instead of 51 s); where uv
# cannot be installed, pip does it. Both write the packages' bytecode now, as pip does by default: a Python
# that may not write it at import (PYTHONDONTWRITEBYTECODE) would compile every module it imports again in
# every process (each `backfill` command and Spark's Python workers; 3-4 s per command, docs/stack.md)
if [ -x .venv/bin/uv ] || .venv/bin/python -m pip install --quiet --disable-pip-version-check "uv==0.13.9" \
    >/dev/null 2>&1; then
  .venv/bin/uv pip install --quiet --compile-bytecode --python .venv/bin/python -e ".[test]"
  # pyspark comes as a source distribution: uv keeps each build of it (1.4 GB) under a new revision, one per
  # new environment (a setup, the wheel test's), which filled this machine's disk (70 GB) in a day; the old
  # revisions go (the current one stays, so nothing is built again)
  .venv/bin/uv cache prune --quiet 2>/dev/null || true
else
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[test]"
fi
# the project itself is installed editable: its bytecode too (an edited module is compiled again, as usual)
.venv/bin/python -m compileall -q backfill >/dev/null

# --- JVM: jars resolved once into jvm/lib (offline when the local Maven repository has them) ---------------
if ! mvn -q -o -f jvm/pom.xml package >/dev/null 2>&1; then
  mvn -q -f jvm/pom.xml package || { echo "setup: Maven could not resolve the pinned jars (jvm/pom.xml);" \
    "check the network or the Maven settings" >&2; exit 2; }
fi

# --- backfill's own Spark operator (jvm/ops): compiled against the Spark jars pyspark ships, so it always
# matches the Spark it runs in; built again when its sources or pyspark change ---------------------------------
SPARK_JARS=$(.venv/bin/python -c "import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), 'jars'))")
OPS_JAR=jvm/lib/ops/backfill-ops.jar
OPS_STAMP="$(.venv/bin/python -c "import pyspark; print(pyspark.__version__)") $(cat jvm/ops/src/main/java/io/backfill/spark/*.java | cksum)"
if [ ! -f "$OPS_JAR" ] || [ "$(cat jvm/lib/ops/stamp 2>/dev/null)" != "$OPS_STAMP" ]; then
  rm -rf jvm/ops/target jvm/lib/ops && mkdir -p jvm/ops/target/classes jvm/lib/ops
  javac --release 17 -nowarn -cp "$SPARK_JARS/*" -d jvm/ops/target/classes jvm/ops/src/main/java/io/backfill/spark/*.java
  jar cf "$OPS_JAR" -C jvm/ops/target/classes .
  echo "$OPS_STAMP" > jvm/lib/ops/stamp
fi

# --- the driver JVM's class archive: small jobs start 2-3 s sooner (docs/stack.md) ---------------------------
# written once (about a minute, 150 MB under jvm/lib/cds); BACKFILL_CLASS_ARCHIVE=0 skips it
if [ "${BACKFILL_CLASS_ARCHIVE-1}" != "0" ] && [ -n "${BACKFILL_CLASS_ARCHIVE-1}" ]; then
  .venv/bin/python scripts/class_archive.py
fi
