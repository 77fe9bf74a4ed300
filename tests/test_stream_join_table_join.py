"""A stream-stream join's rows joined, without a re-key, with a table (docs/semantics.md §18.8):
`orders.leftJoin(payments, window).join(tiers)`. The table join runs in the stream-stream join's tasks: each row
is joined with `tiers` as the task had it when it took the record whose processing forwarded the row. A left
join's unmatched order is forwarded later, when a record moves stream time past its window; several rows can
come at one record. Golden rows derived by hand on both engines; Kafka Streams judges random scenarios of the
shape."""
from __future__ import annotations

import pytest

from tests.golden.harness import judged_rows, partitioned, run_job

pytestmark = pytest.mark.spark

JOB = """
name: paid-tiers
sources:
  orders: {format: jsonl, path: inputs/orders.jsonl, partitions: 2}
  payments: {format: jsonl, path: inputs/payments.jsonl, partitions: 2}
  tiers: {format: jsonl, path: inputs/tiers.jsonl, partitions: 2}
operators:
  - name: paid
    join: {left: orders, right: payments, how: left, window: {before: 2ms, after: 2ms, grace: 0ms},
           value: "concat(left.value, '|', coalesce(right.value, '-'))"}
  - name: paid_tier
    join: {left: paid, table: tiers, how: inner, value: "concat(left.value, '>', right.value)"}
sinks:
  paid: {format: jsonl, path: out/paid.jsonl}
  paid_tier: {format: jsonl, path: out/paid_tier.jsonl}
  _ledger: {format: jsonl, path: out/ledger.jsonl}
  _runs: {format: jsonl, path: out/runs.jsonl}
"""

# partition 0: key a, partition 1: key d (murmur2 modulo 2)
ORDERS = partitioned("orders", [(0, "a", "o1", 1), (0, "a", "o2", 11), (0, "a", "o3", 25), (1, "d", "o4", 2),
                                (1, "d", "o6", 3)])
PAYMENTS = partitioned("payments", [(0, "a", "p1", 10), (1, "d", "p2", 4)])
TIERS = partitioned("tiers", [(0, "a", "gold", 3), (0, "a", "silver", 5), (0, "a", None, 12), (1, "d", "bronze", 1)])


@pytest.mark.parametrize("engine", ["spark", "reference"])
def test_each_row_meets_the_table_as_the_task_had_it_when_it_forwarded_the_row(tmp_path, spark, engine):
    """Task 0 takes, by head timestamp: o1@1, gold@3, silver@5, p1@10 (stream time 10 closes o1's window: its
    unmatched row, timestamp 1, is forwarded now and meets silver; a join as of its timestamp would find no
    tier), o2@11 (joins p1: silver), the delete of a@12, o3@25 (its window never closes: no row). Task 1:
    bronze@1, o4@2, o6@3, p2@4, which joins both orders: two rows at one record, each meeting bronze."""
    got = run_job(tmp_path, JOB, {"orders": ORDERS, "payments": PAYMENTS, "tiers": TIERS}, engine=engine)
    assert got.code == 0, got.stderr
    rows = got.outputs["paid_tier"]
    assert sorted((r["key"], r["value"], r["ts"], r["task"]) for r in rows) == [
        ("a", "o1|->silver", 1, 0), ("a", "o2|p1>silver", 11, 0), ("d", "o4|p2>bronze", 4, 1),
        ("d", "o6|p2>bronze", 4, 1)]
    assert len({(r["task"], r["emit_seq"]) for r in rows}) == 4  # the two rows of p2 keep their order
    assert [r["value"] for r in sorted(rows, key=lambda r: (r["task"], r["emit_seq"]))][2:] == [
        "o4|p2>bronze", "o6|p2>bronze"]
    if engine == "spark":  # the 4 rows read, the 4 tiers beside them
        assert got.summary["chained"]["paid_tier"] == {"from": "paid", "records": 4, "forwarded": 4, "beside": 4}


@pytest.mark.jvm
def test_kafka_streams_joins_each_row_with_the_table_as_the_reference_engine(tmp_path):
    """The topology judge's `sjt` chains (backfill/conformance/topologies.py) alone: Kafka Streams 4.4.0 and 3.6.2
    build `left.join(right, windows).join(third)` (and leftJoin, outerJoin) with the DSL, fed each task's records
    (three topics) in the reference engine's merge order; they forward the same rows and drop as many records."""
    from backfill.conformance.scenarios import drawn

    scenarios = drawn("chain", 2400, 19, lambda c: c["up"] == "sjt")
    assert len(scenarios) >= 80
    for version, rows in judged_rows(scenarios, tmp_path).items():
        # not vacuous: pairs, and unmatched rows (a left or outer join's, some forwarded at a later record)
        assert sum(1 for r in rows if "|-" not in r[2] and not r[2].startswith("-")) > 40, version
        assert sum(1 for r in rows if "|-" in r[2] or r[2].startswith("-")) > 100, version
