"""Part: io. Sinks: every format replaces exactly the run's range, after an audit, in one atomic step.

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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from backfill.errors import PublishError
from backfill.ranges import in_range

STAGING = ".staging-"
RETIRED = ".retired-"


@dataclass(frozen=True)
class Staged:
    """One sink's output, written and audited, waiting for its commit (JSON-able: a publish journal holds it)."""

    name: str
    format: str
    path: str
    folder: str
    column: str
    start: int | None
    end: int | None
    rows: int
    kept: int
    metadata: dict[str, str]

    def to_dict(self) -> dict[str, Any]:
        """For the publish journal."""
        return asdict(self)


def write_output(spark: SparkSession, df: DataFrame, fmt: str, path: str, *, column: str,
                 start: int | None, end: int | None, metadata: dict[str, str],
                 before_commit: Callable[[], None] | None = None,
                 audit: Callable[[DataFrame], None] | None = None) -> dict[str, Any]:
    """Stage, audit and commit one sink (replacing the rows with `column` in [start, end))."""
    staged = stage_output(spark, df, fmt, path, name=path, column=column, start=start, end=end, metadata=metadata,
                          audit=audit)
    if before_commit is not None:
        before_commit()
    return commit_staged(spark, staged)


def stage_output(spark: SparkSession, df: DataFrame, fmt: str, path: str, *, name: str, column: str,
                 start: int | None, end: int | None, metadata: dict[str, str],
                 audit: Callable[[DataFrame], None] | None = None) -> Staged:
    """Write the sink's new content next to it and audit the run's rows; nothing visible changes yet.

    Delta: the run's rows (the commit replaces the range with them). Parquet/JSONL: the whole new content,
    the run's rows plus the existing rows outside the range. `audit` may raise to stop the publish.
    """
    staging = f"{path.rstrip('/')}{STAGING}{uuid.uuid4().hex[:8]}"
    try:
        if fmt == "delta":
            from backfill.io.delta import stage_rows

            rows = stage_rows(spark, df, path, staging, column=column, start=start, end=end, audit=audit)
            return Staged(name, fmt, path, staging, column, start, end, rows, 0, metadata)
        single = fmt == "jsonl" and path.endswith(".jsonl")
        new = f"{staging}/new"
        _write(df.coalesce(1) if single else df, fmt, new)
        rows = _count_rows(new, fmt)
        if audit is not None:
            audit(_read(spark, new, fmt, df))
        kept, final = 0, new
        if (start is not None or end is not None) and os.path.exists(path):
            outside = _read_existing(spark, path, fmt, df).where(~in_range(column, start, end))
            final = f"{staging}/final"
            merged = _read(spark, new, fmt, df).unionByName(outside)
            _write(merged.coalesce(1) if single else merged, fmt, final)
            kept = _count_rows(final, fmt) - rows
        return Staged(name, fmt, path, final, column, start, end, rows, kept, metadata)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def commit_staged(spark: SparkSession, staged: Staged) -> dict[str, Any]:
    """Make a staged sink visible (one Delta commit, or one atomic swap); safe to call again after a kill."""
    out: dict[str, Any] = {"format": staged.format, "path": staged.path, "rows": staged.rows}
    if "backfill.table" in staged.metadata:  # a catalog table: its name beside its location and version
        out["table"] = staged.metadata["backfill.table"]
    if staged.format == "delta":
        from backfill.io.delta import commit_rows

        result = commit_rows(spark, staged.folder, staged.path, column=staged.column, start=staged.start,
                             end=staged.end, metadata=staged.metadata, rows=staged.rows)
        out.update(version=result.version, files_added=result.files_added, files_removed=result.files_removed)
    elif os.path.exists(staged.folder):  # gone: the swap already happened (a journal being rolled forward)
        _swap(staged.folder, staged.path, single_file=staged.format == "jsonl" and staged.path.endswith(".jsonl"))
        out["rows_kept"] = staged.kept
    shutil.rmtree(_staging_root(staged.folder), ignore_errors=True)
    return out


def discard(staged: Staged) -> None:
    """Remove a staged sink that will not be committed (another sink of the run failed its audit)."""
    shutil.rmtree(_staging_root(staged.folder), ignore_errors=True)


def _staging_root(folder: str) -> str:
    """The `<sink>.staging-<id>` folder a staged folder lives in."""
    head, tail = os.path.split(folder.rstrip("/"))
    return folder if STAGING in tail else head


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
