"""Catalog tables (`table: db.name`) as source and sink, through a local Hive metastore (derby, the jars pyspark
ships) in the test's folder: each command a new process, as a user runs them."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _env(tmp: Path) -> dict[str, str]:
    conf = (f"spark.sql.catalogImplementation=hive,spark.sql.warehouse.dir={tmp / 'warehouse'},"
            f"spark.hadoop.javax.jdo.option.ConnectionURL=jdbc:derby:;databaseName={tmp / 'metastore'};create=true,"
            "spark.driver.memory=2g")
    return {**os.environ, "BACKFILL_SPARK_CONF": conf}


def _python(tmp: Path, code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], cwd=tmp, env=_env(tmp), capture_output=True, text=True,
                          timeout=900)


def _backfill(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "backfill.cli", *args], cwd=tmp, env=_env(tmp), capture_output=True,
                          text=True, timeout=900)


def test_a_catalog_table_is_a_source_and_a_ranged_idempotent_sink(tmp_path):
    rows = [(f"u{i % 2}", json.dumps({"amount": i}), 0, i, 60_000 * (i // 3) + i) for i in range(30)]
    made = _python(tmp_path, f"""
from backfill.session import get_spark
spark = get_spark("local")
spark.sql("CREATE DATABASE bronze")
spark.sql("CREATE DATABASE gold")
spark.createDataFrame({rows!r}, "key string, value string, partition int, offset long, timestamp long") \\
    .selectExpr("'clicks' AS topic", "*").write.format("delta").saveAsTable("bronze.clicks")
""")
    assert made.returncode == 0, made.stderr[-2000:]
    job = tmp_path / "job.yaml"
    job.write_text("""
name: catalog
sources:
  clicks: {format: delta, table: bronze.clicks, key: {format: string}, value: {format: json}}
operators:
  - name: per_minute
    aggregate: {input: clicks, window: {type: tumbling, size: 1m, grace: 0ms}, emit: final,
                aggregations: {n: count(), amount: sum(value.amount)}}
sinks:
  per_minute: {format: delta, table: gold.per_minute}
  _ledger: {format: jsonl, path: out/ledger.jsonl}
""")
    first = _backfill(tmp_path, "run", str(job), "--json")
    assert first.returncode == 0, first.stderr[-2000:]
    summary = json.loads(first.stdout)
    assert summary["inputs"]["clicks"]["table"] == "bronze.clicks"
    assert summary["inputs"]["clicks"]["location"].endswith("warehouse/bronze.db/clicks")
    assert summary["inputs"]["clicks"]["version"] == 0
    assert summary["sinks"]["per_minute"]["table"] == "gold.per_minute"
    # the same range twice: the table's rows of the range are replaced, never doubled
    for _ in range(2):
        ranged = _backfill(tmp_path, "run", str(job), "--start", "120000", "--end", "300000", "--json")
        assert ranged.returncode == 0, ranged.stderr[-2000:]
    read = _python(tmp_path, """
import json
from backfill.session import get_spark
spark = get_spark("local")
rows = spark.sql("SELECT window_start, n, amount FROM gold.per_minute ORDER BY key, window_start").collect()
print(json.dumps([list(r) for r in rows]))
print(spark.sql("DESCRIBE HISTORY gold.per_minute").count())
""")
    assert read.returncode == 0, read.stderr[-2000:]
    lines = read.stdout.strip().splitlines()
    windows = json.loads(lines[-2])
    assert len(windows) == 2 * 9 and len({(w[0], w[1]) for w in windows}) <= len(windows)  # 9 closed minutes, 2 keys
    assert sum(w[1] for w in windows) == 27 and int(lines[-1]) == 3  # the first run, then one commit per ranged run


def test_a_source_table_the_catalog_lacks_is_one_line_exit_2(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("""
name: catalog
sources:
  clicks: {format: delta, table: bronze.nothing, value: {format: json}}
operators:
  - name: c
    aggregate: {input: clicks, window: {type: tumbling, size: 1m, grace: 0ms}, aggregations: {n: count()}}
sinks:
  c: {format: none}
""")
    done = _backfill(tmp_path, "plan", str(job))
    assert done.returncode == 2 and "sources.clicks.table bronze.nothing: the catalog has no database bronze" in \
        done.stderr and len(done.stderr.strip().splitlines()) == 1
