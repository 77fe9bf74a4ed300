"""`backfill demo --kafka --avro`: the demo through a secured cluster (SASL_SSL, SCRAM) with Avro clicks in two
schema versions through a schema registry, run as a user runs it."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.slow]


def test_the_secured_avro_demo_gives_identical_outputs_from_the_topic_and_its_archive(tmp_path):
    done = subprocess.run([sys.executable, "-m", "backfill.cli", "demo", "--kafka", "--avro", "--json"], cwd=tmp_path,
                          env={**os.environ}, capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    report = json.loads(done.stdout)
    assert report["identical"] and all(report["identical"].values())
    assert report["archive"]["records"] == 20_000
    jobs = (tmp_path / "demo-output" / "kafka" / "jobs" / "demo-topic.yaml").read_text()
    assert "SASL_SSL" in jobs and "${env:BACKFILL_DEMO_KAFKA_PASSWORD}" in jobs and "format: avro" in jobs


def test_avro_without_kafka_is_refused_with_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "backfill.cli", "demo", "--avro"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "--avro: the Avro variant runs through Kafka; add --kafka" in done.stderr
