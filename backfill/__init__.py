"""Part: commands. backfill: re-derive what a Kafka Streams / Flink application emitted, in PySpark batch jobs.

The Python API (docs/python-api.md): `backfill.load_job(path)` gives a job to `.plan()`, `.run(spark)`,
`.verify(...)` and `.diff(...)`; `backfill.diff(old, new, on=...)` compares two outputs.
"""
from __future__ import annotations

__version__ = "0.1.0"

from backfill.api import Job, PlanResult, diff, jars, load_job  # noqa: E402 - after __version__, which every part reads
__all__ = ["Job", "PlanResult", "__version__", "diff", "jars", "load_job"]
