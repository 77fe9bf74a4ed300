"""backfill.io.delta against real Spark with delta-spark and real Delta tables on disk, no mocks."""
from __future__ import annotations

import datetime as dt
import decimal
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import DataFrame, SparkSession

from backfill.errors import PublishError, SourceError
from backfill.io.delta import (append_delta, history, is_delta_table, read_delta, replace_range, table_version,
                               vacuum)

pytestmark = pytest.mark.spark
SCHEMA = "ts long, v string"


def _rows(df: DataFrame) -> list[tuple[Any, ...]]:
    return sorted((tuple(r) for r in df.collect()), key=str)


def _table(spark: SparkSession, path: Path, rows: list[tuple[int, str]]) -> str:
    replace_range(spark, spark.createDataFrame(rows, SCHEMA), str(path), column="ts", start=None, end=None)
    return str(path)


def test_round_trip_keeps_types_and_values(spark: SparkSession, tmp_path: Path) -> None:
    schema = "k string, n long, i int, d double, b boolean, t timestamp, dec decimal(10,2), a array<string>"
    row = ("x", 2**40, 7, 1.5, True, dt.datetime(2024, 1, 2, 3, 4, 5, 678000), decimal.Decimal("3.25"),
           ["p", "q"])
    path = str(tmp_path / "t")
    replace_range(spark, spark.createDataFrame([row], schema), path, column="n", start=None, end=None)
    back = read_delta(spark, path)
    assert back.schema.simpleString() == spark.createDataFrame([row], schema).schema.simpleString()
    assert tuple(back.first()) == row


def test_time_travel_by_version_and_timestamp(spark: SparkSession, tmp_path: Path) -> None:
    path = _table(spark, tmp_path / "t", [(1, "a")])
    moment = dt.datetime.now(dt.timezone.utc)
    time.sleep(1.1)
    replace_range(spark, spark.createDataFrame([(1, "b")], SCHEMA), path, column="ts", start=None, end=None)
    assert table_version(path) == 1
    assert _rows(read_delta(spark, path, version=0)) == [(1, "a")]
    assert _rows(read_delta(spark, path)) == [(1, "b")]
    assert _rows(read_delta(spark, path, timestamp=moment.strftime("%Y-%m-%d %H:%M:%S.%f"))) == [(1, "a")]
    with pytest.raises(SourceError, match="latest version is 1"):
        read_delta(spark, path, version=5)


def test_missing_table_is_a_source_error_naming_the_path(spark: SparkSession, tmp_path: Path) -> None:
    with pytest.raises(SourceError, match=str(tmp_path / "nope")):
        read_delta(spark, str(tmp_path / "nope"))


def test_column_mapping_tables_are_read_by_their_logical_names(spark: SparkSession, tmp_path: Path) -> None:
    path = str(tmp_path / "cm")
    spark.sql(f"CREATE TABLE delta.`{path}` (ts long, v string) USING delta TBLPROPERTIES "
              "('delta.columnMapping.mode' = 'name', 'delta.minReaderVersion' = '2', 'delta.minWriterVersion' = '5')")
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, 'a')")
    spark.sql(f"ALTER TABLE delta.`{path}` RENAME COLUMN v TO value")
    back = read_delta(spark, path)
    assert back.columns == ["ts", "value"] and _rows(back) == [(1, "a")]


def test_replace_middle_range_keeps_every_row_outside(spark: SparkSession, tmp_path: Path) -> None:
    path = _table(spark, tmp_path / "t", [(t, "old") for t in range(10)])
    result = replace_range(spark, spark.createDataFrame([(4, "new"), (5, "new")], SCHEMA), path, column="ts",
                           start=3, end=7)
    assert result.rows_written == 2 and result.version == 1
    assert _rows(read_delta(spark, path)) == [(t, "old") for t in (0, 1, 2)] + [(4, "new"), (5, "new")] + \
        [(t, "old") for t in (7, 8, 9)]


def test_range_edges_are_start_inclusive_end_exclusive(spark: SparkSession, tmp_path: Path) -> None:
    path = _table(spark, tmp_path / "t", [(t, "old") for t in (2, 3, 6, 7)])
    replace_range(spark, spark.createDataFrame([], SCHEMA), path, column="ts", start=3, end=7)
    assert _rows(read_delta(spark, path)) == [(2, "old"), (7, "old")]


def test_a_log_folder_without_a_commit_is_not_a_table_yet(tmp_path: Path) -> None:
    """A first commit creates `_delta_log` a moment before its commit file: a reader then sees no table."""
    (tmp_path / "t" / "_delta_log").mkdir(parents=True)
    assert not is_delta_table(str(tmp_path / "t")) and table_version(str(tmp_path / "t")) is None
    write_deltalake(str(tmp_path / "t"), pa.table({"x": [1]}), mode="append")
    assert is_delta_table(str(tmp_path / "t"))


def test_replace_on_empty_location_creates_the_table(spark: SparkSession, tmp_path: Path) -> None:
    path = str(tmp_path / "new")
    replace_range(spark, spark.createDataFrame([(5, "a")], SCHEMA), path, column="ts", start=0, end=10)
    assert table_version(path) == 0 and _rows(read_delta(spark, path)) == [(5, "a")]


def test_rows_outside_the_range_are_refused_and_the_table_is_unchanged(spark: SparkSession, tmp_path: Path) -> None:
    path = _table(spark, tmp_path / "t", [(1, "a")])
    with pytest.raises(PublishError, match=r"outside \[0, 10\) \((50, -3|-3, 50)\)"):
        replace_range(spark, spark.createDataFrame([(5, "a"), (50, "x"), (-3, "y")], SCHEMA), path, column="ts",
                      start=0, end=10)
    assert table_version(path) == 0 and _rows(read_delta(spark, path)) == [(1, "a")]
    assert not list(tmp_path.glob("t.staging-*"))


def test_an_empty_run_empties_its_range_and_counts_zero_rows(spark: SparkSession, tmp_path: Path) -> None:
    path = _table(spark, tmp_path / "t", [(1, "a"), (20, "b")])
    result = replace_range(spark, spark.createDataFrame([], SCHEMA), path, column="ts", start=0, end=10)
    assert result.rows_written == 0 and table_version(path) == 1 and _rows(read_delta(spark, path)) == [(20, "b")]


def test_a_failing_audit_or_before_commit_leaves_the_table_unchanged(spark: SparkSession, tmp_path: Path) -> None:
    path = _table(spark, tmp_path / "t", [(1, "a")])
    seen: list[int] = []

    def audit(staged: DataFrame) -> None:
        seen.append(staged.count())
        raise PublishError("audit says no")

    with pytest.raises(PublishError, match="audit says no"):
        replace_range(spark, spark.createDataFrame([(1, "b"), (2, "b")], SCHEMA), path, column="ts", start=None,
                      end=None, audit=audit)

    def boom() -> None:
        raise RuntimeError("killed before the commit")

    with pytest.raises(RuntimeError):
        replace_range(spark, spark.createDataFrame([(1, "c")], SCHEMA), path, column="ts", start=None, end=None,
                      before_commit=boom)
    assert seen == [2] and table_version(path) == 0 and _rows(read_delta(spark, path)) == [(1, "a")]


def test_rerunning_a_range_is_idempotent(spark: SparkSession, tmp_path: Path) -> None:
    path = _table(spark, tmp_path / "t", [(t, "old") for t in range(6)])
    new = spark.createDataFrame([(2, "x"), (3, "y")], SCHEMA)
    replace_range(spark, new, path, column="ts", start=2, end=4)
    first = _rows(read_delta(spark, path))
    replace_range(spark, new, path, column="ts", start=2, end=4)
    assert _rows(read_delta(spark, path)) == first and table_version(path) == 2


def test_open_ended_ranges_and_rows_without_a_range_value(spark: SparkSession, tmp_path: Path) -> None:
    path = _table(spark, tmp_path / "t", [(1, "a"), (5, "b"), (None, "n")])
    replace_range(spark, spark.createDataFrame([(6, "c")], SCHEMA), path, column="ts", start=5, end=None)
    assert _rows(read_delta(spark, path)) == sorted([(None, "n"), (1, "a"), (6, "c")], key=str)
    # a row without a value belongs to every range without a start (backfill/ranges.py)
    replace_range(spark, spark.createDataFrame([(0, "z")], SCHEMA), path, column="ts", start=None, end=3)
    assert _rows(read_delta(spark, path)) == [(0, "z"), (6, "c")]


def test_a_schema_change_is_refused_naming_the_columns(spark: SparkSession, tmp_path: Path) -> None:
    path = _table(spark, tmp_path / "t", [(1, "a")])
    with pytest.raises(PublishError, match="ts, v.*ts, w"):
        replace_range(spark, spark.createDataFrame([(1, "a")], "ts long, w string"), path, column="ts", start=0, end=5)


def test_commit_metadata_and_history(spark: SparkSession, tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    replace_range(spark, spark.createDataFrame([(1, "a")], SCHEMA), path, column="ts", start=None, end=None,
                  metadata={"backfill.run_id": "r1"})
    append_delta(spark, spark.createDataFrame([(2, "b")], SCHEMA), path, metadata={"backfill.run_id": "r2"})
    rows = history(spark, path)
    assert [r["version"] for r in rows] == [1, 0]
    assert '"backfill.run_id": "r2"' in rows[0]["userMetadata"] and "r1" in rows[1]["userMetadata"]


def test_tables_written_by_delta_spark_and_delta_rs_read_the_same_in_both(spark: SparkSession,
                                                                           tmp_path: Path) -> None:
    rows = [(t, f"v{t}") for t in range(5)]
    ours = _table(spark, tmp_path / "ours", rows)
    assert sorted(DeltaTable(ours).to_pyarrow_table().to_pylist(), key=lambda r: r["ts"]) == \
        [{"ts": t, "v": v} for t, v in rows]
    theirs = str(tmp_path / "theirs")
    write_deltalake(theirs, pa.table({"ts": pa.array([t for t, _ in rows], pa.int64()), "v": [v for _, v in rows]}))
    assert _rows(read_delta(spark, theirs)) == rows
    replace_range(spark, spark.createDataFrame([(2, "new")], SCHEMA), theirs, column="ts", start=2, end=3)
    assert sorted(DeltaTable(theirs).to_pyarrow_table().to_pylist(), key=lambda r: r["ts"])[2] == {"ts": 2, "v": "new"}


def test_vacuum_removes_files_no_version_needs(spark: SparkSession, tmp_path: Path) -> None:
    path = _table(spark, tmp_path / "t", [(1, "a")])
    replace_range(spark, spark.createDataFrame([(1, "b")], SCHEMA), path, column="ts", start=None, end=None)
    listing = "spark.sql.sources.parallelPartitionDiscovery.parallelism"  # vacuum lowers it while it lists
    before = spark.conf.get(listing)
    assert vacuum(spark, path, retain_hours=0) >= 1
    assert _rows(read_delta(spark, path)) == [(1, "b")]
    assert spark.conf.get(listing) == before


def test_reading_a_small_table_without_spark_leaves_the_interpreter_exiting_cleanly(tmp_path: Path) -> None:
    """The runs table and the demo's tables are read through pyarrow's local filesystem: through deltalake's
    own filesystem bridge a process exited with 134 (abort) about every other time."""
    import subprocess
    import sys

    import pyarrow as pa
    from deltalake import write_deltalake

    path = str(tmp_path / "runs")
    write_deltalake(path, pa.table({"run_id": ["a", "b"], "n": [1, 2]}))
    code = ("import sys; from backfill.io.delta import arrow_table; "
            f"sys.exit(0 if arrow_table({path!r}).num_rows == 2 else 3)")
    codes = [subprocess.run([sys.executable, "-c", code], capture_output=True).returncode for _ in range(6)]
    assert codes == [0] * 6
