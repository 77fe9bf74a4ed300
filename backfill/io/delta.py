"""Delta tables for Spark: delta-spark when its jars are loaded, else delta-rs owns the log and Spark moves parquet.

Without delta-spark (DESIGN decision 6) a read is the snapshot's file list from delta-rs handed to
`spark.read.parquet`, and a write is Spark writing parquet under the table folder followed by ONE
delta-rs commit that adds (and, for `replace_range`, removes) files. This path works on local
folders only. Output tables written by `replace_range` stay unpartitioned: the range replace
decides from per-file min/max statistics, which we compute from the parquet footers.
"""
from __future__ import annotations

import datetime as dt
import json
import math
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake import Schema as DeltaSchema
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.transaction import AddAction, CommitProperties, RemoveAction, create_table_with_add_actions
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

from backfill.errors import PublishError, SourceError

_UNSUPPORTED_READER_FEATURES = frozenset({"deletionVectors", "columnMapping"})
_STAGING_PREFIX = "_staging-"
_FILE_KEY = "__backfill_file"
_APPEND_ATTEMPTS = 5

_Stats = tuple[Any, Any, int | None]  # (min, max, null count) of one column in one file; None = unknown


@dataclass(frozen=True)
class PublishResult:
    """What one `replace_range` commit did."""

    version: int
    rows_written: int
    files_added: int
    files_removed: int
    rows_carried_over: int


@dataclass(frozen=True)
class _StagedFile:
    """A parquet file Spark wrote, moved into the table folder but not yet in the log."""

    rel_path: str
    full_path: str
    partition_values: dict[str, str | None]
    num_rows: int
    size: int
    column_stats: dict[str, _Stats]


# ----------------------------------------------------------------------------- engine detection


def delta_spark_available(spark: SparkSession) -> bool:
    """True when the delta-spark jars are on Spark's classpath (then delta-spark is used)."""
    return _jvm_has_class(spark, "org.apache.spark.sql.delta.DeltaLog")


def _jvm_has_class(spark: SparkSession, name: str) -> bool:
    """Whether the driver JVM can load `name` with the loader that sees --jars / spark.jars.packages."""
    try:
        loader = spark._jvm.org.apache.spark.util.Utils.getContextOrSparkClassLoader()  # type: ignore[union-attr]
        loader.loadClass(name)
        return True
    except Exception:  # no JVM handle (Spark Connect) or class missing: both mean "not available"
        return False


def is_delta_table(path: str) -> bool:
    """True when `path` holds a Delta table (a readable `_delta_log`)."""
    try:
        return bool(DeltaTable.is_deltatable(path))
    except Exception:
        return False


def table_version(path: str) -> int | None:
    """Latest committed version of the table at `path`, None when no table exists there."""
    table = _try_open(path)
    return None if table is None else table.version()


# ----------------------------------------------------------------------------- reading


def read_delta(
    spark: SparkSession, path: str, version: int | None = None, predicate: str | None = None
) -> DataFrame:
    """Snapshot read (latest or `version`); `predicate` only prunes files by stats, callers still filter rows."""
    if delta_spark_available(spark):
        return _read_with_delta_spark(spark, path, version)
    table = _open_for_read(path, version)
    _refuse_unsupported(table, path, SourceError)
    spark_schema = _spark_schema(_arrow_schema(table))
    part_cols = list(table.metadata().partition_columns)
    files = _snapshot_files(table, path, predicate, part_cols)
    if not files:
        return spark.createDataFrame([], spark_schema)
    data_schema = T.StructType([f for f in spark_schema.fields if f.name not in part_cols])
    df = spark.read.schema(data_schema).parquet(*[f for f, _ in files])
    if part_cols:
        df = _with_partition_values(spark, df, files, spark_schema, part_cols)
    return df.select(*[_col(n) for n in spark_schema.names])


def _read_with_delta_spark(spark: SparkSession, path: str, version: int | None) -> DataFrame:
    """delta-spark read; errors become SourceError so callers see one error kind."""
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    try:
        return reader.load(path)
    except Exception as exc:
        raise SourceError(f"{path}: cannot read Delta table ({_first_line(exc)}); check the path and version") from exc


def _open_for_read(path: str, version: int | None) -> DeltaTable:
    """Open a snapshot or raise SourceError saying what is missing."""
    if not is_delta_table(path):
        raise SourceError(f"{path}: no Delta table here (no _delta_log); check the path or create the table first")
    try:
        return DeltaTable(path, version=version)
    except DeltaError as exc:
        if version is None:
            raise SourceError(f"{path}: cannot open the Delta table ({_first_line(exc)}); check its _delta_log") from exc
        latest = table_version(path)
        raise SourceError(
            f"{path}: cannot open version {version} (latest is {latest}): {_first_line(exc)}; pick an existing version"
        ) from exc


def _snapshot_files(
    table: DeltaTable, path: str, predicate: str | None, part_cols: list[str]
) -> list[tuple[str, dict[str, Any]]]:
    """(local file path, typed partition values) for each file of the snapshot that survives pruning."""
    root = _table_root(table)
    actions = pa.table(table.get_add_actions(flatten=True))
    keep = None if predicate is None else _pruned_files(table, path, predicate)
    files = []
    for row in actions.select(["path"] + [f"partition.{c}" for c in part_cols]).to_pylist():
        full = os.path.join(root, unquote(row["path"]))  # log paths are URI-encoded, files on disk are not
        if keep is None or os.path.normpath(full) in keep:
            files.append((full, {c: row[f"partition.{c}"] for c in part_cols}))
    return files


def _pruned_files(table: DeltaTable, path: str, predicate: str) -> set[str]:
    """Local paths delta-rs keeps for `predicate` (by partition values and file stats)."""
    try:
        uris = table.file_uris(file_pruning_predicate=predicate)
    except DeltaError as exc:
        raise SourceError(
            f"{path}: bad file-pruning predicate {predicate!r} ({_first_line(exc)}); use delta-rs SQL such as \"ts >= 1000\""
        ) from exc
    return {os.path.normpath(_strip_file_scheme(u)) for u in uris}


def _with_partition_values(
    spark: SparkSession,
    df: DataFrame,
    files: list[tuple[str, dict[str, Any]]],
    spark_schema: T.StructType,
    part_cols: list[str],
) -> DataFrame:
    """Restore typed partition columns with a broadcast join on each row's source file."""
    # _metadata.file_path is "file:" + the URI-encoded path; '+' must survive url_decode literally
    decoded = F.expr("url_decode(replace(_metadata.file_path, '+', '%2B'))")
    df = df.withColumn(_FILE_KEY, F.regexp_replace(decoded, "^file:", ""))
    key_schema = T.StructType(
        [T.StructField(_FILE_KEY, T.StringType())] + [spark_schema[c] for c in part_cols]
    )
    rows = [(full, *[values[c] for c in part_cols]) for full, values in files]
    values_df = spark.createDataFrame(rows, key_schema)
    return df.join(F.broadcast(values_df), _FILE_KEY).drop(_FILE_KEY)


# ----------------------------------------------------------------------------- appending


def append_delta(
    spark: SparkSession,
    df: DataFrame,
    path: str,
    *,
    partition_by: list[str] | None = None,
    metadata: dict[str, str] | None = None,
) -> int:
    """Append df in one commit, creating the table (schema from df) if missing; returns the new version."""
    if delta_spark_available(spark):
        return _append_with_delta_spark(spark, df, path, partition_by, metadata)
    missing = [c for c in partition_by or [] if c not in df.columns]
    if missing:
        raise PublishError(f"{path}: partition columns {missing} are not in df (columns {df.columns}); fix partition_by")
    table = _try_open(path)
    if table is not None:
        _refuse_unsupported(table, path, PublishError)
        partition_by = _check_partitioning(table, path, partition_by)
        _check_schema(df.schema, _spark_schema(_arrow_schema(table)), path)
    schema = _arrow_schema(table) if table is not None else _arrow_schema_of(df.schema, path)
    staged = _stage(spark, _in_order(df, schema.names), path, partition_by or [])
    adds = [_add_action(f) for f in staged]
    try:
        if table is None:
            return _create(path, schema, adds, partition_by or [], metadata)
        return _append_with_retries(table, path, adds, metadata)
    except PublishError:
        _delete_files(staged)  # the commit did not happen, so nothing references these files
        raise


def _append_with_delta_spark(
    spark: SparkSession, df: DataFrame, path: str, partition_by: list[str] | None, metadata: dict[str, str] | None
) -> int:
    """delta-spark append; the version comes from the table history."""
    writer = df.write.format("delta").mode("append")
    if partition_by:
        writer = writer.partitionBy(*partition_by)
    if metadata:
        writer = writer.option("userMetadata", json.dumps(metadata, sort_keys=True))
    try:
        writer.save(path)
    except Exception as exc:
        raise PublishError(f"{path}: delta-spark append failed ({_first_line(exc)}); fix the cause and re-run") from exc
    return int(_last_history_row(spark, path)["version"])


def _append_with_retries(
    table: DeltaTable, path: str, adds: list[AddAction], metadata: dict[str, str] | None
) -> int:
    """Commit an append; on conflict reload and retry (appends commute, the files are already written)."""
    for attempt in range(_APPEND_ATTEMPTS):
        try:
            return _commit(table, adds, metadata)
        except CommitFailedError as exc:
            if attempt == _APPEND_ATTEMPTS - 1:
                raise PublishError(
                    f"{path}: append lost {_APPEND_ATTEMPTS} commit races to concurrent writers ({_first_line(exc)}); re-run"
                ) from exc
            time.sleep(0.05 * (attempt + 1))
            table = DeltaTable(path)
        except DeltaError as exc:  # outcome unknown: the caller must not delete the files
            raise PublishError(_unknown_commit_message(path, exc)) from exc
    raise AssertionError("unreachable")


def _check_partitioning(table: DeltaTable, path: str, partition_by: list[str] | None) -> list[str]:
    """The table's partition columns; a different explicit request is an error."""
    existing = list(table.metadata().partition_columns)
    if partition_by is not None and list(partition_by) != existing:
        raise PublishError(
            f"{path}: table is partitioned by {existing}, not {list(partition_by)}; pass partition_by={existing} or None"
        )
    return existing


# ----------------------------------------------------------------------------- range replace


def replace_range(
    spark: SparkSession,
    df: DataFrame,
    path: str,
    *,
    column: str,
    start: int | None,
    end: int | None,
    metadata: dict[str, str] | None = None,
    before_commit: Callable[[], None] | None = None,
    audit: Callable[[DataFrame], None] | None = None,
) -> PublishResult:
    """Write-audit-publish: replace the rows with start <= column < end by df's rows in ONE Delta commit.

    `audit` receives the staged rows (exactly what the commit would add) and may raise to stop the commit.
    """
    _check_range_args(df, path, column, start, end)
    if delta_spark_available(spark):
        if audit is not None:
            audit(df)  # delta-spark stages and commits in one call: audit the rows about to be written
        return _replace_with_delta_spark(spark, df, path, column, start, end, metadata, before_commit)
    table = _try_open(path)
    if table is not None:
        _check_replaceable(table, path, df)
    schema = _arrow_schema(table) if table is not None else _arrow_schema_of(df.schema, path)
    written: list[_StagedFile] = []
    carried: list[_StagedFile] = []
    removes: list[RemoveAction] = []
    try:
        written = _stage(spark, _in_order(df, schema.names), path, [])
        _check_staged_in_range(spark, written, path, column, start, end)
        if table is not None:
            removes, straddling = _plan_removals(table, column, start, end)
            carried = _stage_carry_over(spark, straddling, schema, path, column, start, end)
        if audit is not None:
            audit(staged_frame(spark, written, df.schema))
        if before_commit is not None:
            before_commit()  # callers audit here; raising leaves the table untouched
    except BaseException:
        _delete_files(written + carried)
        raise
    version = _publish(table, path, schema, written + carried, removes, metadata)
    rows = sum(f.num_rows for f in written)
    return PublishResult(version, rows, len(written) + len(carried), len(removes), sum(f.num_rows for f in carried))


def staged_frame(spark: SparkSession, staged: list[_StagedFile], schema: T.StructType) -> DataFrame:
    """The rows of staged (written, not yet committed) files, as Spark reads them back."""
    if not staged:
        return spark.createDataFrame([], schema)
    return spark.read.schema(schema).parquet(*[f.full_path for f in staged])


def _check_range_args(df: DataFrame, path: str, column: str, start: int | None, end: int | None) -> None:
    """The range column must be an integral df column and the bounds an ordered pair of ints."""
    for name, bound in (("start", start), ("end", end)):
        if bound is not None and (isinstance(bound, bool) or not isinstance(bound, int)):
            raise PublishError(f"{path}: {name}={bound!r} is not an int; pass integer milliseconds or None")
    if start is not None and end is not None and start >= end:
        raise PublishError(f"{path}: empty range [{start}, {end}); start must be below end")
    if column not in df.columns:
        raise PublishError(f"{path}: range column {column!r} is not in df (columns {df.columns}); pass an existing column")
    if not isinstance(df.schema[column].dataType, T.IntegralType):
        raise PublishError(
            f"{path}: range column {column!r} is {df.schema[column].dataType.simpleString()}; cast it to long"
        )


def _check_replaceable(table: DeltaTable, path: str, df: DataFrame) -> None:
    """Refuse tables this engine cannot rewrite safely, and schema drift."""
    _refuse_unsupported(table, path, PublishError)
    part_cols = list(table.metadata().partition_columns)
    if part_cols:
        raise PublishError(
            f"{path}: table is partitioned by {part_cols}; replace_range needs an unpartitioned table, rewrite it unpartitioned"
        )
    _check_schema(df.schema, _spark_schema(_arrow_schema(table)), path)


def _in_range(column: str, start: int | None, end: int | None) -> Column:
    """Rows inside [start, end); NULL counts as outside unless the range is the whole table."""
    cond = F.lit(True)
    if start is not None:
        cond = cond & (_col(column) >= F.lit(start))
    if end is not None:
        cond = cond & (_col(column) < F.lit(end))
    if start is None and end is None:
        return cond
    return F.coalesce(cond, F.lit(False))


def _check_staged_in_range(
    spark: SparkSession, staged: list[_StagedFile], path: str, column: str, start: int | None, end: int | None
) -> None:
    """Refuse df rows outside the range, from footer stats (Spark scans only files without stats)."""
    if start is None and end is None:
        return
    unknown = []
    for f in staged:
        stats = f.column_stats.get(column, (None, None, None))
        verdict = _classify(stats, f.num_rows, start, end)
        if verdict == "inside":
            continue
        if verdict == "outside" or None not in stats:
            raise PublishError(_out_of_range_message(path, column, start, end, stats))
        unknown.append(f.full_path)
    if unknown and spark.read.parquet(*unknown).filter(~_in_range(column, start, end)).limit(1).count():
        raise PublishError(_out_of_range_message(path, column, start, end, None))


def _out_of_range_message(
    path: str, column: str, start: int | None, end: int | None, stats: _Stats | None
) -> str:
    """One line naming the range and what was seen; the fix is to filter df."""
    seen = "" if stats is None else f" (a written file has min {stats[0]}, max {stats[1]}, nulls {stats[2]})"
    return f"{path}: df has rows with {column} outside [{start}, {end}){seen}; filter df to the range before publishing"


def _classify(stats: _Stats, num_rows: int | None, start: int | None, end: int | None) -> str:
    """'inside' (all rows in range), 'outside' (none), or 'straddle' (some, or unknown from stats)."""
    lo, hi, nulls = stats
    if start is None and end is None:
        return "inside"
    if num_rows == 0:
        return "inside"
    if num_rows is not None and nulls is not None and nulls == num_rows:
        return "outside"  # all NULL: NULL is never in a bounded range
    if lo is None or hi is None or nulls is None:
        return "straddle"
    if (end is not None and lo >= end) or (start is not None and hi < start):
        return "outside"
    fits = (start is None or lo >= start) and (end is None or hi < end)
    return "inside" if fits and nulls == 0 else "straddle"


def _plan_removals(
    table: DeltaTable, column: str, start: int | None, end: int | None
) -> tuple[list[RemoveAction], list[tuple[str, _Stats]]]:
    """Remove actions for files touching the range, and (local path, stats) of those that straddle it."""
    actions = pa.table(table.get_add_actions(flatten=True))
    root, now = _table_root(table), _now_ms()
    removes, straddling = [], []
    for row in actions.to_pylist():
        stats = (row.get(f"min.{column}"), row.get(f"max.{column}"), row.get(f"null_count.{column}"))
        verdict = _classify(stats, row.get("num_records"), start, end)
        if verdict == "outside":
            continue
        raw = unquote(row["path"])  # RemoveAction, like AddAction, wants the raw path: an encoded one is ignored
        removes.append(RemoveAction(raw, True, now, row["size_bytes"], {}))
        if verdict == "straddle":
            straddling.append((os.path.join(root, raw), stats))
    return removes, straddling


def _stage_carry_over(
    spark: SparkSession,
    straddling: list[tuple[str, _Stats]],
    schema: pa.Schema,
    path: str,
    column: str,
    start: int | None,
    end: int | None,
) -> list[_StagedFile]:
    """Rewrite the rows of straddling files that lie outside the range, so removing the files keeps them.

    Each side (below, above, NULL) gets its own files: a carried file then lies wholly outside the
    range, and re-running the same range removes nothing but its own previous output.
    """
    data_schema = _spark_schema(schema)
    staged: list[_StagedFile] = []
    try:
        for condition, files in _carry_sides(straddling, column, start, end):
            if files:
                kept = spark.read.schema(data_schema).parquet(*files).filter(condition)
                staged += _stage(spark, kept, path, [])
    except BaseException:
        _delete_files(staged)
        raise
    return staged


def _carry_sides(
    straddling: list[tuple[str, _Stats]], column: str, start: int | None, end: int | None
) -> list[tuple[Column, list[str]]]:
    """(row condition, files that may hold such rows) for each side of the range; stats skip hopeless files."""
    sides = []
    if start is not None:
        sides.append((_col(column) < start, [f for f, (lo, _, _) in straddling if lo is None or lo < start]))
    if end is not None:
        sides.append((_col(column) >= end, [f for f, (_, hi, _) in straddling if hi is None or hi >= end]))
    sides.append((_col(column).isNull(), [f for f, (_, _, nulls) in straddling if nulls is None or nulls > 0]))
    return sides


def _publish(
    table: DeltaTable | None,
    path: str,
    schema: pa.Schema,
    staged: list[_StagedFile],
    removes: list[RemoveAction],
    metadata: dict[str, str] | None,
) -> int:
    """The one commit of replace_range; a lost race deletes the staged files and asks for a re-run."""
    adds = [_add_action(f) for f in staged]
    try:
        if table is None:
            return _create(path, schema, adds, [], metadata)
        # no retry: the removals were planned on this snapshot, a concurrent commit may have added rows in range
        return _commit(table, [*adds, *removes], metadata)
    except CommitFailedError as exc:
        _delete_files(staged)
        raise PublishError(
            f"{path}: a concurrent writer changed the table during the publish ({_first_line(exc)}); re-run the range"
        ) from exc
    except PublishError:
        _delete_files(staged)
        raise
    except DeltaError as exc:  # outcome unknown: keep the files, they may be referenced now
        raise PublishError(_unknown_commit_message(path, exc)) from exc


def _unknown_commit_message(path: str, exc: BaseException) -> str:
    """One line for a commit that failed in a way that does not tell whether it landed."""
    return f"{path}: commit failed ({_first_line(exc)}); check table_version() and re-run the same range, which is idempotent"


def _replace_with_delta_spark(
    spark: SparkSession,
    df: DataFrame,
    path: str,
    column: str,
    start: int | None,
    end: int | None,
    metadata: dict[str, str] | None,
    before_commit: Callable[[], None] | None,
) -> PublishResult:
    """delta-spark replaceWhere; before_commit runs before the write since delta-spark commits inside it."""
    if df.filter(~_in_range(column, start, end)).limit(1).count():
        raise PublishError(_out_of_range_message(path, column, start, end, None))
    if before_commit is not None:
        before_commit()
    writer = df.write.format("delta").mode("overwrite")
    condition = _range_sql(column, start, end)
    if condition is not None:
        writer = writer.option("replaceWhere", condition)
    if metadata:
        writer = writer.option("userMetadata", json.dumps(metadata, sort_keys=True))
    try:
        writer.save(path)
    except Exception as exc:
        raise PublishError(f"{path}: delta-spark replace failed ({_first_line(exc)}); fix the cause and re-run") from exc
    return _result_from_history(spark, path)


def _range_sql(column: str, start: int | None, end: int | None) -> str | None:
    """replaceWhere text for the range, None for the whole table."""
    name = "`" + column.replace("`", "``") + "`"
    parts = ([f"{name} >= {start}"] if start is not None else []) + ([f"{name} < {end}"] if end is not None else [])
    return " AND ".join(parts) or None


def _result_from_history(spark: SparkSession, path: str) -> PublishResult:
    """PublishResult from delta-spark's operation metrics of the last commit."""
    row = _last_history_row(spark, path)
    metrics = row["operationMetrics"] or {}

    def get(key: str) -> int:
        return int(metrics.get(key) or 0)  # metrics are strings; a missing one means 0

    return PublishResult(
        int(row["version"]), get("numOutputRows") - get("numCopiedRows"), get("numFiles"),
        get("numRemovedFiles"), get("numCopiedRows"),
    )


def _last_history_row(spark: SparkSession, path: str) -> Any:
    """Latest entry of DESCRIBE HISTORY for a path table."""
    quoted = path.replace("`", "``")
    return spark.sql(f"DESCRIBE HISTORY delta.`{quoted}` LIMIT 1").first()


# ----------------------------------------------------------------------------- maintenance


def vacuum_orphans(path: str) -> list[str]:
    """Delete files the current snapshot does not reference (full vacuum, retention 0) and leftover staging folders.

    Time travel to versions whose files were removed stops working; never run it while a writer is active.
    """
    table = _try_open(path)
    if table is None:
        raise SourceError(f"{path}: no Delta table here (no _delta_log); check the path")
    removed = table.vacuum(retention_hours=0, dry_run=False, enforce_retention_duration=False, full=True)
    root = _table_root(table)
    # delta-rs skips '_'-prefixed folders, so a job that died mid-write leaves its staging folder behind
    for name in sorted(os.listdir(root)):
        if name.startswith(_STAGING_PREFIX):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
            removed.append(name + "/")
    return [os.path.relpath(p, root) if os.path.isabs(p) else p for p in removed]


# ----------------------------------------------------------------------------- staging (Spark writes parquet)


def _stage(spark: SparkSession, df: DataFrame, path: str, partition_by: list[str]) -> list[_StagedFile]:
    """Spark writes df under <table>/_staging-<uuid>/, then the non-empty files move to the table layout."""
    root = _local_dir(path)
    staging = os.path.join(root, f"{_STAGING_PREFIX}{uuid.uuid4().hex}")
    try:
        with _micros_timestamps(spark):
            writer = df.write.mode("error").option("compression", "snappy")
            if partition_by:
                writer = writer.partitionBy(*partition_by)
            writer.parquet(staging)
        return _move_out(staging, root)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # also drops _SUCCESS, .crc and empty files


def _move_out(staging: str, root: str) -> list[_StagedFile]:
    """Move each non-empty parquet file from staging to the same relative place under root."""
    staged: list[_StagedFile] = []
    try:
        for dirpath, _, names in os.walk(staging):
            rel_dir = os.path.relpath(dirpath, staging)
            for name in sorted(n for n in names if n.endswith(".parquet") and not n.startswith(".")):
                meta = pq.read_metadata(os.path.join(dirpath, name))
                if meta.num_rows == 0:
                    continue  # Spark writes empty files for empty tasks; they would only add noise to the log
                rel = name if rel_dir == "." else os.path.join(rel_dir, name)
                staged.append(_move_one(os.path.join(dirpath, name), root, rel, meta))
    except BaseException:
        _delete_files(staged)  # a half-moved batch must not linger as unexplained files
        raise
    return staged


def _move_one(src: str, root: str, rel: str, meta: pq.FileMetaData) -> _StagedFile:
    """Rename one file into the table; Spark's names carry a per-job uuid, so a clash means something is wrong."""
    dest = os.path.join(root, rel)
    if os.path.exists(dest):
        raise PublishError(f"{dest}: a file with this name already exists; run vacuum_orphans and re-run")
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    os.rename(src, dest)
    return _StagedFile(rel, dest, _partition_values(rel), meta.num_rows, os.path.getsize(dest), _footer_stats(meta))


def _partition_values(rel: str) -> dict[str, str | None]:
    """Hive-style `k=v` folders of a relative path, unescaped as Spark escaped them."""
    values: dict[str, str | None] = {}
    for part in rel.split(os.sep)[:-1]:
        key, _, value = part.partition("=")
        values[unquote(key)] = None if value == "__HIVE_DEFAULT_PARTITION__" else unquote(value)
    return values


@contextmanager
def _micros_timestamps(spark: SparkSession) -> Iterator[None]:
    """Force TIMESTAMP_MICROS while writing: Spark's default INT96 carries no min/max statistics."""
    key = "spark.sql.parquet.outputTimestampType"
    old = spark.conf.get(key)
    if old == "TIMESTAMP_MICROS":
        yield
        return
    spark.conf.set(key, "TIMESTAMP_MICROS")
    try:
        yield
    finally:
        spark.conf.set(key, old)


def _delete_files(staged: list[_StagedFile]) -> None:
    """Best-effort removal of staged files that no commit references."""
    for f in staged:
        try:
            os.remove(f.full_path)
        except OSError:
            pass  # vacuum_orphans removes whatever is left


# ----------------------------------------------------------------------------- footer statistics


def _footer_stats(meta: pq.FileMetaData) -> dict[str, _Stats]:
    """(min, max, null count) per top-level primitive column from the footer; None where a row group lacks stats."""
    stats = {}
    leaf = 0
    for field in meta.schema.to_arrow_schema():
        width = _leaf_count(field.type)
        if width == 1 and not pa.types.is_nested(field.type):
            stats[field.name] = _leaf_stats(meta, leaf)
        leaf += width
    return stats


def _leaf_count(t: pa.DataType) -> int:
    """How many parquet leaf columns an arrow type occupies."""
    if pa.types.is_struct(t):
        return sum(_leaf_count(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_map(t):
        return _leaf_count(t.key_type) + _leaf_count(t.item_type)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _leaf_count(t.value_type)
    return 1


def _leaf_stats(meta: pq.FileMetaData, leaf: int) -> _Stats:
    """Combine one leaf column's statistics over all row groups."""
    lows, highs, nulls = [], [], 0
    for rg in range(meta.num_row_groups):
        column = meta.row_group(rg).column(leaf)
        s = column.statistics
        if s is None or s.null_count is None or column.physical_type == "INT96":
            return None, None, None
        nulls += s.null_count
        if s.has_min_max:
            lows.append(s.min)
            highs.append(s.max)
        elif s.null_count != meta.row_group(rg).num_rows:
            return None, None, None  # values present but no min/max: unknown, so callers treat it as straddling
    return (min(lows) if lows else None), (max(highs) if highs else None), nulls


def _add_action(f: _StagedFile) -> AddAction:
    """AddAction with the RAW relative path (delta-rs encodes it) and Delta stats JSON."""
    return AddAction(f.rel_path, f.size, f.partition_values, _now_ms(), True, _stats_json(f))


def _stats_json(f: _StagedFile) -> str:
    """Delta `stats`: numRecords, nullCount, and min/max for numbers, dates and timestamps."""
    doc: dict[str, Any] = {"numRecords": f.num_rows, "minValues": {}, "maxValues": {}, "nullCount": {}}
    for name, (lo, hi, nulls) in f.column_stats.items():
        if nulls is not None:
            doc["nullCount"][name] = nulls
        low, high = _json_stat(lo, round_up=False), _json_stat(hi, round_up=True)
        if low is not None and high is not None:
            doc["minValues"][name], doc["maxValues"][name] = low, high
    return json.dumps(doc)


def _json_stat(value: Any, *, round_up: bool) -> Any:
    """A footer value in Delta stats form; None for types we do not publish (strings, decimals, booleans)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dt.datetime):
        return _timestamp_stat(value, round_up)
    if isinstance(value, dt.date):
        return value.isoformat()
    return None  # strings would need Delta's prefix truncation rules; no stats is always safe


def _timestamp_stat(value: dt.datetime, round_up: bool) -> str:
    """Delta stats keep milliseconds: round a max up so pruning never drops a matching file."""
    if round_up and value.microsecond % 1000:
        value += dt.timedelta(microseconds=1000 - value.microsecond % 1000)
    suffix = ""
    if value.tzinfo is not None:
        value, suffix = value.astimezone(dt.timezone.utc), "Z"
    return value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}{suffix}"


# ----------------------------------------------------------------------------- commits


def _create(
    path: str, schema: pa.Schema, adds: list[AddAction], partition_by: list[str], metadata: dict[str, str] | None
) -> int:
    """Create the table with its first files in version 0."""
    try:
        create_table_with_add_actions(
            path, DeltaSchema.from_arrow(schema), adds, mode="error", partition_by=partition_by or None,
            commit_properties=CommitProperties(custom_metadata=metadata),
        )
    except DeltaError as exc:
        if is_delta_table(path):
            raise PublishError(f"{path}: another writer created the table meanwhile; re-run") from exc
        raise PublishError(f"{path}: cannot create the Delta table ({_first_line(exc)}); fix the cause and re-run") from exc
    return 0


def _commit(table: DeltaTable, actions: list[AddAction | RemoveAction], metadata: dict[str, str] | None) -> int:
    """One commit on top of `table`'s snapshot; retries 0 so any concurrent commit surfaces as CommitFailedError."""
    props = CommitProperties(custom_metadata=metadata, max_commit_retries=0)
    table.create_write_transaction(actions, mode="append", schema=table.schema(), commit_properties=props)
    return table.version() + 1  # with no retries the commit lands exactly on the next version


# ----------------------------------------------------------------------------- schemas and small helpers


def _try_open(path: str) -> DeltaTable | None:
    """The latest snapshot, or None when no table exists at path."""
    if not is_delta_table(path):
        return None
    try:
        return DeltaTable(path)
    except TableNotFoundError:
        return None


def _refuse_unsupported(table: DeltaTable, path: str, error: type[Exception]) -> None:
    """Deletion vectors and column mapping change what the parquet files mean; we cannot honour them."""
    features = set(table.protocol().reader_features or []) & _UNSUPPORTED_READER_FEATURES
    if table.metadata().configuration.get("delta.columnMapping.mode", "none") not in (None, "none"):
        features.add("columnMapping")
    if features:
        raise error(
            f"{path}: table uses Delta reader feature(s) {sorted(features)}, unsupported without delta-spark; "
            "rewrite the table without them or run with the delta-spark jars"
        )


def _check_schema(df_schema: T.StructType, table_schema: T.StructType, path: str) -> None:
    """df must have exactly the table's columns and types (nullability aside)."""
    theirs = {f.name: _nullable(f.dataType) for f in table_schema.fields}
    ours = {f.name: _nullable(f.dataType) for f in df_schema.fields}
    missing = [n for n in theirs if n not in ours]
    extra = [n for n in ours if n not in theirs]
    differ = [f"{n} ({ours[n].simpleString()} vs table {theirs[n].simpleString()})"
              for n in theirs if n in ours and ours[n] != theirs[n]]
    if missing or extra or differ:
        raise PublishError(
            f"{path}: df schema does not match the table: missing {missing}, unexpected {extra}, type differs {differ}; "
            "select and cast df's columns to the table schema"
        )


def _nullable(t: T.DataType) -> T.DataType:
    """The same type with every nested field nullable, for comparisons and new tables (as Spark writes files)."""
    if isinstance(t, T.StructType):
        return T.StructType([T.StructField(f.name, _nullable(f.dataType), True) for f in t.fields])
    if isinstance(t, T.ArrayType):
        return T.ArrayType(_nullable(t.elementType), True)
    if isinstance(t, T.MapType):
        return T.MapType(_nullable(t.keyType), _nullable(t.valueType), True)
    return t


def _arrow_schema_of(schema: T.StructType, path: str) -> pa.Schema:
    """Arrow schema for a new table from df's Spark schema (timestamps as UTC microseconds)."""
    try:
        return to_arrow_schema(_nullable(schema))  # type: ignore[arg-type]
    except Exception as exc:
        raise PublishError(f"{path}: df schema has a type Delta cannot store ({_first_line(exc)}); cast that column") from exc


def _arrow_schema(table: DeltaTable) -> pa.Schema:
    """The table schema as pyarrow."""
    return pa.schema(table.schema().to_arrow())


def _spark_schema(schema: pa.Schema) -> T.StructType:
    """Spark schema for an arrow one; Delta timestamp_ntz (no tz) stays NTZ."""
    return from_arrow_schema(schema, prefer_timestamp_ntz=True)


def _in_order(df: DataFrame, names: list[str]) -> DataFrame:
    """df's columns in the table's order (parquet readers match by name, but the layout stays tidy)."""
    return df.select(*[_col(n) for n in names])


def _col(name: str) -> Column:
    """A column by exact name, even with dots or backticks in it."""
    return F.col("`" + name.replace("`", "``") + "`")


def _table_root(table: DeltaTable) -> str:
    """Local folder of a table opened by delta-rs."""
    return _strip_file_scheme(table.table_uri).rstrip("/")


def _strip_file_scheme(uri: str) -> str:
    """A local path from delta-rs' `file://` URIs (which are percent-encoded) or plain paths."""
    if uri.startswith("file://"):
        return unquote(uri[len("file://"):])
    return uri


def _local_dir(path: str) -> str:
    """Local folder for writing; the delta-rs write path moves files with os.rename, so it is local only."""
    local = _strip_file_scheme(path)
    if "://" in local:
        raise PublishError(f"{path}: writing without delta-spark supports local folders only; use a local path")
    return os.path.abspath(local)


def _now_ms() -> int:
    """Wall clock in epoch milliseconds, as Delta's modificationTime and deletionTimestamp want."""
    return int(time.time() * 1000)


def _first_line(exc: BaseException) -> str:
    """First line of an exception, to keep our messages on one line."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
