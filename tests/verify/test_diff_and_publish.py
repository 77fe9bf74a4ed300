"""`backfill diff` between two versions of one Delta table; expectations that fail block a publish."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from typer.testing import CliRunner

from backfill.cli import app
from backfill.errors import PublishError
from backfill.jobspec.models import OperatorSpec

pytestmark = [pytest.mark.spark]
SCHEMA = pa.schema([("key", pa.string()), ("window_start", pa.int64()), ("window_end", pa.int64()),
                    ("n", pa.int64()), ("amount", pa.float64()), ("ts", pa.int64())])


def _table(rows: list[tuple]) -> pa.Table:
    return pa.Table.from_pylist([dict(zip(SCHEMA.names, r)) for r in rows], schema=SCHEMA)


def test_diff_two_versions_of_one_delta_table(tmp_path: Path, spark: Any) -> None:
    path = str(tmp_path / "gold")
    write_deltalake(path, _table([("a", 0, 60_000, 3, 1.0, 10), ("b", 0, 60_000, 1, 2.0, 20),
                                  ("c", 0, 60_000, 2, 3.0, 30), ("d", 0, 60_000, 1, 4.0, 40)]))
    write_deltalake(path, _table([("a", 0, 60_000, 3, 1.004, 10), ("b", 0, 60_000, 2, 2.0, 20),
                                  ("c", 0, 60_000, 2, 3.0, 30), ("e", 0, 60_000, 1, 5.0, 50)]), mode="overwrite")
    result = CliRunner().invoke(app, ["diff", f"{path}@0", path, "--on", "key,window_start", "--tolerance",
                                      "amount=abs:0.01", "--json", "--report", str(tmp_path / "report")])
    assert result.exit_code == 1, result.stderr
    report = json.loads(result.stdout)
    assert report["verdict"] == "differences" and "causes" not in report
    assert report["counts"] == {"match": 2, "mismatch": 1, "missing_in_new": 1, "extra_in_new": 1,
                                "duplicate_in_new": 0}
    mismatch = next(s for s in report["sections"][0]["samples"] if s["category"] == "mismatch")
    assert (mismatch["key"], mismatch["diff_columns"]) == ("b", ["n"])
    assert (tmp_path / "report" / "index.html").is_file()
    same = CliRunner().invoke(app, ["diff", f"{path}@1", path, "--on", "key", "--on", "window_start", "--json",
                                    "--report", str(tmp_path / "same")])
    assert same.exit_code == 0 and json.loads(same.stdout)["verdict"] == "match"


@pytest.mark.parametrize("tolerance,old,new,category", [  # values exact in binary: the bound itself is exact
    ("amount=abs:0.5", 1.0, 1.5, "match"), ("amount=abs:0.5", 1.0, 1.5001, "mismatch"),
    ("amount=rel:0.25", 3.0, 4.0, "match"), ("amount=rel:0.25", 3.0, 4.0001, "mismatch"),
    ("amount=abs:0.5,rel:0.25", 2.5, 4.0, "match"), ("amount=abs:0.5,rel:0.25", 2.5, 4.01, "mismatch"),
])
def test_tolerance_holds_up_to_its_bound_and_not_beyond(tmp_path: Path, spark: Any, tolerance: str, old: float,
                                                        new: float, category: str) -> None:
    """|old - new| <= abs + rel * |new| (the right-hand side is the reference of rel)."""
    old_path, new_path = str(tmp_path / "old"), str(tmp_path / "new")
    write_deltalake(old_path, _table([("a", 0, 60_000, 1, old, 10)]))
    write_deltalake(new_path, _table([("a", 0, 60_000, 1, new, 10)]))
    result = CliRunner().invoke(app, ["diff", old_path, new_path, "--on", "key,window_start", "--tolerance",
                                      tolerance, "--json", "--report", str(tmp_path / "report")])
    assert json.loads(result.stdout)["counts"][category] == 1, result.stdout


def test_failing_expectations_block_the_delta_commit(tmp_path: Path, spark: Any) -> None:
    from backfill.io.sinks import write_output
    from backfill.checks.expectations import PublishChecks

    from backfill.ops.aggregate import WindowAggregate

    spec = OperatorSpec.model_validate({"name": "agg", "aggregate": {
        "input": "s", "window": {"type": "tumbling", "size": "1m", "grace": "0ms"},
        "aggregations": {"n": "count()"}, "emit": "final"}})
    op = WindowAggregate(name="agg", kind="aggregate", inputs=("s",), window="tumbling 1m", emit="final", sink=None,
                         spec=spec)
    results: dict[str, Any] = {}
    checks = PublishChecks(spark, results)
    path = str(tmp_path / "gold")
    good = spark.createDataFrame([("a", 0, 60_000, 1, 5)], "key string, window_start long, window_end long, n long, "
                                                         "ts long")
    write_output(spark, good, "delta", path, column="window_start", start=None, end=None, metadata={},
                 audit=checks.for_output(op))
    assert results["agg.output"]["success"] and DeltaTable(path).version() == 0
    bad = spark.createDataFrame([("a", 0, 60_000, 1, 5), ("a", 0, 60_000, 2, 7), (None, 30_000, 90_000, 1, 95_000)],
                                good.schema)
    with pytest.raises(PublishError) as caught:
        write_output(spark, bad, "delta", path, column="window_start", start=None, end=None, metadata={},
                     audit=checks.for_output(op))
    message = str(caught.value)
    assert "agg.output: expectations failed before publish" in message and "keys not null (1 rows)" in message
    assert "window starts aligned" in message and "(key, window_start) unique" in message
    assert DeltaTable(path).version() == 0  # nothing committed
    assert DeltaTable(path).to_pyarrow_table().num_rows == 1


def test_duplicated_groups_are_exact_whatever_their_hashes(spark: Any) -> None:
    """The uniqueness check groups by a hash first: a repeated group is found with its count, nulls group as
    Spark groups them, and two groups of one hash ((null, 5) and (5, null) hash alike) are not duplicates."""
    from pyspark.sql import functions as F

    from backfill.checks.expectations import duplicated_groups

    rows = [("a", 1), ("a", 1), ("a", 1), ("b", 1), (None, 5), ("5", None), (None, None), (None, None), ("c", 2)]
    df = spark.createDataFrame(rows, "key string, window_start long")
    found = {(r["key"], r["window_start"]): r["count"]
             for r in duplicated_groups(df, ("key", "window_start")).collect()}
    assert found == {("a", 1): 3, (None, None): 2}
    longs = spark.createDataFrame([(None, 5), (5, None), (1, 1)], "a long, b long")
    assert longs.select(F.xxhash64("a", "b")).distinct().count() == 2  # the first two collide
    assert duplicated_groups(longs, ("a", "b")).count() == 0


@pytest.mark.parametrize("stride", [1, 7, 60_000])
def test_duplicated_groups_by_blocks_of_values_match_a_count(spark: Any, stride: int) -> None:
    """The first aggregation groups 64 values of the last column (`stride` apart) under one bit mask: random
    rows of aligned, unaligned, negative, extreme and null values, with a hash-colliding pair, give exactly
    the repeated groups a plain count finds, for one column and for two."""
    import random
    from collections import Counter

    from backfill.checks.expectations import duplicated_groups

    rng = random.Random(stride)
    values = [None, -2**63, 2**63 - 1, 63 * stride, 64 * stride, -stride, 1, 0]
    for _ in range(12):
        rows = [(rng.choice(["a", "b", "5", None]), rng.choice([*values, rng.randint(-3, 200) * stride,
                                                                rng.randint(-500, 500)]))
                for _ in range(rng.randint(0, 40))] + [(None, 5), ("5", None)]
        df = spark.createDataFrame(rows, "key string, window_start long")
        expected = {k: n for k, n in Counter(rows).items() if n > 1}
        found = {(r["key"], r["window_start"]): r["count"]
                 for r in duplicated_groups(df, ("key", "window_start"), stride).collect()}
        assert found == expected
        alone = {k: n for k, n in Counter(v for _, v in rows).items() if n > 1}
        assert {r["window_start"]: r["count"] for r in
                duplicated_groups(df.select("window_start"), ("window_start",), stride).collect()} == alone
