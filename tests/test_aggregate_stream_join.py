"""An aggregation's update stream joined, without a re-key, with a table (docs/semantics.md §18.8):
`views.groupByKey().count().toStream().join(regions)`. The join runs in the aggregate's tasks: each update is
joined with `regions` as the task had it when it took the view that made the update (the merge order of the two
topics, not the timestamps). Golden rows derived by hand on both engines; the refusals of what is not modelled;
Kafka Streams judges random scenarios of the shape."""
from __future__ import annotations

import pytest

from tests.golden.harness import judged_rows, partitioned, run_job

pytestmark = pytest.mark.spark


def _job(counts: str = "", enriched: str = "", how: str = "inner") -> str:
    counts = counts or "aggregate: {input: views, aggregations: {n: count()}, emit: updates}"
    enriched = enriched or (f"join: {{left: counts, table: regions, how: {how}, "
                            "value: \"concat(cast(left.value.n as string), '@', coalesce(right.value, '-'))\"}")
    return f"""
name: counted-regions
sources:
  views: {{format: jsonl, path: inputs/views.jsonl, partitions: 2}}
  regions: {{format: jsonl, path: inputs/regions.jsonl, partitions: 2}}
operators:
  - name: counts
    {counts}
  - name: enriched
    {enriched}
sinks:
  counts: {{format: jsonl, path: out/counts.jsonl}}
  enriched: {{format: jsonl, path: out/enriched.jsonl}}
  _ledger: {{format: jsonl, path: out/ledger.jsonl}}
  _runs: {{format: jsonl, path: out/runs.jsonl}}
"""


# partition 0: keys a and b, partition 1: d (murmur2 modulo 2)
VIEWS = partitioned("views", [(0, "a", "v1", 3), (0, "b", "v2", 4), (0, "a", "v3", 8), (0, "a", "v4", 12),
                              (1, "d", "v5", 3)])
REGIONS = partitioned("regions", [(0, "a", "EU", 5), (0, "b", "US", 1), (0, "a", None, 10), (1, "d", "EU", 9)])
INPUTS = {"views": VIEWS, "regions": REGIONS}


@pytest.mark.parametrize("engine", ["spark", "reference"])
@pytest.mark.parametrize("how", ["inner", "left"])
def test_each_update_meets_the_table_as_the_task_had_it_when_it_took_the_view(tmp_path, spark, engine, how):
    """Task 0 takes, by head timestamp: v1@3 (a: 1, no region yet), v2@4 (b: 1; US@1 waits behind EU@5 in its
    partition), EU@5, US@1, v3@8 (a: 2, EU), the delete of a@10, v4@12 (a: 3, no region any more). Task 1: v5@3
    (d: 1) before EU@9. A join as of the timestamps would have given b's update the region US."""
    got = run_job(tmp_path, _job(how=how), INPUTS, engine=engine)
    assert got.code == 0, got.stderr
    rows = sorted((r["key"], r["value"], r["ts"], r["task"]) for r in got.outputs["enriched"])
    expected = [("a", "2@EU", 8, 0)]
    if how == "left":
        expected = sorted(expected + [("a", "1@-", 3, 0), ("a", "3@-", 12, 0), ("b", "1@-", 4, 0),
                                      ("d", "1@-", 3, 1)])
    assert rows == expected
    assert len(got.outputs["counts"]) == 5 and got.ledger == []
    if engine == "spark":  # the 5 updates read, the 4 regions beside them
        assert got.summary["chained"]["enriched"] == {"from": "counts", "records": 5, "forwarded": 5, "beside": 4}
        assert got.summary["operators"]["enriched"]["dropped"].get("no_table_value", 0) == (4 if how == "inner"
                                                                                           else 0)


@pytest.mark.parametrize(("counts", "enriched", "says"), [
    ("aggregate: {input: views, window: {type: tumbling, size: 10ms, grace: 0ms}, aggregations: {n: count()}, "
     "emit: updates}", "",
     "operators.enriched.join.left: reads operator 'counts' without a re-key; in the upstream's tasks a join reads "
     "a join's or a table aggregate's rows only"),
    ("aggregate: {input: views, group_by: value, aggregations: {n: count()}, emit: updates}", "",
     "operators.enriched.join.left: 'counts' re-keys or reads an operator"),
    ("", "join: {left: counts, table: views, how: inner, value: \"left.value\"}",
     "operators.enriched.join.table: 'views' is read by 'counts' too"),
])
def test_a_join_over_an_aggregate_that_is_not_modelled_is_refused_in_one_line(tmp_path, spark, counts, enriched,
                                                                             says):
    got = run_job(tmp_path, _job(counts, enriched), INPUTS)
    assert got.code == 2, got.stderr
    lines = got.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], got.stderr


@pytest.mark.jvm
def test_kafka_streams_joins_each_update_with_the_table_as_the_reference_engine(tmp_path):
    """The topology judge's `ajoin` chains (backfill/conformance/topologies.py) alone: Kafka Streams 4.4.0 and
    3.6.2 build `left.groupByKey().aggregate(...).toStream().join(right)` (and leftJoin) with the DSL, fed each
    task's records in the reference engine's merge order; they forward the same rows and drop as many records."""
    from backfill.conformance.scenarios import drawn

    scenarios = drawn("chain", 2400, 17, lambda c: c["up"] == "ajoin")
    assert len(scenarios) >= 80
    for version, rows in judged_rows(scenarios, tmp_path).items():
        # not vacuous: updates of a count above 1 that met a region, and (left joins) updates without one
        assert sum(1 for r in rows if not r[2].endswith(">null") and int(r[2].split("|")[0]) >= 2) > 40, version
        assert any(r[2].endswith(">null") for r in rows), version
