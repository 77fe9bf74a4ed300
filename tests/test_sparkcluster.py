"""Smoke test: a real standalone cluster runs Python and shuffles in executor JVMs, then vanishes."""
from __future__ import annotations

import sys
from pathlib import Path

import psutil
import pytest
from pyspark import SparkContext
from pyspark.sql import functions as F

from backfill.session import get_spark

try:
    from sparkcluster import cluster_processes, cluster_session_ctx, executor_count, standalone_cluster
except ImportError:  # rootdir/importlib import modes do not put tests/ on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from sparkcluster import cluster_processes, cluster_session_ctx, executor_count, standalone_cluster

N_ROWS = 10_000
N_KEYS = 7


@pytest.mark.spark
@pytest.mark.slow
def test_standalone_cluster_runs_python_and_shuffle_in_executors(tmp_path: Path) -> None:
    # the suite shares one local session; the cluster helper must replace it, not reuse it
    get_spark("local")  # the project's session (with the pinned jars) is the one the JVM starts with
    work = tmp_path / "cluster"
    out = tmp_path / "agg.parquet"
    executor_pids: set[int] = set()

    with standalone_cluster(work, cores=2, memory="2g") as master_url:
        assert master_url.startswith("spark://127.0.0.1:")
        with cluster_session_ctx(master_url, min_executors=2) as spark:
            sc = spark.sparkContext
            assert sc.master == master_url
            assert executor_count(spark) == 2
            assert spark._jsc.sc().getExecutorMemoryStatus().size() == 3  # driver + 2 executors
            driver_jvm = sc._gateway.proc.pid  # type: ignore[union-attr]

            # a closure, not a module-level function: cloudpickle ships it by value, so the
            # executors need not import this test module (tests/ is not on their sys.path)
            def tag(batches):  # type: ignore[no-untyped-def]
                import os

                import pyarrow as pa

                import backfill  # importable on executors via the worker's PYTHONPATH

                jvm, executor_id = -1, "none"
                for ancestor in psutil.Process().parents():  # python worker -> daemon -> JVM
                    cmd = ancestor.cmdline()
                    if any(a.endswith("CoarseGrainedExecutorBackend") for a in cmd):
                        jvm, executor_id = ancestor.pid, cmd[cmd.index("--executor-id") + 1]
                        break
                facts = {
                    "jvm": (jvm, pa.int64()),
                    "executor": (executor_id, pa.string()),
                    "python": (sys.executable, pa.string()),
                    "marker": (os.environ.get("BACKFILL_SPARK_CLUSTER", ""), pa.string()),
                    "version": (backfill.__version__, pa.string()),
                }
                for batch in batches:
                    for name, (value, typ) in facts.items():
                        batch = batch.append_column(name, pa.array([value] * batch.num_rows, typ))
                    yield batch

            tagged = spark.range(0, N_ROWS, numPartitions=4).mapInArrow(
                tag,
                "id long, jvm long, executor string, python string, marker string, version string",
            )
            tagged.cache()
            where = tagged.select("jvm", "executor", "python", "marker", "version").distinct().collect()
            executor_pids.update(p.pid for p in cluster_processes(work)
                                 if "CoarseGrainedExecutorBackend" in " ".join(p.cmdline()))

            assert {r.executor for r in where} == {"0", "1"}  # both executors ran tasks
            assert {r.jvm for r in where} <= executor_pids and driver_jvm not in executor_pids
            assert {r.python for r in where} == {sys.executable}
            assert {r.marker for r in where} == {str(work.resolve())}
            assert len({r.version for r in where}) == 1

            agg = (
                tagged.groupBy((F.col("id") % N_KEYS).alias("k"))  # shuffle across executors
                .agg(F.count("*").alias("n"), F.sum("id").alias("total"))
            )
            agg.write.parquet(str(out))
            back = {r.k: (r.n, r.total) for r in spark.read.parquet(str(out)).collect()}

    expected = {k: (len(range(k, N_ROWS, N_KEYS)), sum(range(k, N_ROWS, N_KEYS))) for k in range(N_KEYS)}
    assert back == expected
    assert list(out.glob("part-*.parquet"))  # written by executors, visible to the driver
    assert SparkContext._active_spark_context is None
    assert len(executor_pids) == 2
    assert cluster_processes(work) == []
    alive = [pid for pid in executor_pids
             if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert alive == []
