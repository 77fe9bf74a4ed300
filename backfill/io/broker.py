"""Part: io. A local Apache Kafka broker for the tests and `backfill demo --kafka`.

One node in KRaft mode (broker and controller in one process, no ZooKeeper), listening on 127.0.0.1 only,
with its log in a temporary folder; the jars are the ones scripts/setup.sh resolved into jvm/lib/kafka.
Data with old timestamps must survive, so retention by time and by size is off.
"""
from __future__ import annotations

import os
import secrets
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


def end_process(process: subprocess.Popen[bytes], folder: Path) -> None:
    """Stop a local server started for a run or a test (SIGTERM, then SIGKILL after 20 s); remove its folder."""
    process.terminate()
    try:
        process.wait(20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)
    shutil.rmtree(folder, ignore_errors=True)


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
    # with `secure`: the address of each listener by protocol (SASL_PLAINTEXT, SSL, SASL_SSL), the CA file (PEM)
    # the broker's certificate is checked against, and the user and password of each SASL mechanism
    listeners: dict[str, str] = field(default_factory=dict)
    ca_file: Path | None = None
    users: dict[str, tuple[str, str]] = field(default_factory=dict)

    def stop(self) -> None:
        """Stop the broker (SIGTERM, then SIGKILL after 20 s) and remove its data."""
        if self.stopped:
            return
        self.stopped = True
        end_process(self.process, self.folder)

    def __enter__(self) -> Broker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


SECURE = ("SASL_PLAINTEXT", "SSL", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


def _secure_settings(folder: Path, ports: dict[str, int], java: str) -> tuple[list[str], Path, dict[str, tuple[str, str]]]:
    """Broker settings for SASL (PLAIN and SCRAM users) and TLS listeners, a keytool-made key and certificate
    (self-signed for 127.0.0.1, valid 2 days), and the users: one per mechanism, random passwords."""
    keytool = str(Path(java).with_name("keytool")) if os.path.isabs(java) else shutil.which("keytool") or "keytool"
    store, ca, store_pass = folder / "broker.p12", folder / "ca.pem", secrets.token_hex(12)
    subprocess.run([keytool, "-genkeypair", "-alias", "broker", "-keyalg", "RSA", "-keysize", "2048", "-validity",
                    "2", "-dname", "CN=127.0.0.1", "-ext", "SAN=IP:127.0.0.1,DNS:localhost", "-keystore", str(store),
                    "-storetype", "PKCS12", "-storepass", store_pass, "-keypass", store_pass],
                   check=True, capture_output=True, timeout=120)
    subprocess.run([keytool, "-exportcert", "-rfc", "-alias", "broker", "-keystore", str(store), "-storepass",
                    store_pass, "-file", str(ca)], check=True, capture_output=True, timeout=120)
    users = {m: (f"user-{m.lower()}", secrets.token_hex(10)) for m in MECHANISMS}
    plain = " ".join(f'user_{u}="{p}"' for u, p in [users["PLAIN"]])
    lines = ["sasl.enabled.mechanisms=" + ",".join(MECHANISMS), f"ssl.keystore.location={store}",
             "ssl.keystore.type=PKCS12", f"ssl.keystore.password={store_pass}", f"ssl.key.password={store_pass}"]
    for listener in ("sasl_plaintext", "sasl_ssl"):
        lines.append(f"listener.name.{listener}.plain.sasl.jaas.config=org.apache.kafka.common.security.plain."
                     f"PlainLoginModule required {plain};")
        for m in MECHANISMS[1:]:
            lines.append(f"listener.name.{listener}.{m.lower()}.sasl.jaas.config=org.apache.kafka.common.security."
                         "scram.ScramLoginModule required;")
    return lines, ca, users


def start_broker(partitions: int = 1, timeout_s: float = 60.0, secure: bool = False) -> Broker:
    """Start a one-node KRaft broker on free loopback ports; returns once it accepts clients. `secure` adds
    SASL_PLAINTEXT, SSL and SASL_SSL listeners (PLAIN and SCRAM users; SCRAM credentials created through the
    admin API once it runs) beside the plaintext one."""
    jars = sorted(JARS.glob("*.jar"))
    if not jars:
        raise SourceError(f"{JARS}: the Kafka broker jars are missing; run scripts/setup.sh once")
    folder = Path(tempfile.mkdtemp(prefix="backfill-kafka-"))
    port, controller = free_port(), free_port()
    java = shutil.which("java") or "java"
    ports = {p: free_port() for p in SECURE} if secure else {}
    extra, ca, users = _secure_settings(folder, ports, java) if secure else ([], None, {})
    names = ",".join([f"PLAINTEXT://127.0.0.1:{port}", *[f"{p}://127.0.0.1:{n}" for p, n in ports.items()]])
    props = folder / "server.properties"
    props.write_text("\n".join([
        "process.roles=broker,controller", "node.id=1", f"controller.quorum.voters=1@127.0.0.1:{controller}",
        f"listeners={names},CONTROLLER://127.0.0.1:{controller}",
        f"advertised.listeners={names}", "controller.listener.names=CONTROLLER",
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
        + "".join(f",{p}:{p}" for p in ports), *extra,
        "inter.broker.listener.name=PLAINTEXT", f"log.dirs={folder / 'log'}", f"num.partitions={partitions}",
        "offsets.topic.replication.factor=1", "transaction.state.log.replication.factor=1",
        "transaction.state.log.min.isr=1", "group.initial.rebalance.delay.ms=0",
        # archived data is often old: never delete it by age or size while a test or the demo runs
        "log.retention.ms=-1", "log.retention.bytes=-1", "auto.create.topics.enable=false", ""]))
    classpath = os.pathsep.join(str(j) for j in jars)
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
    broker = Broker(f"127.0.0.1:{port}", process, folder, log,
                    listeners={p: f"127.0.0.1:{n}" for p, n in ports.items()}, ca_file=ca, users=users)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            text = log.read_text(errors="replace")[-500:]
            broker.stop()
            raise SourceError(f"the local Kafka broker exited at start: {text}")
        if _ready(broker.bootstrap):
            if users:
                _add_scram_users(broker.bootstrap, users)
            return broker
        time.sleep(0.3)
    broker.stop()
    raise SourceError(f"the local Kafka broker did not start within {timeout_s:.0f} s")


def _add_scram_users(bootstrap: str, users: dict[str, tuple[str, str]]) -> None:
    """The SCRAM users' credentials, created through the admin API (over the plaintext listener)."""
    from confluent_kafka.admin import AdminClient, ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    upserts = [UserScramCredentialUpsertion(users[m][0], ScramCredentialInfo(getattr(ScramMechanism, m.replace("-", "_")),
                                                                             4096), users[m][1].encode())
               for m in MECHANISMS[1:]]
    for future in admin.alter_user_scram_credentials(upserts).values():
        future.result(30)


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
