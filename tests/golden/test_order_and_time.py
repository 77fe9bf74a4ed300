"""Golden timelines for timestamps (docs/semantics.md §1) and task order (§2) via the public CLI.

Not applicable to a batch and therefore not here: rq-set-partition-time (partition time restored from
committed offsets), pg-readiness-idling and task-stream-time-punctuation (wall clock).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from backfill.cli import app
from tests.conftest import examples, write_jsonl
from tests.golden.harness import aggregate_job, run_job, timeline

pytestmark = pytest.mark.spark
ENGINES = ["spark", "reference"]
CASES = examples()

TWO_TOPICS = """
name: order
sources:
  a: {format: jsonl, path: inputs/a.jsonl}
  b: {format: jsonl, path: inputs/b.jsonl}
operators:
  - name: count_a
    aggregate: {input: a, window: {type: tumbling, size: 1h, grace: 1h}, aggregations: {n: count()}}
  - name: count_b
    aggregate: {input: b, window: {type: tumbling, size: 1h, grace: 1h}, aggregations: {n: count()}}
sinks: {count_a: {format: none}, count_b: {format: none}}
"""


def _queue(topic: str, partition: int, stamps: list[int], values: list | None = None) -> list[dict]:
    values = values or stamps
    return [{"topic": topic, "partition": partition, "offset": i, "key": "k", "value": str(v), "timestamp": t}
            for i, (t, v) in enumerate(zip(stamps, values, strict=True))]


def _inspect(tmp: Path, job: str, inputs: dict[str, list[dict]], engine: str) -> list[dict]:
    for name, rows in inputs.items():
        write_jsonl(tmp / "inputs" / f"{name}.jsonl", rows)
    (tmp / "job.yaml").write_text(job)
    result = CliRunner().invoke(app, ["inspect", str(tmp / "job.yaml"), "--json", "--limit", "0", "--engine", engine])
    assert result.exit_code == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]


@pytest.mark.parametrize("engine", ENGINES)
def test_task_processes_partitions_merged_by_head_timestamp(tmp_path, spark, engine):
    case = CASES["task-process-in-order"]
    a = [r for r in case["inputs"] if r["partition"] == "topic1-1"]
    b = [r for r in case["inputs"] if r["partition"] == "topic2-1"]
    rows = _inspect(tmp_path, TWO_TOPICS, {
        "a": _queue("topic1", 1, [r["offset"] for r in a], [r["value"] for r in a]),
        "b": _queue("topic2", 1, [r["offset"] for r in b], [r["value"] for r in b])}, engine)
    by_record = {(x["source"], x["offset"]): x for x in rows}
    values = {("a", i): r["value"] for i, r in enumerate(a)} | {("b", i): r["value"] for i, r in enumerate(b)}
    order = [values[(r["source"], r["offset"])] for r in sorted(rows, key=lambda r: r["seq"])]
    assert order == case["expected_outputs"][0]["order"]
    assert len(by_record) == 6


@pytest.mark.parametrize("engine", ENGINES)
def test_offset_order_within_a_partition_even_when_time_goes_back(tmp_path, spark, engine):
    case = CASES["pg-time-tracking"]
    rows = _inspect(tmp_path, TWO_TOPICS, {"a": _queue("topic-1", 0, [1, 3, 5, 2, 4]),
                                           "b": _queue("topic-2", 0, [2, 4, 6])}, engine)
    got = [(r["source"], r["ts"]) for r in sorted(rows, key=lambda r: r["seq"])]
    expected = [("a" if o["partition"] == "topic-1" else "b", o["ts"]) for o in case["expected_outputs"]]
    assert got == expected
    # the engine's own stream-time columns: each operator's counts only its own records (count_a reads a,
    # count_b reads b), and together they make the task's stream time, the vector's max polled so far
    ordered = sorted(rows, key=lambda r: r["seq"])
    own = [(r["stream_time_count_a"], r["stream_time_count_b"]) for r in ordered]
    assert own == [(1, None), (1, 2), (3, 2), (3, 4), (5, 4), (5, 4), (5, 4), (5, 6)]
    assert [max(v for v in pair if v is not None) for pair in own] == [o["stream_time"] for o in case["expected_outputs"]]


@pytest.mark.parametrize("engine", ENGINES)
def test_head_timestamp_not_partition_time_decides(tmp_path, spark, engine):
    """pg-head-timestamp-not-partition-time, all data buffered (the vector's mid-way arrival is live-edge only)."""
    rows = _inspect(tmp_path, TWO_TOPICS, {"a": _queue("topic-1", 0, [1, 5, 3]),
                                           "b": _queue("topic-2", 0, [2, 4, 6])}, engine)
    got = [(r["source"], r["ts"]) for r in sorted(rows, key=lambda r: r["seq"])]
    # after topic-1 polled 5, its head 3 still wins against topic-2's head 6
    assert got == [("a", 1), ("b", 2), ("b", 4), ("a", 5), ("a", 3), ("b", 6)]


JOINED = """
name: order-joined
sources:
  a: {format: jsonl, path: inputs/a.jsonl}
  b: {format: jsonl, path: inputs/b.jsonl}
EXTRA
operators:
  - name: j
    join: {left: a, right: b, how: inner, window: {before: 0ms, after: 0ms, grace: 1h}, value: "left.value"}
EXTRA_OP
sinks: {SINKS}
"""


def _joined(extra: bool = False) -> str:
    """a and b read by one join: one sub-topology, one heap per task (docs/semantics.md §2.3, §2.5)."""
    return (JOINED.replace("EXTRA_OP", "  - name: n\n    aggregate: {input: c, window: {type: tumbling, size: 1h, "
                                       "grace: 1h}, aggregations: {n: count()}}" if extra else "")
            .replace("EXTRA", "  c: {format: jsonl, path: inputs/c.jsonl}" if extra else "")
            .replace("SINKS", "j: {format: none}, n: {format: none}" if extra else "j: {format: none}"))


def _taken(rows: list[dict], sources: str = "ab") -> list[tuple[str, int]]:
    return [(r["source"], r["offset"]) for r in sorted(rows, key=lambda r: r["seq"]) if r["source"] in sources]


@pytest.mark.parametrize("engine", ENGINES)
def test_equal_heads_alternate_between_two_queues(tmp_path, spark, engine):
    """Java's heap: the queue polled and offered back stays below a queue whose head ties with its own."""
    rows = _inspect(tmp_path, _joined(), {"a": _queue("x", 0, [5, 5]), "b": _queue("y", 0, [5, 5])}, engine)
    assert _taken(rows) == [("a", 0), ("b", 0), ("a", 1), ("b", 1)]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_queue_left_alone_in_a_tie_keeps_the_root(tmp_path, spark, engine):
    rows = _inspect(tmp_path, _joined(), {"a": _queue("x", 0, [5, 5, 5]), "b": _queue("y", 0, [5])}, engine)
    assert _taken(rows) == [("a", 0), ("b", 0), ("a", 1), ("a", 2)]


@pytest.mark.parametrize("engine", ENGINES)
def test_first_tie_goes_to_the_topic_named_first_not_the_source_declared_first(tmp_path, spark, engine):
    """The consumer hands a fetch's partitions over topic by topic: `clicks` is offered before `views`."""
    rows = _inspect(tmp_path, _joined(), {"a": _queue("views", 0, [5, 5, 7]), "b": _queue("clicks", 0, [5, 6])},
                    engine)
    assert _taken(rows) == [("b", 0), ("a", 0), ("a", 1), ("b", 1), ("a", 2)]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_source_of_another_sub_topology_does_not_share_the_heap(tmp_path, spark, engine):
    """c is read by an aggregate alone: its own tasks in Kafka Streams. In one heap with a and b, the topic
    named first (`w`) would move the join's queues (w, y, x, ...); in its own, they alternate as without it."""
    inputs = {"a": _queue("x", 0, [5, 5]), "b": _queue("y", 0, [5, 5]), "c": _queue("w", 0, [5, 5])}
    rows = _inspect(tmp_path, _joined(extra=True), inputs, engine)
    assert _taken(rows) == [("a", 0), ("b", 0), ("a", 1), ("b", 1)]
    assert _taken(rows, "c") == [("c", 0), ("c", 1)]


@pytest.mark.parametrize("engine", ENGINES)
def test_partition_time_replaces_invalid_timestamps_with_the_max_so_far(tmp_path, spark, engine):
    """rq-partition-time: the extractor sees the max timestamp already dequeued from the partition."""
    job = aggregate_job("{type: tumbling, size: 10ms, grace: 1h}", "{n: count()}", "updates",
                        timestamp="{extractor: record, on_invalid: partition_time}")
    got = run_job(tmp_path, job, {"s": timeline([("k", "a", 2), ("k", "b", 1), ("k", "c", -1), ("k", "d", 3),
                                                 ("k", "e", -5)])}, engine=engine)
    assert got.code == 0, got.stderr
    rows = sorted(got.outputs["agg"], key=lambda r: r["emit_seq"])
    assert [r["ts"] for r in rows] == [2, 2, 2, 3, 3] and [r["n"] for r in rows] == [1, 2, 3, 4, 5]
    assert got.ledger == []


@pytest.mark.parametrize("engine", ENGINES)
def test_partition_time_without_an_earlier_record_fails(tmp_path, spark, engine):
    job = aggregate_job("{type: tumbling, size: 10ms, grace: 1h}", "{n: count()}", "updates",
                        timestamp="{extractor: record, on_invalid: partition_time}")
    got = run_job(tmp_path, job, {"s": timeline([("k", "a", -1), ("k", "b", 3)])}, engine=engine)
    assert got.code == 2
    assert "t/0@0" in got.stderr and "partition time" in got.stderr and "Traceback" not in got.stderr


@pytest.mark.parametrize("engine", ENGINES)
def test_negative_timestamp_fails_by_default(tmp_path, spark, engine):
    """rq-negative-timestamp with FailOnInvalidTimestamp: the run stops and names the record."""
    job = aggregate_job("{type: tumbling, size: 10ms, grace: 1h}", "{n: count()}", "updates")
    got = run_job(tmp_path, job, {"s": timeline([("k", "a", 4), ("k", "b", -1)])}, engine=engine)
    assert got.code == 2
    assert "t/0@1" in got.stderr and "invalid timestamp (-1)" in got.stderr
    assert not (tmp_path / "out" / "agg.jsonl").exists()


@pytest.mark.parametrize("engine", ENGINES)
def test_negative_timestamp_skipped_goes_to_the_ledger(tmp_path, spark, engine):
    """rq-negative-timestamp with LogAndSkipOnInvalidTimestamp: dropped, counted, partition time unmoved."""
    job = aggregate_job("{type: tumbling, size: 10ms, grace: 1h}", "{n: count()}", "updates",
                        timestamp="{extractor: record, on_invalid: skip}")
    got = run_job(tmp_path, job, {"s": timeline([("k", "a", 4), ("k", "b", -1), ("k", "c", 5)])}, engine=engine)
    assert got.code == 0, got.stderr
    assert [r["n"] for r in got.outputs["agg"]] == [1, 2]
    assert [(d["offset"], d["reason"], d["timestamp"], d["operator"]) for d in got.ledger] == [
        (1, "invalid_timestamp", -1, None)]


@pytest.mark.parametrize("engine", ENGINES)
def test_field_extractor_reads_the_value(tmp_path, spark, engine):
    job = aggregate_job("{type: tumbling, size: 10ms, grace: 1h}", "{n: count()}", "updates", value_format="json",
                        timestamp="{extractor: field, field: at, on_invalid: skip}")
    records = timeline([("k", json.dumps({"at": 15}), 999), ("k", json.dumps({"at": None}), 999),
                        ("k", json.dumps({"at": 12}), 999)])
    got = run_job(tmp_path, job, {"s": records}, engine=engine)
    assert got.code == 0, got.stderr
    assert [(r["window_start"], r["ts"]) for r in sorted(got.outputs["agg"], key=lambda r: r["emit_seq"])] == [
        (10, 15), (10, 15)]
    assert [(d["offset"], d["reason"]) for d in got.ledger] == [(1, "invalid_timestamp")]


@pytest.mark.parametrize("engine", ENGINES)
def test_unreadable_record_fails_or_goes_to_the_ledger(tmp_path, spark, engine):
    records = timeline([("k", json.dumps({"x": 1}), 1), ("k", "{not json", 2), ("k", json.dumps({"x": 2}), 3)])
    failing = aggregate_job("{type: tumbling, size: 10ms, grace: 1h}", "{n: count()}", "updates",
                            value_format="json")
    got = run_job(tmp_path / "fail", failing, {"s": records}, engine=engine)
    assert got.code == 2 and "t/0@1" in got.stderr and "unreadable" in got.stderr
    skipping = aggregate_job("{type: tumbling, size: 10ms, grace: 1h}", "{n: count()}", "updates",
                             value_format="json", extra_source=", on_error: skip")
    got = run_job(tmp_path / "skip", skipping, {"s": records}, engine=engine)
    assert got.code == 0, got.stderr
    assert [r["n"] for r in got.outputs["agg"]] == [1, 2]
    assert [(d["offset"], d["reason"]) for d in got.ledger] == [(1, "unreadable")]


def test_a_source_holding_two_topics_is_refused(tmp_path, spark):
    """A source is one topic (its partitions are the tasks' queues): two topics in one table is an error."""
    records = timeline([("k", "a", 1), ("k", "b", 2)]) + timeline([("k", "c", 3)], topic="u")
    job = aggregate_job("{type: tumbling, size: 10ms, grace: 0ms}", "{n: count()}", "updates")
    got = run_job(tmp_path, job, {"s": records})
    assert got.code == 2
    assert "sources.s: holds records of several topics (t, u)" in got.stderr


def test_null_key_is_dropped_without_moving_stream_time(tmp_path, spark):
    job = aggregate_job("{type: tumbling, size: 10ms, grace: 0ms}", "{n: count()}", "updates")
    got = run_job(tmp_path, job, {"s": timeline([("k", "a", 5), (None, "b", 50), ("k", "c", 6)])})
    assert got.code == 0, got.stderr
    assert [r["n"] for r in got.outputs["agg"]] == [1, 2]  # 6 is on time: the null-key 50 did not count
    assert [(d["offset"], d["reason"], d["stream_time"]) for d in got.ledger] == [(1, "null_key", 5)]


def test_malformed_job_is_one_line_naming_the_field(tmp_path):
    (tmp_path / "job.yaml").write_text(aggregate_job("{type: hopping, size: 5m, advance: 1m, grace: 5 minutes}",
                                                     "{n: count()}", "updates"))
    result = CliRunner().invoke(app, ["run", str(tmp_path / "job.yaml")])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "operators[0].aggregate.window.grace: '5 minutes' is not a duration; use" in lines[0]


def test_missing_input_path_is_a_clear_error(tmp_path, spark):
    (tmp_path / "job.yaml").write_text(aggregate_job("{type: tumbling, size: 5m, grace: 0ms}", "{n: count()}",
                                                     "updates"))
    result = CliRunner().invoke(app, ["run", str(tmp_path / "job.yaml")])
    assert result.exit_code == 2
    assert "sources.s.path:" in result.stderr and "does not exist" in result.stderr
    assert "Traceback" not in result.stderr


def test_copartitioning_mismatch_is_an_ordering_error():
    from backfill.errors import OrderingError
    from backfill.order.tasks import check_copartitioned

    assert check_copartitioned({"clicks": 4, "views": 4}, "j") == 4
    with pytest.raises(OrderingError, match="not co-partitioned .*clicks: 4, views: 3"):
        check_copartitioned({"clicks": 4, "views": 3}, "j")
