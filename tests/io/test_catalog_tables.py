"""Catalog tables (`table: db.name`) as source and sink, through a local Hive metastore (derby, the jars pyspark
ships) in the test's folder: the Python API
in one process and the command line in another, as users run them."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from deltalake import DeltaTable


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
    rows = [(f"u{i % 2}", json.dumps({"amount": i}), 0, i, 60_000 * (i // 3) + i) for i in range(30)]
    # one process makes the catalog's tables and runs the job through the Python API on a session with the
    # catalog (the whole input, then a range); a second process, the command line, runs the same range again
    made = _python(tmp_path, f"""
import json
import backfill
from backfill.session import get_spark
spark = get_spark("local")
spark.sql("CREATE DATABASE bronze")
spark.sql("CREATE DATABASE gold")
spark.createDataFrame({rows!r}, "key string, value string, partition int, offset long, timestamp long") \\
    .selectExpr("'clicks' AS topic", "*").write.format("delta").saveAsTable("bronze.clicks")
job = backfill.load_job("job.yaml")
print(json.dumps(job.run(spark=spark).to_dict(), default=str))
job.run(spark=spark, start=120000, end=300000)
""")
    assert made.returncode == 0, made.stderr[-2000:]
    summary = json.loads(made.stdout.strip().splitlines()[-1])
    assert summary["inputs"]["clicks"]["table"] == "bronze.clicks"
    assert summary["inputs"]["clicks"]["location"].endswith("warehouse/bronze.db/clicks")
    assert summary["inputs"]["clicks"]["version"] == 0
    assert summary["sinks"]["per_minute"]["table"] == "gold.per_minute"
    # the same range again: the table's rows of the range are replaced, never doubled
    ranged = _backfill(tmp_path, "run", str(job), "--start", "120000", "--end", "300000", "--json")
    assert ranged.returncode == 0, ranged.stderr[-2000:]
    again = json.loads(ranged.stdout)
    assert again["inputs"]["clicks"]["table"] == "bronze.clicks" and again["sinks"]["per_minute"]["table"] == \
        "gold.per_minute"
    table = DeltaTable(str(tmp_path / "warehouse" / "gold.db" / "per_minute"))
    windows = sorted((r["key"], r["window_start"], r["n"], r["amount"]) for r in table.to_pyarrow_table().to_pylist())
    assert len(windows) == 2 * 9 and len({w[:2] for w in windows}) == len(windows)  # 9 closed minutes, 2 keys
    assert sum(w[2] for w in windows) == 27 and len(table.history()) == 3  # the first run, one commit per range


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
