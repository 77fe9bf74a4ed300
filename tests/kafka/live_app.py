"""A live Kafka Streams application of jvm/harness run by a test: a JVM printing RUNNING, `AT partition
offset` per record it processed, and CLOSED after a clean close on SIGTERM.

The stream thread processes records before the client reports RUNNING (it processes its tasks while the
client is still REBALANCING, once their partitions are assigned), so `AT` lines come before RUNNING too: every
line read is kept, and waiting for the end offsets starts from the first line, not from RUNNING."""
from __future__ import annotations

import queue
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any


class LiveApp:
    def __init__(self, command: list[str], log: Path, timeout_s: float = 120) -> None:
        self.log, self.timeout_s = log, timeout_s
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log.open("a"), text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.read: list[str] = []  # every line taken from `lines` so far, in order
        self.reader = threading.Thread(target=lambda: [self.lines.put(x.strip()) for x in self.proc.stdout or []],
                                       daemon=True)
        self.reader.start()
        self._until(lambda line: line == "RUNNING", "RUNNING")

    def _until(self, done: Any, what: str, replay: bool = False) -> None:
        """Until `done(line)` holds for a line; with `replay`, the lines read before are offered first."""
        if replay and any([done(line) for line in self.read]):
            return
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=1)
                self.read.append(line)
                if done(line):
                    return
            except queue.Empty:
                assert self.proc.poll() is None, f"the application exited: {self.log.read_text()[-2000:]}"
        raise AssertionError(f"the application did not reach {what} in {self.timeout_s} s")

    def processed(self, ends: dict[int, int]) -> None:
        """Until it has processed every partition up to its end offset."""
        left = {p: o - 1 for p, o in ends.items() if o > 0}

        def seen(line: str) -> bool:
            if line.startswith("AT "):
                p, o = map(int, line.split()[1:])
                if left.get(p) == o:
                    del left[p]
            return not left

        if left:
            self._until(seen, f"the end offsets {ends}", replay=True)

    def stop(self) -> None:
        """A clean close (caches flushed, every output record written, offsets committed), then CLOSED."""
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)
        self.reader.join(timeout=10)
        assert "CLOSED" in list(self.lines.queue), self.log.read_text()[-2000:]
