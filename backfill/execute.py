"""Part: commands. Load, plan and run one job on the engine asked for (the `run` command, the demo, conformance)."""
from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console

from backfill.errors import SpecError


def execute(job: Path, start: int | None, end: int | None, profile: str | None, engine: str,
            err: Console, quiet: bool = False) -> dict[str, Any]:
    """Load, plan and run a job; return the summary as a dict."""
    from backfill.plan.builder import build_plan
    from backfill.jobspec import load_job

    the_plan = build_plan(load_job(job), start, end)
    if engine == "reference":
        from backfill.reference.engine import run_reference

        return run_reference(the_plan.job, start, end).to_dict()
    if engine != "spark":
        raise SpecError(f"--engine {engine!r} is not an engine; use spark or reference")
    from backfill.io.lock import holding
    from backfill.plan.evaluator import run_plan
    from backfill.session import get_spark

    with holding(the_plan.written_paths, the_plan.job.spec.name), \
            err.status("starting Spark", spinner="dots") if not quiet and sys.stderr.isatty() else _nullctx() as status:
        spark = get_spark(profile, input_bytes=the_plan.job.input_bytes())

        def progress(stage: str) -> None:
            if status is not None:
                status.update(stage)
            elif not quiet:
                err.print(f"[dim]- {stage}[/]", highlight=False)

        summary = run_plan(the_plan, spark, progress).to_dict()
        register_tables(spark, the_plan.job)
        return summary


def register_tables(spark: Any, job: Any) -> None:
    """Register the sink tables (`table:`) a publish created: the catalog then names the Delta table written at
    the location it gave (jobspec/load.py)."""
    import os

    for sink in job.spec.sinks.values():
        if sink.table and sink.path and os.path.isdir(os.path.join(sink.path, "_delta_log")):
            location = sink.path.replace("\\", "\\\\").replace("'", "\\'")
            spark.sql(f"CREATE TABLE IF NOT EXISTS {sink.table} USING delta LOCATION '{location}'")


@contextmanager
def _nullctx() -> Iterator[None]:
    yield None
