"""Part: conformance. The merge order judged by a live Kafka Streams application (docs/semantics.md §2.2-§2.5).

Random scenarios, each one task of two queues: timestamps on a coarse grid so that heads tie often, records
delayed (a timestamp below the partition time), invalid timestamps, partitions of uneven length (empty ones
too), and timestamps spread over hours. A batch is two pairs of topics on a real broker, one partition per
scenario: `a` and `b` read through one source node, `c` and `d` joined (two source nodes, one
sub-topology). Every record is produced before the application starts. The application
(jvm/harness `LiveOrder`) reports each record's (topic, partition, offset) as its task takes it; backfill's
engines give their order for a job that joins `a` with `b` and `c` with `d` (one sub-topology each, as in the
application). The topic names are drawn per batch, so a topic declared first is as often named last.
"""
from __future__ import annotations

import json
import queue
import random
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backfill.conformance.check import KindResult
from backfill.conformance.harness import check_version, classpath
from backfill.errors import SourceError
from backfill.reference.partition_group import partition_group

SOURCES = ("a", "b", "c", "d")
MODES = {"source": ("a", "b"), "join": ("c", "d")}
NAMES = ("clicks", "views", "orders", "pay", "zeta", "alpha", "m1", "m2", "Z", "b_2")


@dataclass
class OrderScenario:
    """One task: the event times of its two partitions (negative: invalid), and keys."""

    id: int
    mode: str  # source: two topics through one source node; join: a stream-stream join
    times: dict[str, list[int]]  # "left" / "right" -> event times in offset order
    keys: dict[str, list[str]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "mode": self.mode, "times": self.times, "keys": self.keys}


@dataclass
class OrderDifference:
    """A scenario whose task order differs between an engine and Kafka Streams."""

    scenario: OrderScenario
    engine: str
    ours: list[tuple[str, int]]
    theirs: list[tuple[str, int]]
    repro: str | None = None

    def to_dict(self) -> dict[str, Any]:
        first = next((i for i, (x, y) in enumerate(zip(self.ours, self.theirs)) if x != y),
                     min(len(self.ours), len(self.theirs)))
        return {"scenario": self.scenario.id, "operator": "order", "engine": self.engine, "first_difference": first,
                "ours": self.ours[first:first + 5], "kafka_streams": self.theirs[first:first + 5], "repro": self.repro}


@dataclass
class OrderResult(KindResult):
    """KindResult, and per engine the tasks whose real first offering was the other one (§2.4): their first
    heads tie and Kafka Streams took them in the order the engine gives once that offering is swapped."""

    first_offer: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "agreeing_after_the_other_first_offering": self.first_offer}


class _Heads:
    """A scenario's queue for the reference's PartitionGroup: invalid timestamps are skipped (never heads)."""

    def __init__(self, topic: str, times: list[int]) -> None:
        self.topic, self.times, self.pos = topic, times, 0
        self.head: dict[str, Any] | None = None
        self._advance()

    def _advance(self) -> None:
        while self.pos < len(self.times) and self.times[self.pos] < 0:
            self.pos += 1
        self.head = {"ts": self.times[self.pos], "offset": self.pos} if self.pos < len(self.times) else None

    def poll(self) -> dict[str, Any]:
        rec = self.head
        assert rec is not None
        self.pos += 1
        self._advance()
        return rec


def offerings(sc: OrderScenario, topics: dict[str, str]) -> list[list[tuple[str, int]]]:
    """The task's order for each first offering the data leaves open (§2.4): the topic-name one, then, when
    the two queues' first heads tie, the other one."""
    left, right = MODES[sc.mode]
    firsts = [next((t for t in sc.times[side] if t >= 0), None) for side in ("left", "right")]
    out = []
    for flipped in (False, True) if firsts[0] is not None and firsts[0] == firsts[1] else (False,):
        queues = [_Heads(topics[left], sc.times["left"]), _Heads(topics[right], sc.times["right"])]
        rank = {q.topic: i for i, q in enumerate(sorted(queues, key=lambda q: q.topic, reverse=flipped))}
        out.append([(q.topic, rec["offset"]) for q, rec in partition_group(queues, lambda q: "", lambda q: rank[q.topic])])
    return out


def generate(n: int, seed: int, invalid: bool = True) -> list[OrderScenario]:
    """n scenarios, alternating between the two topologies."""
    rng = random.Random(seed)
    return [_scenario(rng, i, "source" if i % 2 == 0 else "join", invalid) for i in range(n)]


def _scenario(rng: random.Random, sid: int, mode: str, invalid: bool) -> OrderScenario:
    base = rng.choice([0, 1000, 1_700_000_000_000])
    grid = rng.choice([1, 10, 100])
    times, keys = {}, {}
    for side in ("left", "right"):
        n = rng.choice([0, 1, 3, 8, 20, 40, 80, 150, 300]) if rng.random() < 0.9 else rng.randint(0, 400)
        t, out = base, []
        for i in range(n):
            step = rng.choices([0, 1, 2, 5, 3_600_000 // grid], [50, 25, 10, 5, 1])[0]
            t += step * grid
            ts = t - rng.randint(1, 5) * grid if rng.random() < 0.1 else t  # delayed: below the partition time
            if invalid and i > 0 and rng.random() < 0.03:
                ts = -1
            out.append(max(ts, -1))
        times[side] = out
        keys[side] = [rng.choice(["k1", "k2", "k3", "hot", "hot", "hot"]) for _ in out]
    return OrderScenario(sid, mode, times, keys)


def _records(scenarios: list[OrderScenario], side: str, mode: str, topic: str) -> list[dict[str, Any]]:
    rows = []
    for p, sc in enumerate(s for s in scenarios if s.mode == mode):
        for offset, (ts, key) in enumerate(zip(sc.times[side], sc.keys[side], strict=True)):
            rows.append({"topic": topic, "partition": p, "offset": offset, "key": key,
                         "value": json.dumps({"t": ts}), "timestamp": max(ts, 1)})
    return rows


def _job(partitions: dict[str, int], policy: str) -> str:
    sources = "\n".join(
        f"  {s}: {{format: jsonl, path: {s}.jsonl, partitions: {max(partitions[s], 1)}, key: {{format: string}}, "
        f"value: {{format: json, schema: value.json}}, timestamp: {{extractor: field, field: t, on_invalid: {policy}}}}}"
        for s in SOURCES)
    ops = "\n".join(f"  - name: {a}{b}\n    join: {{left: {a}, right: {b}, how: inner, window: {{before: 5ms, "
                    f"after: 5ms, grace: 0ms}}, value: \"left.value.t\"}}" for a, b in MODES.values())
    sinks = ", ".join(f"{a}{b}: {{format: none}}" for a, b in MODES.values())
    return f"name: order-judge\nsources:\n{sources}\noperators:\n{ops}\nsinks: {{{sinks}}}\n"


def _write_batch(folder: Path, scenarios: list[OrderScenario], topics: dict[str, str], policy: str
                 ) -> dict[str, list[dict[str, Any]]]:
    folder.mkdir(parents=True, exist_ok=True)
    records: dict[str, list[dict[str, Any]]] = {}
    for mode, (left, right) in MODES.items():
        records[left] = _records(scenarios, "left", mode, topics[left])
        records[right] = _records(scenarios, "right", mode, topics[right])
    for name, rows in records.items():
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "value.json").write_text(json.dumps({"type": "object", "properties": {"t": {"type": "integer"}}}))
    count = {mode: sum(1 for s in scenarios if s.mode == mode) for mode in MODES}
    partitions = {s: count[m] for m, pair in MODES.items() for s in pair}
    (folder / "job.yaml").write_text(_job(partitions, policy))
    return records


def _produce(bootstrap: str, records: dict[str, list[dict[str, Any]]], topics: dict[str, str],
             partitions: dict[str, int]) -> None:
    from backfill.io.kafka import create_topic, produce

    for name, topic in topics.items():
        create_topic(bootstrap, topic, max(partitions[name], 1))
        produce(bootstrap, topic, [{k: r[k] for k in ("partition", "key", "value", "timestamp")} for r in records[name]])


def live_order(bootstrap: str, topics: dict[str, str], policy: str, expected: int, work: Path, version: str,
               timeout_s: float = 300, settings: tuple[str, ...] = ()) -> dict[tuple[str, int], list[tuple[str, int]]]:
    """Run LiveOrder until it has reported `expected` records; (topic pair's mode, task partition) -> the
    (topic, offset) it took, in order."""
    check_version(version)
    state = work / f"state-{uuid.uuid4().hex[:8]}"
    command = ["java", "-cp", classpath(version), "io.backfill.harness.LiveOrder", bootstrap,
               f"order-judge-{uuid.uuid4().hex[:8]}", str(state), policy,
               *(topics[s] for s in SOURCES), *settings]
    log = work / "live-order.log"
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log.open("a"), text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x.rstrip("\n")) for x in proc.stdout or []], daemon=True).start()
    mode_of = {topics[s]: m for m, pair in MODES.items() for s in pair}
    order: dict[tuple[str, int], list[tuple[str, int]]] = {}
    seen = 0
    deadline = time.monotonic() + timeout_s
    try:
        while seen < expected:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SourceError(f"the live Kafka Streams application reported {seen} of {expected} records "
                                  f"(log: {log.read_text(errors='replace')[-400:]})")
            try:
                line = lines.get(timeout=1)
            except queue.Empty:
                continue
            f = line.split("\t")
            if f[0] != "P":
                continue
            topic, partition, offset = f[2], int(f[3]), int(f[4])
            order.setdefault((mode_of[topic], partition), []).append((topic, offset))
            seen += 1
        time.sleep(1)  # nothing more should come: a record reported twice would show here
        while not lines.empty():
            f = lines.get().split("\t")
            if f[0] == "P":
                order.setdefault((mode_of[f[2]], int(f[3])), []).append((f[2], int(f[4])))
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(state, ignore_errors=True)
    return order


def ours(job: Path, engine: str, topics: dict[str, str], spark: Any = None
         ) -> dict[tuple[str, int], list[tuple[str, int]]]:
    """An engine's processed records per (mode, task), in its order."""
    from backfill.jobspec.load import load_job
    from backfill.plan.builder import build_plan

    plan = build_plan(load_job(job), None, None)
    rows: list[tuple[int, int, str, int]] = []
    if engine == "reference":
        from backfill.reference.engine import run_reference

        for task, recs in run_reference(plan.job, None, None).order.items():
            rows += [(task, r["seq"], r["source"], r["offset"]) for r in recs]
    else:
        from backfill.plan.evaluator import ordered_records

        df = ordered_records(plan, spark)
        rows = [(r["task"], r["seq"], r["source"], r["offset"]) for r in
                df.select("task", "seq", "source", "offset").collect()]
    mode_of = {s: m for m, pair in MODES.items() for s in pair}
    out: dict[tuple[str, int], list[tuple[str, int]]] = {}
    for task, _, source, offset in sorted(rows):
        out.setdefault((mode_of[source], task), []).append((topics[source], offset))
    return out


@dataclass
class Batch:
    """Scenarios written as one job and produced to one set of topics."""

    scenarios: list[OrderScenario]
    topics: dict[str, str]  # source -> topic name
    folder: Path  # the job and its inputs
    records: dict[str, list[dict[str, Any]]]
    policy: str = "skip"

    @property
    def processed(self) -> int:
        return sum(1 for rows in self.records.values() for r in rows if json.loads(r["value"])["t"] >= 0)

    @property
    def total(self) -> int:
        return sum(len(rows) for rows in self.records.values())

    def task(self, sc: OrderScenario) -> tuple[str, int]:
        """(mode, partition) of a scenario's task."""
        return sc.mode, [s.id for s in self.scenarios if s.mode == sc.mode].index(sc.id)


def prepare(chunk: list[OrderScenario], folder: Path, rng: random.Random, policy: str = "skip") -> Batch:
    """Topic names drawn (their order decides the first ties), the job and its JSONL inputs written."""
    names = rng.sample(NAMES, 4)
    topics = {s: f"{n}-{uuid.uuid4().hex[:6]}" for s, n in zip(SOURCES, names, strict=True)}
    return Batch(chunk, topics, folder, _write_batch(folder, chunk, topics, policy), policy)


def judge_batch(batch: Batch, bootstrap: str, version: str, engines: tuple[str, ...], spark: Any = None,
                settings: tuple[str, ...] = (), work: Path | None = None
                ) -> tuple[dict[tuple[str, int], list[tuple[str, int]]], dict[str, dict[tuple[str, int], list]]]:
    """Produce the batch, run the live application on it, then each engine: (theirs, ours by engine)."""
    partitions = {s: sum(1 for sc in batch.scenarios if sc.mode == m) for m, pair in MODES.items() for s in pair}
    _produce(bootstrap, batch.records, batch.topics, partitions)
    theirs = live_order(bootstrap, batch.topics, batch.policy, batch.processed, work or batch.folder, version,
                        settings=settings)
    return theirs, {e: ours(batch.folder / "job.yaml", e, batch.topics, spark) for e in engines}


def run_order(count: int, seed: int, version: str, engines: tuple[str, ...], work: Path, failures: Path,
              bootstrap: str | None = None, spark: Any = None, batch: int = 200, settings: tuple[str, ...] = (),
              progress: Callable[[str], None] = lambda line: None) -> KindResult:
    """Judge `count` scenarios in batches (one application run and one backfill run each); `settings`: the
    application's own (`name=value`, e.g. a small `max.poll.records`)."""
    from backfill.io.broker import start_broker

    result = OrderResult("order", count, 0, 0, agreeing={e: 0 for e in engines}, first_offer={e: 0 for e in engines})
    broker = None
    if bootstrap is None:
        broker = start_broker()
        bootstrap = broker.bootstrap
    try:
        scenarios = generate(count, seed)
        rng = random.Random(seed + 1)
        for first in range(0, count, batch):
            one = prepare(scenarios[first:first + batch], work / f"order-{first // batch}", rng)
            progress(f"  batch {first // batch}: {len(one.scenarios)} scenarios, {one.processed:,} records "
                     f"processed, topics {', '.join(one.topics[s] for s in SOURCES)}")
            theirs, got = judge_batch(one, bootstrap, version, engines, spark, settings, work)
            result.records += one.total
            result.outputs += one.processed
            result.dropped += one.total - one.processed
            for engine, mine_all in got.items():
                for sc in one.scenarios:
                    mine, real = mine_all.get(one.task(sc), []), theirs.get(one.task(sc), [])
                    verdict = agrees(sc, one.topics, mine, real)
                    if verdict:
                        result.agreeing[engine] += 1
                        result.first_offer[engine] += verdict == "first_offer"
                    else:
                        repro = _keep(failures, sc, one.topics, engine, mine, real)
                        result.differences.append(OrderDifference(sc, engine, mine, real, repro))
    finally:
        if broker is not None:
            broker.stop()
    return result


def agrees(sc: OrderScenario, topics: dict[str, str], mine: list[tuple[str, int]], real: list[tuple[str, int]]
           ) -> str | None:
    """'exact' when the orders are the same; 'first_offer' when they differ only by the first offering the
    data cannot tell (§2.4): the engine's order is the topic-name one and Kafka Streams' the other; else None."""
    if mine == real:
        return "exact"
    ways = offerings(sc, topics)
    return "first_offer" if len(ways) == 2 and mine == ways[0] and real == ways[1] else None


def _keep(failures: Path, sc: OrderScenario, topics: dict[str, str], engine: str, mine: list[tuple[str, int]],
          real: list[tuple[str, int]]) -> str:
    failures.mkdir(parents=True, exist_ok=True)
    path = failures / f"order-{sc.id}-{engine}.json"
    path.write_text(json.dumps({"scenario": sc.to_dict(), "topics": topics, "engine": engine, "ours": mine,
                                "kafka_streams": real}, indent=1))
    return str(path)
