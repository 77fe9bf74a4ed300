"""The whole promise, once against the real thing: a live Kafka Streams application, restarted mid-way,
reconciled by `backfill run` + `backfill verify` from the archives of its input and output topics.

The application (jvm/harness, io.backfill.harness.Live) runs the demo job's clicks_per_user_1m operator
(tumbling 1 min, grace 10 s, count / sum / fold, suppress until the window closes) on the real broker of
the test suite, with the demo's clicks: 2 partitions, stragglers seconds to minutes late, keyless records.
It is stopped cleanly and started again (same state directory) once, at a chosen record, so what the
restart does is known exactly and verify must name it.
"""
from __future__ import annotations

import json
import queue
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from backfill.cli import app
from backfill.conformance.harness import classpath
from backfill.demo import _clicks
from backfill.io.kafka import client_config, create_topic, produce

pytestmark = [pytest.mark.live, pytest.mark.kafka, pytest.mark.spark, pytest.mark.jvm, pytest.mark.slow]
VERSION = "4.4.0"
ROOT = Path(__file__).resolve().parents[2]
# The restart comes right before record 1,881 of the sample (seed 11): a click of user-023 on partition 1,
# 25 s behind its partition, whose window had closed (end + grace <= stream time) and was emitted.
RESTART_BEFORE = 1_881


class LiveApp:
    """One instance of the application: a JVM that prints RUNNING when it runs and closes cleanly on SIGTERM."""

    def __init__(self, bootstrap: str, app_id: str, source: str, sink: str, state: Path, log: Path,
                 guarantee: str = "at_least_once", commit_ms: int = 1000, halt_after: int = 0,
                 mode: str = "windows") -> None:
        self.log = log
        self.proc = subprocess.Popen(["java", "-cp", classpath(VERSION), "io.backfill.harness.Live", bootstrap, app_id, source,
                                      sink, str(state), guarantee, str(commit_ms), str(halt_after), mode],
                                     stdout=subprocess.PIPE, stderr=log.open("a"), text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.reader = threading.Thread(target=lambda: [self.lines.put(x.strip()) for x in self.proc.stdout],
                                       daemon=True)
        self.reader.start()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if self.lines.get(timeout=1) == "RUNNING":
                    return
            except queue.Empty:
                assert self.proc.poll() is None, f"the application exited: {log.read_text()[-2000:]}"
        raise AssertionError("the application did not reach RUNNING in 120 s")

    def stop(self) -> None:
        """A clean shutdown: SIGTERM runs KafkaStreams.close() (offsets committed, state checkpointed)."""
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)  # 143: the JVM's exit status after SIGTERM, once its shutdown hook is done
        self.reader.join(timeout=10)
        said = list(self.lines.queue)
        assert "CLOSED" in said, f"{said} {self.log.read_text()[-2000:]}"


def _data_records(bootstrap: str, topic: str, partitions: int, isolation: str) -> int:
    """How many data records a consumer with `isolation` reads from the whole topic (markers are never read)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**client_config(bootstrap), "isolation.level": isolation})
    try:
        parts = [TopicPartition(topic, p) for p in range(partitions)]
        ends = {tp.partition: consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in parts}
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        seen, deadline = 0, time.monotonic() + 60
        while time.monotonic() < deadline:
            seen += sum(1 for msg in consumer.consume(500, timeout=1) if msg.error() is None)
            if all(tp.offset >= ends[tp.partition] for tp in consumer.position(parts)):
                return seen
        raise AssertionError(f"{topic}: not read to its end offsets {ends} in 60 s")
    finally:
        consumer.close()


def _end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(client_config(bootstrap))
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions)}
    finally:
        consumer.close()


def _wait_committed(bootstrap: str, group: str, topic: str, target: dict[int, int], timeout_s: float = 120) -> None:
    """Until the application's consumer group has committed every partition up to `target`."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**client_config(bootstrap), "group.id": group})
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            done = {tp.partition: tp.offset for tp in
                    consumer.committed([TopicPartition(topic, p) for p in target], timeout=10)}
            if all(done.get(p, -1) >= o for p, o in target.items()):
                return
            time.sleep(0.5)
        raise AssertionError(f"{group} committed {done}, expected {target}")
    finally:
        consumer.close()


def _job(tmp: Path, clicks: Path, stream: Path) -> Path:
    """The demo job reading the input topic's archive, verified against the output topic's archive."""
    spec = yaml.safe_load((ROOT / "jobs" / "demo.yaml").read_text())
    spec["name"] = "live-clicks"
    spec["sources"]["clicks"]["path"] = str(clicks)
    spec["sources"]["clicks"]["value"]["schema"] = str(ROOT / "schemas" / "click.json")
    spec["operators"] = [op for op in spec["operators"] if op["name"] == "clicks_per_user_1m"]
    spec["sinks"] = {"clicks_per_user_1m": {"format": "delta", "path": str(tmp / "gold")},
                     "_ledger": {"format": "delta", "path": str(tmp / "ledger")}}
    spec["verify"]["clicks_per_user_1m"]["against"] = str(stream)
    job = tmp / "live.yaml"
    job.write_text(yaml.safe_dump(spec, sort_keys=False))
    return job


def _topics_and_clicks(bootstrap: str) -> tuple[str, str, str, list[dict[str, Any]]]:
    """Fresh input and output topics (2 partitions each), an application id, and the 4,000 demo clicks."""
    tag = uuid.uuid4().hex[:8]
    source, sink = f"clicks-{tag}", f"clicks-per-user-1m-{tag}"
    create_topic(bootstrap, source, 2)
    create_topic(bootstrap, sink, 2)
    cols, delays = _clicks(4_000, 2, 11)
    assert delays and any(k is None for k in cols["key"])  # stragglers and keyless records are in the input
    records = [{"partition": p, "key": k, "value": v, "timestamp": t}
               for p, k, v, t in zip(cols["partition"], cols["key"], cols["value"], cols["timestamp"])]
    return source, sink, f"live-{tag}", records


def test_live_application_restarted_midway_reconciles(kafka_broker: Any, spark: Any, tmp_path: Path) -> None:
    from backfill.io.archive import archive_topic

    bootstrap = kafka_broker.bootstrap
    source, sink, app_id, records = _topics_and_clicks(bootstrap)
    state, log = tmp_path / "state", tmp_path / "app.log"

    live = LiveApp(bootstrap, app_id, source, sink, state, log)
    produce(bootstrap, source, records[:RESTART_BEFORE])
    _wait_committed(bootstrap, app_id, source, _end_offsets(bootstrap, source, 2))
    emitted_before_restart = sum(_end_offsets(bootstrap, sink, 2).values())
    live.stop()
    live = LiveApp(bootstrap, app_id, source, sink, state, log)  # the same instance again, its state dir kept
    produce(bootstrap, source, records[RESTART_BEFORE:])
    _wait_committed(bootstrap, app_id, source, _end_offsets(bootstrap, source, 2))
    live.stop()
    emitted = sum(_end_offsets(bootstrap, sink, 2).values())
    assert 0 < emitted_before_restart < emitted

    archive_topic(spark, bootstrap, source, str(tmp_path / "in"))
    archive_topic(spark, bootstrap, sink, str(tmp_path / "out"))
    job = _job(tmp_path, tmp_path / "in", tmp_path / "out")
    ran = CliRunner().invoke(app, ["run", str(job), "--json"])
    assert ran.exit_code == 0, ran.stderr
    checked = CliRunner().invoke(app, ["verify", str(job), "--json", "--report", str(tmp_path / "report")])
    assert checked.exit_code == 0, checked.stdout + checked.stderr
    verdict = json.loads(checked.stdout)
    section = verdict["sections"][0]
    print(json.dumps({"emitted": emitted, "counts": section["counts"], "causes": section["causes"]}))
    # exactly as the run went: every window matches but the straggler's (below), which the stream wrote twice
    windows = spark.read.format("delta").load(str(tmp_path / "gold")).count()
    assert section["counts"] == {"match": windows - 1, "mismatch": 1, "missing_in_stream": 0, "extra_in_stream": 0,
                                 "duplicate_in_stream": 0}
    assert emitted == windows + 1 and windows > 500  # the comparison is not vacuous
    assert {c: n for c, n in section["causes"].items() if n} == {"late_drop_differs": 1}
    assert verdict["verdict"] == "explained", verdict
    # What the restart did, as the real engine decided it: the window's processor-local stream time started
    # over, so the straggler was accepted into its closed window, which was emitted a second time with one
    # click more; verify names it (and a continuous run, the backfill, dropped it as late).
    differing = [x for x in section["samples"] if x["category"] != "match"]
    assert [(x["key"], x["window_start"], x["cause"], x["r_clicks"] - x["l_clicks"], x["_rows"]) for x in differing] \
        == [("user-023", 1_704_067_500_000, "late_drop_differs", 1, 2)]
    # the output topic itself, read from the broker, gives the same reconciliation as its archive
    direct = CliRunner().invoke(app, ["verify", str(job), "--json", "--against",
                                      f"clicks_per_user_1m=kafka://{bootstrap}/{sink}"])
    assert direct.exit_code == 0, direct.stdout + direct.stderr
    again = json.loads(direct.stdout)["sections"][0]
    assert (again["counts"], again["causes"]) == (section["counts"], section["causes"])


def test_an_exactly_once_application_crashed_midway_reconciles_to_a_match(kafka_broker: Any, spark: Any,
                                                                             tmp_path: Path) -> None:
    """exactly_once_v2, the JVM halted mid-transaction (no close, no commit): its outputs so far are aborted,
    its state is restored from the changelog, the input reprocessed from the last commit; a read_committed
    archive of the output then matches the backfill exactly."""
    from backfill.io.archive import archive_topic

    bootstrap = kafka_broker.bootstrap
    source, sink, app_id, records = _topics_and_clicks(bootstrap)
    state, log = tmp_path / "state", tmp_path / "app.log"
    produce(bootstrap, source, records[:RESTART_BEFORE])
    # one transaction per 10 s: the halt comes inside the first, after windows were emitted into it
    crashing = LiveApp(bootstrap, app_id, source, sink, state, log, "exactly_once_v2", 10_000, halt_after=1_500)
    assert crashing.proc.wait(timeout=120) == 137
    live = LiveApp(bootstrap, app_id, source, sink, state, log, "exactly_once_v2", 1_000)
    produce(bootstrap, source, records[RESTART_BEFORE:])
    _wait_committed(bootstrap, app_id, source, _end_offsets(bootstrap, source, 2))
    live.stop()
    uncommitted = _data_records(bootstrap, sink, 2, "read_uncommitted")
    committed = _data_records(bootstrap, sink, 2, "read_committed")
    assert uncommitted > committed > 0  # the crash left aborted outputs in the topic

    archive_topic(spark, bootstrap, source, str(tmp_path / "in"))
    out = archive_topic(spark, bootstrap, sink, str(tmp_path / "out"))
    assert out["records"] == committed
    job = _job(tmp_path, tmp_path / "in", tmp_path / "out")
    ran = CliRunner().invoke(app, ["run", str(job), "--json"])
    assert ran.exit_code == 0, ran.stderr
    checked = CliRunner().invoke(app, ["verify", str(job), "--json", "--report", str(tmp_path / "report")])
    verdict = json.loads(checked.stdout)
    section = verdict["sections"][0]
    print(json.dumps({"aborted": uncommitted - committed, "committed": committed, "counts": section["counts"]}))
    assert checked.exit_code == 0 and verdict["verdict"] == "match", section["counts"]
    assert section["counts"]["match"] == committed


def _committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The application's committed input offsets (the next record each partition reads after a restart)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**client_config(bootstrap), "group.id": group})
    try:
        got = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
        return {tp.partition: max(tp.offset, 0) for tp in got}
    finally:
        consumer.close()


def _shifted(records: list[dict[str, Any]], age_ms: dict[int, int]) -> list[dict[str, Any]]:
    """The clicks moved in time, per partition (each its own task), so that the partition's last click is
    `age_ms[partition]` older than the wall clock."""
    now = int(time.time() * 1000)
    shift = {}
    for p, age in age_ms.items():
        delta = now - age - max(r["timestamp"] for r in records if r["partition"] == p)
        shift[p] = delta - delta % 60_000  # whole minutes: the windows keep their shape
    return [{**r, "timestamp": r["timestamp"] + shift[r["partition"]]} for r in records]


HALT_AFTER = 1_500  # the crashed instance halts on its 1,500th record, about 600 after its last commit


def hard_killed_run(kafka_broker: Any, spark: Any, tmp_path: Path, mode: str = "windows") -> tuple[
        list[dict[str, Any]], dict[int, list[int]], dict[int, int], dict[int, list[int]], Path]:
    """The application (`mode`: its operator) halted some hundred records after its last commit, restarted, run
    to the end; its input and output topics archived to tmp_path/in and tmp_path/out. Partition 1 (the task that
    reprocesses most) holds clicks a minute behind the wall clock, partition 0 three hours. Returns the records,
    the offsets the crashed instance applied per partition, its committed offsets, those it applied after its
    commit (processed again after the restart), and the committed offsets as a --commits file."""
    from backfill.io.archive import archive_topic

    bootstrap = kafka_broker.bootstrap
    source, sink, app_id, records = _topics_and_clicks(bootstrap)
    records = _shifted(records, {0: 3 * 3_600_000, 1: 60_000})
    state, log = tmp_path / "state", tmp_path / "app.log"
    crashing = LiveApp(bootstrap, app_id, source, sink, state, log, "at_least_once", 3_000, halt_after=HALT_AFTER,
                       mode=mode)
    produce(bootstrap, source, records[:900])
    _wait_committed(bootstrap, app_id, source, _end_offsets(bootstrap, source, 2))
    produce(bootstrap, source, records[900:RESTART_BEFORE])
    assert crashing.proc.wait(timeout=120) == 137
    crashing.reader.join(timeout=10)
    said = list(crashing.lines.queue)
    halted = [x for x in said if x.startswith("HALT ")]
    assert len(halted) == 1, said[-5:]
    applied: dict[int, list[int]] = {}
    for line in said:
        if line.startswith("AT "):
            p, o = map(int, line.split()[1:])
            applied.setdefault(p, []).append(o)
    commits = _committed(bootstrap, app_id, source, 2)
    # what the crashed instance applied after its last commit: processed again after the restart
    twice = {p: [o for o in offs if o >= commits.get(p, 0)] for p, offs in applied.items()}
    assert sum(map(len, twice.values())) > 50, (commits, {p: max(o) for p, o in applied.items()})

    live = LiveApp(bootstrap, app_id, source, sink, state, log, "at_least_once", 1_000, mode=mode)
    produce(bootstrap, source, records[RESTART_BEFORE:])
    _wait_committed(bootstrap, app_id, source, _end_offsets(bootstrap, source, 2))
    live.stop()

    archive_topic(spark, bootstrap, source, str(tmp_path / "in"))
    archive_topic(spark, bootstrap, sink, str(tmp_path / "out"))
    commits_file = tmp_path / "commits.json"
    commits_file.write_text(json.dumps([{"topic": source, "partition": p, "offset": o} for p, o in commits.items()]))
    return records, applied, commits, twice, commits_file


def test_an_at_least_once_application_hard_killed_midway_reconciles(kafka_broker: Any, spark: Any,
                                                                    tmp_path: Path) -> None:
    """at_least_once (the default), the JVM halted (no close, no commit) some hundred records after its last
    commit: on restart the window store is restored from its changelog, which already holds those records,
    and they are processed again; verify names each effect and proves it by recomputation. Partition 1 (the
    task that reprocesses most) holds clicks a minute behind the wall clock, partition 0 three hours."""
    records, applied, commits, twice, commits_file = hard_killed_run(kafka_broker, spark, tmp_path)
    job = _job(tmp_path, tmp_path / "in", tmp_path / "out")
    ran = CliRunner().invoke(app, ["run", str(job), "--json"])
    assert ran.exit_code == 0, ran.stderr
    checked = CliRunner().invoke(app, ["verify", str(job), "--json", "--report", str(tmp_path / "report"),
                                       "--commits", str(commits_file), "--corrections", str(tmp_path / "fix")])
    assert checked.exit_code in (0, 1), checked.stderr
    verdict = json.loads(checked.stdout)
    section = verdict["sections"][0]
    # verify's cause per window it corrects (reprocessed, lost, late), to compare window by window
    named = {(r["key"], r["window_start"]): r["cause"] for r in spark.read.format("delta").load(
        str(tmp_path / "fix" / "clicks_per_user_1m")).select("key", "window_start", "cause").collect()}
    # What the test knows: the records the crashed instance applied after its last commit (processed again
    # after the restart), the windows they fed (unless the backfill dropped them as late), and the windows
    # whose closing record came in that range (emitted before the crash, restored into suppress's buffer).
    late = {(r["partition"], r["offset"]) for r in spark.read.format("delta").load(str(tmp_path / "ledger"))
            .where("reason = 'late'").select("partition", "offset").collect()}
    offsets: dict[int, int] = {}
    placed = []
    for r in records:
        placed.append((r["partition"], offsets.setdefault(r["partition"], 0), r["key"], r["timestamp"]))
        offsets[r["partition"]] += 1
    doubled = {(p, o) for p, offs in twice.items() for o in offs}
    touched: dict[tuple[str, int], int] = {}
    sizes: dict[tuple[str, int], int] = {}
    newest: dict[int, int] = {}  # per task, the newest window the crashed instance had stored
    for p, o, k, ts in placed:
        if k is None or (p, o) in late:
            continue
        w = (k, ts - ts % 60_000)
        sizes[w] = sizes.get(w, 0) + 1
        if (p, o) in doubled:
            touched[w] = touched.get(w, 0) + 1
        if o <= max(applied.get(p, [-1])):
            newest[p] = max(newest.get(p, w[1]), w[1])
    # The restored store's stream time is the newest window it holds; a window starting more than the
    # retention (size + grace) before it is expired there: a fetch finds nothing (RocksDB segmented store),
    # so its records after the restart are each aggregated alone.
    task_of = {k: p for p, _, k, _ in placed if k is not None}
    expired = {w for w in touched if w[1] < newest[task_of[w[0]]] - 70_000 + 1}
    closed_in_range, stream_time, open_windows = set(), {}, {}
    for p, o, k, ts in sorted(placed):
        if k is None:
            continue
        stream_time[p] = max(stream_time.get(p, ts), ts)
        if (p, o) not in late:
            open_windows.setdefault(p, set()).add((k, ts - ts % 60_000))
        for w in [w for w in open_windows.get(p, set()) if stream_time[p] >= w[1] + 70_000]:
            open_windows[p].discard(w)
            if commits[p] <= o < max(applied[p]) + 1:
                closed_in_range.add(w)
    # The real engine is the judge of what the restored store held: the application's output says, per
    # window fed twice, whether it counted the records again (inflated) or came out of the restart with less
    # than the window holds (lost). The model above (expiry by the newest window the store held) agrees with
    # it on all but a window or two: in some runs (about one in five) a window on the retention edge goes the
    # other way, which the test cannot see from outside (the restore's timing).
    gold = {(r["key"], r["window_start"]): r["clicks"] for r in spark.read.format("delta").load(
        str(tmp_path / "gold")).select("key", "window_start", "clicks").collect()}
    emitted: dict[tuple[str, int], set[int]] = {}
    last: dict[tuple[str, int], int] = {}  # what a compacted table of the output keeps: the last emission
    for r in spark.read.format("delta").load(str(tmp_path / "out")).select("key", "value", "partition", "offset") \
            .orderBy("partition", "offset").collect():
        key = bytes(r["key"])
        w = (key[:-8].decode(), int.from_bytes(key[-8:], "big"))  # windowed key: the key, then the start
        last[w] = json.loads(bytes(r["value"]).decode())["clicks"]
        emitted.setdefault(w, set()).add(last[w])
    inflated = {w for w in touched if last.get(w) == gold[w] + touched[w]}
    lost = {w for w in touched if w not in inflated and sizes[w] > 1 and last.get(w, 0) < gold[w]}
    alone = {w for w in touched if sizes[w] == 1 and emitted.get(w) == {gold[w]}}  # lost, but one record
    causes = section["causes"]
    # the windows where verify and the stream's own output disagree, with what decides each (shown on failure)
    expected = {w: "reprocessed_after_restart" if w in inflated else "state_lost_on_restore" if w in lost
                else named.get(w) if w in alone else "?" for w in touched}
    differs = [{"window": w, "records": sizes[w], "fed_twice": touched[w], "backfill": gold[w], "last": last.get(w),
                "stream": sorted(emitted.get(w, set())), "expired_by_model": w in expired, "verify": named.get(w)}
               for w in sorted(touched) if named.get(w) != expected[w]]
    print(json.dumps({"commits": commits, "applied_twice": {p: (min(o), max(o), len(o)) for p, o in twice.items() if o},
                      "windows_fed_twice": len(touched), "expired_in_restored_store": len(expired),
                      "inflated": len(inflated), "lost": len(lost), "lost_alone": len(alone),
                      "model_differs": sorted((set(touched) - expired) ^ inflated),  # allowed: two at most
                      "closed_after_commit": len(closed_in_range),
                      "counts": section["counts"], "causes": causes, "restarts": section["restarts"],
                      "windows_verify_names_otherwise": differs}, default=str))
    assert checked.exit_code == 0 and verdict["verdict"] == "explained", causes
    assert causes["unexplained"] == 0 and causes["duplicate_delivery"] == 0
    # every window fed twice is inflated (applied twice) or lost (expired in the restored store; one record
    # alone is then the whole window only when it had one record), and the model agrees but for a window or two
    model_differs = (set(touched) - expired) ^ inflated
    assert len(model_differs) <= 2
    # verify names each window as the stream's output shows it: inflated ones reprocessed, lost ones lost on
    # restore. One window on the retention edge, where the restore's timing decided, may be named by another
    # cause that explains it (none is unexplained); `differs` shows what decided it when the test fails.
    edge = {d["window"] for d in differs}
    assert len(edge) <= 1 and edge <= model_differs, differs
    assert inflated | lost | alone | edge == set(touched), differs

    def named_as(cause: str, among: set[tuple[str, int]]) -> set[tuple[str, int]]:
        return {w for w in among - edge if expected[w] == cause} | {w for w in edge & among if named.get(w) == cause}

    assert causes["reprocessed_after_restart"] == len(named_as("reprocessed_after_restart", set(touched))) > 0
    assert causes["state_lost_on_restore"] == len(named_as("state_lost_on_restore", set(touched))) > 0
    # the windows closed after the commit whose value did not change were emitted again, unchanged; verify
    # names a lost one-record window that its model expects inflated `late_drop_differs` (never counted twice)
    changed = inflated | lost
    again = causes["reemitted"] + causes["late_drop_differs"]
    assert len(closed_in_range - changed) - len(edge) <= again <= len(closed_in_range - changed) + len(edge)
    assert again > 0 and causes["late_drop_differs"] <= len(alone - expired) + len(edge)
    for x in section["samples"]:
        w = (x["key"], x["window_start"])
        if w in edge:
            continue
        if x["cause"] == "reprocessed_after_restart":  # the stream counted the records fed twice once more
            assert x["r_clicks"] - x["l_clicks"] == touched[w] == x["restart_n"]
            assert {r["status"] for r in x["records"]} == {"applied twice"}
            assert len(x["records"]) == min(touched[w], 12) and x["restart_from"] >= commits[x["task"]]
        if x["cause"] == "state_lost_on_restore":
            assert w in lost and x["r_clicks"] == 1 < x["l_clicks"]
        if x["cause"] == "reemitted":
            assert w in closed_in_range and x["_rows"] == 2
    # the incident, per task: where it restarted (the commit) and what the restart did there
    per_task = {t["task"]: t for t in section["restarts"]}
    assert sorted(per_task) == sorted(commits)
    for p, t in per_task.items():
        assert (t["committed_offset"], t["restart_offset"], t["restart_offset_from"]) == (commits[p], commits[p],
                                                                                           "--commits")
        mine = {w for w in touched if task_of[w[0]] == p}
        assert t["windows"]["reprocessed_after_restart"] == len(named_as("reprocessed_after_restart", mine))
        assert t["reprocessed_through"] <= max(twice[p])
