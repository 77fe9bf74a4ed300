"""Golden timelines for table aggregations (an aggregate without a window, docs/semantics.md §16) via `backfill
run`. The expected rows are what Kafka Streams' KGroupedStream#aggregate forwarded for the same records
(TopologyTestDriver, caching off: the harness's `tagg` scenarios, 3.4.1 to 4.4.0 alike)."""
from __future__ import annotations

import pytest

from tests.golden.harness import run_job

pytestmark = pytest.mark.spark
ENGINES = ["spark", "reference"]


def _job(aggregations: str, emit: str = "updates", extra: str = "") -> str:
    return f"""
name: golden-table
sources:
  s: {{format: jsonl, path: inputs/s.jsonl, value: {{format: json}}}}
operators:
  - name: t
    aggregate:
      input: s{extra}
      aggregations: {aggregations}
      emit: {emit}
sinks:
  t: {{format: jsonl, path: out/t.jsonl}}
  _ledger: {{format: jsonl, path: out/ledger.jsonl}}
  _runs: {{format: jsonl, path: out/runs.jsonl}}
"""


def _records(rows: list[tuple]) -> list[dict]:
    return [{"topic": "t", "partition": 0, "offset": i, "key": k,
             "value": None if v is None else {"n": v[0], "p": v[1]}, "timestamp": ts}
            for i, (k, v, ts) in enumerate(rows)]


# the harness's probe: a 1,x@5; a 2,y@3; a null@7; null-key 1,x@8; a 3,z@9; a 4,w@2; b 1,z@1
PROBE = _records([("a", (1, "x"), 5), ("a", (2, "y"), 3), ("a", None, 7), (None, (1, "x"), 8), ("a", (3, "z"), 9),
                  ("a", (4, "w"), 2), ("b", (1, "z"), 1)])


@pytest.mark.parametrize("engine", ENGINES)
def test_every_update_is_emitted_with_the_largest_timestamp_so_far(tmp_path, spark, engine):
    got = run_job(tmp_path, _job("{c: count(), s: sum(value.n), f: {fold: {init: \"''\", step: \"concat(acc, "
                                 "value.p)\"}}}"), {"s": PROBE}, engine=engine)
    assert got.code == 0, got.stderr
    rows = [(r["key"], r["c"], r["s"], r["f"], r["ts"]) for r in sorted(got.outputs["t"], key=lambda r: r["emit_seq"])]
    # Kafka Streams forwarded 1|1|x@5, 2|3|xy@5, 3|6|xyz@9, 4|10|xyzw@9 for a and 1|1|z@1 for b
    assert rows == [("a", 1, 1, "x", 5), ("a", 2, 3, "xy", 5), ("a", 3, 6, "xyz", 9), ("a", 4, 10, "xyzw", 9),
                    ("b", 1, 1, "z", 1)]
    assert sorted((d["offset"], d["reason"]) for d in got.ledger) == [(2, "null_value"), (3, "null_key")]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_fold_that_gives_null_deletes_the_key_and_the_next_record_starts_again(tmp_path, spark, engine):
    """One fold alone is the store's value: null is a delete (a tombstone row), then init and the new ts."""
    step = "if(value.p = 'z', null, concat(acc, value.p))"
    got = run_job(tmp_path, _job(f"{{f: {{fold: {{init: \"''\", step: \"{step}\"}}}}}}"), {"s": PROBE},
                  engine=engine)
    assert got.code == 0, got.stderr
    rows = [(r["key"], r["f"], r["ts"]) for r in sorted(got.outputs["t"], key=lambda r: r["emit_seq"])]
    # Kafka Streams: x@5, xy@5, null@9 (a tombstone), w@2 (from the initializer, its own timestamp), b null@1
    assert rows == [("a", "x", 5), ("a", "xy", 5), ("a", None, 9), ("a", "w", 2), ("b", None, 1)]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_table_has_no_final_rows(tmp_path, spark, engine):
    got = run_job(tmp_path, _job("{c: count()}", emit="final"), {"s": PROBE}, engine=engine)
    assert got.code == 2 and "emit" in got.stderr and "never closes" in got.stderr
    assert len(got.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("engine", ENGINES)
def test_a_filtered_table_aggregate_counts_only_what_passes(tmp_path, spark, engine):
    got = run_job(tmp_path, _job("{c: count()}", extra="\n      where: \"value.p != 'x'\""), {"s": PROBE},
                  engine=engine)
    assert got.code == 0, got.stderr
    rows = [(r["key"], r["c"], r["ts"]) for r in sorted(got.outputs["t"], key=lambda r: r["emit_seq"])]
    assert rows == [("a", 1, 3), ("a", 2, 9), ("a", 3, 9), ("b", 1, 1)]
    # the null value and the null-key x are filtered before the aggregate: no ledger rows
    assert got.ledger == []
