"""A one-queue task is ordered by backfill's operator (one streamed pass over each sorted task), or without
it by Spark's windows, over whole tasks or chunk by chunk (bounded window partitions): the running values
must equal a plain pass over the task's records in offset order, across chunk borders, gaps, nulls and
dropped records."""
from __future__ import annotations

import random

from pyspark.sql import functions as F

from backfill.order import tasks
from tests.conftest import delta_tables


def _expected(rows):
    """Per task in offset order: partition time with and before the record, seq, stream time of key-ful."""
    out = {}
    for task in {r["partition"] for r in rows}:
        pt = st = None
        seq = 0
        for r in sorted((r for r in rows if r["partition"] == task), key=lambda r: r["offset"]):
            before = pt
            if r["ts"] is not None:
                pt = r["ts"] if pt is None else max(pt, r["ts"])
            if r["_drop"] is None:
                seq += 1
            if r["ts"] is not None and r["key"] is not None:
                st = r["ts"] if st is None else max(st, r["ts"])
            out[(task, r["offset"])] = (pt, before, seq, st)
    return out


def test_chunked_running_values_equal_one_pass_over_the_task(spark, monkeypatch):
    monkeypatch.setattr(tasks, "CHUNK_OFFSETS", 4)
    monkeypatch.setattr(tasks, "CHUNKED_PARTITIONS", 3)
    rng = random.Random(3)
    rows = []
    for task in range(3):
        offset = rng.randrange(0, 5)
        for _ in range(rng.randrange(0, 40)):
            offset += rng.choice([1, 1, 1, 2, 7])  # gaps (compaction, transaction markers), chunks left empty
            ts = None if rng.random() < 0.1 else rng.randrange(0, 100)
            rows.append({"partition": task, "offset": offset, "ts": ts,
                         "key": None if rng.random() < 0.2 else "k",
                         "_drop": "invalid_timestamp" if ts is None and rng.random() < 0.5 else None})
    df = spark.createDataFrame(rows, "partition int, offset long, ts long, key string, _drop string")
    stored = []
    got = tasks.order_records(df, {"st": F.col("key").isNotNull()}, single_queue=True, stored=stored).collect()
    assert len(stored) == 1  # the chunks' running values, stored once
    assert len(got) == len(rows)  # nothing lost or doubled by the carry join
    expected = _expected(rows)
    for r in got:
        assert (r["_partition_time"], r["_partition_time_before"], r["seq"], r["st"]) == \
            expected[(r["task"], r["offset"])], (r["task"], r["offset"])


def test_streamed_running_values_equal_one_pass_over_the_task(spark, monkeypatch):
    """backfill's operator (jvm/ops RunningValues): tasks sharing a Spark partition, a null task, null
    timestamps, dropped records, a record reaching two operators or none; spread by task, never shuffled again."""
    rng = random.Random(5)
    rows = []
    for task in (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, None):  # ten tasks over 8 shuffle partitions: some share one
        for offset in rng.sample(range(200), rng.randrange(0, 30)):
            ts = None if rng.random() < 0.1 else rng.randrange(0, 100)
            rows.append({"partition": task, "offset": offset, "ts": ts,
                         "key": rng.choice([None, "k", "j"]),
                         "_drop": "invalid_timestamp" if ts is None and rng.random() < 0.5 else None})
    df = spark.createDataFrame(rows, "partition int, offset long, ts long, key string, _drop string")
    assert tasks.running_values_operator(df) is not None, "jvm/lib/ops: run scripts/setup.sh"
    ordered = tasks.order_records(df, {"st": F.col("key").isNotNull(), "sj": F.col("key") == "j"},
                                  single_queue=True, stored=[])
    got = ordered.collect()
    assert len(got) == len(rows)
    expected = _expected(rows)
    for r in got:
        assert (r["_partition_time"], r["_partition_time_before"], r["seq"], r["st"]) == \
            expected[(r["task"], r["offset"])], (r["task"], r["offset"])
        js = [x["ts"] for x in rows if x["partition"] == r["task"] and x["offset"] <= r["offset"]
              and x["key"] == "j" and x["ts"] is not None]
        assert r["sj"] == (max(js) if js else None)
    grouped = ordered.groupBy("task", "key").count()._jdf.queryExecution().executedPlan().toString()
    assert "Exchange" not in grouped, grouped  # the operator says how its rows are spread
    monkeypatch.setattr(tasks, "USE_OPERATOR", False)  # Spark's windows over whole tasks: the same values
    windows = tasks.order_records(df, {"st": F.col("key").isNotNull(), "sj": F.col("key") == "j"},
                                  single_queue=True, stored=None)
    assert "Window" in windows._jdf.queryExecution().executedPlan().toString()
    columns = ["task", "offset", "seq", "_partition_time", "_partition_time_before", "st", "sj"]
    assert sorted(map(tuple, windows.select(columns).collect()), key=repr) == \
        sorted(map(tuple, ordered.select(columns).collect()), key=repr)


def test_records_cross_the_ordering_narrowed_and_come_back_whole(spark, monkeypatch):
    """The streamed ordering carries a record as narrow as it goes (a one-source plan's `source` and
    `source_rank` left out, `partition` as `task`, the ledger's columns packed and null but for unusual
    records, `_raw_ts` only where it is not `ts`): after it every column is back with its type, place and
    value, as Spark's windows give them, and a stream time's predicate may read any of them."""
    rng = random.Random(7)
    rows = []
    for p in (0, 1, 2):
        for o in range(30):
            raw = rng.choice([None, -5, (o * 7) % 11, (o * 7) % 11])
            ts = raw if raw is not None and raw >= 0 else rng.choice([None, 4])  # a policy's partition time
            problem = "bad json" if rng.random() < 0.1 else None
            rows.append((p, o, ts, raw, "k" if o % 3 else None, problem, {"file": "f", "row": o} if problem else None,
                         "fail" if rng.random() < 0.05 else None, "invalid_timestamp" if ts is None else None))
    schema = ("partition int, offset long, ts long, _raw_ts long, key string, _problem string, "
              "_where struct<file: string, row: long>, _fatal string, _drop string")
    df = spark.createDataFrame(rows, schema).select(
        F.lit("clicks").alias("source"), F.lit(3).cast("int").alias("source_rank"), "*")
    stream_times = {"st": (F.col("source") == "clicks") & F.col("key").isNotNull() & F.col("_problem").isNull()}
    narrowed = tasks.order_records(df, stream_times, single_queue=True, stored=[],
                                   constants={"source": "clicks", "source_rank": 3})
    assert narrowed.columns[:len(df.columns) + 1] == [*df.columns, "task"]
    monkeypatch.setattr(tasks, "USE_OPERATOR", False)
    windows = tasks.order_records(df, stream_times, single_queue=True, stored=None)
    assert "Window" in windows._jdf.queryExecution().executedPlan().toString()
    assert [(f.name, f.dataType) for f in narrowed.schema.fields] == \
        [(f.name, f.dataType) for f in windows.select(narrowed.columns).schema.fields]
    assert sorted(map(tuple, narrowed.collect()), key=repr) == \
        sorted(map(tuple, windows.select(narrowed.columns).collect()), key=repr)
    assert any(r["_raw_ts"] != r["ts"] for r in narrowed.collect())  # the packed case happened


def test_small_inputs_are_ordered_whole_and_large_ones_in_chunks(spark, monkeypatch, tmp_path):
    df = spark.createDataFrame([(0, 1, 5, "k", None)], "partition int, offset long, ts long, key string, _drop string")
    assert tasks.ordering_partitions(df) is None  # no file-size estimate
    path = spark.range(1000).selectExpr("cast(id % 2 as int) as partition", "id as offset", "id as ts",
                                        "'k' as key", "cast(null as string) as _drop")
    folder = str(tmp_path / "records")
    path.write.mode("overwrite").parquet(folder)
    monkeypatch.setattr(tasks, "SHUFFLE_BYTES", 1)  # Spark's estimate: the files' bytes
    monkeypatch.setattr(tasks, "CHUNKED_ABOVE", 0)
    assert tasks.ordering_partitions(spark.read.parquet(folder)) == min(10_000, sum(
        f.stat().st_size for f in (tmp_path / "records").glob("*.parquet")))
    monkeypatch.setattr(tasks, "CHUNKED_ABOVE", 1 << 30)
    assert tasks.ordering_partitions(spark.read.parquet(folder)) is None


DEMO_TABLES = ("gold/clicks_per_user_1m", "gold/clicks_per_user_5m_hop", "gold/user_sessions", "ledger/clicks")


def test_the_demo_job_ordered_in_chunks_publishes_what_it_publishes_ordered_whole(spark, monkeypatch, tmp_path):
    """Every operator kind of the demo (final and every-update windows, a fold in processing order, sessions),
    the ledger and the counts, with each task cut into chunks of 64 offsets over 3 Spark partitions."""
    from rich.console import Console

    from backfill.demo import SOURCE, generate_clicks, install_job
    from backfill.execute import execute

    generate_clicks(str(tmp_path / SOURCE), n=3_000)
    job = install_job(tmp_path)
    quiet = Console(stderr=True, quiet=True)
    whole = execute(job, None, None, None, "spark", quiet, quiet=True)
    expected = delta_tables(tmp_path, DEMO_TABLES)
    monkeypatch.setattr(tasks, "CHUNK_OFFSETS", 64)
    monkeypatch.setattr(tasks, "CHUNKED_PARTITIONS", 3)
    chunked = execute(job, None, None, None, "spark", quiet, quiet=True)
    assert delta_tables(tmp_path, DEMO_TABLES) == expected
    keys = ("records_read", "records_processed", "ledger", "ledger_rows")
    assert {k: chunked[k] for k in keys} == {k: whole[k] for k in keys}
    assert {k: {f: v for f, v in op.items() if f != "seconds"} for k, op in chunked["operators"].items()} == \
        {k: {f: v for f, v in op.items() if f != "seconds"} for k, op in whole["operators"].items()}
