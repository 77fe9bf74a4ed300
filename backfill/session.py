"""Part: foundation. Spark session from a conf/ profile (`--profile` or BACKFILL_PROFILE; default `local`), or a
Spark Connect session (`--remote sc://HOST:PORT`, SPARK_REMOTE, or the resident engine of `backfill server`), or
the caller's own session (the Python API), checked for what backfill needs and never reconfigured."""
from __future__ import annotations

import os
import re
import shlex
import string
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import yaml

from backfill.errors import SessionError, SpecError
from backfill.resources import SPARK_PACKAGES, bundled, ivy_dir, jvm_file, jvm_lib

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, Observation

T = TypeVar("T")

CONF_DIR = Path(os.environ.get("BACKFILL_CONF", bundled("conf")))
# jars resolved by scripts/setup.sh from jvm/pom.xml (Delta, Spark's Kafka source), loaded with spark.jars; an
# installed wheel's from `backfill setup-jars`, run by the first session that misses them
JARS_DIR = Path(os.environ.get("BACKFILL_JARS", jvm_lib() / "spark"))
# backfill's own Spark operators (jvm/ops, built by scripts/setup.sh, shipped in the wheel): the ordering's
# running values, one-step aggregations
OPS_JAR = jvm_file("ops/backfill-ops.jar")
OPS_EXTENSION = "io.backfill.spark.OneStepAggregates"
DEFAULT_PROFILE = "local"
DELTA_CONF = {"spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
              "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog"}
# PySpark's DataFrame debugging records the Python call site of every API call (F.col, select, ...) in the
# JVM: five more round trips to the JVM per call and a walk of the Python stack. A run builds its plans from
# thousands of such calls: a 13-join job made 122,702 round trips with it and 36,017 without, and took
# 60 s instead of 32 s on a warm JVM. The call sites only enrich PySpark's own error log, which the CLI
# silences (quiet_python_logs); BACKFILL_DEBUG turns them back on, and a profile may set it too.
PYTHON_CONF = {"spark.python.sql.dataFrameDebugging.enabled": "false"}
# A join whose inputs are already partitioned by some of its keys reuses that partitioning. The stream join
# (ops/join.py) shuffles its records once by (task, key), then range-joins on (task, key, time bucket), groups
# per record and orders each record's pairs: with Spark's default every one of those steps shuffles again.
ENGINE_CONF = {"spark.sql.requireAllClusterKeysForCoPartition": "false"}
# A command run from the shell on a small input is over in seconds: there the JVM's optimizing compiler (C2)
# spends the run compiling code it never gets to reuse, and parallel GC threads compete for the same cores.
# The demo job (20,000 records, a new process each time) took 40-47 s with the defaults and 30-32 s with these
# options (benchmarks/README.md); a long run needs C2. Only a process that exits after its command uses
# them (`backfill ...`, not a library caller or a test's in-process session, whose JVM lives on).
SHORT_RUN_BYTES = 64 * 2**20
# C1 alone gets a 48 MB code cache: a `verify --run` of the join example filled it, and the JVM then prints its
# code-cache summary on stdout, in the middle of --json. Reserved address space, committed as used.
SHORT_RUN_OPTIONS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-XX:ReservedCodeCacheSize=256m")
_ONE_SHOT = {"process": False}


def one_shot_process() -> None:
    """Called by the console-script entry: this process runs one command and exits."""
    _ONE_SHOT["process"] = True


def profile_name(explicit: str | None = None) -> str:
    """The profile to use: explicit, else $BACKFILL_PROFILE, else local."""
    return explicit or os.environ.get("BACKFILL_PROFILE") or DEFAULT_PROFILE


def load_profile(name: str | None = None) -> dict[str, Any]:
    """Read conf/<name>.yaml, expanding ${ENV} references."""
    name = profile_name(name)
    file = CONF_DIR / f"{name}.yaml"
    if not file.is_file():
        known = ", ".join(sorted(p.stem for p in CONF_DIR.glob("*.yaml")))
        raise SpecError(f"--profile {name}: no {file}; profiles are: {known}")
    profile = yaml.safe_load(file.read_text()) or {}
    master = string.Template(str(profile.get("master", "local[2]"))).safe_substitute(os.environ)
    # unresolved: leave the master to spark-submit (or fail at start with a clear message)
    profile["master"] = None if "${" in master else master
    return profile


def apply_env(profile: dict[str, Any]) -> None:
    """Set the process environment Spark needs before the JVM starts."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers must use this venv (pyarrow)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    for key, value in (profile.get("env") or {}).items():
        os.environ.setdefault(key, str(value))


def get_spark(profile: str | None = None, input_bytes: int | None = None) -> Any:
    """The active SparkSession, else a Spark Connect session (`remote_url`), else a new one built from the profile;
    `input_bytes` (an estimate, None when unknown) picks the short-run JVM options for a small input in a
    one-shot process."""
    from pyspark.sql import SparkSession

    conf = load_profile(profile)  # a wrong --profile is an error even when a session is already running
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    url = remote_url(profile)
    if url is not None:
        return connect(url, conf)
    apply_env(conf)
    classic_mode()
    builder = SparkSession.builder
    options = driver_java_options(short=short_run(input_bytes))
    if options:
        builder = builder.config("spark.driver.extraJavaOptions", " ".join(options))
    if conf["master"]:
        builder = builder.master(conf["master"])
    for key, value in spark_settings(conf).items():
        builder = builder.config(key, value)
    with _jvm_stderr(jvm_log()):
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    quiet_python_logs()
    return spark


# PySpark marks the whole process as a Spark Connect client when a Connect session is created (and keeps the
# mark after that session stops, unless it started the server itself): every later SparkSession.builder then
# tries to connect, and pyspark.sql.functions build Connect columns that a classic DataFrame refuses
CONNECT_MARKS = ("SPARK_CONNECT_MODE_ENABLED", "SPARK_LOCAL_REMOTE")


def classic_mode() -> None:
    """Clear PySpark's Connect marks before backfill builds a session of its own (no --remote, no SPARK_REMOTE,
    no resident engine): the session is a classic one, whatever Connect session the process had before."""
    for key in CONNECT_MARKS:
        os.environ.pop(key, None)


def spark_settings(conf: dict[str, Any], say: Callable[[str], None] | None = None) -> dict[str, str]:
    """The settings of a session backfill builds from a profile (the resident engine's too): Delta, the engine's
    and the profile's settings, $BACKFILL_SPARK_CONF, and the jars (the pinned ones, backfill's operators)."""
    python = {} if os.environ.get("BACKFILL_DEBUG") else PYTHON_CONF
    profile_conf = {k: str(v) for k, v in (conf.get("config") or {}).items()}
    settings = {**DELTA_CONF, **ENGINE_CONF, **python, **profile_conf, **env_config()}
    # a cluster profile may name Maven coordinates instead of the pinned jars; an installed wheel without
    # `backfill setup-jars` resolves them once first; backfill's operators are loaded wherever they are built
    jars = project_jars(settings, say or notice) if "spark.jars.packages" not in settings else []
    if OPS_JAR.is_file():
        jars.append(str(OPS_JAR))
        # one aggregation where Spark plans two over rows spread by the grouping already (jvm/ops)
        settings["spark.sql.extensions"] = ",".join(filter(None, [settings.get("spark.sql.extensions"),
                                                                  OPS_EXTENSION]))
    if jars:
        settings["spark.jars"] = ",".join(filter(None, [settings.get("spark.jars"), *jars]))
    return settings


def notice(line: str) -> None:
    """One line on stderr for the person running the command (stdout stays the command's own, --json too)."""
    sys.stderr.write(f"note: {line}\n")
    sys.stderr.flush()


# ----------------------------------------------------------------------------- Spark Connect

_REMOTE: dict[str, str | None] = {"url": None}
# settings a client cannot give a Connect session: the server's JVM, its jars and its SQL extensions
_SERVER_ONLY = ("spark.app.", "spark.ui.", "spark.driver.", "spark.executor.", "spark.jars", "spark.master",
                "spark.sql.extensions", "spark.sql.catalog.spark_catalog", "spark.python.")
UTC_NAMES = ("UTC", "Etc/UTC", "GMT", "Etc/GMT", "Z", "+00:00", "Universal", "Zulu")


@contextmanager
def remote(url: str | None) -> Iterator[None]:
    """Within the block, sessions are Spark Connect sessions to `url` (the CLI's --remote; None: as before)."""
    saved = _REMOTE["url"]
    _REMOTE["url"] = url or saved
    try:
        yield
    finally:
        _REMOTE["url"] = saved


def remote_url(profile: str | None = None, say: Callable[[str], None] | None = None) -> str | None:
    """The Spark Connect address to use: --remote, else $SPARK_REMOTE, else the resident engine of `backfill
    server` when it runs for the same profile (BACKFILL_SERVER=0: never), else None (a session of its own)."""
    url = _REMOTE["url"] or os.environ.get("SPARK_REMOTE")
    if url:
        if not url.startswith("sc://"):
            raise SpecError(f"--remote {url}: a Spark Connect address is sc://HOST:PORT (e.g. sc://127.0.0.1:15002)")
        return url
    if os.environ.get("BACKFILL_SERVER", "1").strip() in ("", "0"):
        return None
    from backfill.resources import resident_server, server_dir

    found = resident_server()
    if found is None or found.get("profile") != profile_name(profile):
        return None
    _touch(server_dir() / "server.used")  # a command counts as activity for the engine's idle timeout
    (say or notice)(f"using the resident engine at {found['url']} (`backfill server stop` ends it; "
                    "BACKFILL_SERVER=0 starts a session of its own)")
    return str(found["url"])


def _touch(file: Path) -> None:
    try:
        file.touch()
    except OSError:  # another user's folder: the engine's connections still count
        pass


def connect(url: str, conf: dict[str, Any]) -> Any:
    """A Spark Connect session to `url`, given the profile's session settings (its SQL settings; the server's
    own JVM, jars and extensions are the server's), then checked like any session backfill did not build."""
    from pyspark.sql import SparkSession

    _reachable(url)
    settings = {k: v for k, v in {**spark_settings(conf, say=lambda _: None), **env_config()}.items()
                if not k.startswith(_SERVER_ONLY)}
    spark = SparkSession.builder.remote(url).config(map=settings).getOrCreate()  # a setting refused is skipped
    quiet_python_logs()
    check_session(spark)
    return spark


def _reachable(url: str) -> None:
    """A one-line error at once when nothing listens at the address (the client would retry for minutes)."""
    import socket
    from urllib.parse import urlparse

    parsed = urlparse(url.replace("sc://", "http://", 1))
    host, port = parsed.hostname or "localhost", parsed.port or 15002
    try:
        socket.create_connection((host, port), timeout=5).close()
    except OSError as exc:
        raise SessionError(f"--remote {url}: no Spark Connect server answers at {host}:{port} ({exc.strerror or exc});"
                           " start one (`backfill server start` runs one here) or check the address") from None


def is_connect(spark: Any) -> bool:
    """True for a Spark Connect session (no JVM on this side: no sparkContext, no _jvm, no RDDs)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def jvm_operator(spark: Any, name: str) -> Any | None:
    """backfill's own JVM operator `name` (jvm/ops) where it is reachable: a classic session with backfill's jar
    loaded; None over Spark Connect (no JVM gateway on the client) or without the jar (the jar-less plan)."""
    if is_connect(spark):
        return None
    from py4j.java_gateway import JavaClass

    try:
        found = getattr(spark._jvm.io.backfill.spark, name)
    except Exception:  # noqa: BLE001 - a session without a JVM gateway
        return None
    return found if isinstance(found, JavaClass) else None


ORDERING_NOTE = ("ordering: backfill's own operator (jvm/ops RunningValues) is not reachable from this session "
                 "({why}), so the jar-less plan orders each task with Spark's windows: the same values; a task is "
                 "buffered whole (at 10M records about 1 s more CPU; a large input is ordered in chunks, each "
                 "stored once)")


def operator_note(spark: Any) -> str | None:
    """What the jar-less plan costs, when the session cannot reach backfill's operator (None when it can)."""
    if jvm_operator(spark, "RunningValues") is not None:
        return None
    why = "a Spark Connect session" if is_connect(spark) else "its jar is not loaded"
    return ORDERING_NOTE.format(why=why)


def check_session(spark: Any, delta: bool = True) -> list[str]:
    """Check a session backfill did not build (the caller's, a Connect server's) without changing it: raise
    SessionError naming what a run cannot do without (UTC, Delta when `delta`); return notes on what it does
    differently (the jar-less plan)."""
    zone = spark.conf.get("spark.sql.session.timeZone", None)
    if zone not in UTC_NAMES:
        raise SessionError(f"the session's time zone is {zone}: backfill needs spark.sql.session.timeZone=UTC "
                           "(window starts and timestamps parsed from text depend on it); set it on the session, "
                           "e.g. spark.conf.set('spark.sql.session.timeZone', 'UTC'): backfill never changes a "
                           "session it was given")
    if delta and not has_delta(spark):
        raise SessionError("the session has no Delta Lake (the job reads or writes Delta tables): build it with "
                           f"spark.jars.packages={SPARK_PACKAGES[0]}, spark.sql.extensions={DELTA_CONF['spark.sql.extensions']} "
                           f"and spark.sql.catalog.spark_catalog={DELTA_CONF['spark.sql.catalog.spark_catalog']} "
                           "(`backfill jars` lists every jar)")
    note = operator_note(spark)
    return [note] if note else []


def has_delta(spark: Any) -> bool:
    """Whether the session reads and writes Delta: its extension is configured, or (a platform with Delta built
    in) the `delta` data source resolves."""
    if "DeltaSparkSessionExtension" in (spark.conf.get("spark.sql.extensions", None) or ""):
        return True
    try:
        spark.read.format("delta").load(os.path.join(tempfile.gettempdir(), "backfill-no-such-table")).schema
    except Exception as exc:  # noqa: BLE001 - only the kind of failure is read
        text = str(exc)
        return "DATA_SOURCE_NOT_FOUND" not in text and "Failed to find the data source" not in text
    return True


def json_schema(texts: DataFrame) -> Any:
    """The schema Spark's JSON reader infers from a one-column frame of JSON texts, over Spark Connect (which has
    no Dataset[String] to hand the reader): the texts are written once as a text table and read back by the same
    reader. The folder must be one the server sees: $BACKFILL_SCRATCH, else this machine's temporary folder (a
    local server). Line breaks between a value's tokens become spaces (a text table holds one value a line)."""
    import shutil

    from pyspark.sql import functions as F

    scratch = os.environ.get("BACKFILL_SCRATCH") or tempfile.gettempdir()
    folder = os.path.join(scratch, f"backfill-json-{os.getpid()}-{id(texts):x}")
    try:
        texts.select(F.regexp_replace(texts.columns[0], "[\r\n]", " ")).write.mode("overwrite").text(folder)
        return texts.sparkSession.read.json(folder).schema
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def default_parallelism(spark: Any) -> int:
    """Spark's default parallelism (the cores of a local session); over Spark Connect the setting or the
    shuffle partitions (the client cannot ask the scheduler)."""
    if not is_connect(spark):
        return int(spark.sparkContext.defaultParallelism)
    return int(spark.conf.get("spark.default.parallelism", None) or spark.conf.get("spark.sql.shuffle.partitions"))


def end_connect_session() -> None:
    """Release this process's Spark Connect session on its server (its stored blocks go with it), if any."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None and is_connect(active):
        active.stop()


def short_run(input_bytes: int | None) -> bool:
    """Whether a JVM started now gets the short-run options: a one-shot process, an input known to be small."""
    return _ONE_SHOT["process"] and input_bytes is not None and input_bytes <= SHORT_RUN_BYTES


def driver_java_options(record: bool = False, short: bool = False) -> list[str]:
    """The driver JVM's options: quiet logging from the first line on, the short-run options (`short`), and
    the class archive when there is one for this JVM and classpath and `use_class_archive(short)` (`record`:
    started to write one, scripts/class_archive.py)."""
    options = []
    log4j = CONF_DIR / "log4j2.properties"
    if log4j.is_file():
        options.append(f"-Dlog4j2.configurationFile=file:{log4j}")
    if record:  # jcmd's dump notices (classes it leaves out) go to the JVM log too
        options += ["-XX:+RecordDynamicDumpInfo", "-Xlog:disable", "-Xlog:all=warning:stderr"]
    elif use_class_archive(short):
        archive = class_archive()
        if archive is not None and archive.is_file():
            # a stale or foreign archive is ignored by the JVM (-Xshare:auto); its notice goes to the JVM log
            options += [f"-XX:SharedArchiveFile={archive}", "-Xlog:disable", "-Xlog:all=warning:stderr"]
    own = shlex.split(os.environ.get("BACKFILL_JAVA_OPTIONS", ""))
    if short:  # a machine's own choice of collector wins: a JVM refuses to start with two
        picks_gc = any(re.fullmatch(r"-XX:\+Use\w+GC", o) for o in own)
        options += [o for o in SHORT_RUN_OPTIONS if not (picks_gc and o.endswith("GC"))]
    # one machine's own JVM options, after ours: the JVM takes the last value of a flag
    return options + own


def use_class_archive(short: bool) -> bool:
    """BACKFILL_CLASS_ARCHIVE=1: every driver maps the class archive; set but empty or 0: none does; unset: a
    short run does (a small job in a new process started 2-3 s sooner with it, 13.1-13.6 s against 16.5-18.3 s
    for a 60-record job), a long one does not (10M-record runs measured slower with it: median exact/inexact
    1.96 and 2.05 against 1.58 without, in the same hour)."""
    setting = os.environ.get("BACKFILL_CLASS_ARCHIVE")
    if setting is None:
        return short
    return setting.strip() not in ("", "0")


def class_archive() -> Path | None:
    """Where the class archive of this JVM, pyspark and jar set lives (jvm/lib/cds/<hash>.jsa), or None
    without a `java` to start.

    A JVM maps the archive instead of loading and verifying Spark's classes one by one: measured here, a
    session starts in 4.6 s instead of 6.6 s and its first query takes 1.9 s instead of 3.0 s. The name
    changes with the java binary, pyspark's version and the jars, so a changed setup never uses an old one.
    """
    import hashlib
    import shutil

    import pyspark

    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not java:
        return None
    real = Path(java).resolve()
    try:
        stamp = real.stat().st_mtime_ns
    except OSError:
        return None
    jars = sorted(p.name for p in JARS_DIR.glob("*.jar")) if JARS_DIR.is_dir() else []
    key = "\n".join([str(real), str(stamp), pyspark.__version__, *jars])
    return JARS_DIR.parent / "cds" / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.jsa"


def env_config() -> dict[str, str]:
    """Spark settings from $BACKFILL_SPARK_CONF (`key=value,key=value`), over the profile's: one machine's
    adjustment without a profile of its own (the test suite gives each of its Spark drivers a smaller heap)."""
    text = os.environ.get("BACKFILL_SPARK_CONF", "").strip()
    out = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SpecError(f"BACKFILL_SPARK_CONF: {item!r} is not key=value (e.g. spark.driver.memory=3g)")
        out[key.strip()] = value.strip()
    return out


def jvm_log() -> Path | None:
    """Where the JVM's own stderr goes (start-up notices, log4j errors); None with BACKFILL_DEBUG (the terminal)."""
    if os.environ.get("BACKFILL_DEBUG"):
        return None
    folder = Path(tempfile.gettempdir()) / f"backfill-{os.getuid()}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / "spark.log"


@contextmanager
def _jvm_stderr(log: Path | None) -> Iterator[None]:
    """Start the JVM with its stderr on `log`: it inherits fd 2 at launch and keeps it for its lifetime.

    The JVM prints start-up notices a user cannot act on (an incubator-module warning, Spark's default
    log level); the CLI reports failures itself, in one line.
    """
    if log is None:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    target = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(target, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(target)


def project_jars(settings: dict[str, str] | None = None, say: Callable[[str], None] = notice) -> list[str]:
    """The jars of jvm/lib/spark that pyspark does not ship itself (same artifact name: pyspark's wins).

    An installed wheel without them (no `backfill setup-jars` yet) resolves them first, once, as
    `backfill setup-jars` does (a notice says so); with `settings` None it only reports them missing ([]).
    """
    import pyspark

    if not JARS_DIR.is_dir() or not any(JARS_DIR.glob("*.jar")):
        from backfill.resources import checkout

        if checkout() is not None:
            raise SpecError(f"{JARS_DIR}: the pinned jars (Delta, Spark's Kafka source) are missing; run "
                            "scripts/setup.sh once (it resolves them with Maven)")
        if settings is None:
            return []
        say(f"the pinned jars are not in {JARS_DIR} yet: resolving them once with Spark's resolver, as "
            "`backfill setup-jars` does (every later session finds them there)")
        setup_jars(say)
    shipped = {_artifact(p.name) for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    return [str(p) for p in sorted(JARS_DIR.glob("*.jar")) if _artifact(p.name) not in shipped]


def job_jars(packages: bool = False) -> list[str]:
    """What a session of one's own needs for backfill (`backfill jars`): the pinned jars as files (or, with
    `packages` or without them, their Maven coordinates for spark.jars.packages) and backfill's operators' jar."""
    files = [] if packages else project_jars(None, say=lambda _: None)
    pinned = files or list(SPARK_PACKAGES)
    return pinned + ([str(OPS_JAR)] if OPS_JAR.is_file() and not packages else [])


def setup_jars(say: Callable[[str], None] = notice) -> list[str]:
    """Resolve the pinned Maven coordinates with Spark's own resolver (Ivy, cached in ivy_dir()) and copy the jars
    into JARS_DIR, where every later session finds them (`backfill setup-jars`); returns their paths."""
    import shutil
    import subprocess

    from pyspark.find_spark_home import _find_spark_home

    from backfill.errors import SourceError

    say(f"resolving {', '.join(SPARK_PACKAGES)} with Spark's resolver (Ivy, cache {ivy_dir()})")
    # Spark's resolver looks in ~/.m2/repository first and, where a module's pom is there without its jar (as
    # Maven leaves a dependency it only read), fails instead of downloading the jar: it is given a home of its
    # own, so its chain is the Ivy cache and the remote repositories only
    home = ivy_dir() / "home"
    home.mkdir(parents=True, exist_ok=True)
    submit_opts = " ".join(filter(None, [os.environ.get("SPARK_SUBMIT_OPTS"), f"-Duser.home={home}"]))
    with tempfile.TemporaryDirectory(prefix="backfill-jars-") as tmp:
        script = Path(tmp) / "nothing.py"
        script.write_text("")  # spark-submit resolves --packages before it starts the application
        done = subprocess.run([str(Path(_find_spark_home()) / "bin" / "spark-submit"), "--packages",
                               ",".join(SPARK_PACKAGES), "--conf", f"spark.jars.ivy={ivy_dir()}", str(script)],
                              capture_output=True, text=True, timeout=1800,
                              env={**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_SUBMIT_OPTS": submit_opts})
    resolved = ivy_dir() / "jars"
    if done.returncode != 0 or not any(resolved.glob("*.jar")):
        last = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
        raise SourceError(f"Spark could not resolve {', '.join(SPARK_PACKAGES)} ({last}); check the network, or "
                          "name a mirror with BACKFILL_SPARK_CONF=spark.jars.repositories=URL")
    JARS_DIR.mkdir(parents=True, exist_ok=True)
    for jar in sorted(resolved.glob("*.jar")):  # Ivy names them organization_artifact-version.jar
        org, sep, rest = jar.name.partition("_")
        shutil.copy2(jar, JARS_DIR / (rest if sep and "." in org else jar.name))
    return [str(j) for j in sorted(JARS_DIR.glob("*.jar"))]


def _artifact(jar: str) -> str:
    """`delta-spark_4.1_2.13-4.3.1.jar` -> `delta-spark_4.1_2.13` (the name without its version)."""
    return re.sub(r"-\d[\w.\-]*\.jar$", "", jar)


def quiet_python_logs() -> None:
    """PySpark logs every analysis error with a JSON dump; the CLI reports it in one line instead."""
    import logging

    if not os.environ.get("BACKFILL_DEBUG"):
        for name in ("DataFrameQueryContextLogger", "SQLQueryContextLogger"):
            logging.getLogger(name).disabled = True


def shallow(frame: DataFrame, held: list[DataFrame]) -> DataFrame:
    """Over Spark Connect, `frame` stored once (a local checkpoint, appended to `held` for the caller to release):
    the client encodes a plan as nested protobuf messages, which may not nest deeper than 100, and a plan built
    from many steps goes past that; a plan built on the stored frame starts from one level. A classic session's
    frame is returned as it is."""
    if not is_connect(frame.sparkSession):
        return frame
    stored = frame.localCheckpoint(eager=True)
    held.append(stored)
    return stored


def computed_once(frame: DataFrame) -> DataFrame:
    """`frame` computed by the first job that reads it and stored there (a lazy local checkpoint): every later
    plan reads the stored rows, however it reads the frame. For a Python kernel's output that later steps join
    back to frames derived from it. Spark's cache (`persist`) is found by plan, and a plan reading a frame twice
    (a self-join) gets a re-instanced copy of one side, with new attribute ids, that the cache does not find: a
    persisted session kernel ran 5 to 7 times per run (once with this; a 15-operator conformance job of 522
    records, 105 s -> 59 s). Free it with `release` (an OperatorResult's `cached` frames are)."""
    return frame.localCheckpoint(eager=False)


def release(checkpointed: DataFrame) -> None:
    """Free a local checkpoint's blocks now (Spark keeps them for the session's lifetime otherwise). Over Spark
    Connect the server frees them when the client drops the DataFrame, or with the session."""
    if is_connect(checkpointed.sparkSession):
        return
    plan = checkpointed._jdf.queryExecution().analyzed()
    if plan.getClass().getSimpleName() == "LogicalRDD":
        plan.rdd().unpersist(False)


def together(calls: list[Callable[[], T]], undo: Callable[[T], None] | None = None, workers: int = 4) -> list[T]:
    """Run independent Spark actions (a sink's write, a table's commit) from threads; results in order.

    Small outputs spend their time on the driver, in Spark's planning and Delta's log work, one job after
    the other; run side by side they overlap that latency. Every call runs to its end; the first failure,
    in the calls' order, is raised after all have ended (nothing is left running behind an error), and
    `undo` is then given each result of the calls that succeeded.
    """
    from concurrent.futures import ThreadPoolExecutor

    from pyspark import inheritable_thread_target
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    # each thread gets the caller's local properties (job group, description), as PySpark asks of thread pools
    inherit = inheritable_thread_target(active) if active is not None else (lambda call: call)
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(calls))), thread_name_prefix="backfill") as pool:
        futures = [pool.submit(inherit(call)) for call in calls]
    failed = next((f.exception() for f in futures if f.exception() is not None), None)
    if failed is None:
        return [f.result() for f in futures]
    for f in futures:
        if undo is not None and f.exception() is None:
            undo(f.result())
    raise failed


def observed(seen: Observation, frame: DataFrame, columns: list[Column]) -> dict[str, Any]:
    """An Observation's values, or, when Spark observed nothing (it skips the pass over an empty plan), the
    same aggregations over `frame` in one job."""
    try:
        found = seen.get
    except Exception:  # noqa: BLE001 - py4j's error: the observation's row was never filled
        found = None
    if found:  # a Spark Connect observation not filled is empty
        return found
    return frame.agg(*columns).first().asDict()  # type: ignore[union-attr]


def observation_done(seen: Observation) -> bool:
    """Whether an action has filled the Observation's values: a classic one's JVM future has completed, a Spark
    Connect one's values came back with an action's result."""
    if hasattr(seen, "_result"):  # Spark Connect's
        return bool(seen._result)
    jo = getattr(seen, "_jo", None)
    return jo is not None and bool(jo.future().isCompleted())


def catalog_table(name: str) -> tuple[str, bool]:
    """A catalog table's location (a local path when it is one) and whether it exists, through the session's catalog
    (`spark.sql.catalogImplementation`: `hive` for a metastore, else Spark's in-memory catalog). A table that does
    not exist yet is placed where the catalog would create it (its warehouse)."""
    spark = get_spark()
    if is_connect(spark):
        return _catalog_table_connect(spark, name)
    jvm = spark._jvm
    parts = name.split(".")
    catalog = jvm.scala.Some(parts[0]) if len(parts) == 3 else jvm.scala.Option.empty()
    ident = jvm.org.apache.spark.sql.catalyst.TableIdentifier(parts[-1], jvm.scala.Some(parts[-2]), catalog)
    sessions = spark._jsparkSession.sessionState().catalog()
    if not sessions.databaseExists(parts[-2]):
        raise SpecError(f"table {name}: the catalog has no database {parts[-2]} (CREATE DATABASE {parts[-2]}, or "
                        "check spark.sql.catalogImplementation and the metastore settings)")
    exists = bool(sessions.tableExists(ident))
    location = str(sessions.getTableMetadata(ident).location().toString() if exists else
                   sessions.defaultTablePath(ident).toString())
    return (location[len("file:"):] if location.startswith("file:") else location), exists


def _catalog_table_connect(spark: Any, name: str) -> tuple[str, bool]:
    """catalog_table over Spark Connect (no JVM gateway): the catalog API and DESCRIBE TABLE EXTENDED; a table not
    created yet goes where Spark's session catalog puts one (`<warehouse>/<db>.db/<table>`, default: no `.db`)."""
    parts = name.split(".")
    database = ".".join(parts[:-1])
    if not spark.catalog.databaseExists(database):
        raise SpecError(f"table {name}: the catalog has no database {parts[-2]} (CREATE DATABASE {parts[-2]}, or "
                        "check spark.sql.catalogImplementation and the metastore settings)")
    exists = bool(spark.catalog.tableExists(name))
    if exists:
        rows = spark.sql(f"DESCRIBE TABLE EXTENDED {name}").collect()
        location = next((str(r["data_type"]) for r in rows if r["col_name"] == "Location"), "")
    else:
        warehouse = str(spark.conf.get("spark.sql.warehouse.dir")).rstrip("/")
        folder = warehouse if parts[-2] == "default" else f"{warehouse}/{parts[-2]}.db"
        location = f"{folder}/{parts[-1]}"
    return (location[len("file:"):] if location.startswith("file:") else location), exists
