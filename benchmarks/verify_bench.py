"""Benchmark: `backfill verify` on a ~10M-row output next to the `backfill run` that produced it.

    python benchmarks/verify_bench.py [--records 10000000] [--out benchmarks/results/verify-10m.json]

One process, one SparkSession (conf/local.yaml). Steps, each timed:
  run     run_plan on the aggregate_bench data (parquet, 4 partitions, 3% disorder): tumbling 1m, grace 30s,
          emit updates, so the output has about one row per record (~10M rows), Delta sink + Delta ledger
  stream  a "streaming output" derived from the published output with Spark (partition = task,
          offset = emit_seq): the last update of 1 in 10,000 windows written twice, of 1 in 20,000 changed (unexplained)
  verify  verify_plan + write_report: normalise, reconcile, attribute, GX suite, samples, report
Data and outputs go to benchmarks/work/ (git-ignored).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--out", default=str(HERE / "results" / "verify-10m.json"))
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    import aggregate_bench as ab
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from backfill.plan.builder import build_plan
    from backfill.plan.evaluator import run_plan
    from backfill.session import get_spark
    from backfill.jobspec.load import load_job
    from backfill.verify.report import write_report
    from backfill.verify.runner import Target, verify_plan

    work = HERE / "work"
    data = work / "data" / f"n{args.records}-d0.03-p4-s0"
    if not data.is_dir():
        ab.generate(data, args.records, 0.03, 4, 0, 500_000, work / "data" / "verify-sample", 1000)
    root = work / "verify"
    shutil.rmtree(root, ignore_errors=True)
    jobs = root / "jobs"
    jobs.mkdir(parents=True)
    (jobs / "event.schema.json").write_text(json.dumps(ab.SCHEMA))
    job = jobs / "verify-bench.yaml"
    job.write_text(f"""name: verify-bench
sources:
  events: {{format: parquet, path: {os.path.relpath(data, jobs)}, value: {{format: json, schema: event.schema.json}}}}
operators:
  - name: amount_1m
    aggregate:
      input: events
      window: {{type: tumbling, size: 1m, grace: 30s}}
      aggregations: {{cnt: count(), amt: sum(value.amount)}}
      emit: updates
sinks:
  amount_1m: {{format: delta, path: ../out/amount_1m}}
  _ledger: {{format: delta, path: ../out/ledger}}
""")
    t = time.perf_counter()
    spark = get_spark("local")
    startup = time.perf_counter() - t
    plan = build_plan(load_job(job))
    t = time.perf_counter()
    summary = run_plan(plan, spark).to_dict()
    run_s = time.perf_counter() - t
    print(f"run: {run_s:.1f} s, {summary['operators']['amount_1m']['outputs']:,} output rows", flush=True)

    t = time.perf_counter()
    from backfill.io.delta import read_delta

    out = read_delta(spark, str(root / "out" / "amount_1m"))
    stream = out.select("key", "window_start", "window_end", "cnt", "amt", "ts",
                        F.col("task").cast("int").alias("partition"), F.col("emit_seq").alias("offset"))
    last = F.col("offset") == F.max("offset").over(Window.partitionBy("key", "window_start"))
    changed = stream.withColumn("_last", last).withColumn(
        "cnt", F.when(F.col("_last") & (F.xxhash64("key", "window_start") % 20000 == 0), F.col("cnt") + 7)
        .otherwise(F.col("cnt"))).drop("_last")
    # at-least-once: a final update written again later (same values, a later offset)
    dupes = stream.withColumn("_last", last).where(F.col("_last") & (F.xxhash64("key", "window_start") % 10000 == 1)) \
        .drop("_last").withColumn("offset", F.col("offset") + 1_000_000_000)
    changed.unionByName(dupes).write.mode("overwrite").parquet(str(root / "stream"))
    stream_s = time.perf_counter() - t
    rows = spark.read.parquet(str(root / "stream")).count()
    print(f"stream output: {rows:,} rows ({stream_s:.1f} s)", flush=True)

    t = time.perf_counter()
    outcome = verify_plan(spark, plan, [Target("amount_1m", str(root / "stream"), None)], {}, {},
                          root / "report", lambda s: print(f"  - {s} ({time.perf_counter() - t:.0f} s)", flush=True))
    write_report(outcome)
    verify_s = time.perf_counter() - t
    result = {"records": args.records, "output_rows": summary["operators"]["amount_1m"]["outputs"],
              "stream_rows": rows, "spark_startup_s": round(startup, 1), "run_s": round(run_s, 1),
              "make_stream_s": round(stream_s, 1), "verify_s": round(verify_s, 1),
              "verify_sections_s": [round(s.seconds, 1) for s in outcome.sections], "verdict": outcome.verdict,
              "counts": outcome.counts, "causes": outcome.causes, "loadavg": os.getloadavg(),
              "engine": ab.engine_fingerprint(),
              "command": "python benchmarks/verify_bench.py --records %d" % args.records}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
