"""Joins over an operator (docs/semantics.md §18.3, §18.5): an enrichment chain, each join re-keying what it reads.

orders (keyed by order id) -> joined with customers after a re-key by customer -> that join's rows re-keyed by
product and joined with products: Kafka Streams' `orders.selectKey(customer).join(customers).selectKey(product)
.leftJoin(products)`. The second join reads the first one's rows through its repartition topic, the products
table as it is. Golden: the rows each engine derives by hand; the refusals of what is not modelled."""
from __future__ import annotations

from typing import Any

import pytest

from backfill.reference.repartition import partition_for
from tests.golden.harness import judged_rows, partitioned, run_job

pytestmark = pytest.mark.spark


def _job(second: str = "") -> str:
    second = second or """
    join:
      left: with_customer
      table: products
      how: left
      group_by: {left: "substr(value, 1, 2)"}
      value: "concat(substr(left.value, 4), '|', coalesce(right.value, '-'))\""""
    return f"""
name: enrichment-chain
sources:
  orders: {{format: jsonl, path: inputs/orders.jsonl, partitions: 2}}
  customers: {{format: jsonl, path: inputs/customers.jsonl, partitions: 2}}
  products: {{format: jsonl, path: inputs/products.jsonl, partitions: 2}}
operators:
  - name: with_customer
    join:
      left: orders
      table: customers
      how: inner
      group_by: {{left: "substr(value, 1, 2)"}}
      value: "concat(substr(left.value, 3, 2), ':', right.value)"
  - name: with_product{second}
sinks:
  with_customer: {{format: jsonl, path: out/with_customer.jsonl}}
  with_product: {{format: jsonl, path: out/with_product.jsonl}}
  _ledger: {{format: jsonl, path: out/ledger.jsonl}}
  _runs: {{format: jsonl, path: out/runs.jsonl}}
"""



def _table(topic: str, rows: list[tuple[str, str, int]]) -> list[dict[str, Any]]:
    return partitioned(topic, [(partition_for(k.encode(), 2), k, v, ts) for k, v, ts in rows])


CUSTOMERS = _table("customers", [("u1", "EU", 1), ("u5", "US", 2)])
PRODUCTS = _table("products", [("p1", "book", 1), ("p6", "game", 2), ("p1", "ebook", 12)])
# value: customer (2 characters), then product; u9 is no customer; p3 no product
ORDERS = partitioned("orders", [(0, "o1", "u1p6", 10), (0, "o2", "u5p1", 11), (0, "o3", "u9p1", 12),
                             (1, "o4", "u5p6", 13), (1, "o5", "u1p1", 14), (1, "o6", "u5p3", 15)])


def test_the_keys_land_where_the_golden_timeline_says() -> None:
    assert [partition_for(k.encode(), 2) for k in ("u1", "u5", "p1", "p3", "p6")] == [0, 1, 0, 0, 1]


@pytest.mark.parametrize("engine", ["spark", "reference"])
def test_an_enrichment_chain_reads_the_first_joins_rows_through_its_repartition_topic(tmp_path, spark, engine):
    """The first join: u1's orders in task 0 (o1 at 10, o5 at 14), u5's in task 1 (o2 11, o4 13, o6 15); o3 has
    no customer. Its rows re-keyed by product: partition 0 gets (by the upstream tasks' partition times) u5's
    p1 at 11, u1's p1 at 14, u5's p3 at 15, merged with book@1 and ebook@12; partition 1 u1's p6 at 10 and
    u5's at 13, with game@2. So the order at 11 meets book, the one at 14 the update ebook, p3 nothing."""
    got = run_job(tmp_path, _job(), {"orders": ORDERS, "customers": CUSTOMERS, "products": PRODUCTS},
                  engine=engine)
    assert got.code == 0, got.stderr
    rows = sorted((r["key"], r["value"], r["ts"], r["task"]) for r in got.outputs["with_product"])
    assert rows == [("p1", "EU|ebook", 14, 0), ("p1", "US|book", 11, 0), ("p3", "US|-", 15, 0),
                    ("p6", "EU|game", 10, 1), ("p6", "US|game", 13, 1)]
    assert len(got.outputs["with_customer"]) == 5
    assert got.ledger == []
    if engine == "spark":
        assert got.summary["chained"]["with_product"] == {"from": "with_customer", "records": 5, "forwarded": 5,
                                                          "beside": 3}  # the products, read beside the rows
        assert got.summary["repartitions"]["with_product-left-repartition"]["records"] == 5


@pytest.mark.parametrize(("second", "says"), [
    ("""
    join: {left: with_customer, table: products, how: left, value: "left.value"}""",
     "operators.with_product.join.left: 'with_customer' re-keys or reads an operator; its rows are read without a "
     "re-key only when it reads sources as they are: re-key it (group_by: {left: <new key>})"),
    ("""
    join: {left: with_customer, right: products, how: inner, window: {before: 1ms, after: 1ms, grace: 0ms},
           value: "left.value"}""",
     "operators.with_product.join.left: 'with_customer' re-keys or reads an operator; its rows are read without a "
     "re-key only when it reads sources as they are: re-key it (group_by: {left: <new key>})"),
    ("""
    join: {left: products, table: with_customer, how: left, value: "left.value"}""",
     "operators.with_product.join.table: 'with_customer' is no table (a windowed aggregate's keys are windows, a "
     "join's rows a stream); a table is a source or an aggregate without a window"),
    ("""
    join: {left: with_customer, right: products, how: inner, group_by: {left: "substr(value, 1, 2)"},
           window: {before: 1ms, after: 1ms, grace: 0ms}, where: {right: "value != 'book'"}, value: "left.value"}""",
     "operators.with_product.join.where.right: a filter on the source beside an operator is not supported yet"),
])
def test_a_join_over_an_operator_that_is_not_modelled_is_refused_in_one_line(tmp_path, spark, second, says):
    got = run_job(tmp_path, _job(second), {"orders": ORDERS, "customers": CUSTOMERS, "products": PRODUCTS})
    assert got.code == 2, got.stderr
    lines = got.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], got.stderr


def test_a_struct_from_the_operator_beside_a_plain_source_is_refused_in_one_line(tmp_path, spark):
    """The join's tasks read the operator's rows and the source as one table: one kind of value."""
    job = _job().replace("\"concat(substr(left.value, 3, 2), ':', right.value)\"",
                         "\"named_struct('p', substr(left.value, 3, 2), 'c', right.value)\"")
    got = run_job(tmp_path, job, {"orders": ORDERS, "customers": CUSTOMERS, "products": PRODUCTS})
    assert got.code == 2, got.stderr
    lines = got.stderr.strip().splitlines()
    assert len(lines) == 1 and ("operators.with_product.join: the rows it reads from an operator have a struct and "
                                "source 'products' a plain value") in lines[0], got.stderr


@pytest.mark.jvm
def test_kafka_streams_runs_each_enrichment_chain_as_the_reference_engine(tmp_path):
    """The topology judge's enrichment chains (`chain` configurations `rtjoin`, backfill/conformance/topologies.py)
    alone: Kafka Streams 4.4.0 and 3.6.2 build `stream.join(regions).filter(...).selectKey(region).join(third)`
    with the DSL and are fed each scenario as one sequence consistent with both joins' task orders; they forward
    the same rows and drop as many records."""
    from backfill.conformance import topologies
    from backfill.conformance.scenarios import drawn

    scenarios = drawn("chain", 2000, 9, lambda c: c["up"] == "rtjoin")
    assert len(scenarios) >= 80 and all(topologies.rekeyed(sc.config) for sc in scenarios)
    for version, rows in judged_rows(scenarios, tmp_path).items():
        # not vacuous: the second join's rows, in many scenarios (its table often comes later than the rows)
        assert len(rows) > len(scenarios) // 3 and len({r[0].split(".")[0] for r in rows}) == 3, version
