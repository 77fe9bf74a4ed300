"""Golden timelines for stream-table joins (docs/semantics.md §17) via `backfill run`, both engines.

Each timeline was replayed through Kafka Streams' own KStream#join/leftJoin(KTable) (the harness's `tjoin`
scenarios, TopologyTestDriver): the expected rows and dropped counts are what it forwarded, per release."""
from __future__ import annotations

import pytest

from tests.golden.harness import run_job

pytestmark = pytest.mark.spark
ENGINES = ["spark", "reference"]
N = None


def _job(how: str, versioned: str = "", kafka_streams: str = "") -> str:
    extra = f"\n      versioned: {versioned}" if versioned else ""
    release = f"kafka_streams: \"{kafka_streams}\"\n" if kafka_streams else ""
    return f"""
name: golden-table-join
{release}sources:
  clicks: {{format: jsonl, path: inputs/clicks.jsonl, value: {{format: string}}, order_by: seq}}
  users: {{format: jsonl, path: inputs/users.jsonl, value: {{format: string}}, order_by: seq}}
operators:
  - name: j
    join:
      left: clicks
      table: users
      how: {how}{extra}
      value: "concat(left.value, '|', coalesce(right.value, '-'))"
sinks:
  j: {{format: jsonl, path: out/j.jsonl}}
  _ledger: {{format: jsonl, path: out/ledger.jsonl}}
  _runs: {{format: jsonl, path: out/runs.jsonl}}
"""


def _inputs(timeline: list[tuple]) -> dict[str, list[dict]]:
    """(side L|R, key, value, ts) in the task's processing order -> both topics, `seq` keeping that order."""
    out: dict[str, list[dict]] = {"clicks": [], "users": []}
    for seq, (side, key, value, ts) in enumerate(timeline):
        rows = out["clicks" if side == "L" else "users"]
        rows.append({"topic": "clicks" if side == "L" else "users", "partition": 0, "offset": len(rows), "key": key,
                     "value": value, "timestamp": ts, "seq": seq})
    return out


def _rows(got) -> list[tuple]:
    return [(r["key"], r["value"], r["ts"]) for r in sorted(got.outputs["j"], key=lambda r: r["emit_seq"])]


def _reasons(got) -> list[tuple]:
    return sorted((d["source"], d["offset"], d["reason"]) for d in got.ledger)


PLAIN = [("R", "a", "t1", 1), ("L", "a", "l1", 2), ("L", "b", "l2", 3), ("R", "a", N, 4), ("L", "a", "l3", 5),
         ("L", N, "l4", 6), ("L", "a", N, 7), ("R", N, "t2", 8), ("L", "a", "l5", 9)]


@pytest.mark.parametrize("engine", ENGINES)
def test_inner_join_reads_the_latest_table_value_and_a_null_value_deletes(tmp_path, spark, engine):
    got = run_job(tmp_path, _job("inner"), _inputs(PLAIN), engine=engine)
    assert got.code == 0, got.stderr
    assert _rows(got) == [("a", "l1|t1", 2)]  # b has no table value; t1 was deleted before l3 and l5
    # Kafka Streams: 3 dropped (null-key click, null-value click, null-key user); the unmatched clicks are not
    assert _reasons(got) == [("clicks", 3, "null_key"), ("clicks", 4, "null_value"), ("users", 2, "null_key")]
    if engine == "spark":
        assert got.summary["operators"]["j"]["dropped"]["no_table_value"] == 3


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("release", ["3.6", "4.4"])
def test_left_join_forwards_a_null_key_click_from_3_7(tmp_path, spark, engine, release):
    got = run_job(tmp_path, _job("left", kafka_streams=release), _inputs(PLAIN), engine=engine)
    assert got.code == 0, got.stderr
    rows = [("a", "l1|t1", 2), ("b", "l2|-", 3), ("a", "l3|-", 5)] + (
        [(N, "l4|-", 6)] if release == "4.4" else []) + [("a", "l5|-", 9)]
    assert _rows(got) == rows
    nulls = [] if release == "4.4" else [("clicks", 3, "null_key")]
    assert _reasons(got) == sorted(nulls + [("clicks", 4, "null_value"), ("users", 2, "null_key")])


VERSIONED = [("R", "a", "v1", 10), ("R", "a", "v2", 20), ("L", "a", "s15", 15), ("L", "a", "s25", 25),
             ("R", "a", "v5", 5), ("L", "a", "s7", 7), ("L", "a", "s3", 3), ("R", "a", "v12", 12),
             ("L", "a", "s13", 13), ("R", "b", "w1", 1), ("L", "b", "sb2", 2)]


@pytest.mark.parametrize("engine", ENGINES)
def test_versioned_table_is_read_as_of_the_stream_record(tmp_path, spark, engine):
    got = run_job(tmp_path, _job("left", "{history_retention: 10ms}"), _inputs(VERSIONED), engine=engine)
    assert got.code == 0, got.stderr
    # v5 and w1 are older than the store's time (20) minus the history (10): refused (Kafka Streams: 2 dropped);
    # s7 and s3 read before 10: only a key's latest version is still there, and it is newer than them
    assert _rows(got) == [("a", "s15|v1", 15), ("a", "s25|v2", 25), ("a", "s7|-", 7), ("a", "s3|-", 3),
                          ("a", "s13|v12", 13), ("b", "sb2|-", 2)]
    assert _reasons(got) == [("users", 2, "expired"), ("users", 4, "expired")]


@pytest.mark.parametrize("engine", ENGINES)
def test_versioned_table_keeps_the_latest_version_whatever_its_age(tmp_path, spark, engine):
    timeline = [("R", "a", "v1", 2), ("R", "b", "w", 30), ("L", "a", "s5", 5), ("L", "a", "s1", 1),
                ("R", "a", "v20", 20), ("R", "a", "v20b", 20), ("L", "a", "s21", 21), ("R", "a", N, 25),
                ("L", "a", "s26", 26), ("L", "a", "s24", 24)]
    got = run_job(tmp_path, _job("left", "{history_retention: 10ms}"), _inputs(timeline), engine=engine)
    assert got.code == 0, got.stderr
    # s5 reads before 30 - 10 but a's latest version (v1@2) is older than it; s1 is older than v1. A put of the
    # same timestamp replaces the version (v20b); a null value is a version too (a delete from 25)
    assert _rows(got) == [("a", "s5|v1", 5), ("a", "s1|-", 1), ("a", "s21|v20b", 21), ("a", "s26|-", 26),
                          ("a", "s24|v20b", 24)]


GRACE = [("R", "a", "v1", 10), ("L", "a", "s12", 12), ("R", "a", "v11", 11), ("L", "a", "s30", 30),
         ("L", "a", "s14", 14), ("L", "a", "s28", 28), ("R", "a", "v29", 29), ("L", "a", "s40", 40),
         ("L", "a", "s1", 1)]


@pytest.mark.parametrize("engine", ENGINES)
def test_grace_buffers_stream_records_and_joins_them_with_the_table_as_it_is_then(tmp_path, spark, engine):
    got = run_job(tmp_path, _job("left", "{history_retention: 20ms, grace: 5ms}"), _inputs(GRACE), engine=engine)
    assert got.code == 0, got.stderr
    # s12 waits until s30 (30 - 5 >= 12), by then v11 is in; s14 is older than 30 - 5: joined at once; s28 and
    # s30 wait until s40, in timestamp order, and find v29; s40 is still waiting at the end; s1 reads too far back
    assert _rows(got) == [("a", "s12|v11", 12), ("a", "s14|v11", 14), ("a", "s28|v11", 28), ("a", "s30|v29", 30),
                          ("a", "s1|-", 1)]
    assert got.ledger == []
    if engine == "spark":
        assert got.summary["operators"]["j"]["incomplete_windows"] == 1


@pytest.mark.parametrize("engine", ENGINES)
def test_a_versioned_table_needs_3_5_and_a_grace_3_6(tmp_path, spark, engine):
    got = run_job(tmp_path, _job("inner", "{history_retention: 10ms}", kafka_streams="3.4"), _inputs(PLAIN),
                  engine=engine)
    assert got.code == 2 and "versioned" in got.stderr and "3.5" in got.stderr
    assert len(got.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("engine", ENGINES)
def test_a_table_that_is_not_co_partitioned_is_refused(tmp_path, spark, engine):
    inputs = _inputs(PLAIN)
    inputs["users"][0]["partition"] = 1  # users has two partitions, clicks one
    got = run_job(tmp_path, _job("inner"), inputs, engine=engine)
    assert got.code == 2 and "operators.j" in got.stderr and "co-partitioned" in got.stderr
    assert len(got.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("engine", ENGINES)
def test_a_delete_of_the_only_version_at_its_timestamp_leaves_no_trace(tmp_path, spark, engine):
    """Kafka Streams deletes the latest value and keeps no record of where it ended: a later, older put is then
    the latest version for every read (found by `backfill conformance`, confirmed on 3.6.2 and 4.4.0)."""
    timeline = [("R", "a", "t0", 9), ("R", "a", N, 9), ("R", "a", "t7", 0), ("L", "a", "l6", 10),
                ("R", "b", "u0", 2), ("R", "b", "u1", 9), ("R", "b", N, 9), ("L", "b", "m10", 10), ("L", "b", "m5", 5)]
    got = run_job(tmp_path, _job("left", "{history_retention: 30ms}"), _inputs(timeline), engine=engine)
    assert got.code == 0, got.stderr
    # b had an older version (u0): its validity still ends at 9, as a delete there would
    assert _rows(got) == [("a", "l6|t7", 10), ("b", "m10|-", 10), ("b", "m5|u0", 5)]


@pytest.mark.parametrize("engine", ENGINES)
def test_records_released_together_go_by_timestamp_then_key_then_arrival(tmp_path, spark, engine):
    """The grace buffer's store is keyed (timestamp, serialized key, sequence number) (TopologyTestDriver)."""
    timeline = [("R", "q", "t", 0), ("L", "c", "s1", 9), ("L", "a", "s2", 9), ("L", "ab", "s3", 9), ("L", "a", "s4", 9),
                ("L", "b", "s5", 9), ("L", "a", "s6", 8), ("L", "z", "s9", 30)]
    got = run_job(tmp_path, _job("left", "{history_retention: 20ms, grace: 5ms}"), _inputs(timeline), engine=engine)
    assert got.code == 0, got.stderr
    assert [r[1] for r in _rows(got)] == ["s6|-", "s2|-", "s4|-", "s3|-", "s5|-", "s1|-"]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_null_key_in_a_left_join_with_a_grace_stops_the_run_as_kafka_streams_fails(tmp_path, spark, engine):
    """Kafka Streams 3.7+ throws a NullPointerException in the grace buffer there (TopologyTestDriver)."""
    timeline = [("R", "a", "v1", 1), ("L", N, "s1", 2), ("L", "a", "s2", 3)]
    got = run_job(tmp_path, _job("left", "{history_retention: 20ms, grace: 5ms}"), _inputs(timeline), engine=engine)
    assert got.code == 2 and "null key" in got.stderr and "grace" in got.stderr
    assert len(got.stderr.strip().splitlines()) == 1
