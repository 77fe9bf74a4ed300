"""Benchmark: exact stream-stream join (backfill) vs a plain Spark interval join, in one process and session.

    python benchmarks/join_bench.py [--records 1000000] [--partitions 4] [--hot-keys 0.1] [--hot-weight 20]
                                    [--how left] [--repeat 1] [--reference-records 20000]
                                    [--out benchmarks/results/join.json]

Data (deterministic, cached under benchmarks/work/): `--records` per side, keys co-partitioned over
`--partitions` partitions; 100k keys of which `--hot-keys` (10%) carry `--hot-weight` (20x) the records
of a cold key; about 1000 records/s of event time per partition per side, jitter < 50 ms, 3% of the records
late by 1-60 s (so retention, out-of-order pairs and immediate null results all occur).

  exact     run_plan() of a job with one `--how` join (before 10 s, after 10 s, grace 5 s) over parquet,
            parquet sink: read, order, checks, pairs, outer-store kernel, ledger, publish, run manifest
  baseline  plain Spark: the same parquet, L.join(R, key equal and R.ts in [L.ts - 10 s, L.ts + 10 s],
            how), the same joiner, parquet sink; ignores processing order, retention and emission timing
  reference (with --reference-records) the record-at-a-time engine on a prefix, compared row for row
            with the Spark engine on the same prefix
Also reported: the candidate pairs the exact range join evaluates vs the pairs it emits, and the key
cross product a key-only equi-join would evaluate. Data and sinks go to benchmarks/work/ (git-ignored).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))  # run from a checkout without installing
sys.path.insert(0, str(HERE))

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
N_KEYS = 100_000
RATE = 1000  # records per second of event time, per partition and side
BEFORE = AFTER = 10_000
GRACE = 5_000
JOINER = "concat(coalesce(left.value, 'null'), '+', coalesce(right.value, 'null'))"
KEPT = ("seconds", "records_per_s", "peak_pss_bytes", "peak_rss_bytes", "peak_jvm_rss_bytes", "peak_heap_used_bytes",
        "outputs")


# --------------------------------------------------------------------------------------------------- data

def _side(rng: np.random.Generator, n: int, partitions: int, weights: np.ndarray, topic: str) -> pa.Table:
    """One topic: keys by weight, key -> partition by key id, offsets in production order, 3% late 1-60 s."""
    key = rng.choice(N_KEYS, size=n, p=weights)
    part = (key % partitions).astype(np.int32)
    i = np.arange(n, dtype=np.int64)
    ts = T0 + (i * 1000) // (RATE * partitions) + rng.integers(0, 50, n)
    late = rng.random(n) < 0.03
    ts[late] -= rng.integers(1_000, 60_001, int(late.sum()))
    offset = np.empty(n, dtype=np.int64)
    for p in range(partitions):
        m = part == p
        offset[m] = np.arange(int(m.sum()), dtype=np.int64)
    keys = pa.array([f"k{k:06d}" for k in range(N_KEYS)]).take(pa.array(key))
    values = pa.array([f"{topic[0]}{v}" for v in range(n)])
    return pa.table({"topic": pa.array(np.full(n, topic, dtype=object), pa.string()),
                     "partition": pa.array(part), "offset": pa.array(offset), "key": keys, "value": values,
                     "timestamp": pa.array(ts)})


def generate(folder: Path, n: int, partitions: int, hot: float, hot_weight: float, seed: int) -> dict[str, Any]:
    """Write left/ and right/ parquet (cached by parameters); return what they hold."""
    facts = folder / "facts.json"
    if facts.exists():
        return {**json.loads(facts.read_text()), "cached": True}
    started = time.perf_counter()
    rng = np.random.default_rng(seed)
    weights = np.ones(N_KEYS)
    hot_keys = rng.choice(N_KEYS, size=int(N_KEYS * hot), replace=False)
    weights[hot_keys] = hot_weight  # the same keys are hot on both sides
    weights /= weights.sum()
    info: dict[str, Any] = {"records_per_side": n, "partitions": partitions, "keys": N_KEYS,
                            "hot_keys": len(hot_keys), "hot_weight": hot_weight}
    shutil.rmtree(folder, ignore_errors=True)
    for side in ("left", "right"):
        table = _side(rng, n, partitions, weights, side)
        (folder / side).mkdir(parents=True)
        pq.write_table(table, folder / side / "part-00000.parquet")
        info[f"{side}_late_share"] = 0.03
    hot_share = float(weights[hot_keys].sum())
    info.update({"hot_record_share": round(hot_share, 3), "generate_s": round(time.perf_counter() - started, 2)})
    facts.write_text(json.dumps(info))
    return {**info, "cached": False}


def prefix(src: Path, dst: Path, k: int) -> Path:
    """The first k records of each side in production order (a valid input in itself)."""
    shutil.rmtree(dst, ignore_errors=True)
    for side in ("left", "right"):
        (dst / side).mkdir(parents=True)
        pq.write_table(pq.read_table(src / side).slice(0, k), dst / side / "part-00000.parquet")
    return dst


def write_job(folder: Path, data: Path, out: Path, how: str, partitions: int, sink: str = "parquet") -> Path:
    """The job file of the exact run."""
    ext = ".jsonl" if sink == "jsonl" else ""
    sources = "".join(f"  {s}: {{format: parquet, path: {data / s}, partitions: {partitions}}}\n"
                      for s in ("left", "right"))
    job = folder / f"join-{how}-{sink}.yaml"
    folder.mkdir(parents=True, exist_ok=True)
    job.write_text(f"""name: join-bench
sources:
{sources}operators:
  - name: j
    join: {{left: left, right: right, how: {how}, window: {{before: {BEFORE}ms, after: {AFTER}ms, grace: {GRACE}ms}},
            value: "{JOINER}"}}
sinks:
  j: {{format: {sink}, path: {out / 'j'}{ext}}}
  _ledger: {{format: {sink}, path: {out / 'ledger'}{ext}}}
  _runs: {{format: jsonl, path: {out / 'runs.jsonl'}}}
""")
    return job


# ------------------------------------------------------------------------------------------ measurement

class PeakMemory:
    """Peak memory of this process and its descendants (the JVM, Python workers): RSS sampled every 0.25 s,
    PSS every 2 s.

    `pss` splits pages shared between processes (forked Python workers share most of theirs) in
    proportion, so it does not count them once per worker as summed RSS does; both are kept. PSS is read from
    the kernel's page walk (/proc/<pid>/smaps_rollup): about 20 ms per GB of a process's RSS, so sampled every
    0.25 s on a 6 GB JVM it took half a core of this 2-core machine from the runs it measured."""

    PSS_EVERY = 8  # samples

    def __init__(self, spark: Any) -> None:
        self.me, self.stop = psutil.Process(), threading.Event()
        self.heap = spark._jvm.java.lang.management.ManagementFactory.getMemoryMXBean()
        self.peak = {"rss": 0, "pss": 0, "jvm_rss": 0, "heap": 0, "processes": 0}

    def _sample(self, with_pss: bool = True) -> None:
        rss = pss = jvm = 0
        procs = [self.me, *self.me.children(recursive=True)]
        for proc in procs:
            try:
                info = proc.memory_full_info() if with_pss else proc.memory_info()
                rss, pss = rss + info.rss, pss + getattr(info, "pss", info.rss)
                if "java" in proc.name():
                    jvm = max(jvm, info.rss)
            except psutil.Error:
                pass
        if not with_pss:
            pss = 0
        heap = self.heap.getHeapMemoryUsage().getUsed()  # what the JVM holds live, unlike its RSS
        for name, value in (("rss", rss), ("pss", pss), ("jvm_rss", jvm), ("heap", heap), ("processes", len(procs))):
            self.peak[name] = max(self.peak[name], value)

    def _run(self) -> None:
        n = 0
        while not self.stop.wait(0.25):
            n += 1
            self._sample(with_pss=n % self.PSS_EVERY == 0)

    def __enter__(self) -> PeakMemory:
        self._sample()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.thread.join()
        self._sample()

    def to_dict(self) -> dict[str, int]:
        return {"peak_pss_bytes": self.peak["pss"], "peak_rss_bytes": self.peak["rss"],
                "peak_jvm_rss_bytes": self.peak["jvm_rss"], "peak_heap_used_bytes": self.peak["heap"],
                "max_processes": self.peak["processes"]}


def run_exact(spark: Any, job: Path, records: int) -> dict[str, Any]:
    """The exact join through the public run path (plan, evaluate, publish)."""
    from backfill.plan.builder import build_plan
    from backfill.plan.evaluator import run_plan
    from backfill.jobspec.load import load_job

    stages: dict[str, float] = {}
    last = [time.perf_counter(), "start"]

    def progress(stage: str) -> None:
        now = time.perf_counter()
        stages[str(last[1])] = round(now - float(last[0]), 2)
        last[0], last[1] = now, stage

    started = time.perf_counter()
    with PeakMemory(spark) as mem:
        summary = run_plan(build_plan(load_job(job)), spark, progress)
    seconds = time.perf_counter() - started
    stages[str(last[1])] = round(time.perf_counter() - float(last[0]), 2)
    ops = summary.operators["j"]
    return {"seconds": round(seconds, 2), "records_per_s": round(records / seconds), **mem.to_dict(),
            "outputs": ops.outputs, "pending_non_joined": ops.incomplete_windows, "dropped": ops.dropped,
            "stages_s": stages}


def run_baseline(spark: Any, data: Path, out: Path, how: str, records: int) -> dict[str, Any]:
    """Plain Spark interval join: key equality and time bounds; no order, no retention, no emission timing."""
    from pyspark.sql import functions as F

    shutil.rmtree(out, ignore_errors=True)
    started = time.perf_counter()
    with PeakMemory(spark) as mem:
        left = spark.read.parquet(str(data / "left")).select("key", "value", F.col("timestamp").alias("ts"))
        right = spark.read.parquet(str(data / "right")).select(
            F.col("key").alias("r_key"), F.col("value").alias("r_value"), F.col("timestamp").alias("r_ts"))
        cond = (left.key == right.r_key) & right.r_ts.between(left.ts - BEFORE, left.ts + AFTER)
        joined = left.join(right, cond, {"inner": "inner", "left": "left", "outer": "full"}[how])
        value = F.concat(F.coalesce("value", F.lit("null")), F.lit("+"), F.coalesce("r_value", F.lit("null")))
        joined.select(F.coalesce("key", "r_key").alias("key"), value.alias("value"),
                      F.greatest("ts", "r_ts").alias("ts")).write.parquet(str(out))
    seconds = time.perf_counter() - started
    rows = sum(pq.ParquetFile(f).metadata.num_rows for f in out.glob("*.parquet"))
    return {"seconds": round(seconds, 2), "records_per_s": round(records / seconds), **mem.to_dict(),
            "outputs": rows}


def pair_facts(spark: Any, job: Path) -> dict[str, int]:
    """Candidates the bucketed range join evaluates, pairs it emits, and the key cross product."""
    from pyspark.sql import functions as F

    from backfill.ops.join import _pair_join, _records, bucketed
    from backfill.ops.windows import JoinWindows
    from backfill.plan import evaluator as ev
    from backfill.plan.builder import build_plan
    from backfill.jobspec.load import load_job

    plan = build_plan(load_job(job))
    op = plan.operators[0]
    summary = ev.RunSummary(run_id="facts", job="facts", start=None, end=None)
    ordered = ev._ordered(plan, ev._read_all(plan, spark, summary), summary)
    w = JoinWindows.of(op.spec.join)  # type: ignore[union-attr,arg-type]
    recs = _records(ordered, op.spec, op.stream_time, w).where(  # type: ignore[arg-type]
        "key IS NOT NULL AND value IS NOT NULL")
    recs = recs.persist()
    lrows, rrows, equi = bucketed(recs, recs, w)
    per_key = recs.groupBy("task", "key").agg(F.sum(F.when(F.col("_side") == 1, 1).otherwise(0)).alias("l"),
                                              F.sum(F.when(F.col("_side") == 0, 1).otherwise(0)).alias("r"))
    facts = {"candidate_pairs": lrows.join(rrows, equi).count(),
             "visible_pairs": _pair_join(recs, recs, w, "both", wide=False).count(),
             "key_cross_product": int(per_key.select(F.sum(F.col("l") * F.col("r"))).first()[0])}
    recs.unpersist()
    return facts


def check_reference(spark: Any, data: Path, work: Path, how: str, k: int, partitions: int) -> dict[str, Any]:
    """Spark vs the reference engine, row for row, on the first k records of each side."""
    from backfill.plan.builder import build_plan
    from backfill.plan.evaluator import run_plan
    from backfill.reference.engine import run_reference
    from backfill.jobspec.load import load_job

    small = prefix(data, work / "data" / f"join-prefix-{k}", k)
    out = work / "out" / "join-prefix"
    shutil.rmtree(out, ignore_errors=True)
    job = write_job(work / "jobs", small, out, how, partitions, sink="jsonl")
    run_plan(build_plan(load_job(job)), spark)
    started = time.perf_counter()
    ref = run_reference(load_job(job))
    seconds = time.perf_counter() - started
    fast = sorted(json.dumps(json.loads(line), sort_keys=True)
                  for line in (out / "j.jsonl").read_text().splitlines() if line.strip())
    slow = sorted(json.dumps(r, sort_keys=True) for r in ref.outputs["j"])
    return {"records": 2 * k, "outputs": len(slow), "spark_equals_reference": fast == slow, "reference_seconds":
            round(seconds, 2), "reference_records_per_s": round(2 * k / seconds)}


# ------------------------------------------------------------------------------------------------- main

def machine() -> dict[str, Any]:
    """Where the numbers come from."""
    import pyspark

    return {"cores": os.cpu_count(), "memory_bytes": psutil.virtual_memory().total, "python": platform.python_version(),
            "pyspark": pyspark.__version__, "platform": platform.platform(), "loadavg": list(os.getloadavg())}


def gb(b: float) -> str:
    return f"{b / 2**30:.2f} GiB"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000, help="records per side")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--hot-keys", type=float, default=0.1, help="share of keys that are hot")
    parser.add_argument("--hot-weight", type=float, default=20.0, help="records of a hot key / of a cold key")
    parser.add_argument("--how", choices=["inner", "left", "outer"], default="left")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reference-records", type=int, default=20_000, help="per side; 0 skips the check")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "join.json")
    args = parser.parse_args(argv)
    started_at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    work = HERE / "work"
    data = work / "data" / f"join-n{args.records}-p{args.partitions}-h{args.hot_keys}-w{args.hot_weight}-s{args.seed}"
    info = generate(data, args.records, args.partitions, args.hot_keys, args.hot_weight, args.seed)
    print(f"data: {2 * args.records:,} records ({info['hot_record_share']:.0%} on {info['hot_keys']:,} hot keys) "
          f"in {data}", flush=True)

    from aggregate_bench import engine_fingerprint
    from backfill.session import get_spark

    engine = engine_fingerprint()
    load_at_start = list(os.getloadavg())
    print(f"engine {engine['sha256_of_sources']}, load average {load_at_start[0]:.2f}", flush=True)
    t = time.perf_counter()
    spark = get_spark("local")
    startup = round(time.perf_counter() - t, 2)
    job = write_job(work / "jobs", data, work / "out" / "join-exact", args.how, args.partitions)
    runs: dict[str, list[dict[str, Any]]] = {"exact": [], "baseline": []}
    records = 2 * args.records
    for r in range(args.repeat):
        for variant in ("exact", "baseline"):
            res = (run_exact(spark, job, records) if variant == "exact" else
                   run_baseline(spark, data, work / "out" / "join-baseline", args.how, records))
            runs[variant].append(res)
            print(f"  rep {r} {variant:8s} {res['seconds']:8.2f} s  {res['records_per_s']:>9,} records/s  peak PSS "
                  f"{gb(res['peak_pss_bytes'])} (RSS sum {gb(res['peak_rss_bytes'])}, JVM "
                  f"{gb(res['peak_jvm_rss_bytes'])}, heap used {gb(res['peak_heap_used_bytes'])})  outputs "
                  f"{res['outputs']:,}", flush=True)
    facts = pair_facts(spark, job)
    print(f"  pairs: {facts['candidate_pairs']:,} candidates evaluated for {facts['visible_pairs']:,} emitted "
          f"(key cross product {facts['key_cross_product']:,})", flush=True)
    ref = check_reference(spark, data, work, args.how, args.reference_records, args.partitions) \
        if args.reference_records else None
    if ref:
        print(f"  reference on {ref['records']:,} records: spark == reference: {ref['spark_equals_reference']}, "
              f"{ref['reference_records_per_s']:,} records/s", flush=True)
    best = {v: min(rs, key=lambda x: x["seconds"]) for v, rs in runs.items()}
    per_round = [round(e["seconds"] / b["seconds"], 3) for e, b in zip(runs["exact"], runs["baseline"])]
    result = {"benchmark": "join_bench", "started_at": started_at,
              "finished_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "command": "python benchmarks/join_bench.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "machine": {**machine(), "loadavg_at_start": load_at_start, "loadavg_at_end": list(os.getloadavg())},
              "engine": {**engine, "changed_during_run": engine_fingerprint()["sha256_of_sources"]
                         != engine["sha256_of_sources"]},
              "parameters": {**vars(args), "out": str(args.out), "window_ms":
                                                   {"before": BEFORE, "after": AFTER, "grace": GRACE}},
              "data": info, "spark_startup_s": startup, "runs": runs,
              "best": {v: {k: best[v][k] for k in KEPT} for v in best},
              "peak_pss_bytes_max": {v: max(r["peak_pss_bytes"] for r in rs) for v, rs in runs.items()},
              "exact_over_baseline_time": round(best["exact"]["seconds"] / best["baseline"]["seconds"], 2),
              "ratio_per_round": per_round, "ratio_median_of_rounds": round(statistics.median(per_round), 3),
              "pairs": facts, "reference": ref,
              "notes": ["peak memory of this Python process and its descendants (JVM, Python workers), sampled every "
                        "0.25 s during the variant: PSS (shared pages split between the processes sharing them), "
                        "summed RSS (counts pages shared by forked Python workers once per worker) and the JVM's "
                        "RSS; both variants share one SparkSession (local[2], the local profile's driver memory), "
                        "so a later variant inherits the JVM heap an earlier one grew (the JVM does not return "
                        "it; a run releases its local checkpoints when it ends); peak_heap_used_bytes is the "
                        "JVM's used heap, sampled the same way",
                        "baseline outputs differ from exact ones by design: it joins pairs that retention hides, "
                        "never emits immediate/delayed null rows in stream order, and has no emission order"]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=str))
    print(f"exact {best['exact']['seconds']} s vs baseline {best['baseline']['seconds']} s "
          f"({result['exact_over_baseline_time']}x best over best; per round {per_round}, median "
          f"{result['ratio_median_of_rounds']}x); wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
