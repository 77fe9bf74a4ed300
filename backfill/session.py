"""Spark session from a conf/ profile (`--profile` or BACKFILL_PROFILE; default `local`)."""
from __future__ import annotations

import os
import string
import sys
from pathlib import Path
from typing import Any

import yaml

from backfill.errors import SpecError

CONF_DIR = Path(os.environ.get("BACKFILL_CONF", Path(__file__).resolve().parent.parent / "conf"))
DEFAULT_PROFILE = "local"


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


def get_spark(profile: str | None = None) -> Any:
    """The active SparkSession, or a new one built from the profile."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    conf = load_profile(profile)
    apply_env(conf)
    builder = SparkSession.builder
    log4j = CONF_DIR / "log4j2.properties"
    if log4j.is_file():  # quiet JVM logging from the first line on
        builder = builder.config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{log4j}")
    if conf["master"]:
        builder = builder.master(conf["master"])
    for key, value in (conf.get("config") or {}).items():
        builder = builder.config(key, str(value))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    quiet_python_logs()
    return spark


def quiet_python_logs() -> None:
    """PySpark logs every analysis error with a JSON dump; the CLI reports it in one line instead."""
    import logging

    if not os.environ.get("BACKFILL_DEBUG"):
        for name in ("DataFrameQueryContextLogger", "SQLQueryContextLogger"):
            logging.getLogger(name).disabled = True
