"""A real Spark standalone cluster (master + one worker, separate JVMs on 127.0.0.1) for tests.

Usage::

    with standalone_cluster(tmp_path) as master_url:
        with cluster_session_ctx(master_url, min_executors=2) as spark:
            ...

Everything the cluster writes (logs, conf, worker/executor dirs, shuffle files) stays under
``work_dir``; every process it starts (master, worker, executors, their Python daemons) carries
``BACKFILL_SPARK_CLUSTER=<work_dir>`` in its environment, so ``cluster_processes(work_dir)`` finds
leftovers even after they were re-parented.

Pitfalls for tests using it:
- Functions shipped to executors (UDFs, mapInArrow) that are defined at module level in a test
  file are pickled *by reference*; executors cannot import test modules. Define them inside the
  test (pickled by value) or in the ``backfill`` package, which the worker puts on PYTHONPATH.
- Executors start asynchronously after the session; wait (``wait_for_executors``) before
  asserting anything about distribution.
"""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Iterator

import psutil
from pyspark import SparkContext
from pyspark.find_spark_home import _find_spark_home
from pyspark.sql import SparkSession

MARKER_ENV = "BACKFILL_SPARK_CLUSTER"
REPO_ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0

# Log lines that mean "ready" (Spark 4.1 wording; older docs say "granted leadership").
_MASTER_READY = re.compile(r"I have been elected leader|granted leadership")
_MASTER_URL = re.compile(r"Starting Spark master at (spark://\S+)")
_WORKER_READY = re.compile(r"Successfully registered with master")

_MASTER_CLASS = "org.apache.spark.deploy.master.Master"
_WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


class ClusterError(RuntimeError):
    """The test cluster did not start, or left processes behind."""


@dataclass
class _Daemon:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    log_file: IO[bytes]


def spark_home() -> Path:
    """The Spark distribution bundled with pyspark (bin/, sbin/, jars/)."""
    return Path(_find_spark_home())


def free_ports(n: int) -> list[int]:
    """n distinct free TCP ports on 127.0.0.1 (sockets held together so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _cluster_env(work_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    for key in ("SPARK_MASTER_OPTS", "SPARK_WORKER_OPTS", "SPARK_DAEMON_JAVA_OPTS", "SPARK_REMOTE"):
        env.pop(key, None)  # a caller's settings must not leak into the test cluster
    env.update(
        SPARK_HOME=str(spark_home()),
        SPARK_CONF_DIR=str(work_dir / "conf"),  # isolates from any spark-env.sh / defaults
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_LOG_DIR=str(work_dir / "logs"),
        SPARK_WORKER_DIR=str(work_dir / "worker"),
        SPARK_LOCAL_DIRS=str(work_dir / "local"),  # executor shuffle/spill files
        PYSPARK_PYTHON=sys.executable,  # executors must run the venv's Python
        # backfill is not pip-installed: executors (cwd = their app dir) import it from the repo
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
        **{MARKER_ENV: str(work_dir)},
    )
    return env


def _write_conf(work_dir: Path) -> Path:
    for sub in ("conf", "logs", "worker", "local"):
        (work_dir / sub).mkdir(parents=True, exist_ok=True)
    props = work_dir / "conf" / "spark-defaults.conf"
    # the REST submission server would bind the fixed port 6066; nothing here needs it
    props.write_text("spark.master.rest.enabled false\n")
    return props


def _start(name: str, args: list[str], work_dir: Path, env: dict[str, str]) -> _Daemon:
    log = work_dir / "logs" / f"{name}.log"
    log_file = log.open("wb")
    cmd = [str(spark_home() / "bin" / "spark-class"), *args]
    proc = subprocess.Popen(
        cmd,
        cwd=work_dir,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # own process group: killpg reaches the JVM and its executors
    )
    return _Daemon(name, proc, log, log_file)


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"
    return "\n".join(text[-lines:])


def _logs_report(daemons: list[_Daemon]) -> str:
    return "\n".join(f"--- {d.name} ({d.log}) ---\n{_tail(d.log)}" for d in daemons)


def _wait_for_log(daemon: _Daemon, pattern: re.Pattern[str], all_daemons: list[_Daemon],
                  timeout: float) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    while True:
        text = daemon.log.read_text(errors="replace")
        match = pattern.search(text)
        if match:
            return match
        if daemon.proc.poll() is not None:
            raise ClusterError(
                f"Spark {daemon.name} exited with code {daemon.proc.returncode} before it was "
                f"ready\n{_logs_report(all_daemons)}"
            )
        if time.monotonic() > deadline:
            raise ClusterError(
                f"Spark {daemon.name} not ready after {timeout:.0f}s (waiting for "
                f"/{pattern.pattern}/)\n{_logs_report(all_daemons)}"
            )
        time.sleep(0.1)


def _proc_tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def cluster_processes(work_dir: Path) -> list[psutil.Process]:
    """Live processes started for the cluster in work_dir (master, worker, executors, Python daemons)."""
    marker = str(Path(work_dir).resolve())
    found = []
    for p in psutil.process_iter():
        try:
            if p.pid == os.getpid() or p.status() == psutil.STATUS_ZOMBIE:
                continue
            if p.environ().get(MARKER_ENV) == marker:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _stop_daemon(daemon: _Daemon, timeout: float) -> None:
    pgid = daemon.proc.pid  # start_new_session: the group id is the leader's pid
    _killpg(pgid, signal.SIGTERM)
    try:
        daemon.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        _killpg(pgid, signal.SIGKILL)
        daemon.proc.wait(timeout)


def _stop_all(daemons: list[_Daemon], work_dir: Path) -> None:
    # snapshot descendants first: pyspark.daemon calls setpgid(0, 0), so killpg misses it
    tree = [p for d in daemons if d.proc.poll() is None for p in _proc_tree(d.proc.pid)]
    for daemon in reversed(daemons):  # worker (and its executors) before the master
        if daemon.proc.poll() is None:
            _stop_daemon(daemon, STOP_TIMEOUT_S)
    leftovers = {p.pid: p for p in _alive(tree) + cluster_processes(work_dir)}
    for p in leftovers.values():
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    _, still = psutil.wait_procs(list(leftovers.values()), timeout=5)
    for d in daemons:
        d.log_file.close()
    still = _alive(still)
    if still:
        desc = ", ".join(f"{p.pid} {' '.join(p.cmdline())[:120]}" for p in still)
        raise ClusterError(f"processes survived SIGKILL: {desc}")


@contextmanager
def standalone_cluster(work_dir: Path, cores: int = 2, memory: str = "2g") -> Iterator[str]:
    """Start a Spark standalone master and one worker on 127.0.0.1 (separate JVMs), yield the master URL, stop both.

    Logs: work_dir/logs/{master,worker}.log; executor logs: work_dir/worker/app-*/<id>/stderr.
    On exit the worker's process group (worker + executors) then the master's are sent SIGTERM,
    then SIGKILL; any process still carrying the cluster's marker is killed too.
    """
    work_dir = Path(work_dir).resolve()
    props = _write_conf(work_dir)
    env = _cluster_env(work_dir)
    master_port, master_ui, worker_port, worker_ui = free_ports(4)
    daemons: list[_Daemon] = []
    try:
        master = _start("master", [
            _MASTER_CLASS, "--host", "127.0.0.1", "--port", str(master_port),
            "--webui-port", str(master_ui), "--properties-file", str(props),
        ], work_dir, env)
        daemons.append(master)
        _wait_for_log(master, _MASTER_READY, daemons, START_TIMEOUT_S)
        # Spark retries the next port if ours was taken meanwhile; trust the log, not our pick
        url_match = _wait_for_log(master, _MASTER_URL, daemons, START_TIMEOUT_S)
        master_url = url_match.group(1)
        worker = _start("worker", [
            _WORKER_CLASS, master_url, "--host", "127.0.0.1", "--port", str(worker_port),
            "--cores", str(cores), "--memory", memory, "--work-dir", str(work_dir / "worker"),
            "--webui-port", str(worker_ui), "--properties-file", str(props),
        ], work_dir, env)
        daemons.append(worker)
        _wait_for_log(worker, _WORKER_READY, daemons, START_TIMEOUT_S)
        yield master_url
    finally:
        _stop_all(daemons, work_dir)


def stop_active_session() -> bool:
    """Stop the process's SparkSession/SparkContext, if any; True if one was running.

    ``SparkSession.getActiveSession()`` only sees the session active in *this thread*; a session
    made elsewhere still holds the one SparkContext a process may have, so check that too.
    """
    stopped = False
    session = SparkSession.getActiveSession() or SparkSession._instantiatedSession
    if session is not None and session._sc._jsc is not None:
        session.stop()
        stopped = True
    sc = SparkContext._active_spark_context
    if sc is not None:
        sc.stop()
        stopped = True
    return stopped


def cluster_session(master_url: str, app_name: str = "backfill-test") -> SparkSession:
    """A SparkSession whose executors run on the standalone cluster at master_url.

    The caller must stop any running session first (``stop_active_session()``, or use
    ``cluster_session_ctx``): ``SparkSession.builder.master(url).getOrCreate()`` would otherwise
    silently return the existing local session, ignoring ``master`` and all non-SQL settings, so
    this raises instead. The driver JVM (py4j gateway) outlives ``stop()`` and is reused, so
    driver JVM options (spark.driver.memory, extraJavaOptions) cannot change here.
    Sets os.environ["PYSPARK_PYTHON"] = sys.executable: the driver sends that path to the
    executors, which otherwise start a bare ``python3`` without pyspark/pandas.
    """
    if SparkContext._active_spark_context is not None:
        raise RuntimeError(
            "a SparkContext is already running in this process; stop it first "
            "(sparkcluster.stop_active_session()) or use cluster_session_ctx()"
        )
    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (
        SparkSession.builder.master(master_url)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "4")
        # 1 core / 1g each: a 2-core 2g worker runs two executor JVMs for this one application
        .config("spark.executor.memory", "1g")
        .config("spark.executor.cores", "1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
        .getOrCreate()
    )
    if spark.sparkContext.master != master_url:
        raise RuntimeError(f"got a session on {spark.sparkContext.master}, not {master_url}")
    return spark


def executor_count(spark: SparkSession) -> int:
    """Registered executors, not counting the driver."""
    # pyspark's StatusTracker lacks getExecutorInfos; the JVM map lists the driver too
    return max(spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1, 0)


def wait_for_executors(spark: SparkSession, n: int, timeout: float = START_TIMEOUT_S) -> None:
    """Block until n executors registered (they start asynchronously after the session)."""
    deadline = time.monotonic() + timeout
    while executor_count(spark) < n:
        if time.monotonic() > deadline:
            raise ClusterError(f"{executor_count(spark)} of {n} executors after {timeout:.0f}s")
        time.sleep(0.2)


@contextmanager
def cluster_session_ctx(master_url: str, app_name: str = "backfill-test",
                        min_executors: int = 1) -> Iterator[SparkSession]:
    """Stop any running (local) session, yield a cluster session with min_executors up, stop it.

    The previous session is not restored; fixtures should recreate theirs lazily.
    """
    stop_active_session()
    spark = cluster_session(master_url, app_name)
    try:
        wait_for_executors(spark, min_executors)
        yield spark
    finally:
        spark.stop()
