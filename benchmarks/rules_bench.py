"""Benchmark: the exact lookback rule engine (backfill `rules`) against a plain Spark RANGE BETWEEN query.

    python benchmarks/rules_bench.py [--records 1000000] [--big] [--orders arrival,event_time] [--repeat 1]
                                     [--keys 100000] [--days 30] [--out benchmarks/results/rules.json]

Data (numpy, cached in benchmarks/work/rules-data/): transactions on 4 partitions over `--days` days; payer and
beneficiary ids Zipf-distributed over `--keys` pairs (a few very hot pairs), amounts gamma-distributed in
cents; the record timestamp is the arrival, the event time (value.eventTime) is up to 2 s earlier, and 3% of
the transactions arrive up to 180 s late. Three rules, present before the data (rules.jsonl):

  1  SUM(paymentAmount) > 20000 per (payerId, beneficiaryId) over 24 h
  2  COUNT per payerId over 10 min >= 25
  3  MAX(paymentAmount) per beneficiaryId over 7 days > 400

Variants (one process, one SparkSession, local[2]):

  exact arrival     `backfill run`: order arrival (the live job: only what arrived before counts, cleanup
                    timers), rule versions as of arrival, parquet sink of the alerts
  exact event_time  the same with order: event_time (Flink BATCH: event-time order, ties in arrival order)
  plain             per rule, SUM/COUNT/MAX OVER (PARTITION BY the rule's key ORDER BY eventTime RANGE BETWEEN
                    W PRECEDING AND CURRENT ROW), filtered by the limit: no arrival order, no rule versions,
                    peers of equal event time see each other

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

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from aggregate_bench import PeakRSS, gb, machine  # noqa: E402
from window_bench import run_exact  # noqa: E402

BIG = 10_000_000
RULES = [
    {"ruleId": 1, "ruleState": "ACTIVE", "groupingKeyNames": ["payerId", "beneficiaryId"], "unique": [],
     "aggregateFieldName": "paymentAmount", "aggregatorFunctionType": "SUM", "limitOperatorType": "GREATER",
     "limit": "20000", "windowMinutes": 1440},
    {"ruleId": 2, "ruleState": "ACTIVE", "groupingKeyNames": ["payerId"], "unique": [],
     "aggregateFieldName": "COUNT_FLINK", "aggregatorFunctionType": "SUM", "limitOperatorType": "GREATER_EQUAL",
     "limit": "25", "windowMinutes": 10},
    {"ruleId": 3, "ruleState": "ACTIVE", "groupingKeyNames": ["beneficiaryId"], "unique": [],
     "aggregateFieldName": "paymentAmount", "aggregatorFunctionType": "MAX", "limitOperatorType": "GREATER",
     "limit": "400", "windowMinutes": 10080},
]


def ensure_data(args: argparse.Namespace, work: Path) -> tuple[Path, Path, dict[str, Any]]:
    """Transactions (parquet, 4 partitions) and the rules (JSONL), generated once per shape."""
    tag = f"n{args.records}-k{args.keys}-d{args.days}-s{args.seed}"
    folder = work / "rules-data" / tag
    meta_file = folder / "meta.json"
    if meta_file.is_file() and not args.regen:
        return folder / "tx", folder / "rules.jsonl", json.loads(meta_file.read_text())
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "tx").mkdir(parents=True)
    rng = np.random.default_rng(args.seed)
    n = args.records
    span = args.days * 86_400_000
    pair = (rng.zipf(1.1, n) - 1) % args.keys
    payer, beneficiary = pair // 10 + 1, pair % 10 + 1 + (pair // 1000) * 10
    arrival = np.sort(rng.integers(0, span, n)) + 1_700_000_000_000
    event = arrival - rng.integers(0, 2000, n)
    late = rng.random(n) < 0.03
    event[late] -= rng.integers(1000, 180_000, late.sum())
    cents = np.maximum(1, np.round(rng.gamma(2.0, 2500.0, n))).astype(np.int64)
    kinds = np.array(["CSH", "CRD", "WIR"])[rng.integers(0, 3, n)]
    partition = (payer % 4).astype(np.int32)
    offsets = np.zeros(n, dtype=np.int64)
    for p in range(4):
        mask = partition == p
        offsets[mask] = np.arange(mask.sum())
    values = [f'{{"transactionId":{i},"eventTime":{e},"payerId":{a},"beneficiaryId":{b},"paymentType":"{k}",'
              f'"paymentAmount":{c // 100}.{c % 100:02d}}}'
              for i, e, a, b, k, c in zip(range(n), event.tolist(), payer.tolist(), beneficiary.tolist(),
                                         kinds.tolist(), cents.tolist())]
    step = 1_000_000
    for start in range(0, n, step):
        sl = slice(start, start + step)
        table = pa.table({"topic": pa.array(["tx"] * len(values[sl])), "partition": partition[sl],
                          "offset": offsets[sl], "key": pa.array(payer[sl].astype(str)),
                          "value": pa.array(values[sl]), "timestamp": arrival[sl]})
        pq.write_table(table, folder / "tx" / f"part-{start // step:05d}.parquet")
    rules = folder / "rules.jsonl"
    rules.write_text("".join(json.dumps({"topic": "rules", "partition": 0, "offset": i, "key": None,
                                         "value": json.dumps(r), "timestamp": 1_600_000_000_000 + i}) + "\n"
                             for i, r in enumerate(RULES)))
    meta = {"records": n, "keys": args.keys, "days": args.days, "late_fraction": float(late.mean()),
            "hottest_pair_share": float(np.bincount(pair).max() / n), "bytes": sum(
                f.stat().st_size for f in (folder / "tx").iterdir())}
    meta_file.write_text(json.dumps(meta))
    return folder / "tx", rules, meta


def write_job(jobs: Path, order: str, tx: Path, rules: Path, out: Path) -> Path:
    jobs.mkdir(parents=True, exist_ok=True)
    path = jobs / f"rules-{order}.yaml"
    path.write_text(f"""# written by benchmarks/rules_bench.py
name: rules-bench-{order.replace('_', '-')}
sources:
  transactions: {{format: parquet, path: {os.path.relpath(tx, jobs)}, key: {{format: string}},
                 value: {{format: json}}, timestamp: {{extractor: record}}}}
  rules: {{format: jsonl, path: {os.path.relpath(rules, jobs)}, value: {{format: string}}}}
operators:
  - name: alerts
    rules: {{input: transactions, rules: rules, event_time: value.eventTime, order: {order}}}
sinks:
  alerts: {{format: parquet, path: {os.path.relpath(out / order, jobs)}}}
""")
    return path


def run_plain(spark: Any, tx: Path, out: Path, timeout_s: float) -> dict[str, Any]:
    """The plain query; cancelled after `timeout_s` (Spark's sliding frames rescan the frame per row, so a hot
    key with a long window costs frame size x rows)."""
    import threading

    sc = spark.sparkContext
    sc.setJobGroup("rules-bench-plain", "plain RANGE BETWEEN baseline", interruptOnCancel=True)
    timer = threading.Timer(timeout_s, lambda: sc.cancelJobGroup("rules-bench-plain"))
    timer.start()
    try:
        return _plain(spark, tx, out)
    except Exception as exc:  # cancelled
        if "cancel" not in str(exc).lower():
            raise
        return {"seconds": None, "timed_out_after_s": timeout_s, "outputs": None, "peak_rss_bytes": None}
    finally:
        timer.cancel()
        sc.setLocalProperty("spark.jobGroup.id", None)


def _plain(spark: Any, tx: Path, out: Path) -> dict[str, Any]:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    with PeakRSS() as mem:
        t = time.perf_counter()
        df = spark.read.parquet(str(tx)).select(F.col("value").cast("string").alias("v"))
        df = df.select(F.get_json_object("v", "$.eventTime").cast("long").alias("t"),
                       F.get_json_object("v", "$.payerId").alias("payerId"),
                       F.get_json_object("v", "$.beneficiaryId").alias("beneficiaryId"),
                       F.get_json_object("v", "$.paymentAmount").cast("decimal(18,2)").alias("amount"),
                       F.get_json_object("v", "$.transactionId").cast("long").alias("id"))
        frames = []
        for rule in RULES:
            keys = rule["groupingKeyNames"]
            w = Window.partitionBy(*keys).orderBy("t").rangeBetween(-rule["windowMinutes"] * 60_000, 0)
            value = {"SUM": F.sum("amount"), "MAX": F.max("amount")}[rule["aggregatorFunctionType"]] \
                if rule["aggregateFieldName"] != "COUNT_FLINK" else F.count(F.lit(1))
            limit = float(rule["limit"])
            agg = df.select("id", "t", value.over(w).alias("value"))
            cond = F.col("value") > limit if rule["limitOperatorType"] == "GREATER" else F.col("value") >= limit
            frames.append(agg.where(cond).select(F.lit(rule["ruleId"]).alias("rule_id"), "id", "t",
                                                 F.col("value").cast("string").alias("value")))
        result = frames[0]
        for f in frames[1:]:
            result = result.unionByName(f)
        result.write.mode("overwrite").parquet(str(out / "plain"))
        seconds = time.perf_counter() - t
    rows = spark.read.parquet(str(out / "plain")).count()
    return {"seconds": round(seconds, 3), "outputs": rows, **mem.to_dict()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--big", action="store_true", help=f"{BIG:,} records")
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--orders", default="arrival,event_time")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--regen", action="store_true")
    ap.add_argument("--plain-timeout", type=float, default=3600, help="seconds before the baseline is cancelled")
    ap.add_argument("--work", default=str(HERE / "work"))
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.big:
        args.records = BIG
    out_json = Path(args.out) if args.out else HERE / "results" / ("rules-10m.json" if args.big else "rules.json")
    work = Path(args.work).resolve()
    info = machine()
    t = time.perf_counter()
    tx, rules, meta = ensure_data(args, work)
    print(f"machine: {info['cores']} cores; data: {args.records:,} transactions ({meta['bytes'] / 1e6:.0f} MB, "
          f"hottest pair {meta['hottest_pair_share']:.1%}, {meta['late_fraction']:.1%} late) "
          f"ready in {time.perf_counter() - t:.1f} s", flush=True)
    run_dir = work / "runs" / f"rules-pid{os.getpid()}"
    from backfill.session import get_spark

    spark = get_spark("local")
    spark.range(1).count()
    runs: dict[str, list[dict[str, Any]]] = {o: [] for o in [*args.orders.split(","), "plain"]}
    for r in range(args.repeat):
        for variant in runs:
            if variant == "plain":
                res = run_plain(spark, tx, run_dir / "out", args.plain_timeout)
                if res["seconds"] is None:
                    print(f"  plain      rep {r}: cancelled after {args.plain_timeout:.0f} s", flush=True)
                    runs[variant].append(res)
                    continue
            else:
                res = run_exact(spark, write_job(run_dir / "jobs", variant, tx, rules, run_dir / "out"), "alerts")
            runs[variant].append(res)
            print(f"  {variant:10s} rep {r}: {res['seconds']:8.2f} s  {args.records / res['seconds']:>10,.0f} "
                  f"transactions/s  peak {gb(res['peak_rss_bytes'])}  alerts {res['outputs']:,}", flush=True)
    best = {v: min((x["seconds"] for x in rs if x["seconds"] is not None), default=None) for v, rs in runs.items()}
    ratios = {v: round(best[v] / best["plain"], 2) if best["plain"] else None for v in best if v != "plain"}
    print("best: " + ", ".join(f"{v} {s:.1f} s" if s else f"{v} (cancelled)" for v, s in best.items())
          + "; ratio to plain: " + ", ".join(f"{v} {x}x" if x else f"{v} -" for v, x in ratios.items()), flush=True)
    spark.stop()
    out_json.parent.mkdir(parents=True, exist_ok=True)
    out_json.write_text(json.dumps({"started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                                    "records": args.records, "machine": info, "data": meta, "rules": RULES,
                                    "runs": runs, "best_s": best, "ratio_to_plain": ratios}, indent=1, default=str))
    print(f"wrote {out_json}")
    shutil.rmtree(run_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
