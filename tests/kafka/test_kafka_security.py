"""Kafka security (`kafka.security`): SASL PLAIN/SCRAM and TLS for every client of a run, secrets only by
reference, never written anywhere."""
from __future__ import annotations

import json
import os
import struct
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from backfill.cli import app
from backfill.io.kafka import create_topic, produce
from tests.conftest import read_jsonl

pytestmark = [pytest.mark.kafka, pytest.mark.spark]
BASE = 1_700_000_040_000


def _topic(broker, n: int = 30) -> str:
    topic = f"sec{uuid.uuid4().hex[:6]}"
    create_topic(broker.bootstrap, topic, 1)  # set up over the plaintext listener; the job reads over the secure one
    produce(broker.bootstrap, topic, [{"partition": 0, "key": f"u{i % 2}", "value": {"amount": i},
                                       "timestamp": BASE + 7_000 * i} for i in range(n)])
    return topic


def _job(tmp_path: Path, bootstrap: str, topic: str, security: str, name: str = "sec") -> Path:
    job = tmp_path / f"{name}.yaml"
    job.write_text(f"""
name: {name}
sources:
  s: {{format: kafka, kafka: {{bootstrap: '{bootstrap}', topic: {topic}, security: {security}}},
      key: {{format: string}}, value: {{format: json}}}}
operators:
  - name: c
    aggregate: {{input: s, window: {{type: tumbling, size: 1m, grace: 0ms}}, emit: final,
                aggregations: {{n: count(), amount: sum(value.amount)}}}}
sinks:
  c: {{format: jsonl, path: out-{name}/c.jsonl}}
  _ledger: {{format: jsonl, path: out-{name}/ledger.jsonl}}
""")
    return job


def _files_text(*folders: Path) -> str:
    text = []
    for folder in folders:
        for path in folder.rglob("*") if folder.is_dir() else [folder]:
            if path.is_file():
                text.append(path.read_bytes().decode(errors="replace"))
    return "\n".join(text)


@pytest.mark.slow
def test_sasl_scram_over_tls_for_run_archive_and_verify_with_the_secret_nowhere(tmp_path, secure_kafka_broker,
                                                                                spark, monkeypatch):
    broker = secure_kafka_broker
    topic = _topic(broker)
    user, password = broker.users["SCRAM-SHA-512"]
    monkeypatch.setenv("TEST_KAFKA_PASSWORD", password)
    security = (f"{{protocol: SASL_SSL, mechanism: SCRAM-SHA-512, username: {user}, "
                f"password: '${{env:TEST_KAFKA_PASSWORD}}', ca_file: '{broker.ca_file}'}}")
    bootstrap = broker.listeners["SASL_SSL"]
    job = _job(tmp_path, bootstrap, topic, security)
    ran = CliRunner().invoke(app, ["run", str(job), "--json"])
    assert ran.exit_code == 0, ran.stderr
    rows = read_jsonl(tmp_path / "out-sec/c.jsonl")
    assert sum(r["n"] for r in rows) == 26  # the last minute (4 records) is still open
    # archive over SASL PLAIN (no TLS), the password in a file
    plain_user, plain_password = broker.users["PLAIN"]
    (tmp_path / "pw.txt").write_text(plain_password + "\n")
    (tmp_path / "security.yaml").write_text(f"{{protocol: SASL_PLAINTEXT, mechanism: PLAIN, username: {plain_user}, "
                                       "password: '${file:pw.txt}'}")
    archived = CliRunner().invoke(app, ["archive", "--bootstrap", broker.listeners["SASL_PLAINTEXT"], "--topic", topic,
                                        "--to", str(tmp_path / "archive"), "--security", str(tmp_path / "security.yaml"),
                                        "--json"])
    assert archived.exit_code == 0, archived.stderr
    assert json.loads(archived.stdout)["records"] == 30
    # verify reads the output topic with the settings of the job's sources on that cluster
    out_topic = f"out{uuid.uuid4().hex[:6]}"
    create_topic(broker.bootstrap, out_topic, 1)
    produce(broker.bootstrap, out_topic, [{"partition": 0, "key": r["key"].encode() + struct.pack(">q", r["window_start"]),
                                           "value": {"n": r["n"], "amount": r["amount"]}, "timestamp": r["ts"]}
                                          for r in rows])
    verified = CliRunner().invoke(app, ["verify", str(job), "--against", f"c=kafka://{bootstrap}/{out_topic}",
                                        "--json", "--report", str(tmp_path / "report")])
    assert verified.exit_code == 0, verified.stderr
    assert json.loads(verified.stdout)["verdict"] == "match"
    # no secret in any output, ledger, manifest, report, archive log, message, or the Spark log
    spark_log = Path(f"/tmp/backfill-{os.getuid()}/spark.log")
    written = _files_text(tmp_path / "out-sec", tmp_path / ".backfill", tmp_path / "report", tmp_path / "archive",
                          *([spark_log] if spark_log.exists() else []))
    said = "\n".join(r.stdout + r.stderr for r in (ran, archived, verified))
    for secret in (password, plain_password):
        assert secret not in written and secret not in said


def test_a_wrong_password_is_one_line_exit_2(tmp_path, secure_kafka_broker, monkeypatch):
    broker = secure_kafka_broker
    topic = _topic(broker, 3)
    user, _ = broker.users["SCRAM-SHA-256"]
    monkeypatch.setenv("TEST_KAFKA_PASSWORD", "not-the-password")
    job = _job(tmp_path, broker.listeners["SASL_PLAINTEXT"], topic,
               f"{{protocol: SASL_PLAINTEXT, mechanism: SCRAM-SHA-256, username: {user}, "
               "password: '${env:TEST_KAFKA_PASSWORD}'}")
    result = CliRunner().invoke(app, ["run", str(job), "--json"])
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "sources.s.kafka.security: the broker at" in result.stderr and "Authentication failed" in result.stderr
    assert "not-the-password" not in result.stderr and not (tmp_path / "out-sec" / "c.jsonl").exists()


@pytest.mark.parametrize("security, message", [
    ("{protocol: SASL_SSL, mechanism: PLAIN, username: u, password: hunter2}", "a secret in a job file is refused"),
    ("{protocol: SASL_SSL, mechanism: PLAIN, username: u}", "password: is required with protocol: SASL_SSL"),
    ("{protocol: PLAINTEXT, ca_file: ca.pem}", "ca_file: is for TLS"),
    ("{protocol: SSL, mechanism: PLAIN}", "mechanism, username and password are for SASL"),
])
def test_bad_security_settings_are_refused_with_one_line(tmp_path, security, message):
    job = _job(tmp_path, "127.0.0.1:1", "t", security)
    result = CliRunner().invoke(app, ["plan", str(job)])
    assert result.exit_code == 2 and message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert "hunter2" not in result.stderr


def test_an_unset_environment_variable_is_named_not_guessed(tmp_path, monkeypatch):
    monkeypatch.delenv("NO_SUCH_KAFKA_PASSWORD", raising=False)
    job = _job(tmp_path, "127.0.0.1:1", "t", "{protocol: SASL_PLAINTEXT, mechanism: PLAIN, username: u, "
               "password: '${env:NO_SUCH_KAFKA_PASSWORD}'}")
    result = CliRunner().invoke(app, ["run", str(job), "--json"])
    assert result.exit_code == 2 and "the environment variable NO_SUCH_KAFKA_PASSWORD is not set" in result.stderr
