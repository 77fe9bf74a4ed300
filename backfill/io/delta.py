"""Part: io. Delta tables through delta-spark: snapshot reads, range publish in one commit, the runs table.

Publishing is write-audit-publish: the run's rows are staged as parquet next to the table (outside its
folder, so no Delta reader ever sees them), checked (every row inside the range, the caller's audit),
then committed by ONE delta-spark overwrite with `replaceWhere` on the range: the rows of the range are
replaced and every other row stays. A Delta commit is atomic (its log entry appears whole or not at all),
so a crash before or during it leaves the table at its previous version; the staged folder is removed
by the next run of a sink (`backfill.io.sinks.recover`). Reruns of a range are idempotent: the same
rows replace the same range.

delta-rs (the `deltalake` package) stays for what must run without a JVM: the reference engine's
reads and the demo's summary read tables with it. Tables written here are protocol (1, 2) tables that
delta-rs reads, and the reverse (tests/io/test_delta.py checks both directions).
"""
from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from backfill.errors import PublishError, SourceError
from backfill.ranges import in_range
from backfill.session import default_parallelism, observed

STAGING = ".staging-"


@dataclass(frozen=True)
class PublishResult:
    """What one publish did: the new table version, rows written, and files added and removed."""

    version: int
    rows_written: int
    files_added: int
    files_removed: int
    rows_copied: int = 0


def is_delta_table(path: str) -> bool:
    """True when `path` holds a Delta log with a commit (or a checkpoint): a table's first commit creates the
    log folder a moment before its first commit file, and a reader then must not take it for a table."""
    log = os.path.join(path, "_delta_log")
    if not os.path.isdir(log):
        return False
    return any(name == "_last_checkpoint" or (name.split(".")[0].isdigit() and
                                              (name.endswith(".json") or ".checkpoint." in name))
               for name in os.listdir(log))


def table_version(path: str) -> int | None:
    """Latest committed version (from the log's file names; no JVM needed), None when there is no table."""
    log = os.path.join(path, "_delta_log")
    if not os.path.isdir(log):
        return None
    versions = [int(name.split(".")[0]) for name in os.listdir(log)
                if name.endswith(".json") and name.split(".")[0].isdigit()]
    return max(versions) if versions else None


def read_delta(spark: SparkSession, path: str, version: int | None = None, timestamp: str | None = None
               ) -> DataFrame:
    """A snapshot of the table: the latest, `version` (versionAsOf) or `timestamp` (timestampAsOf)."""
    if not is_delta_table(path):
        raise SourceError(f"{path}: no Delta table here (no _delta_log folder); check the path")
    reader = spark.read.format("delta")
    if version is not None:
        latest = table_version(path)
        if latest is not None and version > latest:
            raise SourceError(f"{path}@{version}: the table's latest version is {latest}")
        reader = reader.option("versionAsOf", version)
    if timestamp is not None:
        reader = reader.option("timestampAsOf", timestamp)
    try:
        return reader.load(path)
    except Exception as exc:  # noqa: BLE001 - a vacuumed version, a timestamp before the table, ...
        raise SourceError(f"{path}: cannot read this snapshot ({_first_line(exc)})") from None


def arrow_table(path: str, columns: list[str] | None = None, version: int | None = None,
                filter: Any = None) -> Any:  # noqa: A002 - pyarrow's own name for it
    """A (small) Delta table read into the driver as a pyarrow Table, without Spark.

    A local table's files are read through pyarrow's own local filesystem: through the deltalake package's
    filesystem bridge, the interpreter aborted at exit about every other time (`terminate called without an
    active exception`, exit 134), whatever the command had done.
    """
    import pyarrow.fs as pafs
    from deltalake import DeltaTable as Log

    table = Log(path, version=version)
    local = "://" not in path or path.startswith("file://")
    root = path[len("file://"):] if path.startswith("file://") else os.path.abspath(path)
    dataset = table.to_pyarrow_dataset(filesystem=pafs.SubTreeFileSystem(root, pafs.LocalFileSystem())) if local \
        else table.to_pyarrow_dataset()
    return dataset.to_table(columns=columns, filter=filter)


def append_delta(spark: SparkSession, df: DataFrame, path: str, metadata: dict[str, str] | None = None,
                 merge_schema: bool = False) -> int:
    """Append rows in one commit (creating the table; `merge_schema`: adding new columns); returns the new version."""
    writer = df.write.format("delta").mode("append")
    if merge_schema:
        writer = writer.option("mergeSchema", "true")
    if metadata:
        writer = writer.option("userMetadata", json.dumps(metadata, sort_keys=True))
    try:
        writer.save(path)
    except Exception as exc:  # noqa: BLE001
        raise PublishError(f"{path}: append failed ({_first_line(exc)}); nothing was appended") from None
    return table_version(path) or 0


def replace_range(spark: SparkSession, df: DataFrame, path: str, *, column: str, start: int | None,
                  end: int | None, metadata: dict[str, str] | None = None,
                  before_commit: Callable[[], None] | None = None,
                  audit: Callable[[DataFrame], None] | None = None) -> PublishResult:
    """Replace the rows with start <= column < end (all rows when unbounded) by df's rows, in ONE commit.

    `audit` receives the staged rows (exactly what the commit adds) and may raise to stop the publish;
    `before_commit` runs right before the commit (raising leaves the table untouched).
    """
    staging = f"{path.rstrip('/')}{STAGING}{uuid.uuid4().hex[:8]}"
    try:
        rows = stage_rows(spark, df, path, staging, column=column, start=start, end=end, audit=audit)
        if before_commit is not None:
            before_commit()
        return commit_rows(spark, staging, path, column=column, start=start, end=end, metadata=metadata, rows=rows)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def stage_rows(spark: SparkSession, df: DataFrame, path: str, staging: str, *, column: str, start: int | None,
               end: int | None, audit: Callable[[DataFrame], None] | None = None) -> int:
    """Write the run's rows as parquet at `staging`, check them and audit them; returns the row count."""
    _check_column(df, path, column)
    # the rows and those outside the range are counted as they are written, not by reading them again
    outside = ~in_range(column, start, end)
    counts = [F.count(F.lit(1)).alias("rows"), F.count(F.when(outside, 1)).alias("outside")]
    seen = Observation()
    df.observe(seen, *counts).write.mode("error").parquet(staging)
    staged = spark.read.schema(df.schema).parquet(staging)
    counted = observed(seen, staged, counts)
    if counted["outside"]:
        shown = ", ".join(str(r[0]) for r in staged.where(outside).select(column).limit(3).collect())
        raise PublishError(f"{path}: the run produced rows with {column} outside [{start}, {end}) ({shown}); "
                           "nothing was published (this is a bug in the run: please report it)")
    if audit is not None:
        audit(staged)
    if is_delta_table(path):
        _check_schema(spark, path, df.schema)
    return int(counted["rows"])


def commit_rows(spark: SparkSession, staging: str, path: str, *, column: str, start: int | None, end: int | None,
                metadata: dict[str, str] | None = None, rows: int | None = None) -> PublishResult:
    """The one commit replacing the range by the staged rows; a second call for the same run is a no-op.

    Idempotent by the commit's metadata: when the table already has a commit of this run and output (a
    publish killed after its commit and rolled forward), that commit is the result.
    """
    done = _committed(spark, path, metadata)
    if done is not None:
        return done
    staged = spark.read.parquet(staging)
    _commit(staged, path, _range_sql(column, start, end), metadata)
    return _result(spark, path, staged.count() if rows is None else rows)


def _committed(spark: SparkSession, path: str, metadata: dict[str, str] | None) -> PublishResult | None:
    """The commit of this run and output, when the table has one among its newest commits."""
    if not metadata or "backfill.run_id" not in metadata or not is_delta_table(path):
        return None
    for row in history(spark, path, 50):
        try:
            found = json.loads(row.get("userMetadata") or "{}")
        except ValueError:
            continue
        if all(found.get(k) == metadata.get(k) for k in ("backfill.run_id", "backfill.output")):
            return PublishResult(int(row["version"]), int((row.get("operationMetrics") or {}).get("numOutputRows") or 0),
                                 0, 0)
    return None


def _commit(staged: DataFrame, path: str, condition: str | None, metadata: dict[str, str] | None) -> None:
    writer = staged.write.format("delta").mode("overwrite")
    if condition is not None and is_delta_table(path):
        writer = writer.option("replaceWhere", condition)
    if metadata:
        writer = writer.option("userMetadata", json.dumps(metadata, sort_keys=True))
    try:
        writer.save(path)
    except Exception as exc:  # noqa: BLE001 - concurrent writers, a broken log: one line, table unchanged
        name = type(exc).__name__ + " " + str(exc)
        if "Concurrent" in name or "conflict" in name.lower():
            raise PublishError(f"{path}: another writer committed to this table while the run was publishing "
                               f"({_first_line(exc)}); the table is unchanged: run again") from None
        raise PublishError(f"{path}: the Delta commit failed ({_first_line(exc)}); the table is unchanged") from None


def _check_column(df: DataFrame, path: str, column: str) -> None:
    if column not in df.columns or not isinstance(df.schema[column].dataType, (T.LongType, T.IntegerType)):
        raise PublishError(f"{path}: the range column {column!r} is missing or not an integer column")


def _check_schema(spark: SparkSession, path: str, schema: T.StructType) -> None:
    """The table must have the columns this run writes (a range replace cannot change the schema)."""
    from deltalake import DeltaTable as Log

    found = [f.name for f in Log(path).schema().fields]
    if sorted(found) != sorted(schema.names):
        raise PublishError(f"{path}: the table has the columns {', '.join(found)}, this run writes "
                           f"{', '.join(schema.names)}; write to a new table, or delete this one and run without "
                           "--start/--end")


def _range_sql(column: str, start: int | None, end: int | None) -> str | None:
    """The replaceWhere condition of [start, end) (the range rule of backfill/ranges.py), None for all rows."""
    if start is None and end is None:
        return None
    value = f"coalesce(`{column}`, -1)"
    parts = ([f"{value} >= {start}"] if start is not None else []) + ([f"{value} < {end}"] if end is not None else [])
    return " AND ".join(parts)


def _result(spark: SparkSession, path: str, rows: int) -> PublishResult:
    """The commit's version and file counts, from the table history."""
    row = history(spark, path, 1)[0]
    metrics = row.get("operationMetrics") or {}

    def get(key: str) -> int:
        return int(metrics.get(key) or 0)

    return PublishResult(int(row["version"]), rows, get("numFiles") or get("numAddedFiles"),
                         get("numRemovedFiles"), get("numCopiedRows"))


def history(spark: SparkSession | None, path: str, limit: int | None = 20) -> list[dict[str, Any]]:
    """The newest `limit` commits of a table (None: all the log holds), newest first (version, timestamp in
    epoch ms, operation, operationMetrics, userMetadata); read from the log directly (milliseconds, no Spark job)."""
    from deltalake import DeltaTable as Log

    keys = ("version", "timestamp", "operation", "operationMetrics", "userMetadata")
    return [{k: commit.get(k) for k in keys} for commit in Log(path).history(limit)]


def vacuum(spark: SparkSession, path: str, retain_hours: float = 168.0) -> int:
    """Delete files no version younger than `retain_hours` needs (orphans of killed commits included).

    Time travel to versions older than the retention stops working; the default keeps a week.
    """
    if not is_delta_table(path):
        raise SourceError(f"{path}: no Delta table here (no _delta_log folder); check the path")
    before = _data_files(path)
    if retain_hours < 168:
        spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    # Delta lists the table's folders in a Spark job of spark.sql.sources.parallelPartitionDiscovery.parallelism
    # tasks (10,000 by default): 74 s for a one-file table on 2 cores. One task per core lists the same files.
    key = "spark.sql.sources.parallelPartitionDiscovery.parallelism"
    saved = spark.conf.get(key, None)
    spark.conf.set(key, str(max(1, default_parallelism(spark))))
    try:  # SQL, not delta-spark's DeltaTable: it works over Spark Connect too
        spark.sql(f"VACUUM delta.`{path}` RETAIN {retain_hours} HOURS")
    finally:
        if saved is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, saved)
    return before - _data_files(path)


def _data_files(path: str) -> int:
    return sum(len([f for f in files if f.endswith(".parquet")])
               for root, _, files in os.walk(path) if "_delta_log" not in root)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__
