"""Part: foundation. Spark session from a conf/ profile (`--profile` or BACKFILL_PROFILE; default `local`)."""
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

from backfill.errors import SpecError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, Observation

T = TypeVar("T")

CONF_DIR = Path(os.environ.get("BACKFILL_CONF", Path(__file__).resolve().parent.parent / "conf"))
# jars resolved by scripts/setup.sh from jvm/pom.xml (Delta, Spark's Kafka source), loaded with spark.jars
JARS_DIR = Path(os.environ.get("BACKFILL_JARS", Path(__file__).resolve().parent.parent / "jvm" / "lib" / "spark"))
# backfill's own Spark operators (jvm/ops, built by scripts/setup.sh): the ordering's running values, one-step
# aggregations
OPS_JAR = Path(__file__).resolve().parent.parent / "jvm" / "lib" / "ops" / "backfill-ops.jar"
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
SHORT_RUN_OPTIONS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")
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
    """The active SparkSession, or a new one built from the profile; `input_bytes` (an estimate, None when
    unknown) picks the short-run JVM options for a small input in a one-shot process."""
    from pyspark.sql import SparkSession

    conf = load_profile(profile)  # a wrong --profile is an error even when a session is already running
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    apply_env(conf)
    builder = SparkSession.builder
    options = driver_java_options(short=short_run(input_bytes))
    if options:
        builder = builder.config("spark.driver.extraJavaOptions", " ".join(options))
    if conf["master"]:
        builder = builder.master(conf["master"])
    python = {} if os.environ.get("BACKFILL_DEBUG") else PYTHON_CONF
    profile_conf = {k: str(v) for k, v in (conf.get("config") or {}).items()}
    settings = {**DELTA_CONF, **ENGINE_CONF, **python, **profile_conf, **env_config()}
    # a cluster profile may name Maven coordinates instead of the pinned jars; backfill's operators are loaded
    # whenever setup built them
    jars = project_jars() if "spark.jars.packages" not in settings else []
    if OPS_JAR.is_file():
        jars.append(str(OPS_JAR))
        # one aggregation where Spark plans two over rows spread by the grouping already (jvm/ops)
        settings["spark.sql.extensions"] = ",".join(filter(None, [settings.get("spark.sql.extensions"),
                                                                  OPS_EXTENSION]))
    if jars:
        settings["spark.jars"] = ",".join(filter(None, [settings.get("spark.jars"), *jars]))
    for key, value in settings.items():
        builder = builder.config(key, value)
    with _jvm_stderr(jvm_log()):
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    quiet_python_logs()
    return spark


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


def project_jars() -> list[str]:
    """The jars of jvm/lib/spark that pyspark does not ship itself (same artifact name: pyspark's wins)."""
    import pyspark

    if not JARS_DIR.is_dir() or not any(JARS_DIR.glob("*.jar")):
        raise SpecError(f"{JARS_DIR}: the pinned jars (Delta, Spark's Kafka source) are missing; run "
                        "scripts/setup.sh once (it resolves them with Maven)")
    shipped = {_artifact(p.name) for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    return [str(p) for p in sorted(JARS_DIR.glob("*.jar")) if _artifact(p.name) not in shipped]


def _artifact(jar: str) -> str:
    """`delta-spark_4.1_2.13-4.3.1.jar` -> `delta-spark_4.1_2.13` (the name without its version)."""
    return re.sub(r"-\d[\w.\-]*\.jar$", "", jar)


def quiet_python_logs() -> None:
    """PySpark logs every analysis error with a JSON dump; the CLI reports it in one line instead."""
    import logging

    if not os.environ.get("BACKFILL_DEBUG"):
        for name in ("DataFrameQueryContextLogger", "SQLQueryContextLogger"):
            logging.getLogger(name).disabled = True


def release(checkpointed: DataFrame) -> None:
    """Free a local checkpoint's blocks now (Spark keeps them for the session's lifetime otherwise)."""
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
        return seen.get
    except Exception:  # noqa: BLE001 - py4j's error: the observation's row was never filled
        return frame.agg(*columns).first().asDict()  # type: ignore[union-attr]


def catalog_table(name: str) -> tuple[str, bool]:
    """A catalog table's location (a local path when it is one) and whether it exists, through the session's catalog
    (`spark.sql.catalogImplementation`: `hive` for a metastore, else Spark's in-memory catalog). A table that does
    not exist yet is placed where the catalog would create it (its warehouse)."""
    spark = get_spark()
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
