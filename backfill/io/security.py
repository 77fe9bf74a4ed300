"""Part: io. Kafka security: one `kafka.security` block as the settings of every client of a run.

librdkafka (confluent-kafka: the planner's admin and consumer calls, `archive`, scheduled readiness, `verify
kafka://`) and Spark's Kafka source (its `kafka.`-prefixed consumer settings) get the same protocol, SASL
mechanism and credentials, and the same CA file (PEM). Secrets are read when a client is made, from the
environment (`${env:NAME}`) or a file (`${file:PATH}`), and are never printed: an error names the variable or
the file, never its content; the run manifest records the source's `location`, never its settings.
"""
from __future__ import annotations

import os
from typing import Any

from backfill.errors import SourceError
from backfill.jobspec.models import SECRET_REF, SecuritySpec

_LOGIN = {"PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
          "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
          "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule"}


def reveal(text: str, where: str) -> str:
    """The value of `${env:NAME}` / `${file:PATH}` (text that is neither is returned as it is)."""
    match = SECRET_REF.match(text)
    if match is None:
        return text
    kind, ref = match[1], match[2]
    if kind == "env":
        if ref not in os.environ:
            raise SourceError(f"{where}: the environment variable {ref} is not set")
        return os.environ[ref]
    try:
        with open(ref) as fh:
            return fh.read().strip()
    except OSError as exc:
        raise SourceError(f"{where}: cannot read {ref} ({exc.strerror})") from None


def _checked_ca(sec: SecuritySpec, where: str) -> str | None:
    if sec.ca_file is not None and not os.path.isfile(sec.ca_file):
        raise SourceError(f"{where}.ca_file: {sec.ca_file} does not exist (a PEM file of CA certificates)")
    return sec.ca_file


def librdkafka(sec: SecuritySpec | None, where: str = "kafka.security") -> dict[str, Any]:
    """confluent-kafka settings for `sec` (none: plaintext)."""
    if sec is None:
        return {}
    out: dict[str, Any] = {"security.protocol": sec.protocol}
    if sec.mechanism is not None:
        out["sasl.mechanism"] = sec.mechanism
        out["sasl.username"] = reveal(sec.username or "", f"{where}.username")
        out["sasl.password"] = reveal(sec.password or "", f"{where}.password")
    ca = _checked_ca(sec, where)
    if ca is not None:
        out["ssl.ca.location"] = ca
    return out


def spark_options(sec: SecuritySpec | None, where: str = "kafka.security") -> dict[str, str]:
    """Spark Kafka source options for `sec`: `kafka.security.protocol`, `kafka.sasl.*`, `kafka.ssl.*`."""
    if sec is None:
        return {}
    out = {"kafka.security.protocol": sec.protocol}
    if sec.mechanism is not None:
        user = reveal(sec.username or "", f"{where}.username").replace("\\", "\\\\").replace('"', '\\"')
        password = reveal(sec.password or "", f"{where}.password").replace("\\", "\\\\").replace('"', '\\"')
        out["kafka.sasl.mechanism"] = sec.mechanism
        out["kafka.sasl.jaas.config"] = f'{_LOGIN[sec.mechanism]} required username="{user}" password="{password}";'
    ca = _checked_ca(sec, where)
    if ca is not None:
        out["kafka.ssl.truststore.type"] = "PEM"
        out["kafka.ssl.truststore.location"] = ca
    return out
