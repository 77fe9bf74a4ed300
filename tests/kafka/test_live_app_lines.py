"""tests/kafka/live_app.py reads the application's stdout as it is: records processed before RUNNING count.

Kafka Streams' stream thread processes its tasks as soon as their partitions are assigned, while the client
still reports REBALANCING: a small input can be processed whole before the RUNNING line. A stand-in process
prints exactly that sequence (no Kafka needed: this checks the test runner, not the engine)."""
from __future__ import annotations

import sys
from pathlib import Path

from tests.kafka.live_app import LiveApp

SCRIPT = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: (print("CLOSED", flush=True), sys.exit(0)))
for line in ("AT 0 0", "AT 1 0", "AT 0 1", "RUNNING", "AT 1 1"):
    print(line, flush=True)
time.sleep(60)
"""


def test_offsets_processed_before_running_are_seen(tmp_path: Path) -> None:
    app = LiveApp([sys.executable, "-c", SCRIPT], tmp_path / "app.log", timeout_s=5)
    app.processed({0: 2, 1: 2})  # partition 0's last offset came before RUNNING
    app.stop()


def test_the_wait_still_fails_when_an_end_offset_never_comes(tmp_path: Path) -> None:
    app = LiveApp([sys.executable, "-c", SCRIPT], tmp_path / "app.log", timeout_s=2)
    try:
        app.processed({0: 3})
    except AssertionError as e:
        assert "did not reach the end offsets" in str(e)
    else:
        raise AssertionError("the wait passed without offset 2 of partition 0")
    finally:
        app.stop()
