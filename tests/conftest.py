"""Shared fixtures: one SparkSession per test run (local[2], UTC, small shuffles), job-file helpers."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
# each test worker (and each `backfill` process a test starts) is one Spark driver: the local profile's 8g
# heap is for 10M-record runs; with two workers, a broker and Kafka Streams beside them, 8g each ran the
# 24 GiB machine out of memory
os.environ.setdefault("BACKFILL_SPARK_CONF", "spark.driver.memory=3g")
# the suite starts dozens of Spark drivers (its workers, and every `backfill` process a test runs): each maps
# the driver's class archive instead of loading Spark's classes one by one (docs/stack.md; the whole suite
# took 28:28 with it, 33:56 without, back to back). BACKFILL_CLASS_ARCHIVE=0 (or empty) turns it off.
os.environ.setdefault("BACKFILL_CLASS_ARCHIVE", "1")
# a test driver runs thousands of small queries, each with code of its own: with the JVM's default thresholds
# its compilers were busy for 282 s of the golden tests' 224 s on two workers (java.ci.totalTime; 115 s with
# these), much of it C2 compiling code that then ran a few times. C2 only for code run 100,000 times (C1
# compiles the rest, as before): tests/golden 223.8 -> 195.6 s, the property-test files 274.0 -> 252.4 s, back
# to back; the whole suite 3,041 -> 2,761 s of test time (benchmarks/README.md). Users' drivers keep the
# defaults; a `backfill` process a test starts on a small input stops at C1 anyway (session.py)
os.environ.setdefault("BACKFILL_JAVA_OPTIONS", "-XX:Tier4InvocationThreshold=100000 -XX:Tier4MinInvocationThreshold="
                      "40000 -XX:Tier4CompileThreshold=120000 -XX:Tier4BackEdgeThreshold=800000")

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"


def pytest_configure(config: pytest.Config) -> None:
    """Write the class archive once, before any driver starts (about a minute; later runs find it)."""
    from backfill.session import class_archive, use_class_archive

    # a worker: the controller has written it; BACKFILL_CLASS_ARCHIVE=0 or empty: no driver maps one
    if hasattr(config, "workerinput") or not use_class_archive(short=False):
        return

    archive = class_archive()
    if archive is None or archive.is_file():
        return
    import subprocess

    # its output would vanish into pytest's capture: a failure only means drivers start without the archive
    subprocess.run([sys.executable, str(REPO / "scripts" / "class_archive.py")], capture_output=True, timeout=600,
                   check=False)


_MEASURED = [line.split(None, 1) for line in (REPO / "tests" / "slow.txt").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
SLOW = [entry for _, entry in _MEASURED]
# seconds per test file, as measured: the longest files are handed out first
FILE_SECONDS: dict[str, float] = {}
for _secs, _entry in _MEASURED:
    FILE_SECONDS[_entry.split("::")[0]] = FILE_SECONDS.get(_entry.split("::")[0], 0.0) + float(_secs)


def _listed_slow(nodeid: str) -> bool:
    """tests/slow.txt names it: its id, or FILE::*[PARAMS] (any test of FILE with those parameters)."""
    for entry in SLOW:
        head, star, params = entry.partition("::*")
        if nodeid == entry or (star and nodeid.startswith(f"{head}::") and (
                nodeid.endswith(params) if params else not nodeid.endswith("]"))):
            return True
    return False


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests tests/slow.txt names (measured, scripts/slow_tests.py) are `slow`, as if marked in their file.

    Files then run longest first (their measured seconds; a file's tests keep their order): the workers take a
    file at a time (`--dist loadfile`), and a long file handed out last kept one worker busy alone."""
    for item in items:
        if _listed_slow(item.nodeid):
            item.add_marker(pytest.mark.slow)
    rank = {path: i for i, path in enumerate(dict.fromkeys(item.nodeid.split("::")[0] for item in items))}
    items.sort(key=lambda item: (-FILE_SECONDS.get(item.nodeid.split("::")[0], 0.0),
                                 rank[item.nodeid.split("::")[0]]))


@pytest.fixture
def spark():
    """A live local SparkSession (built from conf/local.yaml, test-sized shuffles).

    Function-scoped but cheap: it returns the active session, and builds a new one only when a test
    stopped it (the standalone-cluster tests stop the local session to start a cluster driver).
    """
    from backfill.session import get_spark

    session = get_spark("local")
    session.conf.set("spark.sql.shuffle.partitions", "4")
    return session


@pytest.fixture(scope="module")
def spark_module():
    """The same live session, for module-scoped fixtures."""
    from backfill.session import get_spark

    session = get_spark("local")
    session.conf.set("spark.sql.shuffle.partitions", "4")
    return session


def restore_env(saved: dict[str, str | None]) -> None:
    """Put environment variables back as `saved` had them (None: unset)."""
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(autouse=True)
def _no_connect_mark_leaks():
    """A test that leaves PySpark's Spark Connect marks in the environment (a Connect session created in-process
    sets them) turns every later session and column of its worker, and every process it starts, into a Connect
    client: such a test errors here, and the marks are cleared for the next one."""
    from backfill.session import CONNECT_MARKS

    before = {key: os.environ.get(key) for key in (*CONNECT_MARKS, "SPARK_REMOTE")}
    yield
    after = {key: os.environ.get(key) for key in before}
    restore_env(before)
    leaked = sorted(key for key in before if after[key] != before[key])
    assert not leaked, f"the test left {', '.join(leaked)} changed in the environment (restore it)"


@pytest.fixture(scope="session", autouse=True)
def _stop_spark_at_exit():
    """Stop whatever session is left when the test run ends."""
    yield
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    """Write records as JSONL (one object per line)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Read a JSONL sink file (missing -> empty)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def examples(prefix: str = "") -> dict[str, dict[str, Any]]:
    """The Kafka Streams test vectors of ../shared/semantics, by id."""
    cases = json.loads((SHARED / "semantics" / "kafka-streams-examples.json").read_text())
    return {c["id"]: c for c in cases if c["id"].startswith(prefix)}


def flink_examples(prefix: str = "") -> dict[str, dict[str, Any]]:
    """The Flink test vectors of ../shared/semantics, by id."""
    cases = json.loads((SHARED / "semantics" / "flink-examples.json").read_text())
    return {c["id"]: c for c in cases if c["id"].startswith(prefix)}


@pytest.fixture(scope="session")
def kafka_broker():
    """A real Apache Kafka broker (KRaft, one node, 127.0.0.1), started once per test session."""
    from backfill.io.broker import start_broker

    broker = start_broker()
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def secure_kafka_broker():
    """A broker with SASL (PLAIN, SCRAM) and TLS listeners beside the plaintext one, for the security tests only."""
    from backfill.io.broker import start_broker

    broker = start_broker(secure=True)
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def schema_registry():
    """A real schema registry (Apicurio Registry, its Confluent-compatible API, in-memory), once per test worker."""
    from backfill.io.registry_server import start_registry

    registry = start_registry()
    yield registry
    registry.stop()


def delta_tables(work: Path, names: tuple[str, ...]) -> dict[str, list[dict]]:
    """Delta tables under `work`/data by name, their rows sorted, without `run_id`: a sum of doubles depends on
    how Spark split the rows, so floats are compared to 9 digits."""
    from deltalake import DeltaTable

    out = {}
    for name in names:
        rows = DeltaTable(str(work / "data" / name)).to_pyarrow_table().to_pylist()
        for r in rows:
            r.pop("run_id", None)
            r.update({k: round(v, 9) for k, v in r.items() if isinstance(v, float)})
        out[name] = sorted(rows, key=repr)
    return out
