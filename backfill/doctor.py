"""Part: commands. `backfill --version` and `backfill doctor`: what is installed, and whether a job can run here.

Each doctor check is one line: ok, warn (works, at a cost or without an optional part) or fail (a run cannot
work), and for warn and fail what to do. Nothing is changed, nothing is installed.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit


@dataclass(frozen=True)
class Check:
    """One line of the doctor's answer."""

    name: str
    status: str  # ok | warn | fail
    detail: str
    fix: str = ""

    def line(self) -> str:
        return f"{self.status:<5} {self.name:<18} {self.detail}" + (f" -> {self.fix}" if self.fix else "")

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def versions() -> list[str]:
    """`backfill --version`: the package, Python, Spark, Delta and the Kafka Streams profiles."""
    import platform

    import pyspark

    from backfill.io.runs import code_version
    from backfill.jobspec.versions import CURRENT, EARLIEST, MEASURED
    from backfill.resources import DELTA_VERSION, SPARK_PACKAGES

    try:
        from importlib.metadata import version

        delta = version("delta-spark")
    except Exception:  # noqa: BLE001 - not installed
        delta = "not installed"
    return [f"backfill {code_version()}",
            f"python {platform.python_version()}",
            f"pyspark {pyspark.__version__} (Spark {pyspark.__version__}, Scala 2.13)",
            f"delta-spark {delta} (jar {SPARK_PACKAGES[0]}; Delta {DELTA_VERSION})",
            f"spark-sql-kafka {SPARK_PACKAGES[1].rsplit(':', 1)[1]} ({SPARK_PACKAGES[1]})",
            f"Kafka Streams profiles {EARLIEST[0]}.{EARLIEST[1]} to {CURRENT} (default {CURRENT}; judged with "
            f"{', '.join(MEASURED)})"]


# ----------------------------------------------------------------------------- the checks


def java() -> Check:
    """The JVM Spark starts: JAVA_HOME's, else the first on PATH; Spark 4 needs 17 or newer."""
    home = os.environ.get("JAVA_HOME")
    binary = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    install = "install Java 17 (e.g. apt-get install openjdk-17-jdk-headless) or set JAVA_HOME"
    if not binary or not Path(binary).is_file():
        return Check("java", "fail", f"no java{' in JAVA_HOME=' + home if home else ' on PATH'}", install)
    try:
        text = subprocess.run([binary, "-version"], capture_output=True, text=True, timeout=30).stderr
    except (OSError, subprocess.SubprocessError) as exc:
        return Check("java", "fail", f"{binary} does not run ({exc})", install)
    found = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    major = int(found.group(1)) if found else 0
    major = int(found.group(2) or 0) if major == 1 and found else major  # "1.8.0" is Java 8
    first = text.strip().splitlines()[0] if text.strip() else "?"
    if major < 17:
        return Check("java", "fail", f"{first} at {binary}: Spark 4 needs 17 or newer", install)
    return Check("java", "ok", f"{first} at {binary}")


def maven() -> Check:
    """Maven resolves the pinned jars in a checkout (scripts/setup.sh); an installed wheel does without it."""
    from backfill.resources import checkout

    found = shutil.which("mvn")
    if found is None:
        if checkout() is None:
            return Check("maven", "ok", "not found; not needed here (`backfill setup-jars` resolves the jars)")
        return Check("maven", "warn", "not found: scripts/setup.sh resolves the pinned jars with it",
                     "install it (e.g. apt-get install maven), or use `backfill setup-jars`")
    try:
        first = subprocess.run([found, "-v"], capture_output=True, text=True, timeout=60).stdout.splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        first = "found"
    plain = re.sub(r"\x1b\[[0-9;]*m", "", first)  # Maven colours its banner
    return Check("maven", "ok", f"{plain} at {found}")


def jars() -> list[Check]:
    """The jars a session loads (Delta, Spark's Kafka source, backfill's operators) and the harnesses'."""
    from backfill import session
    from backfill.resources import checkout, jvm_file, jvm_lib

    out = []
    names = [p.name for p in session.JARS_DIR.glob("*.jar")] if session.JARS_DIR.is_dir() else []
    wanted = ("delta-spark_", "spark-sql-kafka-")
    missing = [w.rstrip("_-") for w in wanted if not any(n.startswith(w) for n in names)]
    if not missing:
        out.append(Check("jars", "ok", f"{len(names)} pinned jars in {session.JARS_DIR}"))
    elif checkout() is not None:
        out.append(Check("jars", "fail", f"{', '.join(missing)} missing in {session.JARS_DIR}", "run scripts/setup.sh"))
    else:
        out.append(Check("jars", "warn", f"{', '.join(missing)} not in {session.JARS_DIR}: each session start resolves "
                         "them through spark.jars.packages", "run `backfill setup-jars` once"))
    ops = session.OPS_JAR
    out.append(Check("operator jar", "ok", str(ops)) if ops.is_file() else
               Check("operator jar", "warn", f"{ops} missing: ordering uses Spark's windows (jar-less plan)",
                     "run scripts/setup.sh (it compiles jvm/ops)"))
    lib = jvm_lib()
    streams = sorted(p.name.removeprefix("kafka-streams-") for p in lib.glob("kafka-streams-*") if any(p.glob("*.jar")))
    harness = jvm_file("harness/backfill-harness.jar")
    if streams and harness.is_file():
        out.append(Check("kafka streams", "ok", f"harness and Kafka Streams {', '.join(streams)} (conformance)"))
    else:
        out.append(Check("kafka streams", "warn", "the conformance harness or its Kafka Streams jars are missing: "
                         "`backfill conformance` cannot run", "run scripts/setup.sh in a checkout"))
    flink = jvm_file("flink-harness/backfill-flink-harness.jar")
    out.append(Check("flink", "ok", "harness and Flink jars (conformance --operator rules)")
               if flink.is_file() and any(lib.glob("flink-*/*.jar")) else
               Check("flink", "warn", "the Flink harness is missing: `conformance --operator rules` cannot run",
                     "run scripts/setup.sh in a checkout"))
    broker = any((lib / "kafka").glob("*.jar")) if (lib / "kafka").is_dir() else False
    out.append(Check("kafka broker", "ok", "jars for `demo --kafka` and the tests' broker") if broker else
               Check("kafka broker", "warn", "no broker jars: `backfill demo --kafka` cannot start one",
                     "run scripts/setup.sh in a checkout, or give a job your own broker"))
    return out


def spark_session(profile: str | None) -> list[Check]:
    """Start the session a command would use (the profile's, --remote, the resident engine) and use it once."""
    from backfill import session

    began = time.time()
    try:
        spark = session.get_spark(profile)
        spark.range(3).count()
    except Exception as exc:  # noqa: BLE001 - reported as one line
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        return [Check("spark", "fail", f"no session: {first}", "check java, the jars and the profile (conf/)")]
    kind = f"Spark Connect {session.remote_url(profile, say=lambda _: None)}" if session.is_connect(spark) else \
        f"master {spark.conf.get('spark.master', None) or '?'}"
    out = [Check("spark", "ok", f"Spark {spark.version}, {kind}, up in {time.time() - began:.1f} s")]
    try:
        session.check_session(spark)
        out.append(Check("delta", "ok", "Delta reads and writes; session time zone UTC"))
    except Exception as exc:  # noqa: BLE001 - SessionError: its one line says what to do
        out.append(Check("delta", "fail", str(exc)))
    if not session.is_connect(spark):
        out.append(_delta_round_trip(spark))
    note = session.operator_note(spark)
    out.append(Check("operator", "warn", note, "scripts/setup.sh builds it; over Spark Connect it cannot be reached")
               if note else Check("operator", "ok", "backfill's ordering operator is loaded (jvm/ops)"))
    return out


def _delta_round_trip(spark: Any) -> Check:
    with tempfile.TemporaryDirectory(prefix="backfill-doctor-") as folder:
        try:
            spark.range(3).write.format("delta").save(folder + "/t")
            n = spark.read.format("delta").load(folder + "/t").count()
        except Exception as exc:  # noqa: BLE001
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
            return Check("delta table", "fail", f"a Delta write and read failed: {first}", "check the Delta jars")
    return Check("delta table", "ok" if n == 3 else "fail", f"wrote and read a Delta table ({n} rows)")


def job_checks(path: Path) -> list[Check]:
    """A job's file, its local inputs, and its brokers' and schema registries' reachability."""
    import yaml

    from backfill.errors import BackfillError
    from backfill.jobspec.load import load_job

    try:
        job = load_job(path)
    except BackfillError as exc:
        return [Check("job", "fail", str(exc))]
    out = [Check("job", "ok", f"{job.spec.name} ({path}): {len(job.spec.sources)} sources, "
                 f"{len(job.spec.operators)} operators")]
    for name, source in job.spec.sources.items():
        where = f"sources.{name}"
        if source.format == "kafka" and source.kafka is not None:
            out.append(_broker(where, source.kafka.bootstrap, source.kafka.topic))
        elif source.path and "://" not in source.path and not Path(job.resolve(source.path)).exists():
            out.append(Check(where, "fail", f"{job.resolve(source.path)} does not exist", "check its path"))
    raw = yaml.safe_load(Path(path).read_text()) or {}
    for where, url in _registries(raw.get("sources") or {}, "sources"):
        out.append(_registry(where, url))
    return out


def _broker(where: str, bootstrap: str, topic: str) -> Check:
    """The topic's partitions from the broker; a bootstrap address nobody listens on fails at once."""
    import socket

    from backfill.io.kafka import partitions

    began = time.time()
    refused = []
    for server in bootstrap.split(","):
        host, _, port = server.strip().rpartition(":")
        try:
            socket.create_connection((host.strip("[]") or "localhost", int(port)), timeout=5).close()
            break
        except (OSError, ValueError) as exc:
            refused.append(f"{server.strip()}: {getattr(exc, 'strerror', None) or exc}")
    else:
        return Check(where, "fail", f"no Kafka broker listens at {bootstrap} ({'; '.join(refused)})",
                     "start the broker, or fix kafka.bootstrap")
    try:
        found = partitions(bootstrap, topic, where)
    except Exception as exc:  # noqa: BLE001 - SourceError: one line naming the field
        return Check(where, "fail", str(exc), "start the broker, or fix kafka.bootstrap / kafka.topic")
    return Check(where, "ok", f"broker {bootstrap} answered in {time.time() - began:.1f} s: topic {topic} has "
                 f"{len(found)} partitions")


def _registries(node: Any, where: str) -> list[tuple[str, str]]:
    """Every `registry: {url: ...}` under the job's sources (a key's or a value's format)."""
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "registry" and isinstance(value, dict) and isinstance(value.get("url"), str):
                found.append((f"{where}.registry", value["url"]))
            else:
                found += _registries(value, f"{where}.{key}")
    return found


def _registry(where: str, url: str) -> Check:
    """A schema registry answers GET /subjects (the Confluent REST API); credentials in the URL are never shown."""
    import urllib.error
    import urllib.request

    parts = urlsplit(url)
    shown = urlunsplit(parts._replace(netloc=parts.hostname + (f":{parts.port}" if parts.port else ""))) \
        if parts.hostname else url
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/subjects", timeout=5) as answer:
            status = answer.status
    except urllib.error.HTTPError as exc:  # it answered
        status = exc.code
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return Check(where, "fail", f"no schema registry answered at {shown} ({reason})",
                     "start it or fix registry.url (or give registry.schemas, a folder, to decode offline)")
    return Check(where, "ok" if status < 500 else "fail", f"schema registry {shown} answered HTTP {status}")


def diagnose(job: Path | None, profile: str | None, spark: bool = True) -> list[Check]:
    """Every check, in the order a person fixes them."""
    checks = [Check("backfill", "ok", versions()[0].split(" ", 1)[1] + f", python {sys.version.split()[0]}"),
              java(), maven(), *jars()]
    if spark and not any(c.status == "fail" for c in checks if c.name in ("java", "jars")):
        checks += spark_session(profile)
    if job is not None:
        checks += job_checks(job)
    return checks
