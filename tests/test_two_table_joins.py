"""A stream-table join over another stream-table join's rows, without a re-key (docs/semantics.md §18.8):
`orders.leftJoin(customers).join(tiers)`, every table keyed as the orders are. Both joins run in one task: each
row of the first is joined with `tiers` as the task had it when it took the order that made the row (the merge
order of three topics, not the timestamps). Golden rows derived by hand on both engines; the refusals of what is
not modelled; Kafka Streams judges random scenarios of the shape."""
from __future__ import annotations

import pytest

from tests.golden.harness import judged_rows, partitioned, run_job

pytestmark = pytest.mark.spark


def _job(first: str = "", second: str = "") -> str:
    first = first or ("join: {left: orders, table: customers, how: left, "
                      "value: \"concat(left.value, '@', coalesce(right.value, '-'))\"}")
    second = second or ("join: {left: with_region, table: tiers, how: inner, "
                        "value: \"concat(left.value, '/', right.value)\"}")
    return f"""
name: two-tables
sources:
  orders: {{format: jsonl, path: inputs/orders.jsonl, partitions: 2}}
  customers: {{format: jsonl, path: inputs/customers.jsonl, partitions: 2}}
  tiers: {{format: jsonl, path: inputs/tiers.jsonl, partitions: 2}}
operators:
  - name: with_region
    {first}
  - name: with_tier
    {second}
sinks:
  with_region: {{format: jsonl, path: out/with_region.jsonl}}
  with_tier: {{format: jsonl, path: out/with_tier.jsonl}}
  _ledger: {{format: jsonl, path: out/ledger.jsonl}}
  _runs: {{format: jsonl, path: out/runs.jsonl}}
"""


# partition 0: keys a and b, partition 1: d (murmur2 modulo 2)
ORDERS = partitioned("orders", [(0, "a", "o1", 3), (0, "b", "o2", 4), (0, "a", "o3", 8), (0, "a", "o4", 12),
                                (1, "d", "o5", 3)])
CUSTOMERS = partitioned("customers", [(0, "a", "EU", 1), (0, "b", "US", 2), (1, "d", "EU", 1)])
TIERS = partitioned("tiers", [(0, "a", "gold", 5), (0, "b", "silver", 1), (0, "a", None, 10), (1, "d", "gold", 9)])
INPUTS = {"orders": ORDERS, "customers": CUSTOMERS, "tiers": TIERS}


@pytest.mark.parametrize("engine", ["spark", "reference"])
def test_each_row_meets_the_second_table_as_the_task_had_it_when_it_took_the_order(tmp_path, spark, engine):
    """Task 0 takes, by head timestamp: EU@1 and US@2 (customers), o1@3 (row o1@EU: tiers has no a yet), o2@4
    (o2@US: silver@1 waits behind gold@5 in its partition), gold@5, silver@1, o3@8 (o3@EU/gold), the delete of
    a@10, o4@12 (no tier any more). Task 1: o5@3 comes before gold@9. One row: a join as of the timestamps would
    have given o2 its silver tier."""
    got = run_job(tmp_path, _job(), INPUTS, engine=engine)
    assert got.code == 0, got.stderr
    assert [(r["key"], r["value"], r["ts"], r["task"]) for r in got.outputs["with_tier"]] == [("a", "o3@EU/gold", 8, 0)]
    assert len(got.outputs["with_region"]) == 5 and got.ledger == []
    if engine == "spark":  # the 5 rows read, the 4 tiers beside them; 4 rows found no tier
        assert got.summary["chained"]["with_tier"] == {"from": "with_region", "records": 5, "forwarded": 5,
                                                       "beside": 4}
        assert got.summary["operators"]["with_tier"]["dropped"]["no_table_value"] == 4


@pytest.mark.parametrize("engine", ["spark", "reference"])
def test_a_filter_on_the_rows_it_reads_drops_them_before_the_second_join(tmp_path, spark, engine):
    """`where.left` filters the first join's rows (KStream#filter between the joins): o3's row never reaches
    the second join, which then has no row; counted as filtered, not ledgered."""
    second = ("join: {left: with_region, table: tiers, how: inner, where: {left: \"value != 'o3@EU'\"}, "
              "value: \"concat(left.value, '/', right.value)\"}")
    got = run_job(tmp_path, _job(second=second), INPUTS, engine=engine)
    assert got.code == 0, got.stderr
    assert got.outputs["with_tier"] == [] and got.ledger == []
    filtered = (got.summary["operators"]["with_tier"]["filtered"] if engine == "spark"
                else got.summary["filtered"]["with_tier"])
    assert filtered == 1


@pytest.mark.parametrize(("first", "second", "says"), [
    ("join: {left: orders, table: customers, how: left, group_by: {left: value}, value: \"left.value\"}", "",
     "operators.with_tier.join.left: 'with_region' re-keys or reads an operator"),
    ("join: {left: orders, table: customers, how: left, versioned: {history_retention: 10ms, grace: 2ms}, "
     "value: \"left.value\"}", "",
     "operators.with_tier.join.left: 'with_region' has a grace period"),
    ("", "join: {left: with_region, table: tiers, how: inner, versioned: {history_retention: 10ms, grace: 0ms}, "
         "value: \"left.value\"}",
     "operators.with_tier.join.versioned: a join over an operator's rows reads a plain table here"),
    ("", "join: {left: with_region, table: customers, how: inner, value: \"left.value\"}",
     "operators.with_tier.join.table: 'customers' is read by 'with_region' too"),
])
def test_a_join_over_a_join_that_is_not_modelled_is_refused_in_one_line(tmp_path, spark, first, second, says):
    got = run_job(tmp_path, _job(first, second), INPUTS)
    assert got.code == 2, got.stderr
    lines = got.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], got.stderr


@pytest.mark.jvm
def test_kafka_streams_joins_each_row_with_the_second_table_as_the_reference_engine(tmp_path):
    """The topology judge's `ttjoin` chains (backfill/conformance/topologies.py) alone: Kafka Streams 4.4.0 and
    3.6.2 build `left.join(right).join(third)` (the first also leftJoin) with the DSL, fed each task's records
    (three topics) in the reference engine's merge order; they forward the same rows and drop as many records."""
    from backfill.conformance.scenarios import drawn

    scenarios = drawn("chain", 2400, 13, lambda c: c["up"] == "ttjoin")
    assert len(scenarios) >= 80
    for version, rows in judged_rows(scenarios, tmp_path).items():
        # not vacuous: rows that met both tables, some of them without a region (a left join's)
        assert len(rows) > len(scenarios) and any("|null>" in r[2] for r in rows), version
