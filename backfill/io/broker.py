"""Part: io. A local Apache Kafka broker for the tests and `backfill demo --kafka`.

One node in KRaft mode (broker and controller in one process, no ZooKeeper), listening on 127.0.0.1 only,
with its log in a temporary folder; the jars are the ones scripts/setup.sh resolved into jvm/lib/kafka.
Data with old timestamps must survive, so retention by time and by size is off.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from backfill.errors import SourceError

JARS = Path(os.environ.get("BACKFILL_KAFKA_JARS", Path(__file__).resolve().parents[2] / "jvm" / "lib" / "kafka"))


def free_port() -> int:
    """A TCP port nobody listens on right now (loopback)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Broker:
    """A running broker: `bootstrap` is what clients connect to; `stop()` ends it and deletes its log."""

    bootstrap: str
    process: subprocess.Popen[bytes]
    folder: Path
    log: Path
    stopped: bool = field(default=False)

    def stop(self) -> None:
        """Stop the broker (SIGTERM, then SIGKILL after 20 s) and remove its data."""
        if self.stopped:
            return
        self.stopped = True
        self.process.terminate()
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> Broker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_broker(partitions: int = 1, timeout_s: float = 60.0) -> Broker:
    """Start a one-node KRaft broker on free loopback ports; returns once it accepts clients."""
    jars = sorted(JARS.glob("*.jar"))
    if not jars:
        raise SourceError(f"{JARS}: the Kafka broker jars are missing; run scripts/setup.sh once")
    folder = Path(tempfile.mkdtemp(prefix="backfill-kafka-"))
    port, controller = free_port(), free_port()
    props = folder / "server.properties"
    props.write_text("\n".join([
        "process.roles=broker,controller", "node.id=1", f"controller.quorum.voters=1@127.0.0.1:{controller}",
        f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}",
        f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}", "controller.listener.names=CONTROLLER",
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name=PLAINTEXT", f"log.dirs={folder / 'log'}", f"num.partitions={partitions}",
        "offsets.topic.replication.factor=1", "transaction.state.log.replication.factor=1",
        "transaction.state.log.min.isr=1", "group.initial.rebalance.delay.ms=0",
        # archived data is often old: never delete it by age or size while a test or the demo runs
        "log.retention.ms=-1", "log.retention.bytes=-1", "auto.create.topics.enable=false", ""]))
    classpath = os.pathsep.join(str(j) for j in jars)
    java = shutil.which("java") or "java"
    log = folder / "broker.log"
    heap = ["-Xms256m", "-Xmx1g"]
    fmt = subprocess.run([java, *heap, "-cp", classpath, "kafka.tools.StorageTool", "format", "-t",
                          uuid.uuid4().hex[:22], "-c", str(props), "--standalone"],
                         capture_output=True, text=True, timeout=120)
    if fmt.returncode != 0:  # older StorageTool versions have no --standalone
        fmt = subprocess.run([java, *heap, "-cp", classpath, "kafka.tools.StorageTool", "format", "-t",
                              uuid.uuid4().hex[:22], "-c", str(props)], capture_output=True, text=True, timeout=120)
    if fmt.returncode != 0:
        shutil.rmtree(folder, ignore_errors=True)
        raise SourceError(f"the local Kafka broker's storage could not be formatted: {fmt.stderr.strip()[-300:]}")
    with open(log, "wb") as out:
        process = subprocess.Popen([java, *heap, "-cp", classpath, "kafka.Kafka", str(props)], stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    broker = Broker(f"127.0.0.1:{port}", process, folder, log)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            text = log.read_text(errors="replace")[-500:]
            broker.stop()
            raise SourceError(f"the local Kafka broker exited at start: {text}")
        if _ready(broker.bootstrap):
            return broker
        time.sleep(0.3)
    broker.stop()
    raise SourceError(f"the local Kafka broker did not start within {timeout_s:.0f} s")


def _ready(bootstrap: str) -> bool:
    """True once the broker accepts connections and answers a metadata request."""
    from confluent_kafka.admin import AdminClient

    host, port = bootstrap.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
        AdminClient({"bootstrap.servers": bootstrap, "log_level": 0}).list_topics(timeout=5)
        return True
    except Exception:  # noqa: BLE001 - not up yet
        return False
