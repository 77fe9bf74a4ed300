"""A whole application against the real thing: a live Kafka Streams application of the PageViewRegion shape (a
filter, a stream-table join with the users topic, a filter, a re-key by region through a repartition topic, a
hopping count; jvm/harness io.backfill.harness.LivePageViews) on the test broker, and the same topology as a
backfill job reading the same topics. What the real engine decides, the test checks: every view's region as the
table held it when the view was processed (the order of the two topics in each task), which views reached the
count, every window's last count; `verify` of the chain's last operator against the application's output topic
is a match.

The count's grace is a day in both, so no view is late and each window's last count does not depend on how the
repartition topic interleaved its two writers (its updates in between do, and verify compares the last).
"""
from __future__ import annotations

import json
import sys
import uuid
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from backfill.cli import app
from backfill.io.kafka import create_topic, produce
from tests.conftest import read_jsonl
from tests.kafka.test_live_rekey import _consume_all, _run_app

pytestmark = [pytest.mark.live, pytest.mark.kafka, pytest.mark.spark, pytest.mark.jvm, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]

def _job(folder: Path, bootstrap: str, pageviews: str, users: str) -> Path:
    """jobs/pageviews_per_region.yaml reading the two topics, its count's grace a day (as the application's),
    its outputs under `folder`."""
    spec = yaml.safe_load((ROOT / "jobs" / "pageviews_per_region.yaml").read_text())
    for name, topic in (("pageviews", pageviews), ("users", users)):
        source = spec["sources"][name]
        spec["sources"][name] = {"format": "kafka", "kafka": {"bootstrap": bootstrap, "topic": topic},
                                 "key": source["key"], "value": source["value"]}
    [count] = [op for op in spec["operators"] if op["name"] == "views_per_region"]
    count["aggregate"]["window"]["grace"] = "1d"
    # no file name starts with "_": Spark's file listing skips such files as hidden
    spec["sinks"] = {name: {"format": "jsonl", "path": str(folder / "out" / f"{name.lstrip('_')}.jsonl")}
                     for name in ("enriched", "views_per_region", "_ledger", "_runs")}
    job = folder / "job.yaml"
    job.write_text(yaml.safe_dump(spec, sort_keys=False))
    return job


def _sample() -> dict[str, list[dict[str, Any]]]:
    """The bundled sample's events for 5 minutes of views (scripts/pageview_sample.py: late registrations,
    moves, a tombstone, beacons, late views), per topic in arrival order, keyed by user in 2 partitions."""
    import random

    sys.path.insert(0, str(ROOT / "scripts"))
    from pageview_sample import _events

    out: dict[str, list[dict[str, Any]]] = {"pageviews": [], "users": []}
    for _, topic, key, value, ts in sorted(_events(random.Random(5), 5), key=lambda e: (e[0], e[1])):
        out[topic].append({"partition": zlib.crc32(key.encode()) % 2, "key": key,
                           "value": None if value is None else json.dumps(value), "timestamp": ts})
    return out


def test_a_live_pageview_region_application_equals_the_backfill_and_verify_says_match(
        kafka_broker: Any, spark: Any, tmp_path: Path) -> None:
    bootstrap = kafka_broker.bootstrap
    tag = uuid.uuid4().hex[:8]
    pageviews, users, sink, app_id = f"pageviews-{tag}", f"users-{tag}", f"views-{tag}", f"pvr-{tag}"
    for topic in (pageviews, users, sink):
        create_topic(bootstrap, topic, 2)
    sample = _sample()
    assert sum(1 for r in sample["users"] if r["value"] is None) == 1  # the tombstone is there
    produce(bootstrap, pageviews, sample["pageviews"])
    produce(bootstrap, users, sample["users"])
    _run_app(bootstrap, app_id, pageviews, sink, tmp_path, main="LivePageViews", inputs=(users,))

    job = _job(tmp_path, bootstrap, pageviews, users)
    ran = CliRunner().invoke(app, ["run", str(job), "--json"])
    assert ran.exit_code == 0, ran.stderr
    enriched = read_jsonl(tmp_path / "out" / "enriched.jsonl")
    ours = read_jsonl(tmp_path / "out" / "views_per_region.jsonl")
    unknown = sum(1 for r in enriched if r["value"]["region"] is None)
    assert unknown > 0 and len(enriched) - unknown > 200  # views before a registration find no region

    # the views that reached the count, each with the region the table gave it, as the repartition topic
    # received them (key: the region, timestamp: the view's)
    written = _consume_all(bootstrap, f"{app_id}-by-region-repartition", 2)
    assert Counter((r["key"], r["timestamp"]) for r in written) == Counter(
        (r["value"]["region"], r["ts"]) for r in enriched if r["value"]["region"] is not None)
    # every window's last count (the update before it is interleaving)
    def last(rows: list[tuple[str, int, int]]) -> dict[tuple[str, int], int]:
        out: dict[tuple[str, int], int] = {}
        for region, start, n in rows:
            out[(region, start)] = max(out.get((region, start), 0), n)
        return out

    emitted = _consume_all(bootstrap, sink, 2)
    theirs = last([(r["key_bytes"][:-8].decode(), int.from_bytes(r["key_bytes"][-8:], "big"),
                    json.loads(r["value"])["views"]) for r in emitted])
    assert last([(r["key"], r["window_start"], r["views"]) for r in ours]) == theirs and len(theirs) > 20

    # verify: the chain's last operator against the application's output topic
    checked = CliRunner().invoke(app, ["verify", str(job), "--json", "--against",
                                       f"views_per_region=kafka://{bootstrap}/{sink}", "--report",
                                       str(tmp_path / "report")])
    assert checked.exit_code == 0, checked.stdout + checked.stderr
    verdict = json.loads(checked.stdout)
    [section] = verdict["sections"]
    assert section["counts"]["match"] == len(theirs) and sum(section["counts"].values()) == len(theirs), section
    assert verdict["verdict"] == "match", verdict["verdict"]
    print(json.dumps({"views": len(sample["pageviews"]), "enriched": len(enriched), "without_region": unknown,
                      "counted": len(written), "windows": len(theirs), "updates": len(emitted)}))
