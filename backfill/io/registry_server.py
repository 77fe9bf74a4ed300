"""Part: io. A local schema registry for the tests: Apicurio Registry (its Confluent-compatible REST API).

The runnable Quarkus build that scripts/setup.sh unpacked into jvm/lib/registry (jvm/deps/registry), on
127.0.0.1 at a free port, with its default in-memory storage (H2) and its management interface on another
free loopback port. It needs Java 21 or newer: `BACKFILL_REGISTRY_JAVA`, else a Temurin 21+ under
/usr/lib/jvm, else `java` when it is new enough.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from backfill.errors import SourceError
from backfill.io.broker import end_process, free_port

APP = Path(os.environ.get("BACKFILL_REGISTRY_APP",
                          Path(__file__).resolve().parents[2] / "jvm" / "lib" / "registry" / "quarkus-run.jar"))
CCOMPAT = "/apis/ccompat/v7"


@dataclass
class Registry:
    """A running registry: `url` is its Confluent-compatible API; `stop()` ends it."""

    url: str
    process: subprocess.Popen[bytes]
    folder: Path
    stopped: bool = field(default=False)

    def stop(self) -> None:
        """Stop the registry (SIGTERM, then SIGKILL after 20 s) and remove its folder."""
        if self.stopped:
            return
        self.stopped = True
        end_process(self.process, self.folder)

    def __enter__(self) -> Registry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def java21() -> str:
    """A java binary of version 21 or newer (see the module docstring)."""
    given = os.environ.get("BACKFILL_REGISTRY_JAVA")
    candidates = [given] if given else []
    candidates += sorted((str(p / "bin" / "java") for p in Path("/usr/lib/jvm").glob("*")
                          if re.search(r"-(2[1-9]|[3-9]\d)(-|\.|$)", p.name)), reverse=True)
    candidates.append(shutil.which("java") or "")
    for java in candidates:
        if java and os.access(java, os.X_OK) and _major(java) >= 21:
            return java
    raise SourceError("the local schema registry needs Java 21 or newer (set BACKFILL_REGISTRY_JAVA to its java)")


def _major(java: str) -> int:
    out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30).stderr
    match = re.search(r'version "(\d+)', out)
    return int(match[1]) if match else 0


def start_registry(timeout_s: float = 120.0) -> Registry:
    """Start Apicurio Registry on a free loopback port; returns once its API answers."""
    if not APP.is_file():
        raise SourceError(f"{APP}: the schema registry is missing; run scripts/setup.sh once")
    folder = Path(tempfile.mkdtemp(prefix="backfill-registry-"))
    port = free_port()
    args = [java21(), "-Xms64m", "-Xmx512m", "-XX:TieredStopAtLevel=1", f"-Dquarkus.http.port={port}",
            "-Dquarkus.http.host=127.0.0.1",
            # the management interface is fixed at build time (on, 0.0.0.0:9000): a free loopback port instead, so
            # several registries (test workers, a demo) run side by side
            f"-Dquarkus.management.port={free_port()}", "-Dquarkus.management.host=127.0.0.1",
            "-Dquarkus.otel.sdk.disabled=true", "-jar", str(APP)]
    with open(folder / "registry.log", "wb") as log:
        process = subprocess.Popen(args, cwd=folder, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    registry = Registry(f"http://127.0.0.1:{port}{CCOMPAT}", process, folder)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            text = (folder / "registry.log").read_text(errors="replace")[-500:]
            registry.stop()
            raise SourceError(f"the local schema registry exited at start: {text}")
        try:
            with urllib.request.urlopen(f"{registry.url}/subjects", timeout=2) as resp:
                if resp.status == 200:
                    return registry
        except OSError:
            pass
        time.sleep(0.5)
    registry.stop()
    raise SourceError(f"the local schema registry did not start within {timeout_s:.0f} s")
