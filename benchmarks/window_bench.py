"""Benchmark: exact session and sliding windows (backfill) against the nearest plain Spark query.

    python benchmarks/window_bench.py [--records 1000000] [--big] [--kinds session,sliding] [--repeat 1]
                                      [--gap 30s] [--diff 1s] [--out benchmarks/results/windows.json]

The data is aggregate_bench.py's (cached in benchmarks/work/data/): 4 partitions, Zipf keys (the top key about
8% of the records), 3% of records delayed by up to 180 s. Everything runs in one process and one SparkSession.

  session exact   `backfill run` of a job: session window (gap, grace 30 s), count() and sum(value.amount),
                  emit: final, parquet sink (read, order, kernel per task, values, checks, publish, manifest)
  session plain   groupBy(key, session_window(ts, gap)).agg(count, sum): the usual gap-based sessionisation,
                  no processing order, no lateness, no store
  sliding exact   the same with a sliding window (time difference, grace 30 s)
  sliding plain   per key, the aggregates over [ts - D, ts] and over (ts, ts + 1 + D] of every record
                  (two range frames): the windows a "records within D" query gives, no order, no lateness

Each variant prints seconds, records/s and peak memory (Python + JVM RSS); the JSON result has them all.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from aggregate_bench import BIG, SCHEMA, PeakRSS, ensure_data, gb, machine  # noqa: E402

from backfill.jobspec.durations import parse_duration  # noqa: E402

GRACE = "30s"


def write_job(jobs: Path, kind: str, width: str, data: Path, out: Path) -> Path:
    """One source (parquet, JSON values), one session or sliding aggregate, emit final, parquet sink."""
    jobs.mkdir(parents=True, exist_ok=True)
    (jobs / "event.schema.json").write_text(json.dumps(SCHEMA, indent=1))
    window = (f"{{type: session, gap: {width}, grace: {GRACE}}}" if kind == "session"
              else f"{{type: sliding, time_difference: {width}, grace: {GRACE}}}")
    path = jobs / f"{kind}.yaml"
    path.write_text(f"""# written by benchmarks/window_bench.py
name: window-bench-{kind}
sources:
  events:
    format: parquet
    path: {os.path.relpath(data, jobs)}
    key: {{format: string}}
    value: {{format: json, schema: event.schema.json}}
    timestamp: {{extractor: record}}
operators:
  - name: w
    aggregate:
      input: events
      window: {window}
      aggregations: {{cnt: count(), amt: sum(value.amount)}}
      emit: final
sinks:
  w: {{format: parquet, path: {os.path.relpath(out / kind, jobs)}}}
""")
    return path


def run_exact(spark: Any, job: Path, operator: str = "w") -> dict[str, Any]:
    """`run_plan` of a one-operator job, timed, with its operator's counts (rules_bench.py uses it too)."""
    from backfill.jobspec.load import load_job
    from backfill.plan import evaluator
    from backfill.plan.builder import build_plan

    with PeakRSS() as mem:
        t = time.perf_counter()
        summary = evaluator.run_plan(build_plan(load_job(job), None, None), spark, lambda _: None).to_dict()
        seconds = time.perf_counter() - t
    op = summary["operators"][operator]
    return {"seconds": round(seconds, 3), "outputs": op["outputs"], "incomplete": op["incomplete_windows"],
            "dropped": op["dropped"], **mem.to_dict()}


def run_plain(spark: Any, kind: str, width_ms: int, data: Path, out: Path) -> dict[str, Any]:
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    with PeakRSS() as mem:
        t = time.perf_counter()
        schema = T.StructType([T.StructField("amount", T.DoubleType())])
        df = spark.read.parquet(str(data)).select(
            "key", "timestamp", F.from_json(F.col("value").cast("string"), schema).alias("value"))
        if kind == "session":
            win = F.session_window(F.timestamp_millis("timestamp"), f"{width_ms} milliseconds")
            result = df.groupBy("key", win.alias("w")).agg(F.count(F.lit(1)).alias("cnt"),
                                                           F.sum("value.amount").alias("amt")).select(
                "key", F.unix_millis("w.start").alias("window_start"), F.unix_millis("w.end").alias("window_end"),
                "cnt", "amt")
        else:
            by_ts = Window.partitionBy("key").orderBy("timestamp")
            left, right = by_ts.rangeBetween(-width_ms, 0), by_ts.rangeBetween(1, width_ms + 1)
            frames = df.select(
                "key", "timestamp",
                F.count(F.lit(1)).over(left).alias("l_cnt"), F.sum("value.amount").over(left).alias("l_amt"),
                F.count(F.lit(1)).over(right).alias("r_cnt"), F.sum("value.amount").over(right).alias("r_amt"))
            per_ts = frames.dropDuplicates(["key", "timestamp"])
            result = per_ts.select("key", (F.col("timestamp") - width_ms).alias("window_start"),
                                   F.col("l_cnt").alias("cnt"), F.col("l_amt").alias("amt")).unionByName(
                per_ts.where(F.col("r_cnt") > 0).select("key", (F.col("timestamp") + 1).alias("window_start"),
                                                        F.col("r_cnt").alias("cnt"), F.col("r_amt").alias("amt")))
        result.write.mode("overwrite").parquet(str(out / f"plain-{kind}"))
        seconds = time.perf_counter() - t
    rows = spark.read.parquet(str(out / f"plain-{kind}")).count()
    return {"seconds": round(seconds, 3), "outputs": rows, **mem.to_dict()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--big", action="store_true", help=f"{BIG:,} records")
    ap.add_argument("--kinds", default="session,sliding")
    ap.add_argument("--gap", default="30s", help="session gap")
    ap.add_argument("--diff", default="1s", help="sliding time difference")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--disorder", type=float, default=0.03)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--file-rows", type=int, default=500_000)
    ap.add_argument("--reference-records", type=int, default=50_000)
    ap.add_argument("--regen", action="store_true")
    ap.add_argument("--work", default=str(HERE / "work"))
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.big:
        args.records = BIG
    out_json = Path(args.out) if args.out else HERE / "results" / (
        "windows-10m.json" if args.big else "windows.json")
    work = Path(args.work).resolve()
    info = machine()
    data, _, meta = ensure_data(args, work)
    print(f"machine: {info['cores']} cores; data: {args.records:,} records ({meta['bytes'] / 1e6:.0f} MB), "
          f"span {meta['event_time_span_s']} s", flush=True)
    run_dir = work / "runs" / f"windows-{data.name}-pid{os.getpid()}"
    from backfill.session import get_spark

    spark = get_spark("local")
    spark.range(1).count()
    widths = {"session": args.gap, "sliding": args.diff}
    results: dict[str, Any] = {}
    for kind in args.kinds.split(","):
        job = write_job(run_dir / "jobs", kind, widths[kind], data, run_dir / "out")
        width_ms = parse_duration(widths[kind])
        runs: dict[str, list[dict[str, Any]]] = {"exact": [], "plain": []}
        for r in range(args.repeat):
            for variant in ("exact", "plain"):
                res = run_exact(spark, job) if variant == "exact" else run_plain(spark, kind, width_ms, data,
                                                                                run_dir / "out")
                runs[variant].append(res)
                print(f"  {kind} {variant:5s} rep {r}: {res['seconds']:8.2f} s  "
                      f"{args.records / res['seconds']:>10,.0f} records/s  peak {gb(res['peak_rss_bytes'])}  "
                      f"outputs {res['outputs']:,}", flush=True)
        best = {v: min(x["seconds"] for x in rs) for v, rs in runs.items()}
        results[kind] = {"width": widths[kind], "grace": GRACE, "runs": runs, "best_s": best,
                         "ratio_exact_to_plain": round(best["exact"] / best["plain"], 2)}
        print(f"{kind} ({widths[kind]}): exact {best['exact']:.1f} s, plain {best['plain']:.1f} s, "
              f"ratio {results[kind]['ratio_exact_to_plain']}x", flush=True)
    spark.stop()
    out_json.parent.mkdir(parents=True, exist_ok=True)
    out_json.write_text(json.dumps({"started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                                    "records": args.records, "machine": info, "data": meta, "results": results},
                                   indent=1, default=str))
    print(f"wrote {out_json}")
    shutil.rmtree(run_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
