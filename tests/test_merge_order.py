"""The merge of a task's queues (docs/semantics.md §2.3-§2.5): the heap as Java keeps it, and Spark's two ways of
replaying it (backfill's operator, the Python fallback) against the reference engine on random tasks with
many equal timestamps, delayed and invalid records, and a source of another sub-topology beside them."""
from __future__ import annotations

import json
import os
import random
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from backfill.cli import app
from backfill.order import merge, tasks
from backfill.reference.partition_group import JavaPriorityQueue
from tests.conftest import write_jsonl

PQ = """
import java.util.*;
public class PQ {
  public static void main(String[] a) {
    Scanner in = new Scanner(System.in);
    long[] key = new long[64];
    PriorityQueue<Integer> heap = new PriorityQueue<>(Comparator.comparingLong(x -> key[x]));
    StringBuilder out = new StringBuilder();
    while (in.hasNext()) {
      String op = in.next();
      if (op.equals("o")) { int x = in.nextInt(); key[x] = in.nextLong(); heap.offer(x); }
      else if (op.equals("p")) { out.append(heap.poll()).append(' '); }
      else { System.out.println(out.toString().trim()); out.setLength(0); heap.clear(); }
    }
  }
}
"""


def _operations(rng: random.Random) -> list[tuple]:
    """Offers (element, key) and polls as a task makes them: an element is offered again only once polled."""
    ops: list[tuple] = []
    out = list(range(rng.randint(1, 7)))
    inside = 0
    for _ in range(rng.randint(1, 60)):
        if out and (inside == 0 or rng.random() < 0.6):
            ops.append(("o", out.pop(rng.randrange(len(out))), rng.choice([0, 1, 1, 2, 2, 2, 3, 5])))
            inside += 1
        elif inside:
            ops.append(("p",))
            inside -= 1
    return ops


def _polled(heap, ops: list[tuple]) -> list[int]:
    keys: dict[int, int] = {}
    heap.key = lambda x: keys[x]
    got = []
    for op in ops:
        if op[0] == "o":
            keys[op[1]] = op[2]
            heap.offer(op[1])
        else:
            got.append(heap.poll())
    return got


def test_both_heaps_poll_as_java_util_priority_queue_does(tmp_path):
    """Java's own PriorityQueue (a source-file program, one case per line) decides; most keys drawn tie."""
    java = tmp_path / "PQ.java"
    java.write_text(PQ)
    seed = int(os.environ.get("BACKFILL_TEST_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    cases = [_operations(rng) for _ in range(300)]
    program = "\n".join(" ".join(" ".join(str(x) for x in op) for op in ops) + " |" for ops in cases)
    proc = subprocess.run(["java", str(java)], input=program, capture_output=True, text=True, timeout=120, check=True)
    expected = [[int(x) for x in line.split()] for line in proc.stdout.splitlines()]
    assert len(expected) == len(cases)
    for ops, want in zip(cases, expected, strict=True):
        assert _polled(JavaPriorityQueue(lambda x: 0), ops) == want, f"seed {seed}: {ops}"
        assert _polled(merge.JavaHeap(lambda x: 0), ops) == want, f"seed {seed}: {ops}"


JOB = """
name: merge-order
sources:
  a: {format: jsonl, path: inputs/a.jsonl, partitions: PARTS, timestamp: {extractor: record, on_invalid: skip}}
  b: {format: jsonl, path: inputs/b.jsonl, partitions: PARTS, timestamp: {extractor: record, on_invalid: skip}}
  c: {format: jsonl, path: inputs/c.jsonl, timestamp: {extractor: record, on_invalid: skip}}
operators:
  - name: j
    join: {left: a, right: b, how: left, window: {before: 2ms, after: 2ms, grace: 0ms},
           value: "concat(coalesce(left.value, '-'), coalesce(right.value, '-'))"}
  - name: n
    aggregate: {input: c, window: {type: tumbling, size: 10ms, grace: 0ms}, aggregations: {n: count()}}
sinks: {j: {format: none}, n: {format: none}}
"""


def _partitions(rng: random.Random, topic: str, parts: int) -> list[dict]:
    rows = []
    for p in range(parts):
        t = rng.choice([0, 3])
        for o in range(rng.choice([0, 1, 2, 5, 9, 14])):
            t = max(0, t + rng.choice([0, 0, 0, 1, 2, -1, -3]))  # mostly ties, some delayed
            ts = t if rng.random() > 0.06 else -1  # invalid: skipped, never a head
            rows.append({"topic": topic, "partition": p, "offset": o, "key": rng.choice("kkx"),
                         "value": f"{topic}{p}.{o}", "timestamp": ts})
    return rows


def _order(job: Path, engine: str) -> list[tuple]:
    result = CliRunner().invoke(app, ["inspect", str(job), "--json", "--limit", "0", "--engine", engine])
    assert result.exit_code == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    return [(r["task"], r["source"], r["offset"]) for r in sorted(rows, key=lambda r: (r["task"], r["seq"]))]


@pytest.mark.spark
@pytest.mark.parametrize("seed", [3, 17, "fresh"])
def test_spark_merges_queues_as_the_reference_does(tmp_path, spark, seed, monkeypatch):
    """Backfill's operator and the Python fallback against the reference engine, task by task (40 tasks; the
    topics named in another order than the sources are declared, on one seed of three)."""
    if seed == "fresh":
        seed = int(os.environ.get("BACKFILL_TEST_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    parts = 40
    topics = rng.sample(["alpha", "m", "zz"], 3)
    for name, topic in zip("abc", topics, strict=True):
        write_jsonl(tmp_path / "inputs" / f"{name}.jsonl", _partitions(rng, topic, parts))
    job = tmp_path / "job.yaml"
    job.write_text(JOB.replace("PARTS", str(parts)))
    reference = _order(job, "reference")
    assert _order(job, "spark") == reference, f"seed {seed}, topics {topics}"
    monkeypatch.setattr(tasks, "USE_OPERATOR", False)
    assert _order(job, "spark") == reference, f"seed {seed} (without the operator), topics {topics}"


@pytest.mark.spark
def test_a_recorded_order_streams_as_the_windows_number_it(tmp_path, spark, monkeypatch):
    """order_by: the operator's pass in the recorded order gives the same seq, partition times and stream
    times as Spark's windows over whole tasks (the path without the jar)."""
    rng = random.Random(5)
    for name, topic in zip("ab", ("t1", "t2"), strict=True):
        rows = _partitions(rng, topic, 6)
        for r in rows:
            r["seq"] = rng.randint(0, 30)  # recorded positions, ties included
        write_jsonl(tmp_path / "inputs" / f"{name}.jsonl", rows)
    job = tmp_path / "job.yaml"
    job.write_text(JOB.replace("PARTS", "6").replace("on_invalid: skip}}", "on_invalid: skip}, order_by: seq}")
                   .replace("  c: {format: jsonl, path: inputs/c.jsonl, timestamp: {extractor: record, on_invalid: "
                            "skip}, order_by: seq}\n", "")
                   .replace("  - name: n\n    aggregate: {input: c, window: {type: tumbling, size: 10ms, grace: 0ms}, "
                            "aggregations: {n: count()}}\n", "").replace(", n: {format: none}", ""))

    def inspected() -> list[dict]:
        result = CliRunner().invoke(app, ["inspect", str(job), "--json", "--limit", "0"])
        assert result.exit_code == 0, result.stderr
        return sorted((json.loads(line) for line in result.stdout.splitlines() if line.strip()),
                      key=lambda r: (r["task"], r["seq"]))

    streamed = inspected()
    monkeypatch.setattr(tasks, "USE_OPERATOR", False)
    assert streamed == inspected() and len(streamed) > 20
