"""Part: io. A run's publish as one unit: stage every sink, journal, commit each, then the manifest.

1. every sink's new content is staged and audited (nothing visible changes);
2. a journal (`<runs table>.pending/<run>.json`) records what is staged and the manifest to append;
3. each sink is committed (one Delta commit, or one atomic swap; the sinks side by side);
4. the run manifest is appended to the runs table, naming the version of every sink: it is what
   tells a reader which versions belong together;
5. the journal is removed.
A run killed during 1 changes nothing (its staged folders are removed by the next run); killed during
3 or 4, the next run of the job first completes the journal (commits are idempotent, the manifest is
appended once), so the sinks end at the new versions together, named by one manifest.
"""
from __future__ import annotations

import functools
import json
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from backfill.errors import BackfillError, PublishError
from backfill.io.runs import append_run, has_run
from backfill.io.sinks import Staged, commit_staged, recover
from backfill.session import together

FAULT_POINTS = ("before_commit", "between_commits", "before_manifest")


def journal_dir(runs: str) -> Path:
    """Where the journals of a job's unfinished publishes are."""
    return Path(runs.rstrip("/") + ".pending")


def publish(spark: SparkSession, runs: str, job_file: str, staged: list[Staged], manifest: dict[str, Any],
            progress: Callable[[str], None] = lambda _: None) -> dict[str, dict[str, Any]]:
    """Commit every staged sink, then append `manifest` (with the sinks' versions); returns them by name."""
    journal = journal_dir(runs) / f"{manifest['run_id']}.json"
    journal.parent.mkdir(parents=True, exist_ok=True)
    tmp = journal.with_suffix(".tmp")
    tmp.write_text(json.dumps({"job_file": job_file, "staged": [s.to_dict() for s in staged], "manifest": manifest},
                              default=str))
    os.replace(tmp, journal)  # whole or absent
    return _complete(spark, runs, journal, progress)


def complete_pending(spark: SparkSession, runs: str, sinks: list[str]) -> list[str]:
    """Finish what killed runs of this job left: roll journals forward, then remove leftover staging."""
    done = []
    folder = journal_dir(runs)
    for journal in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        _complete(spark, runs, journal)
        done.append(f"completed the publish of run {journal.stem}, killed before it finished")
    for tmp in folder.glob("*.tmp") if folder.is_dir() else []:
        tmp.unlink()  # a journal never finished: its run had committed nothing
    for sink in sinks:
        done += recover(sink)
    return done


def _complete(spark: SparkSession, runs: str, journal: Path,
              progress: Callable[[str], None] = lambda _: None) -> dict[str, dict[str, Any]]:
    data = json.loads(journal.read_text())
    manifest = data["manifest"]
    sinks = [Staged(**item) for item in data["staged"]]
    done: list[str] = []
    lock = threading.Lock()

    def commit(staged: Staged) -> dict[str, Any]:
        progress(f"committing {staged.name}")
        result = commit_staged(spark, staged)
        with lock:
            done.append(staged.name)
            if len(done) == 1 and len(sinks) > 1:
                fault("between_commits")  # one sink committed, the others in flight or not begun
        return result

    fault("before_commit")
    # the sinks are independent tables, each commit idempotent: side by side (a kill at any moment leaves
    # some committed, and the journal commits the rest)
    results = dict(zip([s.name for s in sinks], together([functools.partial(commit, s) for s in sinks])))
    fault("before_manifest")
    manifest["sinks"] = results
    try:
        if not has_run(spark, runs, manifest["run_id"]):
            append_run(spark, runs, manifest, job_file=data["job_file"])
    except BackfillError:
        raise
    except Exception as exc:  # the outputs are published; say so rather than hide the manifest failure
        raise PublishError(f"{runs}: outputs were published but the run manifest could not be appended ({exc}); "
                           "the next run of the job appends it") from None
    journal.unlink()
    return results


def fault(point: str) -> None:
    """Test hook: BACKFILL_FAULT=<point> kills the process (SIGKILL) at that point of a publish."""
    if os.environ.get("BACKFILL_FAULT") == point:
        os.kill(os.getpid(), signal.SIGKILL)
