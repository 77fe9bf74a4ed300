"""Re-keyed stream-table joins (`join: {left, table, group_by: {left: EXPR}}`, docs/semantics.md §17.7):
`selectKey` on the stream before KStream#join/leftJoin(KTable).

The stream goes through its repartition topic (murmur2 of the new key, as many partitions as the table); the
table is read as it is by the join's tasks, its partitions merged with the repartition topic's by head
timestamp. A golden timeline pins the tasks, the table value each click meets there, and the null keys; the
topology judge (tests/test_topology_conformance.py, `table_join` configurations with `rekey`) has Kafka Streams
decide the rows."""
from __future__ import annotations

import pytest

from backfill.reference.repartition import partition_for
from tests.golden.harness import judged_rows, partitioned, run_job

pytestmark = pytest.mark.spark
N = None


def _job(how: str, by: str = "{left: \"nullif(value, 'anon')\"}", release: str = "4.4") -> str:
    return f"""
name: rekey-table-join
kafka_streams: "{release}"
sources:
  clicks: {{format: jsonl, path: inputs/clicks.jsonl, partitions: 2}}
  users: {{format: jsonl, path: inputs/users.jsonl, partitions: 2}}
operators:
  - name: j
    join:
      left: clicks
      table: users
      how: {how}
      group_by: {by}
      value: "concat(coalesce(left.value, 'null'), '|', coalesce(right.value, '-'))"
sinks:
  j: {{format: jsonl, path: out/j.jsonl}}
  _ledger: {{format: jsonl, path: out/ledger.jsonl}}
  _runs: {{format: jsonl, path: out/runs.jsonl}}
"""



# profiles keyed by user, each in the partition a producer gives its key: u1 and u2 in 0, u5 in 1; u1 updated at 20
USERS = partitioned("users", [(partition_for(u.encode(), 2), u, v, ts) for u, v, ts in
                           [("u1", "P-u1", 5), ("u5", "P-u5", 6), ("u1", "Q-u1", 20), ("u2", "P-u2", 40)]])
# clicks keyed by click id, the user in the value ('anon': no user, the new key is null); c7 is out of order
CLICKS = partitioned("clicks", [(0, "c1", "u1", 3), (0, "c2", "anon", 4), (0, "c3", "u5", 30),
                             (1, "c4", "u5", 7), (1, "c5", "u1", 8), (1, "c6", "u2", 41), (1, "c7", "u1", 25)])
# what each click meets in the task of its user's partition (partition 0: c1 3, anon 4, c5 8, c6 41, c7 25 by
# their upstream partitions' times, merged with u1@5, Q-u1@20, u2@40; partition 1: c4 7, c3 30 with u5@6)
INNER = [("u1", "u1|P-u1", 8, 0), ("u1", "u1|Q-u1", 25, 0), ("u2", "u2|P-u2", 41, 0), ("u5", "u5|P-u5", 7, 1),
         ("u5", "u5|P-u5", 30, 1)]


def _rows(got) -> list[tuple]:
    return sorted(((r["key"], r["value"], r["ts"], r["task"]) for r in got.outputs["j"]), key=str)


def test_the_users_land_where_the_golden_timeline_says() -> None:
    assert [partition_for(u.encode(), 2) for u in ("u1", "u2", "u5")] == [0, 0, 1]


@pytest.mark.parametrize("engine", ["spark", "reference"])
def test_a_rekeyed_click_meets_its_users_profile_as_the_users_task_has_it(tmp_path, spark, engine):
    """c1 reaches u1's task before u1's profile (3 before 5): no table value; c5 meets P-u1, c7 (out of order,
    at 25) meets the update Q-u1 (20), which the task took before it. The inner join drops the anonymous click
    before the topic (ledger); a left join lets it through (3.7+) and emits it with no user."""
    got = run_job(tmp_path, _job("inner"), {"clicks": CLICKS, "users": USERS}, engine=engine)
    assert got.code == 0, got.stderr
    assert _rows(got) == sorted(INNER, key=str)
    assert [(r["reason"], r["source"], r["offset"], r["detail"]) for r in got.ledger] == \
        [("null_key", "clicks", 1, "group_by gave a null key: not repartitioned")]
    left = run_job(tmp_path / "left", _job("left"), {"clicks": CLICKS, "users": USERS}, engine=engine)
    assert left.code == 0, left.stderr
    assert _rows(left) == sorted(INNER + [("u1", "u1|-", 3, 0), (N, "anon|-", 4, 0)], key=str)
    assert left.ledger == []
    if engine == "spark":
        assert got.summary["repartitions"]["j-left-repartition"] == {
            "from": "clicks", "key": "nullif(value, 'anon')", "partitions": 2, "operator": "j", "records": 6,
            "null_keys": 1}
        assert got.summary["operators"]["j"]["dropped"] == {"null_key": 1, "null_value": 0, "expired": 0,
                                                            "no_table_value": 1}


def test_before_3_7_a_left_joins_null_key_is_dropped_before_the_topic(tmp_path, spark):
    got = run_job(tmp_path, _job("left", release="3.6"), {"clicks": CLICKS, "users": USERS})
    assert got.code == 0, got.stderr
    assert (N, "anon|-", 4, 0) not in _rows(got)
    assert [(r["reason"], r["offset"]) for r in got.ledger] == [("null_key", 1)]


@pytest.mark.parametrize(("by", "says"), [
    ("value", "operators[0].join.group_by: a table is not re-keyed (a KTable has no selectKey); re-key the stream "
              "only: group_by: {left: EXPR}"),
    ("{right: value}", "a table is not re-keyed"),
    ("{left: {key: value, partitions: 3}}", "operators.j.join.group_by: co-partitioned join inputs need one "
                                            "partition count, got operators.j.join.group_by.left.partitions: 3, "
                                            "sources.users: 2"),
])
def test_rekeyed_table_join_errors_are_one_line(tmp_path, spark, by, says):
    got = run_job(tmp_path, _job("inner", by=by), {"clicks": CLICKS, "users": USERS})
    assert got.code == 2, got.stderr
    lines = got.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], got.stderr


@pytest.mark.jvm
def test_kafka_streams_joins_each_rekeyed_scenario_as_the_reference_engine(tmp_path):
    """The re-keyed configurations of the topology judge alone: Kafka Streams 4.4.0 and 3.6.2 (null keys before
    KIP-962) replay each scenario (selectKey, then the join) in the order of the join's own task, and forward the
    same rows and drop the same records; some rows met the table, some stream records had no new key."""
    from backfill.conformance import check, topologies
    from backfill.conformance.scenarios import drawn

    scenarios = drawn("table_join", 320, 5, topologies.rekeyed)
    assert len(scenarios) >= 60
    for version, rows in judged_rows(scenarios, tmp_path).items():
        assert sum(1 for r in rows if r[2].split("|")[1] != "-") > len(scenarios) // 2  # rows that met the table
        ref, _ = check.reference_summary(tmp_path / version / "job.yaml")
        assert any(r["detail"] == "group_by gave a null key: not repartitioned" for r in ref["ledger_rows"])
