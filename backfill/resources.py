"""Part: foundation. Where backfill's own files are: in a checkout (conf/, jobs/, schemas/, jvm/lib/) or, for an
installed wheel, bundled inside the package (backfill/_bundle/) with the jars Spark resolves in a user cache.

The wheel carries the files a command reads (the Spark profiles, the demo's jobs and schemas) and the small jars
backfill builds itself (the Spark operators of jvm/ops, the Kafka Streams and Flink harnesses); the pinned jars
of other projects (Delta, Spark's Kafka source) come from Maven coordinates through Spark's own resolver
(`spark.jars.packages`, its Ivy cache), ahead of time with `backfill setup-jars`. docs/stack.md lists them.
"""
from __future__ import annotations

import os
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
BUNDLE = PACKAGE / "_bundle"  # written into the wheel by setup.py (build_py)
# Maven coordinates of the jars a session loads besides Spark's own; the same pins as jvm/pom.xml
# (tests/test_resources.py holds them equal)
SPARK_PACKAGES = ("io.delta:delta-spark_4.1_2.13:4.3.1", "org.apache.spark:spark-sql-kafka-0-10_2.13:4.1.1")
DELTA_VERSION = "4.3.1"


def checkout() -> Path | None:
    """The repository the package runs from (an editable install, PYTHONPATH), or None for an installed wheel."""
    root = PACKAGE.parent
    return root if (root / "pyproject.toml").is_file() and (root / "conf").is_dir() else None


def bundled(relative: str) -> Path:
    """A file backfill ships (`conf/local.yaml`, `jobs/demo.yaml`): the checkout's, else the wheel's copy."""
    root = checkout()
    return root / relative if root is not None else BUNDLE / relative


def cache_dir() -> Path:
    """Where an installed backfill keeps what it fetches or builds: $BACKFILL_HOME, else ~/.cache/backfill."""
    own = os.environ.get("BACKFILL_HOME")
    if own:
        return Path(own)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "backfill"


def jvm_lib() -> Path:
    """The jar folders: $BACKFILL_JVM_LIB, the checkout's jvm/lib (scripts/setup.sh fills it), else the user
    cache's jvm/lib (`backfill setup-jars` fills it)."""
    own = os.environ.get("BACKFILL_JVM_LIB")
    if own:
        return Path(own)
    root = checkout()
    return root / "jvm" / "lib" if root is not None else cache_dir() / "jvm" / "lib"


def jvm_file(relative: str) -> Path:
    """A jar backfill builds (`ops/backfill-ops.jar`, `harness/backfill-harness.jar`): jvm/lib's, else the wheel's."""
    found = jvm_lib() / relative
    shipped = BUNDLE / "jvm" / "lib" / relative
    return shipped if not found.is_file() and shipped.is_file() else found


def ivy_dir() -> Path:
    """Spark's Ivy folder for the pinned packages (its cache and the resolved jars, under `jars/`)."""
    return cache_dir() / "ivy"


def server_dir() -> Path:
    """The resident engine's folder (`backfill server`): its lock, state and log, one per user and installation,
    so a second checkout or another user's engine is never taken for this one."""
    import hashlib
    import tempfile

    own = os.environ.get("BACKFILL_SERVER_DIR")
    if own:
        return Path(own)
    tag = hashlib.sha256(str(PACKAGE).encode()).hexdigest()[:10]
    return Path(tempfile.gettempdir()) / f"backfill-{os.getuid()}" / f"server-{tag}"


def resident_server() -> dict[str, object] | None:
    """The running resident engine's state (url, pid, profile, started, log), or None: its supervisor holds the
    lock file for as long as it lives, and it says `ready` once the server answers."""
    import fcntl
    import json

    folder = server_dir()
    lock, state = folder / "server.lock", folder / "server.json"
    if not lock.is_file() or not state.is_file():
        return None
    with open(lock, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: the supervisor lives
            try:
                found = json.loads(state.read_text())
            except (OSError, ValueError):
                return None
            return found if found.get("status") == "ready" else None
        fcntl.flock(fh, fcntl.LOCK_UN)
    return None
