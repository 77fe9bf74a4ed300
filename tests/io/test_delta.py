"""backfill.io.delta against real Spark and real Delta tables (delta-rs log, Spark parquet), no mocks."""
from __future__ import annotations

import datetime as dt
import decimal
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, Schema, write_deltalake
from deltalake.transaction import AddAction, create_table_with_add_actions
from pyspark.sql import DataFrame, SparkSession

from backfill.errors import PublishError, SourceError
from backfill.io.delta import (
    PublishResult,
    _jvm_has_class,
    append_delta,
    delta_spark_available,
    is_delta_table,
    read_delta,
    replace_range,
    table_version,
    vacuum_orphans,
)

SCHEMA = "ts long, v string"


@pytest.fixture(scope="module")
def spark_delta() -> Iterator[SparkSession]:
    """One local Spark for this module; reuse (and leave running) a session someone else started."""
    active = SparkSession.getActiveSession()
    if active is not None:
        yield active
        return
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("test_delta")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        .getOrCreate()
    )
    yield spark
    spark.stop()


# ----------------------------------------------------------------------------- helpers


def _sorted(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Order-independent comparison form (repr sorts rows holding None too)."""
    return sorted(rows, key=repr)


def spark_rows(df: DataFrame) -> list[dict[str, Any]]:
    """Rows through Arrow, so timestamps come back tz-aware in UTC like delta-rs gives them."""
    return _sorted(df.toArrow().to_pylist())


def deltars_rows(path: str, version: int | None = None) -> list[dict[str, Any]]:
    """The same table through delta-rs' own reader."""
    return _sorted(DeltaTable(path, version=version).to_pyarrow_table().to_pylist())


def assert_readers_agree(spark: SparkSession, path: str) -> list[dict[str, Any]]:
    """read_delta and delta-rs return the same rows; returns them."""
    ours = spark_rows(read_delta(spark, path))
    assert ours == deltars_rows(path)
    return ours


def frame(spark: SparkSession, rows: list[tuple[Any, ...]], schema: str = SCHEMA) -> DataFrame:
    """A small DataFrame written as exactly one file."""
    return spark.createDataFrame(rows, schema).coalesce(1)


def files_on_disk(path: str) -> set[str]:
    """Every data file under the table folder (not the log)."""
    root = Path(path)
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and "_delta_log" not in p.parts}


def live_files(path: str) -> set[str]:
    """Files the latest snapshot references."""
    return set(pa.table(DeltaTable(path).get_add_actions(flatten=True)).column("path").to_pylist())


def ts_values(rows: list[dict[str, Any]]) -> list[Any]:
    """The ts column, sorted with NULLs first."""
    return sorted((r["ts"] for r in rows), key=lambda x: (x is not None, x))


# ----------------------------------------------------------------------------- engine + basic reads


def test_delta_spark_is_not_on_this_classpath(spark_delta: SparkSession) -> None:
    assert _jvm_has_class(spark_delta, "org.apache.spark.SparkContext")  # the probe itself works
    assert delta_spark_available(spark_delta) is False


def test_round_trip_keeps_types_values_and_stats(spark_delta: SparkSession, tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    schema = ("id long, i int, s string, d double, day date, at timestamp, flag boolean, amount decimal(10,2), "
              "tags array<int>, st struct<a:int,b:string>, local timestamp_ntz")
    at = dt.datetime(2024, 1, 2, 3, 4, 5, 678901, tzinfo=dt.timezone.utc)
    local = dt.datetime(2024, 5, 6, 7, 8, 9, 123456)
    rows = [
        (1, 7, "a b", 1.5, dt.date(2024, 1, 1), at, True, decimal.Decimal("1.23"), [1, 2], (1, "x"), local),
        (2, None, None, None, None, None, None, None, None, None, None),
    ]
    df = spark_delta.createDataFrame(rows, schema).coalesce(1)
    assert not is_delta_table(path) and table_version(path) is None
    assert append_delta(spark_delta, df, path, metadata={"run": "r1"}) == 0
    assert is_delta_table(path) and table_version(path) == 0
    back = read_delta(spark_delta, path)
    assert back.schema == df.schema
    got = assert_readers_agree(spark_delta, path)
    assert got == spark_rows(df)
    assert got[0]["at"] == at  # microseconds survive
    assert DeltaTable(path).history(1)[0]["run"] == "r1"
    [stats] = pa.table(DeltaTable(path).get_add_actions(flatten=True)).to_pylist()
    assert (stats["num_records"], stats["min.id"], stats["max.id"], stats["null_count.i"]) == (2, 1, 2, 1)
    assert stats["min.day"] == stats["max.day"] == dt.date(2024, 1, 1)
    assert stats["min.at"] == at.replace(microsecond=678000)  # Delta stats keep ms: min truncated ...
    assert stats["max.at"] == at.replace(microsecond=679000)  # ... and max rounded up, so pruning stays safe
    assert stats["min.local"] == local.replace(microsecond=123000)


def test_time_travel_by_version(spark_delta: SparkSession, tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    assert append_delta(spark_delta, frame(spark_delta, [(1, "a"), (2, "b")]), path) == 0
    assert append_delta(spark_delta, frame(spark_delta, [(3, "c")]), path) == 1
    assert ts_values(spark_rows(read_delta(spark_delta, path, version=0))) == [1, 2]
    assert ts_values(spark_rows(read_delta(spark_delta, path))) == [1, 2, 3]
    assert spark_rows(read_delta(spark_delta, path, version=0)) == deltars_rows(path, version=0)
    with pytest.raises(SourceError, match="version 7"):
        read_delta(spark_delta, path, version=7)


def test_missing_table_is_a_source_error_naming_the_path(spark_delta: SparkSession, tmp_path: Path) -> None:
    path = str(tmp_path / "nowhere")
    with pytest.raises(SourceError) as err:
        read_delta(spark_delta, path)
    assert path in str(err.value) and "_delta_log" in str(err.value)
    assert "\n" not in str(err.value)
    with pytest.raises(SourceError, match="nowhere"):
        vacuum_orphans(path)


def test_partitioned_table_from_deltars_restores_typed_partition_values(
    spark_delta: SparkSession, tmp_path: Path
) -> None:
    path = str(tmp_path / "p")
    data = pa.table({
        "offset": pa.array([1, 2, 3, 4, 5, 6], pa.int64()),
        "topic": ["a b", "a b", "ü+x", "50%", "plain", None],
        "day": pa.array([dt.date(2024, 1, d) for d in (1, 1, 2, 2, 3, 3)], pa.date32()),
    })
    write_deltalake(path, data, partition_by=["topic", "day"])
    df = read_delta(spark_delta, path)
    assert [(f.name, f.dataType.simpleString()) for f in df.schema.fields] == [
        ("offset", "bigint"), ("topic", "string"), ("day", "date")]
    got = assert_readers_agree(spark_delta, path)
    assert got == _sorted(data.to_pylist())
    pruned = spark_rows(read_delta(spark_delta, path, predicate="topic = 'a b'"))
    assert [r["offset"] for r in pruned] == [1, 2]
    with pytest.raises(PublishError, match="partitioned by"):
        replace_range(spark_delta, frame(spark_delta, [(1, "a", dt.date(2024, 1, 1))], "offset long, topic string, day date"),
                      path, column="offset", start=0, end=10)


def test_append_partitioned_then_read(spark_delta: SparkSession, tmp_path: Path) -> None:
    path = str(tmp_path / "p")
    schema = "offset long, topic string"
    append_delta(spark_delta, frame(spark_delta, [(1, "x y"), (2, "z")], schema), path, partition_by=["topic"])
    assert DeltaTable(path).metadata().partition_columns == ["topic"]
    assert append_delta(spark_delta, frame(spark_delta, [(3, "z")], schema), path) == 1
    assert [r["offset"] for r in assert_readers_agree(spark_delta, path)] == [1, 2, 3]
    with pytest.raises(PublishError, match="partitioned by"):
        append_delta(spark_delta, frame(spark_delta, [(4, "z")], schema), path, partition_by=[])


def test_refuses_deletion_vector_tables(spark_delta: SparkSession, tmp_path: Path) -> None:
    path = str(tmp_path / "dv")
    DeltaTable.create(path, pa.schema([("ts", pa.int64())]), configuration={"delta.enableDeletionVectors": "true"})
    with pytest.raises(SourceError, match="deletionVectors"):
        read_delta(spark_delta, path)


def test_predicate_prunes_files_by_our_stats(spark_delta: SparkSession, tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    for rows in ([(1, "a"), (5, "b")], [(300, "c"), (340, "d")]):
        append_delta(spark_delta, frame(spark_delta, rows), path)
    assert ts_values(spark_rows(read_delta(spark_delta, path, predicate="ts >= 300"))) == [300, 340]
    with pytest.raises(SourceError, match="predicate"):
        read_delta(spark_delta, path, predicate="ts >>> 3")


# ----------------------------------------------------------------------------- replace_range


def build_range_table(spark: SparkSession, path: str) -> dict[str, list[int | None]]:
    """One file per group, laid out around the range [100, 200) on purpose (written by delta-rs, which is fast)."""
    groups: dict[str, list[int | None]] = {
        "below": [0, 49],                # entirely outside: must stay untouched
        "straddle_start": [80, 99, 100, 101, 129],
        "inside": [120, 150, 179],       # entirely inside: removed without rewrite
        "straddle_end": [170, 199, 200, 259],
        "nulls": [150, None, 160],       # in-range stats but NULL rows, which lie outside the range
        "above": [300, 349],
    }
    for name, values in groups.items():
        rows = pa.table({"ts": pa.array(values, pa.int64()), "v": [f"{name}-{v}" for v in values]})
        write_deltalake(path, rows, mode="append")
    return groups


def test_replace_middle_range_keeps_rows_outside_including_straddling_files(
    spark_delta: SparkSession, tmp_path: Path
) -> None:
    path = str(tmp_path / "t")
    groups = build_range_table(spark_delta, path)
    untouched = live_files(path)
    before = assert_readers_agree(spark_delta, path)
    v_before = table_version(path)
    new = frame(spark_delta, [(100, "new-100"), (150, "new-150"), (199, "new-199")])
    result = replace_range(spark_delta, new, path, column="ts", start=100, end=200, metadata={"run": "r2"})
    kept = [r for r in before if r["ts"] is None or not 100 <= r["ts"] < 200]
    expected = _sorted(kept + [{"ts": t, "v": f"new-{t}"} for t in (100, 150, 199)])
    assert assert_readers_agree(spark_delta, path) == expected
    assert result.version == v_before + 1 == table_version(path)
    carried = [80, 99, None, 200, 259]  # from straddle_start, nulls, straddle_end
    assert result == PublishResult(result.version, 3, result.files_added, 4, len(carried))
    assert result.files_added >= 2  # the new rows and the carry-over
    still_live = untouched & live_files(path)
    assert len(still_live) == 2  # the 'below' and 'above' files were not rewritten
    assert DeltaTable(path).history(1)[0]["run"] == "r2"
    assert spark_rows(read_delta(spark_delta, path, version=v_before)) == before  # time travel still works
    assert sum(len(v) for v in groups.values()) == len(before)


def test_files_without_stats_are_treated_as_straddling(spark_delta: SparkSession, tmp_path: Path) -> None:
    path = tmp_path / "t"
    path.mkdir()
    data = pa.table({"ts": pa.array([50, 150, 250, None], pa.int64()), "v": ["a", "b", "c", "d"]})
    pq.write_table(data, path / "foreign.parquet")
    bare = AddAction("foreign.parquet", (path / "foreign.parquet").stat().st_size, {}, 0, True, '{"numRecords": 4}')
    create_table_with_add_actions(str(path), Schema.from_arrow(data.schema), [bare])
    result = replace_range(spark_delta, frame(spark_delta, [(120, "n")]), str(path), column="ts", start=100, end=200)
    assert (result.files_removed, result.rows_carried_over, result.rows_written) == (1, 3, 1)
    assert ts_values(assert_readers_agree(spark_delta, str(path))) == [None, 50, 120, 250]


def test_replace_range_on_empty_location_creates_the_table(spark_delta: SparkSession, tmp_path: Path) -> None:
    path = str(tmp_path / "new")
    result = replace_range(spark_delta, frame(spark_delta, [(5, "a"), (6, "b")]), path, column="ts", start=0, end=10)
    assert result == PublishResult(0, 2, 1, 0, 0)
    assert DeltaTable(path).metadata().partition_columns == []
    assert ts_values(assert_readers_agree(spark_delta, path)) == [5, 6]


def test_rows_outside_the_range_are_refused_and_table_unchanged(spark_delta: SparkSession, tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    append_delta(spark_delta, frame(spark_delta, [(1, "a"), (150, "b")]), path)
    before, disk = assert_readers_agree(spark_delta, path), files_on_disk(path)
    for bad in ([(100, "ok"), (200, "end is exclusive")], [(None, "null is outside")]):
        with pytest.raises(PublishError, match=r"outside \[100, 200\)"):
            replace_range(spark_delta, frame(spark_delta, bad), path, column="ts", start=100, end=200)
    assert table_version(path) == 0
    assert assert_readers_agree(spark_delta, path) == before
    assert files_on_disk(path) == disk  # staged files were cleaned up


def test_before_commit_failure_leaves_table_unchanged(spark_delta: SparkSession, tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    build_range_table(spark_delta, path)
    before, disk, version = assert_readers_agree(spark_delta, path), files_on_disk(path), table_version(path)
    seen: list[int] = []

    def audit() -> None:
        seen.append(len(files_on_disk(path) - disk))  # the new files exist, unreferenced, at this point
        raise RuntimeError("audit failed")

    with pytest.raises(RuntimeError, match="audit failed"):
        replace_range(spark_delta, frame(spark_delta, [(150, "x")]), path, column="ts", start=100, end=200,
                      before_commit=audit)
    assert seen and seen[0] >= 2  # new rows + carry-over were staged before the hook
    assert table_version(path) == version
    assert assert_readers_agree(spark_delta, path) == before
    assert files_on_disk(path) == disk


def test_rerun_is_idempotent_and_empty_df_still_commits(spark_delta: SparkSession, tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    build_range_table(spark_delta, path)
    new = frame(spark_delta, [(100, "n"), (199, "m")])
    first = replace_range(spark_delta, new, path, column="ts", start=100, end=200)
    content = assert_readers_agree(spark_delta, path)
    second = replace_range(spark_delta, new, path, column="ts", start=100, end=200)
    assert second.version == first.version + 1
    # carried rows went to one file per side, so the rerun only swaps out the first run's own files
    assert (second.rows_carried_over, second.rows_written, second.files_removed) == (0, 2, 1)
    assert assert_readers_agree(spark_delta, path) == content
    empty = replace_range(spark_delta, frame(spark_delta, []), path, column="ts", start=100, end=200)
    assert empty.version == second.version + 1 and empty.rows_written == 0 and empty.files_removed >= 1
    rows = assert_readers_agree(spark_delta, path)
    assert rows == [r for r in content if r["ts"] is None or not 100 <= r["ts"] < 200]


def test_open_ended_and_whole_table_ranges(spark_delta: SparkSession, tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    build_range_table(spark_delta, path)
    replace_range(spark_delta, frame(spark_delta, [(500, "late")]), path, column="ts", start=200, end=None)
    assert ts_values(assert_readers_agree(spark_delta, path)) == [
        None, 0, 49, 80, 99, 100, 101, 120, 129, 150, 150, 160, 170, 179, 199, 500]
    replace_range(spark_delta, frame(spark_delta, [(None, "n"), (7, "x")]), path, column="ts", start=None, end=None)
    assert ts_values(assert_readers_agree(spark_delta, path)) == [None, 7]


def test_concurrent_commit_during_publish_is_refused(spark_delta: SparkSession, tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    append_delta(spark_delta, frame(spark_delta, [(150, "old")]), path)
    disk = files_on_disk(path)

    def other_writer() -> None:
        write_deltalake(path, pa.table({"ts": pa.array([160], pa.int64()), "v": ["concurrent"]}), mode="append")

    with pytest.raises(PublishError, match="concurrent writer"):
        replace_range(spark_delta, frame(spark_delta, [(150, "new")]), path, column="ts", start=100, end=200,
                      before_commit=other_writer)
    assert table_version(path) == 1
    assert sorted(r["v"] for r in assert_readers_agree(spark_delta, path)) == ["concurrent", "old"]
    assert len(files_on_disk(path) - disk) == 1  # only the other writer's file remains


def test_schema_mismatch_names_the_columns(spark_delta: SparkSession, tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    append_delta(spark_delta, frame(spark_delta, [(1, "a")]), path)
    wrong = frame(spark_delta, [(1, 2)], "ts long, w int")
    with pytest.raises(PublishError, match=r"missing \['v'\], unexpected \['w'\]"):
        replace_range(spark_delta, wrong, path, column="ts", start=0, end=10)
    with pytest.raises(PublishError, match=r"v \(int vs table string\)"):
        append_delta(spark_delta, frame(spark_delta, [(1, 2)], "ts long, v int"), path)
    with pytest.raises(PublishError, match="cast it to long"):
        replace_range(spark_delta, frame(spark_delta, [("1", "a")], "ts string, v string"), path,
                      column="ts", start=0, end=10)
    assert table_version(path) == 0


def test_vacuum_removes_orphans_and_stale_staging(spark_delta: SparkSession, tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    append_delta(spark_delta, frame(spark_delta, [(1, "a")]), path)
    replace_range(spark_delta, frame(spark_delta, [(2, "b")]), path, column="ts", start=0, end=10)
    (tmp_path / "t" / "orphan.parquet").write_bytes(b"not referenced")
    (tmp_path / "t" / "_staging-dead").mkdir()
    (tmp_path / "t" / "_staging-dead" / "part-0.parquet").write_bytes(b"x")
    removed = vacuum_orphans(path)
    assert "orphan.parquet" in removed and "_staging-dead/" in removed
    assert files_on_disk(path) == live_files(path)
    assert ts_values(assert_readers_agree(spark_delta, path)) == [2]
