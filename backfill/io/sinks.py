"""Sinks (io): every format replaces exactly the run's range, after an audit, in one atomic step.

- Delta: the rows with the range column in [start, end) are replaced in one commit (io/delta.py).
- Parquet folders and JSONL files or folders: the new content (the run's rows plus the rows of the
  existing output outside the range, read back) is staged next to the target, audited, then swapped in
  with one atomic rename (an exchange of the two folders where the kernel has renameat2). A kill leaves
  either the old or the new content; a leftover staging folder is removed by the next run.
Rows outside the range are never deleted, whatever the format.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from backfill.errors import PublishError
from backfill.ranges import in_range

STAGING = ".staging-"
RETIRED = ".retired-"


def write_output(spark: SparkSession, df: DataFrame, fmt: str, path: str, *, column: str,
                 start: int | None, end: int | None, metadata: dict[str, str],
                 before_commit: Callable[[], None] | None = None,
                 audit: Callable[[DataFrame], None] | None = None) -> dict[str, Any]:
    """Publish `df` to a sink, replacing the rows with `column` in [start, end) (all rows when unbounded).

    `audit` gets the run's staged rows before the commit (or the swap) and may raise to stop the publish.
    """
    recover(path)
    if fmt == "delta":
        from backfill.io.delta import replace_range

        result = replace_range(spark, df, path, column=column, start=start, end=end, metadata=metadata,
                               before_commit=before_commit, audit=audit)
        return {"format": fmt, "path": path, "rows": result.rows_written, "version": result.version,
                "files_added": result.files_added, "files_removed": result.files_removed}
    single = fmt == "jsonl" and path.endswith(".jsonl")
    staging = f"{path.rstrip('/')}{STAGING}{uuid.uuid4().hex[:8]}"
    try:
        new = f"{staging}/new"
        _write(df.coalesce(1) if single else df, fmt, new)
        rows = _count_rows(new, fmt)
        if audit is not None:
            audit(_read(spark, new, fmt, df))
        kept = 0
        final = new
        if (start is not None or end is not None) and os.path.exists(path):
            old = _read_existing(spark, path, fmt, df)
            outside = old.where(~in_range(column, start, end))
            final = f"{staging}/final"
            merged = _read(spark, new, fmt, df).unionByName(outside)
            _write(merged.coalesce(1) if single else merged, fmt, final)
            kept = _count_rows(final, fmt) - rows
        if before_commit is not None:
            before_commit()
        _swap(final, path, single_file=single)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return {"format": fmt, "path": path, "rows": rows, "rows_kept": kept}


def recover(path: str) -> list[str]:
    """Undo what a killed publish left: restore a target moved aside, remove staging folders.

    Returns what was cleaned (for the run summary). Only called by the run that holds the sink's lock.
    """
    base = path.rstrip("/")
    parent, name = os.path.split(base)
    cleaned = []
    retired = sorted(glob.glob(os.path.join(glob.escape(parent), glob.escape(name) + RETIRED + "*")))
    if retired and not os.path.exists(base):  # killed between the two renames of the fallback swap
        os.replace(retired[-1], base)
        cleaned.append(f"restored {base}")
    for leftover in glob.glob(os.path.join(glob.escape(parent), glob.escape(name) + STAGING + "*")) + \
            glob.glob(os.path.join(glob.escape(parent), glob.escape(name) + RETIRED + "*")):
        shutil.rmtree(leftover, ignore_errors=True) if os.path.isdir(leftover) else os.remove(leftover)
        cleaned.append(f"removed {leftover}")
    return cleaned


def _write(df: DataFrame, fmt: str, folder: str) -> None:
    if fmt == "parquet":
        df.write.mode("error").parquet(folder)
    else:
        df.write.mode("error").option("ignoreNullFields", "false").json(folder)


def _read(spark: SparkSession, folder: str, fmt: str, like: DataFrame) -> DataFrame:
    """Rows written to a folder, read back with the output's schema."""
    if not glob.glob(f"{folder}/part-*"):
        return spark.createDataFrame([], like.schema)
    reader = spark.read.schema(like.schema)
    return reader.parquet(folder) if fmt == "parquet" else reader.json(folder)


def _read_existing(spark: SparkSession, path: str, fmt: str, like: DataFrame) -> DataFrame:
    """The current output, which must have the columns this run writes (else its rows would be lost)."""
    if fmt == "parquet":
        found = spark.read.parquet(path).columns
    else:
        found = _jsonl_columns(path)
    missing = [c for c in like.columns if c not in found]
    extra = [c for c in found if c not in like.columns]
    if found and (missing or extra):
        raise PublishError(f"{path}: the existing output has the columns {', '.join(found)}, this run writes "
                           f"{', '.join(like.columns)}; replacing a range would lose or invent values: write to a "
                           "new path, or delete the old output and run without --start/--end")
    if not found:
        return spark.createDataFrame([], like.schema)
    reader = spark.read.schema(like.schema)
    return reader.parquet(path) if fmt == "parquet" else reader.json(path)


def _jsonl_columns(path: str) -> list[str]:
    """The fields of the first row of a JSONL file or folder (none when it is empty)."""
    import json

    files = [path] if os.path.isfile(path) else sorted(glob.glob(f"{path}/part-*"))
    for file in files:
        with open(file) as fh:
            for line in fh:
                if line.strip():
                    return list(json.loads(line))
    return []


def _count_rows(folder: str, fmt: str) -> int:
    if fmt == "parquet":
        import pyarrow.parquet as pq

        return sum(pq.ParquetFile(f).metadata.num_rows for f in glob.glob(f"{folder}/*.parquet"))
    total = 0
    for part in glob.glob(f"{folder}/part-*"):
        with open(part, "rb") as fh:
            total += sum(1 for _ in fh)
    return total


def _swap(staged: str, path: str, single_file: bool) -> None:
    """Replace the target by the staged result; readers never see a half-written state."""
    os.makedirs(os.path.dirname(path.rstrip("/")) or ".", exist_ok=True)
    if single_file:
        parts = sorted(glob.glob(f"{staged}/part-*"))
        target = parts[0] if parts else None
        if target is None:
            Path(f"{staged}/empty").touch()
            target = f"{staged}/empty"
        os.replace(target, path)  # a rename over a file is atomic
        return
    base = path.rstrip("/")
    if not os.path.exists(base):
        os.replace(staged, base)
        return
    if _exchange(staged, base):  # atomic: the two folders trade places
        shutil.rmtree(staged, ignore_errors=True)
        return
    retired = f"{base}{RETIRED}{uuid.uuid4().hex[:8]}"
    os.replace(base, retired)  # a kill here leaves `retired`, which the next run's recover() moves back
    os.replace(staged, base)
    shutil.rmtree(retired, ignore_errors=True)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: str, b: str) -> bool:
    """Atomically exchange two paths (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    return renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0
