"""Re-keyed joins (`join.group_by`, docs/semantics.md §13): `selectKey` before a stream-stream join (and, in the
property test, before a stream-table join, §17.7).

A re-keyed input goes through its repartition topic (murmur2 of the new key); an input kept as it is is read
by the join's own tasks, its partitions merged with the repartition topic's by head timestamp. Golden
timelines pin the tasks, the null keys (an inner side drops them before the topic, a left/outer side lets
them through, 3.7+) and the ledger; a property test holds the Spark engine to the reference engine.
"""
from __future__ import annotations

import json
import random
from typing import Any

import pytest

from backfill.reference.repartition import partition_for
from tests.golden.harness import partitioned, run_job
from tests.test_join_properties import SETTINGS, timelines

pytestmark = pytest.mark.spark


def _job(ops: list[tuple[str, str, str]], *, partitions: int = 2, window: str = "{before: 10ms, after: 10ms, "
         "grace: 0ms}", release: str = "4.4") -> str:
    """Sources clicks and users (string keys and values, `partitions` each); ops: (name, how, group_by YAML)."""
    joiner = "concat(coalesce(left.value, 'null'), '+', coalesce(right.value, 'null'))"
    body = "".join(f"""  - name: {name}
    join: {{left: clicks, right: users, how: {how}, group_by: {by}, window: {window}, value: "{joiner}"}}
""" for name, how, by in ops)
    sinks = "".join(f"  {name}: {{format: jsonl, path: out/{name}.jsonl}}\n" for name, _, _ in ops)
    return f"""
name: rekey-join
kafka_streams: "{release}"
sources:
  clicks: {{format: jsonl, path: inputs/clicks.jsonl, partitions: {partitions}}}
  users: {{format: jsonl, path: inputs/users.jsonl, partitions: {partitions}}}
operators:
{body}sinks:
{sinks}  _ledger: {{format: jsonl, path: out/ledger.jsonl}}
  _runs: {{format: jsonl, path: out/runs.jsonl}}
"""



def _users() -> list[dict[str, Any]]:
    """Profiles keyed by user, each in the partition a producer gives its key (2 partitions)."""
    return partitioned("users", [(partition_for(u.encode(), 2), u, f"P-{u}", ts) for u, ts in
                              [("u1", 5), ("u2", 6), ("u3", 40)]])


# clicks keyed by click id: u1's clicks sit in both partitions; 'anon' has no user (the new key is null)
CLICKS = partitioned("clicks", [(0, "c1", "u1", 3), (0, "c2", "anon", 4), (0, "c3", "u2", 30),
                             (1, "c4", "u2", 7), (1, "c5", "u1", 8), (1, "c6", "u3", 41)])
BY_USER = "{left: \"nullif(value, 'anon')\"}"


@pytest.mark.parametrize("engine", ["spark", "reference"])
def test_a_rekeyed_join_meets_each_user_in_its_partition(tmp_path, spark, engine):
    """Clicks re-keyed by user land in the partition of the user's profile: every pair is found, in the task
    of that partition. The inner join drops the click without a user before the topic (ledger); the left
    join lets it through and emits it unjoined, in the task of its upstream partition."""
    got = run_job(tmp_path, _job([("ij", "inner", BY_USER), ("lj", "left", BY_USER)]),
                  {"clicks": CLICKS, "users": _users()}, engine=engine)
    assert got.code == 0, got.stderr
    task = {u: partition_for(u.encode(), 2) for u in ("u1", "u2", "u3")}
    inner = sorted((r["key"], r["value"], r["ts"], r["task"]) for r in got.outputs["ij"])
    assert inner == [("u1", "u1+P-u1", 5, task["u1"]), ("u1", "u1+P-u1", 8, task["u1"]),
                     ("u2", "u2+P-u2", 7, task["u2"]), ("u3", "u3+P-u3", 41, task["u3"])]
    left = sorted((str(r["key"]), r["value"], r["ts"], r["task"]) for r in got.outputs["lj"])
    assert ("None", "anon+null", 4, 0) in left  # 3.7+: forwarded at once with a null key
    assert {x for x in left if x[1] != "anon+null"} >= {(k, v, ts, t) for k, v, ts, t in inner}
    ledger = sorted((r["operator"], r["reason"], r["source"], r["partition"], r["offset"], r["key"], r["detail"])
                    for r in got.ledger)
    assert ledger == [("ij", "null_key", "clicks", 0, 1, None, "group_by gave a null key: not repartitioned")]
    if engine == "spark":
        assert got.summary["records_read"] == {"clicks": 6, "users": 3}  # derived streams are not read input
        topics = got.summary["repartitions"]
        assert topics["ij-left-repartition"] == {"from": "clicks", "key": "nullif(value, 'anon')", "partitions": 2,
                                                 "operator": "ij", "records": 5, "null_keys": 1}
        assert topics["lj-left-repartition"]["records"] == 6 and "lj-right-repartition" not in topics
        assert got.summary["operators"]["ij"]["records_in"] == 9
        assert got.summary["operators"]["ij"]["dropped"]["null_key"] == 1


@pytest.mark.parametrize("engine", ["spark", "reference"])
def test_a_left_joins_right_side_null_key_reaches_the_join_and_is_dropped_there(tmp_path, spark, engine):
    """3.7+: before a left join both repartitions let null keys through; the join's stream time sees the
    profile without a new key (u3's, at 40) and drops it: a ledger row with the join's stream time."""
    by = "{left: \"nullif(value, 'anon')\", right: \"case when key = 'u3' then null else key end\"}"
    got = run_job(tmp_path, _job([("lj", "left", by)]), {"clicks": CLICKS, "users": _users()}, engine=engine)
    assert got.code == 0, got.stderr
    assert [(r["reason"], r["source"], r["key"], r["timestamp"], r["stream_time"]) for r in got.ledger] == \
        [("null_key", "users", None, 40, 40)]
    joined = {(r["key"], r["value"]) for r in got.outputs["lj"]}
    assert ("u1", "u1+P-u1") in joined and not any(v == "u3+P-u3" for _, v in joined)


def test_before_3_7_a_left_side_null_key_is_dropped_before_the_topic(tmp_path, spark):
    got = run_job(tmp_path, _job([("lj", "left", BY_USER)], release="3.6"), {"clicks": CLICKS, "users": _users()})
    assert got.code == 0, got.stderr
    assert not [r for r in got.outputs["lj"] if r["key"] is None]
    assert [(r["operator"], r["reason"], r["offset"]) for r in got.ledger] == [("lj", "null_key", 1)]


@pytest.mark.parametrize(("by", "says"), [
    ("{left: {key: value, partitions: 3}}", "operators.j.join.group_by: co-partitioned join inputs need one "
                                            "partition count, got operators.j.join.group_by.left.partitions: 3, "
                                            "sources.users: 2"),
    ("{left: nosuch}", "operators.j.join.group_by.left.key: 'nosuch' is not a valid Spark SQL expression"),
    ("{}", "operators[0].join.group_by"),
])
def test_rekeyed_join_errors_are_one_line(tmp_path, spark, by, says):
    got = run_job(tmp_path, _job([("j", "inner", by)]), {"clicks": CLICKS, "users": _users()})
    assert got.code == 2, got.stderr
    lines = got.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], got.stderr


# ---------------------------------------------------------------------------------------------- property
# the new key: a letter from the value's digit, so records of every partition meet (null value: null key)
LETTER = "\"substr('abc', cast(substr(value, 2, 1) as int) % 3 + 1, 1)\""
REKEYED = [("inner_l", "inner", f"{{left: {LETTER}}}", "{before: 5ms, after: 5ms, grace: 0ms}"),
           ("left_lr", "left", f"{{left: {{key: {LETTER}, partitions: 3}}, right: {{key: {LETTER}, partitions: 3}}}}",
            "{before: 3ms, after: 7ms, grace: 2ms}"),
           ("outer_r", "outer", f"{{right: {LETTER}}}", "{before: 8ms, after: -3ms, grace: 1ms}"),
           ("left_both", "left", LETTER, "{before: 0ms, after: 10ms, grace: 0ms}")]


# stream-table joins whose stream is re-keyed (docs/semantics.md §17.7): `right` read as a table
TABLE_REKEYED = [("table_inner", "inner", f"{{left: {LETTER}}}"), ("table_left", "left", f"{{left: {LETTER}}}")]


def _property_job() -> str:
    joiner = "concat(coalesce(left.value, '-'), '/', coalesce(right.value, '-'))"
    body = "".join(f"""  - name: {name}
    join: {{left: left, right: right, how: {how}, group_by: {by}, window: {window}, value: "{joiner}"}}
""" for name, how, by, window in REKEYED)
    body += "".join(f"""  - name: {name}
    join: {{left: left, table: right, how: {how}, group_by: {by}, value: "{joiner}"}}
""" for name, how, by in TABLE_REKEYED)
    sinks = "".join(f"  {name}: {{format: jsonl, path: out/{name}.jsonl}}\n" for name, *_ in REKEYED + TABLE_REKEYED)
    return f"""
name: rekey-join-prop
sources:
  left: {{format: jsonl, path: inputs/left.jsonl, partitions: 4}}
  right: {{format: jsonl, path: inputs/right.jsonl, partitions: 4}}
operators:
{body}sinks:
{sinks}  _ledger: {{format: jsonl, path: out/ledger.jsonl}}
  _runs: {{format: jsonl, path: out/runs.jsonl}}
"""


def _rows(rows: list[dict[str, Any]]) -> list[str]:
    return sorted(json.dumps(r, sort_keys=True) for r in rows)


@pytest.mark.slow
def test_spark_rekeyed_joins_equal_reference(tmp_path_factory, spark):
    """Inner, left, outer; left, right or both sides re-keyed; the join's own partition count or a declared
    one; out-of-order records, ties, null keys and values (random timelines of the join property test, their
    scenarios folded into 4 partitions)."""
    from hypothesis import given
    from hypothesis import strategies as st

    @SETTINGS
    @given(seed=st.integers(0, 2**32 - 1))
    def check(seed: int) -> None:
        inputs = timelines(seed, scenarios=(24, 32))
        inputs = {side: [{**r, "partition": r["partition"] % 4} for r in rows] for side, rows in inputs.items()}
        tmp = tmp_path_factory.mktemp("rekeyjoin")
        job = _property_job()
        fast = run_job(tmp / "spark", job, inputs)
        oracle = run_job(tmp / "ref", job, inputs, engine="reference")
        assert fast.code == 0 and oracle.code == 0, fast.stderr + oracle.stderr
        for name, *_ in REKEYED:
            assert _rows(fast.outputs.get(name, [])) == _rows(oracle.outputs[name]), name
            assert fast.summary["operators"][name]["incomplete_windows"] == \
                len(oracle.summary["incomplete"][name]), name
        for name, *_ in TABLE_REKEYED:
            assert _rows(fast.outputs.get(name, [])) == _rows(oracle.outputs[name]), name
            assert any(r["value"].split("/")[1] != "-" for r in oracle.outputs[name]), name  # some met the table
        assert _rows(fast.ledger) == _rows(oracle.ledger)
        assert sum(len(oracle.outputs[name]) for name, *_ in REKEYED) > 300  # not vacuous
        assert {r["reason"] for r in oracle.ledger} >= {"null_key"}

    random.seed(0)
    check()
