"""The driver JVM's options (the class archive is used when it matches, and a bad one never stops a start), and
Spark actions run side by side."""
from __future__ import annotations

import subprocess
import threading
import time

import pytest

from backfill import session


def test_the_archive_is_used_only_when_asked_for_and_when_it_exists(tmp_path, monkeypatch):
    archive = tmp_path / "cds" / "abc.jsa"
    monkeypatch.setattr(session, "class_archive", lambda: archive)
    monkeypatch.setenv("BACKFILL_CLASS_ARCHIVE", "1")
    assert not any("SharedArchiveFile" in o for o in session.driver_java_options())
    archive.parent.mkdir()
    archive.write_bytes(b"x")
    assert f"-XX:SharedArchiveFile={archive}" in session.driver_java_options()
    # the JVM's own notices (a stale archive) go to its stderr, which the CLI keeps in a log file
    assert "-Xlog:all=warning:stderr" in session.driver_java_options()
    monkeypatch.delenv("BACKFILL_CLASS_ARCHIVE")  # opt-in: 10M-record runs measured slower with it
    assert not any("SharedArchiveFile" in o for o in session.driver_java_options())
    recording = session.driver_java_options(record=True)
    assert "-XX:+RecordDynamicDumpInfo" in recording and not any("SharedArchiveFile" in o for o in recording)


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
