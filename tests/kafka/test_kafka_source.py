"""`format: kafka` sources and `backfill archive` against a real Apache Kafka broker (KRaft, 127.0.0.1)."""
from __future__ import annotations

import json
import random
import struct
import uuid
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from backfill.cli import app
from backfill.io.kafka import create_topic, produce
from tests.conftest import read_jsonl

pytestmark = [pytest.mark.kafka, pytest.mark.spark]
BASE = 1_700_000_000_000


def _records(n: int, partitions: int, seed: int = 3) -> list[dict[str, Any]]:
    """Clicks with out-of-order timestamps (a few seconds to minutes late) over `partitions` partitions."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        late = rng.random() < 0.05
        ts = BASE + i * 700 - (rng.randint(5_000, 200_000) if late else 0)
        out.append({"partition": i % partitions, "key": f"user{rng.randint(0, 9)}",
                    "value": {"page": f"/p{i % 4}", "amount": i % 13}, "timestamp": ts, "headers": {"n": str(i)}})
    return out


def _job(tmp: Path, source: str, name: str = "k") -> Path:
    job = tmp / f"{name}.yaml"
    job.write_text(f"""
name: {name}
sources:
  clicks: {{{source}, key: {{format: string}}, value: {{format: json}}, timestamp: {{extractor: record}}}}
operators:
  - name: per_user
    aggregate:
      input: clicks
      window: {{type: hopping, size: 1m, advance: 20s, grace: 10s}}
      aggregations: {{n: count(), amount: sum(value.amount), pages: {{fold: {{init: "''", step: "concat(acc, value.page)"}}}}}}
      emit: updates
sinks:
  per_user: {{format: jsonl, path: out-{name}/per_user.jsonl}}
  _ledger: {{format: jsonl, path: out-{name}/ledger.jsonl}}
""")
    return job


def _run(job: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    result = CliRunner().invoke(app, ["run", str(job), "--json", *args])
    summary = json.loads(result.stdout) if result.exit_code == 0 else {}
    return result.exit_code, summary, result.stderr


def _topic(broker: Any, partitions: int, records: list[dict[str, Any]]) -> str:
    topic = f"t{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, partitions)
    produce(broker.bootstrap, topic, records)
    return topic


def test_a_job_gives_the_same_outputs_from_the_topic_and_from_its_archive(tmp_path, kafka_broker, spark):
    records = _records(3000, 3)
    topic = _topic(kafka_broker, 3, records)
    archive = tmp_path / "bronze" / topic
    first = CliRunner().invoke(app, ["archive", "--bootstrap", kafka_broker.bootstrap, "--topic", topic, "--to",
                                     str(archive), "--json"])
    assert first.exit_code == 0, first.stderr
    assert json.loads(first.stdout)["records"] == 3000
    again = CliRunner().invoke(app, ["archive", "--bootstrap", kafka_broker.bootstrap, "--topic", topic, "--to",
                                     str(archive), "--json"])
    assert json.loads(again.stdout)["records"] == 0  # nothing new: nothing appended

    code_k, from_kafka, err = _run(_job(tmp_path, f"format: kafka, kafka: {{bootstrap: '{kafka_broker.bootstrap}', "
                                                  f"topic: {topic}}}", "fromkafka"))
    assert code_k == 0, err
    code_a, from_archive, err = _run(_job(tmp_path, f"format: delta, path: bronze/{topic}", "fromarchive"))
    assert code_a == 0, err
    for sink in ("per_user", "ledger"):
        a = read_jsonl(tmp_path / f"out-fromkafka/{sink}.jsonl")
        b = read_jsonl(tmp_path / f"out-fromarchive/{sink}.jsonl")
        key = (lambda r: (r["task"], r["emit_seq"])) if sink == "per_user" else (lambda r: (r["partition"], r["offset"],
                                                                                             r["window_start"]))
        assert sorted(a, key=key) == sorted(b, key=key)
    assert from_kafka["ledger"].get("late", 0) > 0  # the data does exercise lateness
    assert from_kafka["inputs"]["clicks"]["offsets"] == {"0": [0, 1000], "1": [0, 1000], "2": [0, 1000]}

    produce(kafka_broker.bootstrap, topic, _records(30, 3, seed=9))
    more = CliRunner().invoke(app, ["archive", "--bootstrap", kafka_broker.bootstrap, "--topic", topic, "--to",
                                    str(archive), "--json"])
    assert json.loads(more.stdout)["partitions"]["1"] == {"from": 1000, "to": 1010, "records": 10}


def test_a_ranged_run_reads_the_offsets_its_time_bounds_resolve_to_and_records_them(tmp_path, kafka_broker, spark):
    # one partition, timestamps ascending by 1 s: offset i has timestamp BASE + i * 1000
    topic = _topic(kafka_broker, 1, [{"partition": 0, "key": "u", "value": {"amount": 1, "page": "/p"},
                                      "timestamp": BASE + i * 1000} for i in range(600)])
    job = _job(tmp_path, f"format: kafka, kafka: {{bootstrap: '{kafka_broker.bootstrap}', topic: {topic}}}")
    start, end = BASE + 120_000, BASE + 240_000
    code, summary, err = _run(job, "--start", str(start), "--end", str(end))
    assert code == 0, err
    # warm-up: from --start (an older record cannot reach a window starting at or after it); cool-down: up to
    # the first record at or after the close of the last window in range (start 220 s + 60 s + 10 s grace)
    assert summary["inputs"]["clicks"]["offsets"] == {"0": [120, 291]}
    rows = read_jsonl(tmp_path / "out-k/per_user.jsonl")
    assert rows and all(start <= r["window_start"] < end for r in rows)


def test_unknown_topics_and_unreachable_brokers_are_one_line_errors(tmp_path, kafka_broker):
    job = _job(tmp_path, f"format: kafka, kafka: {{bootstrap: '{kafka_broker.bootstrap}', topic: nosuchtopic}}")
    code, _, err = _run(job)
    assert code == 2 and "has no topic 'nosuchtopic'" in err and len(err.strip().splitlines()) == 1
    from backfill.io.broker import free_port

    job = _job(tmp_path, f"format: kafka, kafka: {{bootstrap: '127.0.0.1:{free_port()}', topic: x}}", "down")
    code, _, err = _run(job)
    assert code == 2 and "no Kafka broker answered" in err and len(err.strip().splitlines()) == 1


def test_records_deleted_by_retention_stop_the_run_naming_the_partitions(tmp_path, kafka_broker):
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    topic = _topic(kafka_broker, 2, _records(200, 2))
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap, "log_level": 0})
    futures = admin.delete_records([TopicPartition(topic, 1, 40)])
    list(futures.values())[0].result(30)
    job = _job(tmp_path, f"format: kafka, kafka: {{bootstrap: '{kafka_broker.bootstrap}', topic: {topic}}}")
    code, _, err = _run(job)
    assert code == 2 and "partition 1: 40 records before offset 40" in err
    accepted = _job(tmp_path, f"format: kafka, kafka: {{bootstrap: '{kafka_broker.bootstrap}', topic: {topic}, "
                              "start: earliest}", "accept")
    code, summary, err = _run(accepted)
    assert code == 0, err
    assert summary["records_read"]["clicks"] == 160 and summary["inputs"]["clicks"]["offsets"]["1"] == [40, 100]


def test_long_keys_are_read_as_kafka_longs(tmp_path, kafka_broker, spark):
    rows = [{"partition": 0, "key": struct.pack(">q", k), "value": {"amount": 1}, "timestamp": BASE + i}
            for i, k in enumerate([-1, 7, 2**40, 7])] + [{"partition": 0, "key": b"abc", "value": {"amount": 1},
                                                          "timestamp": BASE + 9}]
    topic = _topic(kafka_broker, 1, rows)
    job = tmp_path / "long.yaml"
    job.write_text(f"""
name: longkeys
sources:
  s: {{format: kafka, kafka: {{bootstrap: '{kafka_broker.bootstrap}', topic: {topic}}}, key: {{format: long}},
      value: {{format: json}}, on_error: skip}}
operators:
  - name: c
    aggregate: {{input: s, window: {{type: tumbling, size: 1h, grace: 0ms}}, aggregations: {{n: count()}}, emit: updates}}
sinks:
  c: {{format: jsonl, path: out/c.jsonl}}
  _ledger: {{format: jsonl, path: out/ledger.jsonl}}
""")
    code, _, err = _run(job)
    assert code == 0, err
    assert sorted({(r["key"], r["n"]) for r in read_jsonl(tmp_path / "out/c.jsonl")}) == \
        sorted({(-1, 1), (7, 1), (2**40, 1), (7, 2)})
    [bad] = read_jsonl(tmp_path / "out/ledger.jsonl")
    assert bad["reason"] == "unreadable" and bad["detail"] == "unreadable key: 3 bytes, not an 8-byte long"


def test_join_topics_with_different_partition_counts_are_refused(tmp_path, kafka_broker):
    left = _topic(kafka_broker, 2, _records(20, 2))
    right = _topic(kafka_broker, 3, _records(30, 3))
    job = tmp_path / "join.yaml"
    kafka = f"bootstrap: '{kafka_broker.bootstrap}'"
    job.write_text(f"""
name: joins
sources:
  l: {{format: kafka, kafka: {{{kafka}, topic: {left}}}, value: {{format: json}}}}
  r: {{format: kafka, kafka: {{{kafka}, topic: {right}}}, value: {{format: json}}}}
operators:
  - name: j
    join: {{left: l, right: r, how: inner, window: {{before: 1s, after: 1s, grace: 0ms}}, value: "left.value"}}
sinks:
  j: {{format: none}}
""")
    code, _, err = _run(job)
    assert code == 2 and "not co-partitioned" in err and "l: 2" in err and "r: 3" in err


def test_transactional_topics_are_read_as_committed_only(tmp_path, kafka_broker, spark):
    """Aborted records (a crashed exactly-once producer's) are never archived; an open transaction waits."""
    from confluent_kafka import Producer

    from backfill.io.archive import archive_topic

    topic = f"tx{uuid.uuid4().hex[:8]}"
    create_topic(kafka_broker.bootstrap, topic, 1)
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap, "transactional.id": topic, "log_level": 0})
    producer.init_transactions(60)

    def transaction(values: list[str], commit: bool | None) -> None:
        producer.begin_transaction()
        for v in values:
            producer.produce(topic, key=b"k", value=v.encode(), partition=0, timestamp=BASE)
        producer.flush(30)
        if commit is True:
            producer.commit_transaction(30)
        elif commit is False:
            producer.abort_transaction(30)

    transaction(["c0", "c1"], True)
    transaction(["a0", "a1", "a2"], False)
    transaction(["d0"], True)
    transaction(["o0", "o1"], None)  # still open while the archive runs
    path = str(tmp_path / "archive")

    def archived() -> list[tuple[int, bytes]]:
        from deltalake import DeltaTable

        return sorted((r["offset"], r["value"]) for r in DeltaTable(path).to_pyarrow_table().to_pylist())

    first = archive_topic(spark, kafka_broker.bootstrap, topic, path)
    # offsets 0-1 committed, 2 a marker, 3-5 aborted, 6 a marker, 7 committed, 8 a marker; 9- the open transaction
    assert archived() == [(0, b"c0"), (1, b"c1"), (7, b"d0")]
    assert (first["records"], first["offsets"]) == (3, 9)
    producer.commit_transaction(30)
    second = archive_topic(spark, kafka_broker.bootstrap, topic, path)
    assert archived() == [(0, b"c0"), (1, b"c1"), (7, b"d0"), (9, b"o0"), (10, b"o1")]
    assert second["records"] == 2


def test_verify_against_a_topic_that_is_not_there_is_one_line(tmp_path, kafka_broker, spark):
    """`--against OP=kafka://HOST:PORT/TOPIC` reads the streaming output from the broker: a malformed reference,
    an unknown topic and a broker that does not answer each give one line and exit 2."""
    topic = _topic(kafka_broker, 1, _records(50, 1))
    job = _job(tmp_path, f"format: kafka, kafka: {{bootstrap: '{kafka_broker.bootstrap}', topic: {topic}}}")
    assert _run(job)[0] == 0
    from backfill.io.broker import free_port

    for against, says in ((f"kafka://{kafka_broker.bootstrap}", "a topic is kafka://HOST:PORT/TOPIC"),
                          (f"kafka://{kafka_broker.bootstrap}/nosuchtopic", "has no topic 'nosuchtopic'"),
                          (f"kafka://127.0.0.1:{free_port()}/x", "no Kafka broker answered")):
        got = CliRunner().invoke(app, ["verify", str(job), "--against", f"per_user={against}"])
        last = got.stderr.strip().splitlines()[-1]  # after the progress lines
        assert got.exit_code == 2 and last.startswith("error: ") and says in last, got.stderr
        assert "Traceback" not in got.stderr


TX_JOB = """
name: tx
sources:
  clicks: {SOURCE, key: {format: string}, value: {format: json}, timestamp: {extractor: record}}
operators:
  - name: per_user
    aggregate: {input: clicks, window: {type: tumbling, size: 10s, grace: 0s}, aggregations: {n: count()},
                emit: final}
sinks:
  per_user: {format: jsonl, path: out/per_user.jsonl}
  _ledger: {format: jsonl, path: out/ledger.jsonl}
"""


def test_transaction_markers_in_the_input_are_no_missing_input(tmp_path, kafka_broker, spark):
    """An input written by an exactly-once producer has an offset per commit marker and per aborted record, none
    of them a record: a logic difference stays `unexplained` (exit 1), never `missing_input`, whether the job
    reads the topic or its archive. A record really gone from the archive is still `missing_input`."""
    from confluent_kafka import Producer

    topic = f"tx{uuid.uuid4().hex[:8]}"
    create_topic(kafka_broker.bootstrap, topic, 1)
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap, "transactional.id": topic, "log_level": 0})
    producer.init_transactions(60)
    for t in range(12):  # three records per transaction, a marker after each; the fifth is aborted
        producer.begin_transaction()
        for i in range(3):
            producer.produce(topic, key=b"u", value=b"{}", partition=0, timestamp=BASE + (3 * t + i) * 1_000)
        producer.flush(30)
        (producer.abort_transaction if t == 4 else producer.commit_transaction)(30)
    archive = tmp_path / "archive"
    done = CliRunner().invoke(app, ["archive", "--bootstrap", kafka_broker.bootstrap, "--topic", topic, "--to",
                                    str(archive), "--json"])
    assert done.exit_code == 0 and json.loads(done.stdout)["records"] == 33, done.stderr
    sources = {"topic": f"format: kafka, kafka: {{bootstrap: '{kafka_broker.bootstrap}', topic: {topic}}}",
               "archive": f"format: delta, path: {archive}"}
    for name, source in sources.items():  # the archive last: its stream output is the one changed below
        folder = tmp_path / f"job-{name}"
        folder.mkdir()
        job = folder / "job.yaml"
        job.write_text(TX_JOB.replace("SOURCE", source))
        code, summary, err = _run(job)
        assert code == 0, err
        assert summary["gaps"] == {} and summary["duplicates"] == {}, name  # markers, aborted records: no gap
        gold = read_jsonl(folder / "out" / "per_user.jsonl")
        # the stream's output: the same windows, one of them a count too high (a logic difference)
        wrong = max(gold, key=lambda r: r["n"])
        stream = [{**r, "n": r["n"] + (r is wrong), "partition": 0, "offset": i} for i, r in enumerate(gold)]
        against = folder / "stream.jsonl"
        against.write_text("".join(json.dumps(r) + "\n" for r in stream))
        checked = CliRunner().invoke(app, ["verify", str(job), "--json", "--against", f"per_user={against}",
                                           "--report", str(folder / "report")])
        causes = json.loads(checked.stdout)["causes"]
        assert (checked.exit_code, causes["missing_input"], causes["unexplained"]) == (1, 0, 1), (name, causes)
    # a record of that window deleted from the archive by another writer than `backfill archive`: the archive's
    # offsets are no longer known to be whole, and the gap is evidence again
    from delta.tables import DeltaTable

    inside = sorted(r["offset"] for r in spark.read.format("delta").load(str(archive)).collect()
                    if wrong["window_start"] <= r["timestamp"] < wrong["window_end"])
    deleted = inside[len(inside) // 2]
    DeltaTable.forPath(spark, str(archive)).delete(f"offset = {deleted}")
    job = tmp_path / "job-archive" / "job.yaml"
    code, summary, err = _run(job)  # the run reports the gap (docs/semantics.md §7.4), and verify reads its record
    assert code == 0, err
    assert any(r["from"] <= deleted <= r["to"] for r in summary["gaps"]["clicks"]["0"]["ranges"]), summary["gaps"]
    checked = CliRunner().invoke(app, ["verify", str(job), "--json", "--against", f"per_user={against}",
                                       "--report", str(tmp_path / "report-deleted")])
    causes = json.loads(checked.stdout)["causes"]
    assert (checked.exit_code, causes["missing_input"], causes["unexplained"]) == (0, 1, 0), causes


def test_a_compacted_topics_gaps_stay_evidence(tmp_path, kafka_broker, spark):
    """Compaction removes records from inside the log, records the application may have seen: neither the
    archive of a compacted topic nor the topic itself claims its gaps are markers."""
    from confluent_kafka.admin import AdminClient, NewTopic

    from backfill.io.archive import COVERED, committed_ranges
    from backfill.io.delta import history
    from backfill.jobspec.models import SourceSpec

    compacted, plain = f"c{uuid.uuid4().hex[:8]}", f"p{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    futures = admin.create_topics([NewTopic(compacted, 1, 1, config={"cleanup.policy": "compact"}),
                                   NewTopic(plain, 1, 1)])
    for f in futures.values():
        f.result(30)
    metadata = {}
    for topic in (compacted, plain):
        produce(kafka_broker.bootstrap, topic, [{"partition": 0, "key": "k", "value": "v", "timestamp": BASE}])
        done = CliRunner().invoke(app, ["archive", "--bootstrap", kafka_broker.bootstrap, "--topic", topic, "--to",
                                        str(tmp_path / topic), "--json"])
        assert done.exit_code == 0, done.stderr
        [commit] = history(None, str(tmp_path / topic))
        metadata[topic] = json.loads(commit["userMetadata"])
        source = SourceSpec.model_validate({"format": "kafka", "kafka": {"bootstrap": kafka_broker.bootstrap,
                                                                         "topic": topic}})
        known = committed_ranges(spark, source, "")
        assert (known is None) == (topic == compacted)
    assert COVERED not in metadata[compacted] and json.loads(metadata[plain][COVERED]) == {"0": [0, 1]}
