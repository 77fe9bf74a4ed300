"""Benchmark: exact hopping-window aggregate (backfill) vs plain Spark (inexact) vs the reference engine.

    python benchmarks/aggregate_bench.py [--records 1000000] [--big] [--disorder 0.03] [--partitions 4]
                                         [--out benchmarks/results/aggregate.json] [--repeat 1]

Everything runs in ONE process and ONE SparkSession (backfill.session.get_spark("local")):
  exact      run_plan(build_plan(load_job(job), None, None), spark): read, order, check, aggregate,
             conservation checks, publish to a parquet sink, append the run manifest
  inexact    plain Spark groupBy(key, window(ts, 5 min, 1 min)).agg(count, sum), same parquet input, same
             JSON parse, parquet sink (mode overwrite); no processing order, no lateness
  reference  run_reference() on a 50k-record prefix of the data (its own small job), records/s
See benchmarks/README.md. Data and sinks go to benchmarks/work/ (git-ignored).
"""
from __future__ import annotations

import argparse
import datetime as dt
import functools
import glob
import json
import math
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
import pyarrow.compute as pc
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))  # run from a checkout without installing

# event-time layout and the operator (5 min hopping by 1 min, grace 30 s)
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z, minute-aligned
SIZE, ADVANCE, GRACE = 300_000, 60_000, 30_000
N_KEYS = 100_000
RATE_PER_PARTITION = 1000  # records per second of event time, per partition
JITTER_MS = 50
DELAY_MS = (1_000, 180_000)
BIG = 10_000_000


# --------------------------------------------------------------------------------------------------- data

def _assign_partitions(weights: np.ndarray, partitions: int) -> np.ndarray:
    """Each key lives in one partition (as with Kafka's key partitioner); balance the Zipf weight greedily."""
    part = np.empty(len(weights), dtype=np.int32)
    load = np.zeros(partitions)
    for k in np.argsort(-weights, kind="stable"):
        p = int(np.argmin(load))
        part[k] = p
        load[p] += weights[k]
    return part


CHUNKED = 20_000_000  # above this many records, data is generated chunk by chunk (memory stays flat)
CHUNK = 5_000_000


def generate(out_dir: Path, n: int, disorder: float, partitions: int, seed: int, file_rows: int,
             sample_dir: Path, sample_n: int) -> dict[str, Any]:
    """Write n records as parquet files of ~file_rows (in production order), plus a prefix sample; return facts."""
    if n > CHUNKED:
        return generate_chunked(out_dir, n, disorder, partitions, seed, file_rows, sample_dir, sample_n)
    t = time.perf_counter()
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, N_KEYS + 1)  # Zipf s = 1 over ranks
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    rank = np.searchsorted(cdf, rng.random(n), side="right").astype(np.int32)
    rank = np.minimum(rank, N_KEYS - 1)
    key_of_rank = rng.permutation(N_KEYS).astype(np.int32)  # key names do not reveal popularity
    key_part = _assign_partitions(weights, partitions)  # by rank
    keyid = key_of_rank[rank]
    part = key_part[rank]
    # production order i: about RATE_PER_PARTITION records/s of event time per partition, jitter < 50 ms
    i = np.arange(n, dtype=np.int64)
    ts = T0 + (i * 1000) // (RATE_PER_PARTITION * partitions) + rng.integers(0, JITTER_MS, n)
    late = rng.random(n) < disorder
    ts[late] -= rng.integers(DELAY_MS[0], DELAY_MS[1] + 1, int(late.sum()))
    offset = np.empty(n, dtype=np.int64)
    for p in range(partitions):  # offsets 0.. per partition, in production order
        m = part == p
        offset[m] = np.arange(int(m.sum()), dtype=np.int64)
    amount = np.round(rng.gamma(2.0, 25.0, n), 2)
    names = pa.array([f"user-{k:06d}" for k in range(N_KEYS)], pa.string())
    key = names.take(pa.array(keyid))
    value = pc.binary_join_element_wise(pa.scalar('{"amount": '), pc.cast(pa.array(amount), pa.string()),
                                        pa.scalar("}"), pa.scalar(""))
    table = pa.table({"topic": pa.array(np.full(n, "events", dtype=object), pa.string()),
                      "partition": pa.array(part, pa.int32()), "offset": pa.array(offset, pa.int64()),
                      "key": key, "value": value, "timestamp": pa.array(ts, pa.int64())})
    for d in (out_dir, sample_dir):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    files = max(1, math.ceil(n / file_rows))
    step = math.ceil(n / files)
    for f in range(files):
        pq.write_table(table.slice(f * step, step), out_dir / f"part-{f:05d}.parquet")
    pq.write_table(table.slice(0, min(sample_n, n)), sample_dir / "part-00000.parquet")
    gen_s = time.perf_counter() - t
    t = time.perf_counter()
    facts = expected_facts(ts, part, keyid, amount, partitions)
    facts_s = time.perf_counter() - t
    sizes = sum(f.stat().st_size for f in out_dir.glob("*.parquet"))
    counts = np.bincount(part, minlength=partitions)
    return {"records": n, "files": files, "bytes": sizes, "generate_s": round(gen_s, 2),
            "facts_s": round(facts_s, 2), "records_per_partition": counts.tolist(),
            "event_time_span_s": round(float(ts.max() - ts.min()) / 1000, 1),
            "distinct_keys": int(len(np.unique(keyid))), "top_key_share": round(float(np.bincount(rank).max()) / n, 4),
            "delayed_records": int(late.sum()), "sample_records": min(sample_n, n), "expected": facts}


def generate_chunked(out_dir: Path, n: int, disorder: float, partitions: int, seed: int, file_rows: int,
                     sample_dir: Path, sample_n: int) -> dict[str, Any]:
    """The same distribution as generate(), written CHUNK records at a time (a random stream per chunk, so
    not the same records as an unchunked run of the same seed). The numpy expectations are the ones that
    need no distinct-window count: all pairs, late pairs, and the closed windows' sum(cnt) and sum(amt)."""
    t = time.perf_counter()
    weights = 1.0 / np.arange(1, N_KEYS + 1)
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    key_of_rank = np.random.default_rng(seed).permutation(N_KEYS).astype(np.int32)
    key_part = _assign_partitions(weights, partitions)
    names = pa.array([f"user-{k:06d}" for k in range(N_KEYS)], pa.string())
    for d in (out_dir, sample_dir):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    next_offset = np.zeros(partitions, dtype=np.int64)
    st_carry = np.full(partitions, np.iinfo(np.int64).min, dtype=np.int64)
    kept = []  # per chunk: ts, partition, stream time, amount (25 bytes a record) for the closed-window sums
    pairs = late_pairs = files = 0
    counts = np.zeros(partitions, dtype=np.int64)
    delayed = 0
    for c, lo in enumerate(range(0, n, CHUNK)):
        m = min(CHUNK, n - lo)
        rng = np.random.default_rng([seed, c])
        rank = np.minimum(np.searchsorted(cdf, rng.random(m), side="right"), N_KEYS - 1).astype(np.int32)
        keyid, part = key_of_rank[rank], key_part[rank]
        i = np.arange(lo, lo + m, dtype=np.int64)
        ts = T0 + (i * 1000) // (RATE_PER_PARTITION * partitions) + rng.integers(0, JITTER_MS, m)
        late = rng.random(m) < disorder
        delayed += int(late.sum())
        ts[late] -= rng.integers(DELAY_MS[0], DELAY_MS[1] + 1, int(late.sum()))
        offset = np.empty(m, dtype=np.int64)
        st = np.empty(m, dtype=np.int64)
        for p in range(partitions):
            sel = part == p
            k = int(sel.sum())
            offset[sel] = next_offset[p] + np.arange(k, dtype=np.int64)
            next_offset[p] += k
            run = np.maximum.accumulate(np.concatenate([[st_carry[p]], ts[sel]]))[1:]
            st[sel] = run
            if k:
                st_carry[p] = run[-1]
        counts += np.bincount(part, minlength=partitions)
        amount = np.round(rng.gamma(2.0, 25.0, m), 2)
        first = (np.maximum(0, ts - SIZE + ADVANCE) // ADVANCE) * ADVANCE
        last = (ts // ADVANCE) * ADVANCE
        pairs += int(((last - first) // ADVANCE + 1).sum())
        for j in range(-(-SIZE // ADVANCE)):
            ws = first + j * ADVANCE
            late_pairs += int(((ws <= last) & ~(ws + SIZE > st - GRACE)).sum())
        kept.append((ts, part.astype(np.int8), st, amount))
        value = pc.binary_join_element_wise(pa.scalar('{"amount": '), pc.cast(pa.array(amount), pa.string()),
                                            pa.scalar("}"), pa.scalar(""))
        table = pa.table({"topic": pa.array(np.full(m, "events", dtype=object), pa.string()),
                          "partition": pa.array(part, pa.int32()), "offset": pa.array(offset, pa.int64()),
                          "key": names.take(pa.array(keyid)), "value": value, "timestamp": pa.array(ts, pa.int64())})
        for f in range(0, m, file_rows):
            pq.write_table(table.slice(f, file_rows), out_dir / f"part-{files:05d}.parquet")
            files += 1
        if c == 0:
            pq.write_table(table.slice(0, min(sample_n, m)), sample_dir / "part-00000.parquet")
        print(f"  generated {lo + m:,} of {n:,} records", flush=True)
    gen_s = time.perf_counter() - t
    t = time.perf_counter()
    closed_pairs, closed_amt = 0, 0.0
    for ts, part, st, amount in kept:  # closed: the task's final stream time >= window end + grace
        first = (np.maximum(0, ts - SIZE + ADVANCE) // ADVANCE) * ADVANCE
        last = (ts // ADVANCE) * ADVANCE
        for j in range(-(-SIZE // ADVANCE)):
            ws = first + j * ADVANCE
            closed = (ws <= last) & (ws + SIZE > st - GRACE) & (st_carry[part] >= ws + SIZE + GRACE)
            closed_pairs += int(closed.sum())
            closed_amt += float(amount[closed].sum())
    facts = {"pairs": pairs, "late_pairs": late_pairs, "closed_cnt_sum": closed_pairs,
             "closed_amt_sum": round(closed_amt, 2), "task_stream_time": st_carry.tolist(), "chunked": True}
    return {"records": n, "files": files, "bytes": sum(f.stat().st_size for f in out_dir.glob("*.parquet")),
            "generate_s": round(gen_s, 2), "facts_s": round(time.perf_counter() - t, 2),
            "records_per_partition": counts.tolist(), "event_time_span_s": None, "distinct_keys": None,
            "top_key_share": None, "delayed_records": delayed, "sample_records": min(sample_n, n), "expected": facts}


def expected_facts(ts: np.ndarray, part: np.ndarray, keyid: np.ndarray, amount: np.ndarray,
                   partitions: int) -> dict[str, Any]:
    """Kafka Streams' result computed independently with numpy (stream time = own partition's prefix max,
    which holds because each task owns one partition of one source); used to check the exact run cheaply."""
    st = np.empty_like(ts)
    task_st = np.zeros(partitions, dtype=np.int64)
    for p in range(partitions):
        m = part == p
        st[m] = np.maximum.accumulate(ts[m])  # arrays are in production order = offset order per partition
        task_st[p] = st[m][-1] if m.any() else -1
    first = (np.maximum(0, ts - SIZE + ADVANCE) // ADVANCE) * ADVANCE
    last = (ts // ADVANCE) * ADVANCE
    nwin = (last - first) // ADVANCE + 1
    wmin = int(first.min())
    span = int((last.max() - wmin) // ADVANCE) + 1
    acc_codes, closed_codes, all_codes = [], [], []
    late_pairs = closed_pairs = 0
    closed_amt = 0.0
    lost = np.ones(len(ts), dtype=bool)
    for j in range(-(-SIZE // ADVANCE)):
        ws = first + j * ADVANCE
        valid = ws <= last
        accepted = valid & (ws + SIZE > st - GRACE)
        lost &= ~accepted
        late_pairs += int((valid & ~accepted).sum())
        code = keyid.astype(np.int64) * span + (ws - wmin) // ADVANCE
        closed = accepted & (task_st[part] >= ws + SIZE + GRACE)
        closed_pairs += int(closed.sum())
        closed_amt += float(amount[closed].sum())
        all_codes.append(code[valid])
        acc_codes.append(code[accepted])
        closed_codes.append(code[closed])
    windows_all = len(np.unique(np.concatenate(all_codes)))
    windows_acc = len(np.unique(np.concatenate(acc_codes)))
    windows_closed = len(np.unique(np.concatenate(closed_codes)))
    return {"pairs": int(nwin.sum()), "late_pairs": late_pairs, "records_losing_every_window": int(lost.sum()),
            "windows_inexact": windows_all, "windows_exact_accepted": windows_acc,
            "windows_exact_closed": windows_closed, "windows_exact_incomplete": windows_acc - windows_closed,
            "closed_cnt_sum": closed_pairs, "closed_amt_sum": round(closed_amt, 2),
            "task_stream_time": task_st.tolist()}


def ensure_data(args: argparse.Namespace, work: Path) -> tuple[Path, Path, dict[str, Any]]:
    tag = f"n{args.records}-d{args.disorder:g}-p{args.partitions}-s{args.seed}"
    data, sample = work / "data" / tag, work / "data" / f"{tag}-sample{args.reference_records}"
    meta_file = work / "data" / f"{tag}.meta.json"
    if not args.regen and meta_file.is_file() and sample.is_dir():
        meta = json.loads(meta_file.read_text())
        # the meta file is the last generation's, which may have written another sample size; this is the one used
        meta["sample_records"] = min(args.reference_records, args.records)
        meta["cached"] = True
        return data, sample, meta
    meta = generate(data, args.records, args.disorder, args.partitions, args.seed, args.file_rows, sample,
                    args.reference_records)
    meta_file.write_text(json.dumps(meta, indent=1))
    meta["cached"] = False
    return data, sample, meta


# ---------------------------------------------------------------------------------------------------- job

SCHEMA = {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "bench event",
          "type": "object", "properties": {"amount": {"type": "number"}}}


def write_job(jobs: Path, name: str, data: Path, out: Path, ledger: bool, file: str | None = None) -> Path:
    """Job YAML: parquet source, key string, JSON value (amount number), record timestamp, one hopping agg."""
    jobs.mkdir(parents=True, exist_ok=True)
    (jobs / "event.schema.json").write_text(json.dumps(SCHEMA, indent=1))
    rel = lambda p: os.path.relpath(p, jobs)  # noqa: E731 - paths in a job are relative to it
    sinks = f"  amount_5m_hop: {{format: parquet, path: {rel(out / 'exact')}}}\n"
    if ledger:
        sinks += f"  _ledger: {{format: parquet, path: {rel(out / 'ledger')}}}\n"
    text = f"""# written by benchmarks/aggregate_bench.py
name: {name}
semantics: kafka-streams
sources:
  events:
    format: parquet
    path: {rel(data)}
    key: {{format: string}}
    value: {{format: json, schema: event.schema.json}}
    timestamp: {{extractor: record}}
operators:
  - name: amount_5m_hop
    aggregate:
      input: events
      window: {{type: hopping, size: 5m, advance: 1m, grace: 30s}}
      aggregations:
        cnt: count()
        amt: sum(value.amount)
      emit: final
sinks:
{sinks}"""
    path = jobs / f"{file or name}.yaml"  # one job file per data set: runs of other sizes do not rewrite it
    path.write_text(text)
    return path


# --------------------------------------------------------------------------------------------------- memory

class PeakRSS:
    """Summed RSS of this process and all its descendants (the JVM, Python workers), sampled every 0.2 s."""

    def __init__(self, interval: float = 0.2) -> None:
        self.interval = interval
        self.me = psutil.Process()
        self.peak_total = self.peak_python = self.start_total = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> tuple[int, int]:
        py = self.me.memory_info().rss
        total = py
        direct = {c.pid for c in self.me.children()}
        for child in self.me.children(recursive=True):
            try:
                # below the JVM, only Python workers are counted: anything else is a command the JVM starts
                # (Hadoop shells out for file permissions), which until it has exec'd shares the JVM's pages
                # (a fork named java, or jspawnhelper; a 100M run peaked once at 19 GB with a 9-10 GB JVM)
                if child.pid not in direct and not child.name().startswith("python"):
                    continue
                total += child.memory_info().rss
            except psutil.Error:
                pass
        return total, py

    def _run(self) -> None:
        while not self._stop.is_set():
            total, py = self.sample()
            self.peak_total, self.peak_python = max(self.peak_total, total), max(self.peak_python, py)
            self._stop.wait(self.interval)

    def __enter__(self) -> PeakRSS:
        self.start_total, _ = self.sample()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join()
        total, py = self.sample()
        self.peak_total, self.peak_python = max(self.peak_total, total), max(self.peak_python, py)

    def to_dict(self) -> dict[str, int]:
        return {"peak_rss_bytes": self.peak_total, "peak_python_rss_bytes": self.peak_python,
                "rss_at_start_bytes": self.start_total}


# ------------------------------------------------------------------------------------------------ variants

class StageClock:
    """Progress callback: time per stage name (a stage lasts until the next one or the end of the run),
    plus wall time of selected evaluator functions, wrapped without changing what they do."""

    WRAPPED = ("_read_all", "order_records", "_record_stats", "aggregate", "_ledger", "_check_ledger", "_publish",
               "_check_unique", "write_output", "_append_manifest")

    def __init__(self, spark: Any = None, group: str | None = None) -> None:
        self.marks: list[tuple[str, float]] = []
        self.calls: dict[str, float] = {}
        self.spark, self.group = spark, group
        self.jobs_by_call: dict[str, list[int]] = {}
        self.job_marks: list[set[int]] = []

    def __call__(self, stage: str) -> None:
        self.marks.append((stage, time.perf_counter()))
        self.job_marks.append(set(self._jobs()))

    def stages(self, end: float) -> dict[str, float]:
        out: dict[str, float] = {}
        for (name, t0), (_, t1) in zip(self.marks, [*self.marks[1:], ("end", end)]):
            out[name] = round(out.get(name, 0.0) + t1 - t0, 3)
        return out

    def install(self) -> None:
        from backfill.plan import evaluator

        for name in self.WRAPPED:  # the engine evolves: wrap what exists, skip the rest
            original = getattr(evaluator, name, None)
            if original is None or not callable(original):
                continue
            original = getattr(original, "__wrapped__", original)
            setattr(evaluator, name, self._timed(name, original))

    def _timed(self, name: str, fn: Any) -> Any:
        @functools.wraps(fn)
        def wrapper(*a: Any, **kw: Any) -> Any:
            t = time.perf_counter()
            before = set(self._jobs())
            try:
                return fn(*a, **kw)
            finally:
                self.calls[name] = round(self.calls.get(name, 0.0) + time.perf_counter() - t, 3)
                new = sorted(set(self._jobs()) - before)
                if new:
                    self.jobs_by_call.setdefault(name, []).extend(new)
        return wrapper

    def _jobs(self) -> list[int]:
        if self.spark is None or self.group is None:
            return []
        try:
            return list(self.spark.sparkContext.statusTracker().getJobIdsForGroup(self.group))
        except Exception:  # noqa: BLE001
            return []

    def spark_by_stage(self) -> dict[str, Any]:
        """Spark stages that ran (skipped ones left out), grouped by the progress stage during which their
        job was submitted, with totals; plus the Spark job ids each wrapped call submitted."""
        marks = [*self.job_marks, set(self._jobs())]
        out: dict[str, Any] = {}
        for i, (name, _) in enumerate(self.marks):
            jobs = sorted(marks[i + 1] - marks[i])
            stages = [st for j in jobs for st in stage_metrics(self.spark, j)]
            total = lambda k: round(sum(st[k] or 0 for st in stages), 2)  # noqa: E731
            out[name] = {"jobs": len(jobs), "stages_run": len(stages),
                         "stage_wall_s": total("wall_s"), "executor_run_s": total("executor_run_s"),
                         "gc_s": total("gc_s"), "shuffle_write_mb": total("shuffle_write_mb"),
                         "spill_disk_mb": total("spill_disk_mb"), "stages": stages}
        return {"by_progress_stage": out, "job_ids_by_call": self.jobs_by_call}


def stage_metrics(spark: Any, job_id: int) -> list[dict[str, Any]]:
    """Metrics of the stages of one Spark job that actually ran (skipped stages have no attempt)."""
    sc = spark.sparkContext
    try:
        info = sc.statusTracker().getJobInfo(job_id)
        store = sc._jsc.sc().statusStore()
    except Exception:  # noqa: BLE001 - diagnostics only
        return []
    out = []
    for sid in info.stageIds if info else []:
        try:
            attempts = store.stageData(sid, False, None, False, None)
        except Exception:  # noqa: BLE001 - skipped stage or API change
            continue
        for i in range(attempts.size()):
            sd = attempts.apply(i)
            if str(sd.status()) != "COMPLETE":
                continue
            sub, done = sd.submissionTime(), sd.completionTime()
            wall = (done.get().getTime() - sub.get().getTime()) / 1000 if sub.isDefined() and done.isDefined() else None
            mb = lambda v: round(v / 1e6, 1)  # noqa: E731
            out.append({"job": job_id, "stage": sid, "name": sd.name().split(" at ")[0], "tasks": sd.numTasks(), "wall_s": wall, "executor_run_s": round(sd.executorRunTime() / 1000, 2),
                        "gc_s": round(sd.jvmGcTime() / 1000, 2), "input_records": sd.inputRecords(),
                        "shuffle_read_mb": mb(sd.shuffleReadBytes()), "shuffle_write_mb": mb(sd.shuffleWriteBytes()),
                        "spill_memory_mb": mb(sd.memoryBytesSpilled()), "spill_disk_mb": mb(sd.diskBytesSpilled())})
    return out


def jobs_of(spark: Any, group: str) -> int | None:
    try:
        return len(spark.sparkContext.statusTracker().getJobIdsForGroup(group))
    except Exception:  # noqa: BLE001 - a nice-to-have count
        return None


def run_exact(spark: Any, job_file: Path, group: str) -> dict[str, Any]:
    from backfill.plan import evaluator
    from backfill.plan.builder import build_plan
    from backfill.jobspec.load import load_job

    clock = StageClock(spark, group)
    clock.install()
    spark.sparkContext.setJobGroup(group, group)
    error = None
    with PeakRSS() as mem:
        t = time.perf_counter()
        try:
            summary = evaluator.run_plan(build_plan(load_job(job_file), None, None), spark, clock).to_dict()
        except Exception as exc:  # noqa: BLE001 - report where it failed instead of losing the other numbers
            summary, error = None, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        end = time.perf_counter()
    seconds = end - t
    calls = clock.calls
    derived = {
        "first action: read + order + record stats (_record_stats)": calls.get("_record_stats"),
        "late ledger pairs + conservation check (_check_ledger)": calls.get("_check_ledger"),
        "final uniqueness check (_check_unique)": calls.get("_check_unique"),
        "sink write incl. aggregation (write_output)": calls.get("write_output"),
        "rest of _publish: incomplete-window count, ledger count": round(
            calls.get("_publish", 0) - calls.get("_check_unique", 0) - calls.get("write_output", 0), 3)
        if "_publish" in calls else None,
        "run manifest append (_append_manifest)": calls.get("_append_manifest"),
    }
    derived = {k: v for k, v in derived.items() if v is not None}
    out = {"seconds": round(seconds, 3), "stages": clock.stages(end), "calls": calls, "breakdown": derived,
           "spark_jobs": jobs_of(spark, group), "spark": clock.spark_by_stage(), "summary": summary,
           **mem.to_dict()}
    if error:
        out["error"] = error
        out["failed_in_stage"] = clock.marks[-1][0] if clock.marks else "before the first stage"
    return out


def run_inexact(spark: Any, data: Path, schema_file: Path, out: Path, group: str) -> dict[str, Any]:
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from backfill.io.schemas import load_value_schema

    spark.sparkContext.setJobGroup(group, group)
    with PeakRSS() as mem:
        t = time.perf_counter()
        df = spark.read.parquet(str(data))
        schema = load_value_schema(str(schema_file))  # the same schema, parsed the same way as the engine
        schema = T.StructType([*schema.fields, T.StructField("_corrupt_record", T.StringType())])
        value = F.from_json(F.col("value").cast("string"), schema,
                            {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": "_corrupt_record"})
        df = df.select("key", "timestamp", value.alias("value"))
        win = F.window(F.timestamp_millis(F.col("timestamp")), "5 minutes", "1 minute")
        result = (df.groupBy("key", win.alias("w"))
                  .agg(F.count(F.lit(1)).alias("cnt"), F.sum("value.amount").alias("amt"))
                  .select("key", F.unix_millis("w.start").alias("window_start"),
                          F.unix_millis("w.end").alias("window_end"), "cnt", "amt"))
        result.write.mode("overwrite").parquet(str(out))
        seconds = time.perf_counter() - t
    ids = spark.sparkContext.statusTracker().getJobIdsForGroup(group)
    return {"seconds": round(seconds, 3), "spark_jobs": jobs_of(spark, group),
            "spark_stages": [st for j in sorted(ids) for st in stage_metrics(spark, j)], **mem.to_dict()}


def run_ref(job_file: Path) -> dict[str, Any]:
    from backfill.reference.engine import run_reference
    from backfill.jobspec.load import load_job

    with PeakRSS() as mem:
        t = time.perf_counter()
        result = run_reference(load_job(job_file))
        seconds = time.perf_counter() - t
    reasons: dict[str, int] = {}
    for row in result.ledger:
        reasons[row["reason"]] = reasons.get(row["reason"], 0) + 1
    n = sum(result.records_read.values())
    return {"seconds": round(seconds, 3), "engine_duration_s": round(result.duration_s, 3), "records": n,
            "records_per_s": round(n / seconds, 1), "outputs": len(result.outputs["amount_5m_hop"]),
            "incomplete_windows": len(result.incomplete["amount_5m_hop"]), "ledger": reasons,
            "incomplete_cnt_sum": sum(r["cnt"] for r in result.incomplete["amount_5m_hop"]),
            "outputs_cnt_sum": sum(r["cnt"] for r in result.outputs["amount_5m_hop"]), **mem.to_dict()}


def sink_facts(folder: Path) -> dict[str, Any]:
    """Rows, sum(cnt), sum(amt) of a parquet sink folder (read with pyarrow, outside the timing)."""
    files = sorted(glob.glob(str(folder / "*.parquet")))
    if not files:
        return {"rows": 0, "cnt_sum": 0, "amt_sum": 0.0}
    t = pq.read_table(files, columns=["cnt", "amt"]) if len(files) > 1 else pq.read_table(files[0],
                                                                                           columns=["cnt", "amt"])
    return {"rows": t.num_rows, "cnt_sum": int(pc.sum(t["cnt"]).as_py() or 0),
            "amt_sum": round(float(pc.sum(t["amt"]).as_py() or 0.0), 2)}


# ---------------------------------------------------------------------------------------------------- report

def gb(b: int | float | None) -> str:
    return "-" if not b else f"{b / 2**30:.2f} GB"


def stats(values: list[float]) -> dict[str, float]:
    return {"min": round(min(values), 3), "median": round(statistics.median(values), 3),
            "max": round(max(values), 3)}


def table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    line = lambda r: "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))  # noqa
    return "\n".join([line(rows[0]), "  ".join("-" * w for w in widths), *map(line, rows[1:])])


def engine_fingerprint() -> dict[str, Any]:
    """Which engine code ran (the engine is being changed while benchmarks run): content hash of backfill/*.py
    and of backfill's Spark operators (jvm/ops/*.java)."""
    import hashlib

    import backfill

    h = hashlib.sha256()
    files = sorted((REPO / "backfill").rglob("*.py")) + sorted((REPO / "jvm" / "ops").rglob("*.java"))
    for f in files:
        h.update(str(f.relative_to(REPO)).encode())
        h.update(f.read_bytes())
    newest = max(files, key=lambda f: f.stat().st_mtime)
    return {"version": backfill.__version__, "sha256_of_sources": h.hexdigest()[:16],
            "newest_file": str(newest.relative_to(REPO)),
            "newest_mtime": dt.datetime.fromtimestamp(newest.stat().st_mtime, dt.timezone.utc).isoformat(
                timespec="seconds")}


def machine() -> dict[str, Any]:
    import pyspark

    mem = psutil.virtual_memory()
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    return {"cores": os.cpu_count(), "cpu": platform.processor() or platform.machine(),
            "memory_bytes": mem.total, "python": platform.python_version(), "pyspark": pyspark.__version__,
            "pyarrow": pa.__version__, "numpy": np.__version__, "platform": platform.platform(),
            "java": os.environ.get("JAVA_HOME"), "loadavg_at_start": load}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--big", action="store_true", help=f"{BIG:,} records")
    ap.add_argument("--disorder", type=float, default=0.03, help="fraction of records delayed by U[1 s, 180 s]")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--out", default=None, help="JSON result (default benchmarks/results/aggregate[-10m].json)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--work", default=str(HERE / "work"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--file-rows", type=int, default=500_000)
    ap.add_argument("--reference-records", type=int, default=50_000)
    ap.add_argument("--ledger-sink", action="store_true", help="also write the ledger to a parquet sink")
    ap.add_argument("--regen", action="store_true", help="regenerate the data even if it is cached")
    ap.add_argument("--variants", default="exact,inexact", help="which of exact,inexact to time (a 100M run may "
                    "time the exact one alone; the ratio needs both)")
    ap.add_argument("--keep", action="store_true", help="keep the run folder (jobs, sinks) under work/runs/")
    args = ap.parse_args(argv)
    if args.big:
        args.records = BIG
    out_json = Path(args.out) if args.out else HERE / "results" / (
        "aggregate-10m.json" if args.big else "aggregate.json")
    started_at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    work = Path(args.work).resolve()
    info = machine()
    engine = engine_fingerprint()
    print(f"machine: {info['cores']} cores, python {info['python']}, pyspark {info['pyspark']}, "
          f"load avg {info['loadavg_at_start']}", flush=True)

    t = time.perf_counter()
    data, sample, meta = ensure_data(args, work)
    print(f"data: {args.records:,} records in {meta['files']} files ({meta['bytes'] / 1e6:.0f} MB), "
          f"{'cached' if meta['cached'] else 'generated in %s s' % meta['generate_s']} "
          f"(+{meta['facts_s']} s numpy expectations), span {meta['event_time_span_s']} s", flush=True)
    data_s = time.perf_counter() - t
    run_dir = work / "runs" / f"{data.name}-pid{os.getpid()}"  # concurrent runs do not share jobs or sinks
    sinks = run_dir / "out"
    jobs = run_dir / "jobs"
    job = write_job(jobs, "aggregate-bench", data, sinks, args.ledger_sink, file=f"aggregate-bench-{data.name}")
    sample_job = write_job(jobs, "aggregate-bench-sample", sample, sinks / "sample", args.ledger_sink,
                           file=f"aggregate-bench-sample-{data.name}")

    # Spark startup, reported separately
    t = time.perf_counter()
    from backfill.session import get_spark

    spark = get_spark("local")
    spark.range(1).count()
    startup_s = time.perf_counter() - t
    print(f"spark startup: {startup_s:.2f} s (import + get_spark('local') + range(1).count())", flush=True)

    # warm-up on the small prefix sample (JIT, class loading, codegen caches); not measured
    t = time.perf_counter()
    warm_exact = run_exact(spark, sample_job, "warmup-exact")
    warm_inexact = run_inexact(spark, sample, jobs / "event.schema.json", sinks / "sample" / "inexact",
                               "warmup-inexact")
    warm_s = time.perf_counter() - t
    print(f"warm-up on {meta['sample_records']:,} records: {warm_s:.1f} s (exact {warm_exact['seconds']} s, "
          f"inexact {warm_inexact['seconds']} s)", flush=True)

    runs: dict[str, list[dict[str, Any]]] = {"exact": [], "inexact": []}
    for r in range(args.repeat):
        for variant in [v for v in ("exact", "inexact") if v in args.variants.split(",")]:
            if variant == "exact":
                res = run_exact(spark, job, f"exact-{r}")
            else:
                res = run_inexact(spark, data, jobs / "event.schema.json", sinks / "inexact", f"inexact-{r}")
            res["repetition"] = r
            runs[variant].append(res)
            if res.get("error"):
                print(f"  rep {r} {variant} FAILED in stage {res['failed_in_stage']!r} after {res['seconds']} s: "
                      f"{res['error']}", flush=True)
            extra = f" stages {res['stages']}" if variant == "exact" else ""
            print(f"  rep {r} {variant:8s} {res['seconds']:8.2f} s  peak {gb(res['peak_rss_bytes'])}{extra}",
                  flush=True)

    # reference engine last: its Python objects would otherwise inflate the Python RSS of the Spark variants
    try:
        ref = run_ref(sample_job)
    except Exception as exc:  # noqa: BLE001 - keep the Spark numbers
        ref = {"error": f"{type(exc).__name__}: {exc}", "records": meta["sample_records"], "seconds": float("nan"),
               "records_per_s": float("nan"), "peak_rss_bytes": 0, "outputs": None, "incomplete_windows": None,
               "ledger": {}}
    print(f"reference on {ref['records']:,} records: {ref['seconds']} s ({ref['records_per_s']:,.0f} rec/s)",
          flush=True)

    # exactness facts (cheap; outside the timing)
    exp = meta["expected"]
    ok_runs = [r for r in runs["exact"] if not r.get("error")]
    facts: dict[str, Any]
    if not ok_runs or warm_exact.get("error"):
        first_error = next(r for r in [warm_exact, *runs["exact"]] if r.get("error"))
        facts = {"exact_failed": {"error": first_error["error"], "stage": first_error["failed_in_stage"],
                                  "stages": first_error["stages"], "calls": first_error["calls"]},
                 "numpy_expected": exp, "inexact_sink": sink_facts(sinks / "inexact")}
    else:
        facts = exactness(ok_runs[-1]["summary"], warm_exact["summary"], ref, exp, sink_facts(sinks / "exact"),
                          sink_facts(sinks / "inexact"))
    report(args, started_at, info, engine, meta, data, data_s, startup_s, warm_s, warm_exact, warm_inexact, runs,
           ref, facts, out_json)
    spark.stop()
    if not args.keep:
        shutil.rmtree(run_dir, ignore_errors=True)
    return 0


def exactness(summ: dict[str, Any], warm: dict[str, Any], ref: dict[str, Any], exp: dict[str, Any],
              exact_sink: dict[str, Any], inexact_sink: dict[str, Any]) -> dict[str, Any]:
    """Cheap checks of the exact run against the numpy expectation and of the sample run against the reference."""
    op = summ["operators"]["amount_5m_hop"]
    warm_op = warm["operators"]["amount_5m_hop"]
    checks = {
            "late_pairs == numpy": op["late_pairs"] == exp["late_pairs"],
            "outputs == numpy closed windows": op["outputs"] == exp.get("windows_exact_closed", op["outputs"])
            == exact_sink["rows"],
            "incomplete == numpy": op["incomplete_windows"] == exp.get("windows_exact_incomplete",
                                                                       op["incomplete_windows"]),
            "sum(cnt) == numpy": exact_sink["cnt_sum"] == exp["closed_cnt_sum"],
            "sum(amt) ~= numpy": abs(exact_sink["amt_sum"] - exp["closed_amt_sum"]) <= 1e-6 * max(
                1.0, abs(exp["closed_amt_sum"])) + 0.05,
            "reference == exact on sample (outputs, incomplete, late)": (
                ref["outputs"] == warm_op["outputs"] and ref["incomplete_windows"] == warm_op["incomplete_windows"]
                and ref["ledger"].get("late", 0) == warm_op["late_pairs"])}
    if inexact_sink["rows"]:  # timed (not --variants exact)
        checks["inexact rows == numpy windows"] = inexact_sink["rows"] == exp.get("windows_inexact",
                                                                                  inexact_sink["rows"])
        checks["inexact sum(cnt) == all pairs"] = inexact_sink["cnt_sum"] == exp["pairs"]
    return {
        "exact_summary": {"records_in": summ.get("records_in"), **op, "ledger": summ.get("ledger"),
                          "ledger_rows": summ.get("ledger_rows")},
        "exact_sink": exact_sink, "inexact_sink": inexact_sink, "numpy_expected": exp,
        "checks": checks,
    }


def report(args: argparse.Namespace, started_at: str, info: dict[str, Any], engine: dict[str, Any],
           meta: dict[str, Any], data: Path, data_s: float, startup_s: float, warm_s: float,
           warm_exact: dict[str, Any], warm_inexact: dict[str, Any], runs: dict[str, list[dict[str, Any]]],
           ref: dict[str, Any], facts: dict[str, Any], out_json: Path) -> None:
    """Print the table and write the JSON."""
    n = args.records
    ok = [(a["seconds"], b["seconds"]) for a, b in zip(runs["exact"], runs["inexact"]) if not a.get("error")]
    ex = [r["seconds"] for r in runs["exact"] if not r.get("error")]
    inx = [r["seconds"] for r in runs["inexact"]]
    ratios = [a / b for a, b in ok]
    result_variants: dict[str, Any] = {}
    for name, vals in (("exact", ex), ("inexact", inx)):
        if not runs[name]:  # not asked for (--variants)
            result_variants[name] = {"records": n, "not_run": True, "runs": []}
            continue
        if not vals:
            result_variants[name] = {"records": n, "failed": True, "runs": runs[name]}
            continue
        s = stats(vals)
        result_variants[name] = {"records": n, "seconds": s, "records_per_s_at_median": round(n / s["median"], 1),
                                 "records_per_s_at_min": round(n / s["min"], 1),
                                 "peak_rss_bytes_max": max(r["peak_rss_bytes"] for r in runs[name]),
                                 "runs": runs[name]}
    result_variants["reference"] = {"records": ref["records"], "seconds": {"min": ref["seconds"]},
                                    "records_per_s": ref["records_per_s"], "run": ref}
    ratio = {"per_repetition": [round(x, 3) for x in ratios],
             "median_of_pairs": round(statistics.median(ratios), 3) if ratios else None,
             "min_over_min": round(min(ex) / min(inx), 3) if ex and inx else None,
             "median_over_median": round(statistics.median(ex) / statistics.median(inx), 3) if ex and inx else None}

    rows = [["variant", "records", "seconds (min / median)", "records/s (median)", "peak RSS", "exact/inexact"]]
    for name in ("exact", "inexact"):
        v = result_variants[name]
        if v.get("failed") or v.get("not_run"):
            rows.append([name, f"{n:,}", "not run" if v.get("not_run") else "FAILED", "-", "-", "-"])
            continue
        rows.append([name, f"{n:,}", f"{v['seconds']['min']:.2f} / {v['seconds']['median']:.2f}",
                     f"{v['records_per_s_at_median']:,.0f}", gb(v["peak_rss_bytes_max"]),
                     "-" if ratio["median_of_pairs"] is None else
                     f"{ratio['median_of_pairs']:.2f}" if name == "exact" else "1.00"])
    rows.append(["reference (sample)", f"{ref['records']:,}", f"{ref['seconds']:.2f}",
                 f"{ref['records_per_s']:,.0f}", gb(ref["peak_rss_bytes"]), "-"])
    rows.append(["spark startup", "-", f"{startup_s:.2f}", "-", "-", "-"])
    print()
    print(table(rows))
    if runs["exact"]:
        print("\nexact stages (last repetition):", json.dumps(runs["exact"][-1]["stages"]))
        print("exact breakdown (last repetition):", json.dumps(runs["exact"][-1]["breakdown"]))
        by_stage = runs["exact"][-1].get("spark", {}).get("by_progress_stage", {})
        print("exact Spark work per stage (last repetition):", json.dumps(
            {k: {f: v[f] for f in ("jobs", "stages_run", "stage_wall_s", "executor_run_s", "spill_disk_mb")}
             for k, v in by_stage.items()}))
    print("checks:", json.dumps(facts.get("checks", facts.get("exact_failed"))))

    doc = {
        "benchmark": "aggregate_bench", "started_at": started_at,
        "finished_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {**info, "loadavg_at_end": os.getloadavg()},
        "engine": {**engine, "changed_during_run": engine_fingerprint()["sha256_of_sources"] != engine["sha256_of_sources"]},
        "parameters": {**vars(args), "window": {"type": "hopping", "size_ms": SIZE, "advance_ms": ADVANCE,
                                                "grace_ms": GRACE}, "emit": "final",
                       "ledger_sink": "parquet" if args.ledger_sink else "none",
                       "runs_manifest": "default location (Delta via delta-rs, under the run folder's jobs/.backfill)",
                       "spark_profile": "local"},
        "data": {**{k: v for k, v in meta.items() if k != "expected"}, "path": str(data), "prepare_s": round(data_s, 2)},
        "spark_startup_s": round(startup_s, 3),
        "warmup": {"records": meta["sample_records"], "seconds": round(warm_s, 3), "exact": warm_exact,
                   "inexact": warm_inexact},
        "variants": result_variants, "ratio_exact_over_inexact": ratio, "exactness": facts,
        "notes": ["2-core shared machine; other work (tests) may run concurrently: timings are noisy",
                  "peak RSS = summed RSS of this Python process and its descendants (JVM, Python workers) sampled "
                  "every 0.2 s; the JVM heap only grows within the session, so later variants inherit it",
                  "exact 'calls' are wall times of wrapped evaluator functions (nested: _publish contains "
                  "_check_unique and write_output); 'stages' come from the progress callback"],
    }
    out_json.parent.mkdir(parents=True, exist_ok=True)
    out_json.write_text(json.dumps(doc, indent=1, default=str))
    print(f"\nwrote {out_json}")


if __name__ == "__main__":
    raise SystemExit(main())
