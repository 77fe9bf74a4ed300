"""The driver JVM's options (the class archive is used when it matches, and a bad one never stops a start), and
Spark actions run side by side."""
from __future__ import annotations

import subprocess
import threading
import time

import pytest

from backfill import session


def test_the_archive_is_used_by_short_runs_or_when_asked_for_and_only_when_it_exists(tmp_path, monkeypatch):
    archive = tmp_path / "cds" / "abc.jsa"
    monkeypatch.setattr(session, "class_archive", lambda: archive)

    def mapped(short: bool = False) -> bool:
        return f"-XX:SharedArchiveFile={archive}" in session.driver_java_options(short=short)

    monkeypatch.setenv("BACKFILL_CLASS_ARCHIVE", "1")
    assert not mapped() and not mapped(short=True)  # no file yet
    archive.parent.mkdir()
    archive.write_bytes(b"x")
    assert mapped() and mapped(short=True)
    # the JVM's own notices (a stale archive) go to its stderr, which the CLI keeps in a log file
    assert "-Xlog:all=warning:stderr" in session.driver_java_options()
    # unset: short runs only (10M-record runs measured slower with it)
    monkeypatch.delenv("BACKFILL_CLASS_ARCHIVE")
    assert mapped(short=True) and not mapped()
    for off in ("", "0"):  # set but empty or 0: never
        monkeypatch.setenv("BACKFILL_CLASS_ARCHIVE", off)
        assert not mapped(short=True) and not mapped()
    recording = session.driver_java_options(record=True)
    assert "-XX:+RecordDynamicDumpInfo" in recording and not any("SharedArchiveFile" in o for o in recording)


def test_short_run_options_only_for_a_one_shot_process_and_a_small_input(monkeypatch):
    monkeypatch.delenv("BACKFILL_JAVA_OPTIONS", raising=False)
    assert not set(session.SHORT_RUN_OPTIONS) & set(session.driver_java_options())
    assert set(session.SHORT_RUN_OPTIONS) <= set(session.driver_java_options(short=True))
    # a machine's own options come last: the JVM takes the last value of a flag
    monkeypatch.setenv("BACKFILL_JAVA_OPTIONS", "-XX:TieredStopAtLevel=4")
    assert session.driver_java_options(short=True)[-1] == "-XX:TieredStopAtLevel=4"
    # a JVM given two collectors does not start: a machine's choice replaces ours
    monkeypatch.setenv("BACKFILL_JAVA_OPTIONS", "-XX:+UseG1GC")
    assert [o for o in session.driver_java_options(short=True) if o.endswith("GC")] == ["-XX:+UseG1GC"]


def test_a_one_shot_process_starts_a_small_runs_jvm_with_the_short_run_options(spark):
    """Through the real start: the options reach the driver JVM of a one-shot process; a library's session (this
    test's own) starts without them."""
    code = """
from backfill import session
session.one_shot_process()
spark = session.get_spark(input_bytes=1 << 20)
print("|".join(spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments()))
"""
    import os
    import sys

    env = {k: v for k, v in os.environ.items() if k != "BACKFILL_JAVA_OPTIONS"}  # a machine's own would win
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    assert set(session.SHORT_RUN_OPTIONS) <= set(done.stdout.strip().splitlines()[-1].split("|"))
    mine = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments()
    own = set(os.environ.get("BACKFILL_JAVA_OPTIONS", "").split())  # the suite's (conftest.py) or a machine's
    if not set(session.SHORT_RUN_OPTIONS) & own:
        assert not set(session.SHORT_RUN_OPTIONS) & set(mine)


def test_a_short_run_is_a_one_shot_process_with_a_small_known_input(tmp_path, monkeypatch):
    from backfill.jobspec.load import load_job
    from backfill.jobspec.load import local_bytes

    monkeypatch.setitem(session._ONE_SHOT, "process", False)
    assert not session.short_run(1)
    monkeypatch.setitem(session._ONE_SHOT, "process", True)
    assert session.short_run(1) and session.short_run(session.SHORT_RUN_BYTES)
    assert not session.short_run(session.SHORT_RUN_BYTES + 1) and not session.short_run(None)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.parquet").write_bytes(b"x" * 100)
    (tmp_path / "in" / "_delta_log").mkdir()
    (tmp_path / "in" / "_delta_log" / "0.json").write_bytes(b"x" * 10)
    (tmp_path / "b.jsonl").write_bytes(b"y" * 5)
    job = tmp_path / "job.yaml"
    sources = "  a: {format: delta, path: in}\n  b: {format: jsonl, path: b.jsonl}\n"
    body = ("operators:\n  - name: n\n    aggregate: {input: a, window: {type: tumbling, size: 1m, grace: 0ms}, "
            "aggregations: {n: count()}}\nsinks:\n  n: {format: jsonl, path: out.jsonl}\n")
    job.write_text(f"name: j\nsources:\n{sources}{body}")
    assert load_job(job).input_bytes() == 115
    kafka = "  k: {format: kafka, kafka: {bootstrap: '127.0.0.1:1', topic: t}}\n"
    job.write_text(f"name: j\nsources:\n{sources}{kafka}{body}")
    assert load_job(job).input_bytes() is None  # a topic's size is unknown before Spark reads it
    # verify's and diff's tables: path@version counts the whole table; a URI or a missing path is unknown
    assert local_bytes([f"{tmp_path / 'in'}@3", str(tmp_path / "b.jsonl")]) == 115
    assert local_bytes(["kafka://127.0.0.1:1/t"]) is None and local_bytes([str(tmp_path / "nothing")]) is None


def test_the_archive_name_changes_with_the_jars(tmp_path, monkeypatch):
    monkeypatch.setattr(session, "JARS_DIR", tmp_path / "spark")
    (tmp_path / "spark").mkdir()
    (tmp_path / "spark" / "delta-spark_2.13-4.0.0.jar").write_bytes(b"")
    before = session.class_archive()
    assert before is not None and before.parent == tmp_path / "cds" and before.suffix == ".jsa"
    (tmp_path / "spark" / "delta-spark_2.13-4.0.0.jar").rename(tmp_path / "spark" / "delta-spark_2.13-4.0.1.jar")
    assert session.class_archive() != before


def test_a_jvm_given_a_broken_archive_starts_anyway_and_prints_nothing(tmp_path):
    broken = tmp_path / "broken.jsa"
    broken.write_bytes(b"not an archive")
    options = [f"-XX:SharedArchiveFile={broken}", "-Xlog:disable", "-Xlog:all=warning:stderr"]
    done = subprocess.run(["java", *options, "-version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    assert done.stdout == ""  # stdout is the user's terminal (PySpark's JVM inherits it)


def test_sessions_do_not_send_python_call_sites_to_the_jvm(spark):
    """PySpark's DataFrame debugging costs five JVM round trips per API call (docs/stack.md): off by default."""
    from pyspark.errors.utils import is_debugging_enabled

    assert spark.conf.get("spark.python.sql.dataFrameDebugging.enabled") == "false"
    assert not is_debugging_enabled()


def test_side_by_side_calls_keep_their_order_and_a_failure_waits_for_the_others():
    assert session.together([lambda: (time.sleep(0.2), "slow")[1], lambda: "quick"]) == ["slow", "quick"]
    assert session.together([]) == []
    ended, undone = [], []
    both = threading.Barrier(2, timeout=5)  # the two calls really run at once

    def fails() -> str:
        both.wait()
        raise ValueError("audit failed")

    def succeeds() -> str:
        both.wait()
        time.sleep(0.3)
        ended.append("staged")
        return "staged"

    with pytest.raises(ValueError, match="audit failed"):
        session.together([succeeds, fails], undo=undone.append)
    assert ended == ["staged"] and undone == ["staged"]  # the other call ran to its end, then was undone
