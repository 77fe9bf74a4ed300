"""Part: commands. The resident engine (`backfill server start|stop|status`): a Spark Connect server on 127.0.0.1
with the session a local run builds (the profile's settings, backfill's jars, Delta's extension and catalog), kept
warm between commands so that each one skips the JVM's start.

A supervisor process (`python -m backfill.server`) holds the lock file for as long as it lives, starts the
server's JVM through pyspark's spark-submit, writes the state file (`status: ready` once the port answers; what
resources.resident_server reads), and ends the JVM after the idle timeout (no client connected, no command
started meanwhile), on `stop`, or when it is itself ended. The JVM's output goes to the log file.
"""
from __future__ import annotations

import argparse
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from backfill.errors import SessionError, SpecError
from backfill.resources import resident_server, server_dir

MAIN_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
HOST = "127.0.0.1"
DEFAULT_PORT = 15002  # Spark Connect's own default
DEFAULT_IDLE = "30m"
READY_WITHIN_S = 180  # a cold JVM with every jar answered in 15-25 s here
POLL_S = 2.0


@dataclass(frozen=True)
class Files:
    """The resident engine's files in its folder (resources.server_dir)."""

    folder: Path

    @property
    def lock(self) -> Path:
        return self.folder / "server.lock"

    @property
    def state(self) -> Path:
        return self.folder / "server.json"

    @property
    def log(self) -> Path:
        return self.folder / "server.log"

    @property
    def used(self) -> Path:
        """Touched by every command that uses the engine (session.remote_url): it counts as activity."""
        return self.folder / "server.used"

    @property
    def work(self) -> Path:
        """The JVM's working folder (its warehouse, scratch files), removed when it ends."""
        return self.folder / "work"


def files() -> Files:
    return Files(server_dir())


# ----------------------------------------------------------------------------- the commands


def start(port: int = DEFAULT_PORT, idle: str = DEFAULT_IDLE, profile: str | None = None,
          say: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Start the resident engine and wait until it answers; returns its state (`already` true when one was
    running already, for this profile or another)."""
    from backfill.jobspec.durations import parse_duration
    from backfill.session import load_profile, profile_name

    idle_ms = _idle_ms(idle, parse_duration)
    name = profile_name(profile)
    load_profile(name)  # a wrong --profile is an error before anything starts
    running = resident_server()
    if running is not None:
        return {**running, "already": True}
    where = files()
    if _held(where.lock):  # a supervisor is still starting one
        return {**_wait_ready(where, None), "already": True}
    if not _port_free(port):
        raise SessionError(f"--port {port}: {HOST}:{port} is in use (another Spark Connect server?); give another "
                           "port with --port, or end what listens there")
    where.folder.mkdir(parents=True, exist_ok=True)
    say(f"starting the resident engine on {HOST}:{port} (log {where.log})")
    supervisor = subprocess.Popen(
        [sys.executable, "-m", "backfill.server", "--port", str(port), "--idle-ms", str(idle_ms), "--profile", name],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=open(where.log, "ab"),
        start_new_session=True, cwd=os.getcwd())  # its own session: a terminal's Ctrl-C does not end it
    return {**_wait_ready(where, supervisor), "already": False}


def status() -> dict[str, Any] | None:
    """The running engine's state (url, pid, profile, started, log, status, idle timeout), or None."""
    where = files()
    if not _held(where.lock):
        return None
    return _read_state(where)


def stop(say: Callable[[str], None] = lambda _: None) -> dict[str, Any] | None:
    """End the resident engine (its supervisor ends the JVM with io.broker.end_process); returns the state it
    had, or None when none was running."""
    where = files()
    state = status()
    if state is None:
        return None
    supervisor = int(state.get("supervisor") or 0)
    if supervisor:
        _signal(supervisor, signal.SIGTERM)
    deadline = time.monotonic() + 45  # end_process waits 20 s for SIGTERM, then kills
    while _held(where.lock) and time.monotonic() < deadline:
        time.sleep(0.5)
    if _held(where.lock):  # a supervisor that does not answer: end both by their ids
        for pid in (state.get("pid"), supervisor):
            if pid:
                _signal(int(pid), signal.SIGKILL)
        say("the supervisor did not end in 45 s: killed it and the server's JVM")
    return state


def line(state: dict[str, Any] | None) -> str:
    """`backfill server status` in one line."""
    if state is None:
        return "resident engine: not running (`backfill server start` starts one)"
    idle = state.get("idle_timeout")
    return (f"resident engine: {state.get('status')} at {state.get('url')} (pid {state.get('pid')}, profile "
            f"{state.get('profile')}, started {state.get('started')}, idle timeout {idle}; log {state.get('log')})")


# ----------------------------------------------------------------------------- the supervisor


def supervise(port: int, idle_ms: int, profile: str) -> int:
    """The supervisor's life: hold the lock, start the JVM, say `ready` once it answers, end it when idle."""
    from backfill.io.broker import end_process
    from backfill.jobspec.durations import format_duration

    where = files()
    holder = open(where.lock, "a+")
    try:
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return 0  # another supervisor won the race: the caller waits for its `ready`
    where.work.mkdir(parents=True, exist_ok=True)
    jvm = subprocess.Popen(server_command(port, profile), stdin=subprocess.DEVNULL, stdout=open(where.log, "ab"),
                           stderr=subprocess.STDOUT, cwd=where.work, env=server_env(profile))
    state = {"url": f"sc://{HOST}:{port}", "pid": jvm.pid, "supervisor": os.getpid(), "profile": profile,
             "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "log": str(where.log),
             "idle_timeout": format_duration(idle_ms), "status": "starting"}
    _write_state(where, state)
    ended = {"by": ""}

    def on_term(signum: int, _frame: Any) -> None:
        ended["by"] = signal.Signals(signum).name

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    try:
        reason = _watch(jvm, port, idle_ms, where, state, ended)
    finally:
        if jvm.poll() is None:
            end_process(jvm, where.work)
        where.state.unlink(missing_ok=True)
    _log(where, f"resident engine ended: {reason}")
    return 0


def _watch(jvm: subprocess.Popen[bytes], port: int, idle_ms: int, where: Files, state: dict[str, Any],
           ended: dict[str, str]) -> str:
    """Wait for the JVM to answer, then for a reason to end it; returns the reason."""
    last_active = time.monotonic()
    while True:
        if ended["by"]:
            return f"stopped ({ended['by']})"
        if jvm.poll() is not None:
            return f"the server's JVM exited with code {jvm.returncode}"
        if state["status"] != "ready" and not _port_free(port):
            state["status"] = "ready"
            _write_state(where, state)
            last_active = time.monotonic()
        if state["status"] == "ready":
            if _connected(port) or _touched_since(where.used, last_active):
                last_active = time.monotonic()
            elif (time.monotonic() - last_active) * 1000 > idle_ms:
                return f"idle for {state['idle_timeout']}"
        time.sleep(POLL_S)


def server_command(port: int, profile: str) -> list[str]:
    """spark-submit of Spark Connect's server with the settings a local session of the profile gets."""
    from pyspark.find_spark_home import _find_spark_home

    submit = str(Path(_find_spark_home()) / "bin" / "spark-submit")
    command = [submit, "--class", MAIN_CLASS, "--name", "backfill-server"]
    for key, value in server_settings(port, profile).items():
        command += ["--conf", f"{key}={value}"]
    return command


def server_settings(port: int, profile: str) -> dict[str, str]:
    """The profile's session settings (session.spark_settings: Delta, backfill's jars and extension), its
    master, the driver's options, and the server's address (loopback only)."""
    from backfill.session import driver_java_options, load_profile, spark_settings

    conf = load_profile(profile)
    settings = spark_settings(conf, say=lambda _: None)
    if conf["master"]:
        settings["spark.master"] = conf["master"]
    options = " ".join(driver_java_options())
    if options:
        settings["spark.driver.extraJavaOptions"] = " ".join(
            filter(None, [options, settings.get("spark.driver.extraJavaOptions")]))
    settings["spark.pyspark.python"] = sys.executable  # applyInPandas kernels import backfill from this venv
    settings["spark.connect.grpc.binding.address"] = HOST
    settings["spark.connect.grpc.binding.port"] = str(port)
    return settings


def server_env(profile: str) -> dict[str, str]:
    """The JVM's environment: the profile's (SPARK_LOCAL_IP, ...) and this venv's Python for its workers."""
    from backfill.session import load_profile

    env = dict(os.environ)
    env.pop("SPARK_REMOTE", None)  # the server itself is a classic session
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    for key, value in (load_profile(profile).get("env") or {}).items():
        env.setdefault(key, str(value))
    return env


# ----------------------------------------------------------------------------- helpers


def _idle_ms(idle: str, parse: Callable[[object], int]) -> int:
    try:
        value = parse(idle)
    except (ValueError, SpecError):
        value = 0
    if value <= 0:
        raise SpecError(f"--idle-timeout {idle!r} is not a duration; use e.g. 30m, 2h, 90s")
    return value


def _wait_ready(where: Files, supervisor: subprocess.Popen[bytes] | None) -> dict[str, Any]:
    deadline = time.monotonic() + READY_WITHIN_S
    while time.monotonic() < deadline:
        state = _read_state(where)
        if state is not None and state.get("status") == "ready":
            return state
        if supervisor is not None and supervisor.poll() is not None and not _held(where.lock):
            raise SessionError(f"the resident engine did not start ({_last_line(where.log)}); its log is {where.log}")
        time.sleep(0.5)
    raise SessionError(f"the resident engine did not answer within {READY_WITHIN_S} s; see {where.log}, and "
                       "`backfill server stop` ends what started")


def _held(lock: Path) -> bool:
    """Whether a supervisor holds the lock file (it does for as long as it lives)."""
    if not lock.is_file():
        return False
    with open(lock, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        fcntl.flock(fh, fcntl.LOCK_UN)
    return False


def _read_state(where: Files) -> dict[str, Any] | None:
    try:
        found = json.loads(where.state.read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def _write_state(where: Files, state: dict[str, Any]) -> None:
    staged = where.state.with_suffix(".json.tmp")
    staged.write_text(json.dumps(state, indent=2))
    os.replace(staged, where.state)  # a reader sees the old state or the new one, never half of one


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex((HOST, port)) != 0


def _connected(port: int) -> bool:
    """Whether a client holds a connection to the port (Linux: /proc/net/tcp*, state 01 ESTABLISHED)."""
    suffix = f":{port:04X}"
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        if any(r.split()[1].endswith(suffix) and r.split()[3] == "01" for r in rows if len(r.split()) > 3):
            return True
    return False


def _touched_since(file: Path, since_monotonic: float) -> bool:
    try:
        age = time.time() - file.stat().st_mtime
    except OSError:
        return False
    return time.monotonic() - age > since_monotonic


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _last_line(log: Path) -> str:
    try:
        lines = [x for x in log.read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        return "no log"
    return lines[-1][:300] if lines else "no output"


def _log(where: Files, text: str) -> None:
    with open(where.log, "a") as fh:
        fh.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}\n")


def main(argv: list[str] | None = None) -> int:
    """The supervisor's entry (`python -m backfill.server`), started by `start`."""
    parser = argparse.ArgumentParser(prog="python -m backfill.server")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--idle-ms", type=int, required=True)
    parser.add_argument("--profile", required=True)
    args = parser.parse_args(argv)
    return supervise(args.port, args.idle_ms, args.profile)


if __name__ == "__main__":
    sys.exit(main())
