"""Part: scheduling. One scheduler at a time per job: numbered lock tickets beside the runs table.

Two schedulers (cron, Airflow, two machines sharing the storage) may fire `backfill run --due` at once.
The lock is a folder `<runs table>.lock/` of tickets `00000001.json`, `00000002.json`, ... each created
with exclusive create (the put-if-absent a Delta log commit uses): of two schedulers that read the same
newest ticket, exactly one creates the next number. A ticket says who holds the lock (host, pid, run),
since when, and when the holder last renewed it (every 20 s, by a daemon thread); a ticket not renewed
for `schedule.lock_timeout` belongs to a dead holder and may be taken over (by the next number, the same
race). Releasing writes a `released` ticket. The holder checks before each interval's publish that no
later ticket exists (a stale takeover), so two holders never both publish.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backfill.errors import PublishError

RENEW_S = 20.0


def lock_dir(runs: str) -> Path:
    """The job's lock tickets, next to its runs table (like the publish journals, `<runs>.pending`)."""
    return Path(runs.rstrip("/") + ".lock")


def _now() -> float:
    return time.time()


def _iso(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


@dataclass
class Busy:
    """Another live scheduler holds the lock."""

    holder: dict[str, Any]

    def describe(self) -> str:
        h = self.holder
        what = f" ({h['doing']})" if h.get("doing") else ""
        return (f"run {h['run']} on {h['host']} (pid {h['pid']}) holds the scheduler lock since {h['since']}, "
                f"renewed {h['renewed']}{what}")


@dataclass
class SchedulerLock:
    """A held lock: renewed in the background until released."""

    folder: Path
    number: int
    ticket: dict[str, Any]
    timeout_s: float
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start_renewing(self) -> None:
        self._thread = threading.Thread(target=self._renew_loop, name="backfill-lock", daemon=True)
        self._thread.start()

    def _renew_loop(self) -> None:
        while not self._stop.wait(RENEW_S):
            self.renew()

    def renew(self, doing: str | None = None) -> None:
        """Write a fresh renewal time (and what the run is doing) into the ticket; only the holder writes it."""
        if doing is not None:
            self.ticket["doing"] = doing
        self.ticket["renewed"] = _iso(_now())
        self.ticket["renewed_s"] = _now()
        _rewrite(self.folder / _name(self.number), self.ticket)

    def check(self) -> None:
        """Raise when a later ticket exists: the lock was taken over (this run was thought dead)."""
        newest = _newest(self.folder)
        if newest is not None and newest[0] != self.number:
            raise PublishError(f"{self.folder}: the scheduler lock was taken over by ticket {newest[0]} "
                               f"({newest[1].get('host')}, pid {newest[1].get('pid')}) after this run stopped "
                               f"renewing it for {self.timeout_s:.0f} s; this run stops, publishing nothing more")

    def release(self) -> None:
        """Stop renewing and write a `released` ticket (only when still the holder)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        newest = _newest(self.folder)
        if newest is not None and newest[0] == self.number:
            _create(self.folder / _name(self.number + 1), {"state": "released", "run": self.ticket["run"],
                                                           "since": _iso(_now())})


def acquire(runs: str, job: str, timeout_ms: int, run_id: str | None = None) -> SchedulerLock | Busy:
    """Take the job's scheduler lock, or say who holds it (a live holder: renewed within the timeout)."""
    folder = lock_dir(runs)
    folder.mkdir(parents=True, exist_ok=True)
    timeout_s = timeout_ms / 1000
    for _ in range(20):  # each round loses only to a scheduler that created the next ticket meanwhile
        newest = _newest(folder)
        number = 1 if newest is None else newest[0] + 1
        if newest is not None and newest[1].get("state") == "held" and not _stale(newest[1], timeout_s):
            return Busy(newest[1])
        ticket = {"state": "held", "job": job, "run": run_id or uuid.uuid4().hex[:12], "host": socket.gethostname(),
                  "pid": os.getpid(), "since": _iso(_now()), "renewed": _iso(_now()), "renewed_s": _now(),
                  "took_over": newest[0] if newest is not None and newest[1].get("state") == "held" else None}
        if _create(folder / _name(number), ticket):
            lock = SchedulerLock(folder, number, ticket, timeout_s)
            lock.start_renewing()
            return lock
    raise PublishError(f"{folder}: could not take the scheduler lock (too many concurrent schedulers); try again")


def _stale(ticket: dict[str, Any], timeout_s: float) -> bool:
    """Not renewed for the timeout, or held by a process of this host that no longer exists."""
    if _now() - float(ticket.get("renewed_s") or 0) > timeout_s:
        return True
    if ticket.get("host") == socket.gethostname():
        try:
            os.kill(int(ticket["pid"]), 0)
        except ProcessLookupError:
            return True
        except (PermissionError, KeyError, ValueError, TypeError):
            return False
    return False


def _name(number: int) -> str:
    return f"{number:08d}.json"


def _newest(folder: Path) -> tuple[int, dict[str, Any]] | None:
    """The newest ticket that can be read (a ticket being created is written whole before it is visible)."""
    numbers = sorted((int(p.stem) for p in folder.glob("*.json") if p.stem.isdigit()), reverse=True)
    for number in numbers:
        try:
            return number, json.loads((folder / _name(number)).read_text())
        except (OSError, ValueError):
            continue
    return None


def _create(path: Path, content: dict[str, Any]) -> bool:
    """Put-if-absent: the complete ticket appears under its number, or the call loses (False).

    Written to a temporary file first, then linked to its name: link(2) fails when the name exists, so a
    reader never sees a half-written ticket and only one creator wins.
    """
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
    tmp.write_text(json.dumps(content))
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)


def _rewrite(path: Path, content: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
    tmp.write_text(json.dumps(content))
    os.replace(tmp, path)
