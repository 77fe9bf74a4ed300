"""Part: commands. Run one job on the engine asked for, with progress on the terminal (the `run` command, the demo,
conformance); the run itself is the Python API's (backfill/api.py `run_job`)."""
from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console


def execute(job: Path, start: int | None, end: int | None, profile: str | None, engine: str,
            err: Console, quiet: bool = False) -> dict[str, Any]:
    """Load, plan and run a job; return the summary as a dict (`run --json`)."""
    from backfill.api import run_job

    spinning = not quiet and sys.stderr.isatty() and engine == "spark"
    with err.status("starting Spark", spinner="dots") if spinning else _nullctx() as status:
        def progress(stage: str) -> None:
            if status is not None:
                status.update(stage)
            elif not quiet:
                err.print(f"[dim]- {stage}[/]", highlight=False)

        return run_job(job, start, end, profile=profile, engine=engine, progress=progress).to_dict()


@contextmanager
def _nullctx() -> Iterator[None]:
    yield None
