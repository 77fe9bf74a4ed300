"""`backfill --version`, `backfill doctor` and `backfill jars`: what is installed, one line per check with what to do."""
from __future__ import annotations

import json
import re
import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from backfill.cli import app
from backfill.doctor import _registries, _registry
from backfill.resources import SPARK_PACKAGES

REPO = Path(__file__).resolve().parents[1]

KAFKA_JOB = """
name: doctor
sources:
  clicks: {{format: kafka, kafka: {{bootstrap: "127.0.0.1:{port}", topic: clicks}}}}
operators:
  - name: agg
    aggregate: {{input: clicks, window: {{type: tumbling, size: 10s, grace: 0ms}}, aggregations: {{n: count()}}}}
sinks:
  agg: {{format: jsonl, path: out/agg.jsonl}}
  _ledger: {{format: jsonl, path: out/ledger.jsonl}}
"""


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_version_names_the_package_spark_delta_and_the_kafka_streams_profiles():
    import pyspark

    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("backfill 0.1.0")
    assert f"pyspark {pyspark.__version__}" in result.stdout
    assert "delta-spark 4.3.1" in result.stdout and SPARK_PACKAGES[0] in result.stdout
    assert re.search(r"Kafka Streams profiles 3\.4 to 4\.4 \(default 4\.4; judged with .*3\.4\.1.*4\.4\.0", result.stdout)


def test_the_coordinates_a_wheel_resolves_are_the_pins_of_jvm_pom():
    """One pin, two readers: setup resolves jvm/pom.xml with Maven, an installed wheel the same coordinates with
    Spark's Ivy; they must not drift apart."""
    pom = (REPO / "jvm" / "pom.xml").read_text()
    prop = {k: v for k, v in re.findall(r"<([\w.]+)>([^<]+)</\1>", pom)}
    expected = (f"io.delta:delta-spark_{prop['spark.line']}_{prop['scala.binary']}:{prop['delta.version']}",
                f"org.apache.spark:spark-sql-kafka-0-10_{prop['scala.binary']}:{prop['spark.version']}")
    assert SPARK_PACKAGES == expected


def test_doctor_without_spark_checks_java_maven_and_jars_and_names_an_unreachable_broker(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(KAFKA_JOB.format(port=_closed_port()))
    result = CliRunner().invoke(app, ["doctor", str(job), "--no-spark", "--json"])
    assert result.exit_code == 2, result.output  # a source a run needs cannot be reached
    checks = {c["name"]: c for c in json.loads(result.stdout)}
    assert checks["java"]["status"] == "ok" and "version" in checks["java"]["detail"]
    assert checks["jars"]["status"] == "ok" and checks["operator jar"]["status"] == "ok"
    assert checks["job"]["status"] == "ok"
    broker = checks["sources.clicks"]
    assert broker["status"] == "fail" and "no Kafka broker listens at 127.0.0.1:" in broker["detail"]
    assert "kafka.bootstrap" in broker["fix"]
    assert "spark" not in checks  # --no-spark
    text = CliRunner().invoke(app, ["doctor", str(job), "--no-spark"])
    failed = [line for line in text.stdout.splitlines() if line.startswith("fail")]
    assert len(failed) == 1 and "sources.clicks" in failed[0] and " -> " in failed[0]  # one line, what to do


@pytest.mark.kafka
def test_doctor_says_how_many_partitions_a_reachable_topic_has(tmp_path, kafka_broker):
    from backfill.io.kafka import create_topic

    create_topic(kafka_broker.bootstrap, "doctor-clicks", 3)
    job = tmp_path / "job.yaml"
    job.write_text(KAFKA_JOB.format(port=kafka_broker.bootstrap.rsplit(":", 1)[1]).replace("topic: clicks",
                                                                                           "topic: doctor-clicks"))
    result = CliRunner().invoke(app, ["doctor", str(job), "--no-spark", "--json"])
    assert result.exit_code == 0, result.output
    broker = next(c for c in json.loads(result.stdout) if c["name"] == "sources.clicks")
    assert broker["status"] == "ok" and "topic doctor-clicks has 3 partitions" in broker["detail"]


def test_a_schema_registry_that_does_not_answer_fails_without_showing_its_credentials():
    port = _closed_port()
    check = _registry("sources.clicks.value.registry", f"http://ci-user:s3cret@127.0.0.1:{port}")
    assert check.status == "fail" and f"127.0.0.1:{port}" in check.detail
    assert "s3cret" not in check.line() and "ci-user" not in check.line()
    found = _registries({"clicks": {"value": {"format": "avro", "registry": {"url": "http://r:8081"}}}}, "sources")
    assert found == [("sources.clicks.value.registry", "http://r:8081")]


@pytest.mark.spark
def test_doctor_uses_the_session_a_command_would_use(spark):
    result = CliRunner().invoke(app, ["doctor", "--json"])
    assert result.exit_code == 0, result.output
    checks = {c["name"]: c for c in json.loads(result.stdout)}
    assert checks["spark"]["status"] == "ok" and "Spark 4.1.1" in checks["spark"]["detail"]
    assert checks["delta"]["status"] == checks["delta table"]["status"] == checks["operator"]["status"] == "ok"


def test_jars_lists_what_a_session_of_ones_own_loads():
    result = CliRunner().invoke(app, ["jars"])
    assert result.exit_code == 0, result.output
    jars = result.stdout.strip().split(",")
    assert all(Path(j).is_file() for j in jars)
    names = [Path(j).name for j in jars]
    assert any(n.startswith("delta-spark_4.1_2.13-4.3.1") for n in names)
    assert any(n.startswith("spark-sql-kafka-0-10_2.13-4.1.1") for n in names) and "backfill-ops.jar" in names
    coordinates = CliRunner().invoke(app, ["jars", "--packages"]).stdout.strip()
    assert coordinates == ",".join(SPARK_PACKAGES)
