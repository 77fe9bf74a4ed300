"""Part: io. Run locks: one backfill run at a time writes a given table, whatever job it belongs to.

A lock is an advisory `flock` on a small file beside each sink (`.<name>.backfill-lock`), taken before
Spark starts and held until the process ends; the kernel releases it when the process dies, so a killed
run never leaves a stale lock. A second run that wants any of the same sinks stops at once, naming the
holder, and writes nothing.
"""
from __future__ import annotations

import datetime as dt
import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from backfill.errors import PublishError


def lock_path(sink: str) -> Path:
    """The lock file of a sink: a hidden file next to it."""
    target = Path(sink.rstrip("/"))
    return target.parent / f".{target.name}.backfill-lock"


@contextmanager
def holding(sinks: list[str], job: str) -> Iterator[None]:
    """Hold the locks of every sink for the duration of the block (sorted order: no deadlock)."""
    held: list[IO[str]] = []
    try:
        for sink in sorted(set(sinks)):
            held.append(_take(sink, job))
        yield
    finally:
        for fh in held:
            fcntl.flock(fh, fcntl.LOCK_UN)
            fh.close()


def _take(sink: str, job: str) -> IO[str]:
    path = lock_path(sink)
    path.parent.mkdir(parents=True, exist_ok=True)
    fh = open(path, "a+")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.seek(0)
        holder = fh.read().strip() or "another process"
        fh.close()
        raise PublishError(f"{sink}: another backfill run is writing it ({holder}); nothing was written: wait "
                           "for that run to end (or stop it) and run again") from None
    fh.seek(0)
    fh.truncate()
    started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    fh.write(f"pid {os.getpid()}, job {job}, since {started}")
    fh.flush()
    return fh
