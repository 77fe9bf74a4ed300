"""Sinks: Delta (replace exactly the range, one commit), Parquet folders, JSONL files or folders."""
from __future__ import annotations

import glob
import os
import shutil
import uuid
from collections.abc import Callable
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from backfill.errors import PublishError


def write_output(spark: SparkSession, df: DataFrame, fmt: str, path: str, *, column: str,
                 start: int | None, end: int | None, metadata: dict[str, str],
                 before_commit: Callable[[], None] | None = None,
                 audit: Callable[[DataFrame], None] | None = None) -> dict[str, Any]:
    """Publish `df` to a sink; Delta replaces rows with `column` in [start, end), files are replaced whole.

    `audit` gets the staged rows before the commit (or the swap) and may raise to stop the publish.
    """
    if fmt == "delta":
        from backfill.io.delta import replace_range

        result = replace_range(spark, df, path, column=column, start=start, end=end, metadata=metadata,
                               before_commit=before_commit, audit=audit)
        return {"format": fmt, "path": path, "rows": result.rows_written, "version": result.version,
                "files_added": result.files_added, "files_removed": result.files_removed}
    staging = f"{path.rstrip('/')}.staging-{uuid.uuid4().hex[:8]}"
    writer = df.write.mode("error")
    try:
        if fmt == "parquet":
            writer.parquet(staging)
        else:
            (df.coalesce(1) if path.endswith(".jsonl") else df).write.mode("error") \
                .option("ignoreNullFields", "false").json(staging)
        rows = _count_rows(spark, staging, fmt)
        if audit is not None:
            audit(_staged(spark, staging, fmt, df))
        if before_commit is not None:
            before_commit()
        _swap(staging, path, single_file=fmt == "jsonl" and path.endswith(".jsonl"))
    except PublishError:
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return {"format": fmt, "path": path, "rows": rows}


def _staged(spark: SparkSession, folder: str, fmt: str, df: DataFrame) -> DataFrame:
    """The staged rows read back with the output's schema (what the swap would publish)."""
    if not glob.glob(f"{folder}/part-*"):
        return spark.createDataFrame([], df.schema)
    reader = spark.read.schema(df.schema)
    return reader.parquet(folder) if fmt == "parquet" else reader.json(folder)


def _count_rows(spark: SparkSession, folder: str, fmt: str) -> int:
    if fmt == "parquet":
        import pyarrow.parquet as pq

        return sum(pq.ParquetFile(f).metadata.num_rows for f in glob.glob(f"{folder}/*.parquet"))
    total = 0
    for part in glob.glob(f"{folder}/part-*"):
        with open(part, "rb") as fh:
            total += sum(1 for _ in fh)
    return total


def _swap(staging: str, path: str, single_file: bool) -> None:
    """Replace the target by the staged result (a rename: readers never see a half-written file)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    if single_file:
        parts = sorted(glob.glob(f"{staging}/part-*"))
        target = parts[0] if parts else None
        if target is None:
            open(f"{staging}/empty", "w").close()
            target = f"{staging}/empty"
        os.replace(target, path)
        return
    old = f"{path.rstrip('/')}.old-{uuid.uuid4().hex[:8]}"
    if os.path.exists(path):
        os.replace(path, old)
    os.replace(staging, path)
    shutil.rmtree(old, ignore_errors=True)
