"""Golden timelines for chains (an operator reads another operator's forwarded rows, docs/semantics.md §18) via
`backfill run`, both engines: the rows each task forwarded, in its emission order, with their timestamps."""
from __future__ import annotations

from typing import Any

import pytest

from tests.golden.harness import Outcome, run_job

pytestmark = pytest.mark.spark
ENGINES = ["spark", "reference"]
N = None
SINKS = "  _ledger: {format: jsonl, path: out/ledger.jsonl}\n  _runs: {format: jsonl, path: out/runs.jsonl}"


def _records(topic: str, rows: list[tuple]) -> list[dict[str, Any]]:
    """(partition, key, value, timestamp) in offset order per partition -> JSONL records."""
    offsets: dict[int, int] = {}
    out = []
    for partition, key, value, ts in rows:
        out.append({"topic": topic, "partition": partition, "offset": offsets.setdefault(partition, 0), "key": key,
                    "value": value, "timestamp": ts})
        offsets[partition] += 1
    return out


def _rows(got: Outcome, op: str, *cols: str) -> list[tuple]:
    """The operator's rows per task in emission order (task, then emit_seq)."""
    return [tuple(r[c] for c in cols) for r in sorted(got.outputs[op], key=lambda r: (r["task"], r["emit_seq"]))]


def _ledger(got: Outcome) -> list[tuple]:
    return sorted((d["operator"], d["source"], d["partition"], d["offset"], d["key"], d["reason"], d["window_start"],
                   d["stream_time"]) for d in got.ledger)


def _filtered(got: Outcome, engine: str, op: str) -> int:
    return got.summary["filtered"][op] if engine == "reference" else got.summary["operators"][op]["filtered"]


# ------------------------------------------------------------------------------- table join -> re-keyed aggregate
CONTRACT = f"""
name: views-per-region
sources:
  pageviews: {{format: jsonl, path: inputs/pageviews.jsonl, key: {{format: string}}, value: {{format: json}}}}
  users:     {{format: jsonl, path: inputs/users.jsonl, key: {{format: string}}, value: {{format: json}}}}
operators:
  - name: enriched
    join:
      left: pageviews
      table: users
      how: left
      where: {{left: "value.page is not null"}}
      value: "named_struct('user', key, 'page', left.value.page, 'region', right.value.region)"
  - name: views_per_region
    aggregate:
      input: enriched
      where: "value.region is not null"
      group_by: value.region
      window: {{type: hopping, size: 5m, advance: 1m, grace: 30s}}
      aggregations: {{views: count()}}
      emit: updates
sinks:
  enriched: {{format: jsonl, path: out/enriched.jsonl}}
  views_per_region: {{format: jsonl, path: out/views_per_region.jsonl}}
{SINKS}
"""

USERS = _records("users", [(0, "u1", {"region": "eu"}, 0), (1, "u2", {"region": "us"}, 0),
                           (1, "u3", {"region": "eu"}, 0)])
PAGEVIEWS = _records("pageviews", [
    (0, "u1", {"page": "/a"}, 60_000), (0, "u1", {"page": N}, 62_000), (0, "u4", {"page": "/x"}, 63_000),
    (0, "u1", {"page": "/d"}, 125_000),
    (1, "u2", {"page": "/b"}, 61_000), (1, "u3", {"page": "/c"}, 120_500), (1, "u2", {"page": "/f"}, 400_000),
    (1, "u2", {"page": "/e"}, 10_000)])


@pytest.mark.parametrize("engine", ENGINES)
def test_table_join_rows_regrouped_by_region_into_hopping_windows(tmp_path, spark, engine):
    got = run_job(tmp_path, CONTRACT, {"pageviews": PAGEVIEWS, "users": USERS}, engine=engine)
    assert got.code == 0, got.stderr
    # u1's null page is filtered before the join; u4 has no user: joined with a null region, then filtered
    assert _rows(got, "enriched", "task", "key", "ts") == [
        (0, "u1", 60_000), (0, "u4", 63_000), (0, "u1", 125_000),
        (1, "u2", 61_000), (1, "u3", 120_500), (1, "u2", 400_000), (1, "u2", 10_000)]
    # eu -> repartition partition 0, us -> 1 (murmur2); partition 0 interleaves the upstream tasks by the
    # derived stream's partition time: u1@60000 (task 0), u3@120500 (task 1), u1@125000 (task 0)
    assert _rows(got, "views_per_region", "task", "key", "window_start", "views", "ts") == [
        (0, "eu", 0, 1, 60_000), (0, "eu", 60_000, 1, 60_000),
        (0, "eu", 0, 2, 120_500), (0, "eu", 60_000, 2, 120_500), (0, "eu", 120_000, 1, 120_500),
        (0, "eu", 0, 3, 125_000), (0, "eu", 60_000, 3, 125_000), (0, "eu", 120_000, 2, 125_000),
        (1, "us", 0, 1, 61_000), (1, "us", 60_000, 1, 61_000),
        (1, "us", 120_000, 1, 400_000), (1, "us", 180_000, 1, 400_000), (1, "us", 240_000, 1, 400_000),
        (1, "us", 300_000, 1, 400_000), (1, "us", 360_000, 1, 400_000)]
    # u2@10000 comes after u2@400000 in the us task: late for its only window; the ledger names the forwarded
    # row (enriched's task 1, its 4th row), keyed by the new key
    assert _ledger(got) == [("views_per_region", "enriched", 1, 3, "us", "late", 0, 400_000)]
    assert _filtered(got, engine, "enriched") == 1 and _filtered(got, engine, "views_per_region") == 1
    if engine == "spark":
        counts = got.summary["operators"]["views_per_region"]
        assert (counts["records_in"], counts["contributing"], counts["filtered"], counts["dropped"]["late"]) == (
            7, 5, 1, 1)
        assert got.summary["chained"]["views_per_region"] == {"from": "enriched", "records": 7, "forwarded": 7}


# ------------------------------------------------------------------------------- aggregate updates -> aggregate
UPDATES = f"""
name: bursts
sources:
  clicks: {{format: jsonl, path: inputs/clicks.jsonl, key: {{format: string}}, value: {{format: string}}}}
operators:
  - name: per_minute
    aggregate:
      input: clicks
      window: {{type: tumbling, size: 1m, grace: 2m}}
      aggregations: {{clicks: count()}}
      emit: updates
  - name: bursts
    aggregate:
      input: per_minute
      where: "value.clicks >= 2"
      window: {{type: tumbling, size: 5m, grace: 0ms}}
      aggregations:
        n: count()
        trail:
          fold: {{init: "''", step: "concat(acc, cast(value.window_start as string), ':',
                                         cast(value.clicks as string), ' ')"}}
      emit: updates
sinks:
  per_minute: {{format: jsonl, path: out/per_minute.jsonl}}
  bursts: {{format: jsonl, path: out/bursts.jsonl}}
{SINKS}
"""

CLICKS = _records("clicks", [(0, "a", "x", 10_000), (0, "a", "x", 20_000), (0, "b", "x", 30_000), (0, "a", "x", 70_000),
                             (0, "a", "x", 80_000), (0, "a", "x", 30_000), (0, "a", "x", 600_000),
                             (0, "a", "x", 610_000), (0, "a", "x", 500_000), (0, "a", "x", 510_000),
                             (0, "a", "x", 5_000)])


@pytest.mark.parametrize("engine", ENGINES)
def test_filtered_aggregate_updates_feed_a_wider_window_in_emission_order(tmp_path, spark, engine):
    got = run_job(tmp_path, UPDATES, {"clicks": CLICKS}, engine=engine)
    assert got.code == 0, got.stderr
    # one update per accepted click; a@30000 is within the 2m grace: window 0's update carries ts 30000, not 80000
    assert _rows(got, "per_minute", "key", "window_start", "clicks", "ts") == [
        ("a", 0, 1, 10_000), ("a", 0, 2, 20_000), ("b", 0, 1, 30_000), ("a", 60_000, 1, 70_000),
        ("a", 60_000, 2, 80_000), ("a", 0, 3, 30_000), ("a", 600_000, 1, 600_000), ("a", 600_000, 2, 610_000),
        ("a", 480_000, 1, 500_000), ("a", 480_000, 2, 510_000)]
    # only updates with clicks >= 2 reach bursts; the filtered ones move none of its stream time, so the update
    # of window 480000 (ts 510000) comes when bursts' stream time is 610000: late for [300000, 600000)
    assert _rows(got, "bursts", "key", "window_start", "n", "trail", "ts") == [
        ("a", 0, 1, "0:2 ", 20_000), ("a", 0, 2, "0:2 60000:2 ", 80_000), ("a", 0, 3, "0:2 60000:2 0:3 ", 80_000),
        ("a", 600_000, 1, "600000:2 ", 610_000)]
    # a@5000 is late upstream and is never forwarded; the late forwarded row is per_minute's 10th (offset 9)
    assert _ledger(got) == [("bursts", "per_minute", 0, 9, "a", "late", 300_000, 610_000),
                            ("per_minute", "clicks", 0, 10, "a", "late", 0, 610_000)]
    assert _filtered(got, engine, "bursts") == 5
    if engine == "spark":
        counts = got.summary["operators"]["bursts"]
        assert (counts["records_in"], counts["contributing"], counts["filtered"], counts["late_pairs"]) == (10, 4, 5, 1)


# ------------------------------------------------------------------------------- stream-stream join -> aggregate
JOINED = f"""
name: joined-per-minute
sources:
  left: {{format: jsonl, path: inputs/left.jsonl, key: {{format: string}}, value: {{format: string}}, order_by: seq}}
  right: {{format: jsonl, path: inputs/right.jsonl, key: {{format: string}}, value: {{format: string}}, order_by: seq}}
operators:
  - name: j
    join:
      left: left
      right: right
      how: left
      window: {{before: 10s, after: 10s, grace: 0ms}}
      value: "concat(left.value, '+', coalesce(right.value, 'null'))"
  - name: per_key
    aggregate:
      input: j
      window: {{type: tumbling, size: 1m, grace: 0ms}}
      aggregations:
        n: count()
        trail: {{fold: {{init: "''", step: "concat(acc, value, ' ')"}}}}
      emit: updates
sinks:
  j: {{format: jsonl, path: out/j.jsonl}}
  per_key: {{format: jsonl, path: out/per_key.jsonl}}
{SINKS}
"""


def _sides(timeline: list[tuple]) -> dict[str, list[dict[str, Any]]]:
    """(side, key, value, ts) in the task's processing order -> both topics, `seq` keeping that order."""
    out: dict[str, list[dict[str, Any]]] = {"left": [], "right": []}
    for seq, (side, key, value, ts) in enumerate(timeline):
        rows = out[side]
        rows.append({"topic": side, "partition": 0, "offset": len(rows), "key": key, "value": value, "timestamp": ts,
                     "seq": seq})
    return out


PAIRS = [("left", "a", "l1", 1_000), ("right", "a", "r1", 5_000), ("left", "b", "l2", 8_000),
         ("right", "a", "r2", 62_000), ("left", "a", "l3", 61_000), ("left", "d", "l5", 45_000)]


@pytest.mark.parametrize("engine", ENGINES)
def test_join_pairs_and_unmatched_rows_feed_an_aggregate_with_their_own_timestamps(tmp_path, spark, engine):
    got = run_job(tmp_path, JOINED, _sides(PAIRS), engine=engine)
    assert got.code == 0, got.stderr
    # a pair has the larger timestamp; l2 comes out unjoined when r2 closes its window (before r2's own results);
    # l5 is past its window on arrival (62000 > 45000 + 10000): unjoined at once
    assert _rows(got, "j", "key", "value", "ts") == [("a", "l1+r1", 5_000), ("b", "l2+null", 8_000),
                                                    ("a", "l3+r2", 62_000), ("d", "l5+null", 45_000)]
    assert _rows(got, "per_key", "key", "window_start", "n", "trail", "ts") == [
        ("a", 0, 1, "l1+r1 ", 5_000), ("b", 0, 1, "l2+null ", 8_000), ("a", 60_000, 1, "l3+r2 ", 62_000)]
    # per_key's stream time is 62000 when l5's row comes: late for [0, 60000)
    assert _ledger(got) == [("per_key", "j", 0, 3, "d", "late", 0, 62_000)]
