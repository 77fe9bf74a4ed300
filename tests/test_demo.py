"""`backfill demo`: the bundled click sample is deterministic and realistically disordered; the demo runs end to end."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from backfill.demo import NULL_KEYS, PAGES, START_MS, generate_clicks, partition_for

REPO = Path(__file__).resolve().parents[1]
GRACE_1M_MS = 70_000  # a record this far behind misses its 1m window (size 1m + grace 10s) for sure


def _rows(path: Path) -> list[dict[str, Any]]:
    """The table's rows in (partition, offset) order."""
    rows = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    return sorted(rows, key=lambda r: (r["partition"], r["offset"]))


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The demo's sample with default arguments, and its rows."""
    path = tmp_path_factory.mktemp("sample") / "clicks"
    info = generate_clicks(str(path))
    return info, _rows(path)


def _behind(rows: list[dict[str, Any]]) -> list[int]:
    """For each record behind its partition's time so far (late in offset order): how far behind, ms."""
    out, partition_time = [], {}
    for r in rows:
        pt = partition_time.get(r["partition"])
        if pt is not None and r["timestamp"] < pt:
            out.append(pt - r["timestamp"])
        partition_time[r["partition"]] = max(pt or r["timestamp"], r["timestamp"])
    return out


def test_same_seed_same_table_other_seed_other_table(tmp_path: Path) -> None:
    for name, seed in (("a", 7), ("b", 7), ("c", 8)):
        generate_clicks(str(tmp_path / name), n=2_000, seed=seed)
    a, b, c = (_rows(tmp_path / name) for name in "abc")
    assert a == b
    assert a != c
    assert DeltaTable(str(tmp_path / "a")).schema() == DeltaTable(str(tmp_path / "b")).schema()


def test_sample_is_a_kafka_archive(sample: tuple[dict[str, Any], list[dict[str, Any]]]) -> None:
    info, rows = sample
    assert len(rows) == info["records"] == 20_000
    schema = DeltaTable(info["path"]).to_pyarrow_table().schema
    assert schema.field("partition").type == pa.int32() and schema.field("offset").type == pa.int64()
    assert schema.field("timestamp").type == pa.int64() and schema.field("key").type == pa.string()
    assert {r["topic"] for r in rows} == {"clicks"} and all(r["headers"] is None for r in rows)
    for p in (0, 1):
        offsets = [r["offset"] for r in rows if r["partition"] == p]
        assert offsets == list(range(len(offsets))) and len(offsets) == info["partitions"][p] > 5_000
    values = [json.loads(r["value"]) for r in rows]
    assert all(v["ts"] == r["timestamp"] for v, r in zip(values, rows))
    assert all(v["user"] == r["key"] for v, r in zip(values, rows) if r["key"] is not None)
    assert {v["page"] for v in values} == set(PAGES)
    with_amount = sum(v["amount"] is not None for v in values)
    assert 0.2 * len(rows) < with_amount < 0.4 * len(rows)


def test_keys_stay_in_one_partition_and_are_skewed(sample: tuple[dict[str, Any], list[dict[str, Any]]]) -> None:
    _, rows = sample
    keyed = [r for r in rows if r["key"] is not None]
    assert all(r["partition"] == partition_for(r["key"], 2) for r in keyed)
    per_user: dict[str, int] = {}
    for r in keyed:
        per_user[r["key"]] = per_user.get(r["key"], 0) + 1
    counts = sorted(per_user.values())
    assert len(counts) == 50
    assert counts[-1] > 5 * counts[len(counts) // 2]  # a few heavy users, a long tail


def test_disorder_is_about_three_percent_with_a_few_beyond_grace(
        sample: tuple[dict[str, Any], list[dict[str, Any]]]) -> None:
    info, rows = sample
    behind = _behind(rows)
    assert len(behind) == info["late_injected"]
    assert 0.02 * len(rows) < len(behind) < 0.04 * len(rows)
    assert min(behind) >= 5_000 and max(behind) <= 240_000
    assert 10 < sum(b > GRACE_1M_MS for b in behind) < len(behind) / 2
    assert 2 <= sum(r["key"] is None for r in rows) == info["null_keys"] == NULL_KEYS <= 3
    assert min(r["timestamp"] for r in rows) >= START_MS == 1_704_067_200_000
    assert 3_000 < info["span_s"] < 5_000  # about an hour of event time


@pytest.mark.spark
@pytest.mark.slow
def test_backfill_demo_end_to_end(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "160"}  # wide: no wrapped paths in the output
    done = subprocess.run([sys.executable, "-m", "backfill.cli", "demo"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    text = done.stdout
    assert "generated 20,000 clicks" in done.stderr
    assert "What was dropped, and why" in text and "late examples, clicks_per_user_1m" in text
    assert "late examples, clicks_per_user_5m_hop" in text and "null_key" in text
    assert "demo-output/data/gold/" in text and "demo-output/data/ledger/clicks" in text
    work = tmp_path / "demo-output"
    # the join example is installed next to it, with the verify command that explains its simulated stream
    assert "backfill verify demo-output/jobs/clicks_impressions.yaml --run" in text
    assert (work / "jobs/samples/click_attribution_stream.jsonl").is_file() and (work / "schemas/ad_click.json").is_file()
    ledger = DeltaTable(str(work / "data/ledger/clicks")).to_pyarrow_table().to_pylist()
    assert "late examples, user_sessions (session gap 30s, grace 10s)" in text
    grace = {"clicks_per_user_1m": 10_000, "clicks_per_user_5m_hop": 30_000}
    late = [r for r in ledger if r["reason"] == "late"]
    assert {r["operator"] for r in late} == {*grace, "user_sessions"}
    # every late drop was refused by a closed window (docs/semantics.md §4.2), or a closed session (§11.2: the merged
    # session it would have made ends before stream time - gap - grace)
    assert all(r["stream_time"] >= r["window_end"] + grace[r["operator"]] for r in late if r["operator"] in grace)
    assert all(r["window_end"] < r["stream_time"] - 30_000 - 10_000 for r in late if r["operator"] == "user_sessions")
    assert sum(r["reason"] == "null_key" for r in ledger) == 3 * NULL_KEYS
    for name in (*grace, "user_sessions"):
        assert DeltaTable(str(work / "data/gold" / name)).to_pyarrow_table().num_rows > 0
    # and no record that should count was dropped: replay each partition in offset order (one source, so a
    # task's order is its offset order), keep a record in its minute while end + grace > stream time
    records = sorted(DeltaTable(str(work / "data/bronze/clicks")).to_pyarrow_table().to_pylist(),
                     key=lambda r: (r["partition"], r["offset"]))
    counts: dict[tuple[str, int], int] = {}
    stream_time: dict[int, int] = {}
    for r in records:
        if r["key"] is None:
            continue
        st = stream_time[r["partition"]] = max(stream_time.get(r["partition"], -1), r["timestamp"])
        start = r["timestamp"] // 60_000 * 60_000
        if start + 60_000 > st - 10_000:
            counts[(r["key"], start)] = counts.get((r["key"], start), 0) + 1
    final = {(r["key"], r["window_start"]): r["clicks"]
             for r in DeltaTable(str(work / "data/gold/clicks_per_user_1m")).to_pyarrow_table().to_pylist()}
    assert final and all(counts[k] == n for k, n in final.items())
    closed = {k for k in counts if k[1] + 70_000 <= stream_time[_partition_of(records, k[0])]}
    assert closed == set(final)  # every closed window is written, none of the open ones
    # the rules example: the live alerts re-derived (as the reference engine replays them), and a back-test
    assert "Rules:" in text and "Back-test: rule 1 at a limit of 800" in text and "backfill diff" in text
    from backfill.jobspec.load import load_job
    from backfill.reference.engine import run_reference

    ref = run_reference(load_job(work / "jobs" / "fraud_rules.yaml")).outputs["alerts"]
    alerts = DeltaTable(str(work / "data/gold/alerts")).to_pyarrow_table().to_pylist()
    assert 100 < len(alerts) == len(ref)
    assert sorted((r["emit_seq"], r["rule_id"], r["key"], r["value"], r["ts"]) for r in alerts) == \
        [(r["emit_seq"], r["rule_id"], r["key"], r["value"], r["ts"]) for r in ref]
    # the topology example (PageViewRegion): both engines give the same enriched views and region windows
    assert "A topology" in text and "backfill plan demo-output/jobs/pageviews_per_region.yaml" in text
    pageviews = run_reference(load_job(work / "jobs" / "pageviews_per_region.yaml")).outputs
    for name in ("enriched", "views_per_region"):
        lines = (work / "out/pageviews_per_region" / f"{name}.jsonl").read_text().splitlines()
        got = sorted(json.dumps(json.loads(line), sort_keys=True) for line in lines)
        assert len(got) > 1000 and got == sorted(json.dumps(r, sort_keys=True) for r in pageviews[name])
    backtest = DeltaTable(str(work / "data/gold/alerts_backtest")).to_pyarrow_table().num_rows
    assert backtest > len(alerts)  # a lower limit alerts more
    # the back-test as the demo tells a user to compare it: more and fewer alerts, and changed values
    done = subprocess.run([sys.executable, "-m", "backfill.cli", "diff", str(work / "data/gold/alerts"),
                           str(work / "data/gold/alerts_backtest"), "--on", "rule_id,transaction", "--columns", "value",
                           "--json", "--report", str(tmp_path / "diff")], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 1, done.stderr[-2000:]  # differences
    counts = json.loads(done.stdout)["counts"]
    assert counts["extra_in_new"] > 0 and counts["match"] > 0
    assert counts["match"] + counts["mismatch"] + counts["missing_in_new"] == len(alerts)
    assert counts["match"] + counts["mismatch"] + counts["extra_in_new"] == backtest


def _partition_of(records: list[dict[str, Any]], key: str) -> int:
    return next(r["partition"] for r in records if r["key"] == key)
