"""Scheduled runs (`--due`) from a Kafka topic: readiness from the partitions' newest records, and the
intervals published one by one equal one run over the whole range (a real broker on 127.0.0.1)."""
from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from typer.testing import CliRunner

from backfill.cli import app
from backfill.io.kafka import create_topic, produce

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.slow]
T0, H, M = 1_704_067_200_000, 3_600_000, 60_000


def _clicks(first: int, last: int) -> list[dict[str, Any]]:
    """A click a minute per partition, partition 1 ten seconds behind partition 0; keys live in one partition."""
    return [{"partition": p, "key": f"u{p}{(t // M) % 3}", "value": json.dumps({"amount": (t // M) % 7}),
             "timestamp": t + 10_000 * p} for t in range(first, last, M) for p in (0, 1)]


def _job(tmp: Path, bootstrap: str, topic: str, name: str, schedule: bool) -> Path:
    job = tmp / f"{name}.yaml"
    job.write_text(f"""
name: {name}
{"schedule: {interval: 1h, lag: 5m, start: '2024-01-01T00:00:00Z'}" if schedule else ""}
sources:
  clicks: {{format: kafka, kafka: {{bootstrap: "{bootstrap}", topic: {topic}}}, value: {{format: json}}}}
operators:
  - name: per_user
    aggregate:
      input: clicks
      window: {{type: tumbling, size: 10m, grace: 1m}}
      aggregations: {{n: count(), amount: sum(value.amount)}}
      emit: final
sinks:
  per_user: {{format: delta, path: out-{name}/per_user}}
  _ledger: {{format: delta, path: out-{name}/ledger}}
""")
    return job


def _cli(*args: str) -> Any:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.stdout + result.stderr
    return result


def _rows(path: Path) -> list[tuple]:
    rows = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    return sorted((r["key"], r["window_start"], r["n"], r["amount"]) for r in rows)


def test_due_intervals_from_a_topic_wait_for_every_partition(tmp_path, kafka_broker, spark):
    topic = f"s{uuid.uuid4().hex[:8]}"
    create_topic(kafka_broker.bootstrap, topic, 2)
    produce(kafka_broker.bootstrap, topic, _clicks(T0, T0 + 2 * H + 50 * M))
    job = _job(tmp_path, kafka_broker.bootstrap, topic, "sched", schedule=True)
    until = str(T0 + 3 * H)
    first = json.loads(_cli("run", str(job), "--due", "--until", until, "--json").stdout)
    assert [p["start"] for p in first["intervals"]] == [T0, T0 + H]
    waiting = first["decision"]["waiting"][0]
    assert waiting["interval"] == [T0 + 2 * H, T0 + 3 * H]
    assert "must reach 2024-01-01T03:05:00Z" in waiting["reason"] and "partition 0 reaches 2024-01-01T02:49:00Z" \
        in waiting["reason"]
    produce(kafka_broker.bootstrap, topic, _clicks(T0 + 2 * H + 50 * M, T0 + 3 * H + 10 * M))
    second = json.loads(_cli("run", str(job), "--due", "--until", until, "--json").stdout)
    assert [p["start"] for p in second["intervals"]] == [T0 + 2 * H]
    assert second["intervals"][0]["records_in"] > 100

    whole = _job(tmp_path, kafka_broker.bootstrap, topic, "whole", schedule=False)
    _cli("run", str(whole), "--start", str(T0), "--end", until, "--json")
    got = _rows(tmp_path / "out-sched" / "per_user")
    assert got == _rows(tmp_path / "out-whole" / "per_user") and len(got) > 30
