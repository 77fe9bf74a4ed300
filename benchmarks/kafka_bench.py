"""Benchmark: reading a topic from a real local broker: `backfill archive` and a count job straight from the
topic, beside Kafka's own producer benchmark on the same broker and plain Spark reading the same topic.

    python benchmarks/kafka_bench.py [--records 5000000] [--partitions 4] [--repeat 3]
                                     [--out benchmarks/results/kafka.json]

One process, one broker (KRaft, 127.0.0.1, started and stopped here), one SparkSession:
  broker      Kafka's ProducerPerformance (kafka-producer-perf-test) writing --records records of 100 bytes
              to a topic of its own: the broker's own produce rate on this machine
  produce     this script writing the benchmark's records (keys, JSON values, timestamps) with librdkafka
  plain       spark.read.format("kafka") over the topic, groupBy(key, 1 min window).count(), noop sink: what
              Spark's Kafka source alone costs
  archive     `backfill archive`: the topic into a Kafka-archive Delta table (one commit)
  count       `backfill run` of a count job (clicks and amount per user, tumbling 1 min, grace 10 s, emit
              final; value schema schemas/click.json) reading the topic: offsets resolved, records ordered per
              task, ledger, conservation, expectation suites, publish to parquet
Records/s are records read / wall seconds; peak RSS is this process and its children (JVM, Python workers).
Data goes to benchmarks/work/ (git-ignored).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

from aggregate_bench import PeakRSS, engine_fingerprint, gb, machine, table  # noqa: E402

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def broker_rate(bootstrap: str, records: int) -> dict[str, Any]:
    """Kafka's ProducerPerformance on its own topic: records of 100 random bytes, acks=1, as fast as it can."""
    from backfill.io.broker import JARS
    from backfill.io.kafka import create_topic

    create_topic(bootstrap, "perf", 4)
    out = subprocess.run(["java", "-cp", str(JARS / "*"), "org.apache.kafka.tools.ProducerPerformance",
                          "--topic", "perf", "--num-records", str(records), "--record-size", "100",
                          "--throughput", "-1", "--producer-props", f"bootstrap.servers={bootstrap}", "acks=1",
                          "linger.ms=20", "batch.size=262144"],
                         capture_output=True, text=True, timeout=1800, check=True).stdout
    last = [line for line in out.splitlines() if "records sent" in line][-1]
    rate = float(re.search(r"([\d.]+) records/sec", last).group(1))  # type: ignore[union-attr]
    return {"records": records, "records_per_s": rate, "line": last.strip()}


def produce_clicks(bootstrap: str, topic: str, n: int, partitions: int, seed: int) -> dict[str, Any]:
    """n clicks over `partitions` partitions (1,000 users, each in one partition; 100 clicks per second of event
    time, so about 6 per user and minute), 3% up to 2 min late."""
    from confluent_kafka import Producer

    from backfill.io.kafka import client_config, create_topic

    create_topic(bootstrap, topic, partitions)
    rng = np.random.default_rng(seed)
    users = rng.integers(0, 1_000, n)
    ts = T0 + np.arange(n, dtype=np.int64) * 10 - np.where(rng.random(n) < 0.03, rng.integers(1_000, 120_000, n), 0)
    pages = ("/home", "/search", "/product", "/cart")
    config = {k: v for k, v in client_config(bootstrap).items() if k not in ("group.id", "enable.auto.commit")}
    producer = Producer({**config, "linger.ms": 50, "batch.size": 1_000_000, "queue.buffering.max.messages": 2_000_000})
    started = time.time()
    for i in range(n):
        u = int(users[i])
        while True:
            try:
                producer.produce(topic, key=b"user-%d" % u, partition=u % partitions, timestamp=int(ts[i]),
                                 value=b'{"page":"%s","amount":%d}' % (pages[u % 4].encode(), i % 97))
                break
            except BufferError:
                producer.poll(0.05)
        if i % 100_000 == 0:
            producer.poll(0)
    producer.flush(120)
    seconds = time.time() - started
    return {"records": n, "seconds": round(seconds, 2), "records_per_s": round(n / seconds)}


def write_job(folder: Path, bootstrap: str, topic: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    job = folder / "count.yaml"
    job.write_text(f"""
name: kafka-count
sources:
  clicks: {{format: kafka, kafka: {{bootstrap: '{bootstrap}', topic: {topic}}}, key: {{format: string}},
           value: {{format: json, schema: {REPO / 'schemas' / 'click.json'}}}, timestamp: {{extractor: record}}}}
operators:
  - name: per_user
    aggregate:
      input: clicks
      window: {{type: tumbling, size: 1m, grace: 10s}}
      aggregations: {{clicks: count(), amount: sum(value.amount)}}
      emit: final
sinks:
  per_user: {{format: parquet, path: {folder / 'out'}}}
  _ledger: {{format: parquet, path: {folder / 'ledger'}}}
  _runs: {{format: jsonl, path: {folder / 'runs.jsonl'}}}
""")
    return job


def timed(fn: Any) -> dict[str, Any]:
    with PeakRSS() as mem:
        started = time.time()
        extra = fn() or {}
        seconds = time.time() - started
    return {"seconds": round(seconds, 2), **mem.to_dict(), **extra}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=5_000_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3,
                    help="rounds (the first warms the JVM and the page cache; the count job settles by the third)")
    ap.add_argument("--variants", default="plain,archive,count", help="which of plain, archive, count to time")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", default=str(HERE / "work"))
    ap.add_argument("--out", default=str(HERE / "results" / "kafka.json"))
    args = ap.parse_args(argv)
    info, engine = machine(), engine_fingerprint()
    work = Path(args.work).resolve() / f"kafka-pid{os.getpid()}"
    from backfill.io.archive import archive_topic
    from backfill.io.broker import start_broker
    from backfill.jobspec.load import load_job
    from backfill.plan.builder import build_plan
    from backfill.plan.evaluator import run_plan
    from backfill.session import get_spark

    n = args.records
    results: dict[str, Any] = {}
    with start_broker() as broker:
        bootstrap = broker.bootstrap
        print(f"machine: {info['cores']} cores; broker {bootstrap}; {n:,} records, {args.partitions} partitions",
              flush=True)
        results["broker"] = broker_rate(bootstrap, n)
        print(f"  broker (ProducerPerformance): {results['broker']['records_per_s']:>12,.0f} records/s", flush=True)
        results["produce"] = produce_clicks(bootstrap, "clicks", n, args.partitions, args.seed)
        print(f"  produce (librdkafka):         {results['produce']['records_per_s']:>12,.0f} records/s", flush=True)
        spark = get_spark("local")
        spark.range(1).count()
        from pyspark.sql import functions as F

        def plain() -> dict[str, Any]:
            df = (spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap)
                  .option("subscribe", "clicks").option("startingOffsets", "earliest")
                  .option("endingOffsets", "latest").load())
            (df.groupBy("key", F.window("timestamp", "1 minute")).count()
             .write.format("noop").mode("overwrite").save())
            return {}

        def archive(rep: int) -> dict[str, Any]:
            got = archive_topic(spark, bootstrap, "clicks", str(work / f"archive{rep}"))
            assert got["records"] == n, got
            return {"records_out": got["records"]}

        def count(rep: int) -> dict[str, Any]:
            job = write_job(work / f"job{rep}", bootstrap, "clicks")
            summary = run_plan(build_plan(load_job(job)), spark)
            assert summary.records_in == n, summary.records_in
            return {"outputs": summary.operators["per_user"].outputs, "ledger": summary.ledger}

        chosen = args.variants.split(",")
        runs: dict[str, list[dict[str, Any]]] = {v: [] for v in ("plain", "archive", "count") if v in chosen}
        for rep in range(args.repeat):
            for variant, fn in (("plain", plain), ("archive", lambda: archive(rep)), ("count", lambda: count(rep))):
                if variant not in runs:
                    continue
                res = timed(fn)
                res["records_per_s"] = round(n / res["seconds"])
                runs[variant].append(res)
                print(f"  {variant:8s} rep {rep}: {res['seconds']:8.2f} s {res['records_per_s']:>12,} records/s  "
                      f"peak {gb(res['peak_rss_bytes'])}", flush=True)
        spark.stop()
    best = {v: max(r["records_per_s"] for r in rs) for v, rs in runs.items()}
    rows = [["variant", "records/s (best)", "peak RSS"],
            ["broker (Kafka's producer perf)", f"{results['broker']['records_per_s']:,.0f}", "-"],
            ["produce (librdkafka)", f"{results['produce']['records_per_s']:,}", "-"],
            *[[v, f"{best[v]:,}", gb(max(r["peak_rss_bytes"] for r in runs[v]))] for v in runs]]
    print(table(rows))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                               "records": n, "partitions": args.partitions, "machine": info, "engine": engine,
                               "loadavg_at_end": os.getloadavg(), **results, "runs": runs, "best_records_per_s": best},
                              indent=1, default=str))
    print(f"wrote {out}")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
