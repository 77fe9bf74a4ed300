"""Part: io. The runs table: one manifest row per run (job, range, input versions, counts, duration, code version)."""
from __future__ import annotations

import datetime as dt
import json
import subprocess
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession


def code_version() -> str:
    """Package version plus the git commit of the checkout, when there is one."""
    from backfill import __version__

    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        sha = ""
    return f"{__version__}+{sha}" if sha else __version__


def has_run(spark: SparkSession, location: str, run_id: str) -> bool:
    """True when the runs table already has the manifest of `run_id`."""
    if location.endswith(".jsonl"):
        if not Path(location).is_file():
            return False
        with open(location) as fh:
            return any(json.loads(line).get("run_id") == run_id for line in fh if line.strip())
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    from backfill.io.delta import is_delta_table

    if not is_delta_table(location):
        return False
    # a small table read without a Spark job (a Spark count here cost seconds per run)
    found = DeltaTable(location).to_pyarrow_dataset().to_table(columns=["run_id"], filter=pc.field("run_id") == run_id)
    return found.num_rows > 0


def last_run(location: str | None, job: str, start: int | None, end: int | None) -> dict[str, Any] | None:
    """The newest manifest of `job` over exactly [start, end) in the runs table, with its counts parsed."""
    if location is None:
        return None
    rows: list[dict[str, Any]] = []
    if location.endswith(".jsonl"):
        if Path(location).is_file():
            with open(location) as fh:
                rows = [json.loads(line) for line in fh if line.strip()]
    else:
        from deltalake import DeltaTable

        from backfill.io.delta import is_delta_table

        if not is_delta_table(location):
            return None
        rows = DeltaTable(location).to_pyarrow_table(
            columns=["run_id", "job", "range_start", "range_end", "finished_at", "counts"]).to_pylist()
    mine = [r for r in rows if r.get("job") == job and r.get("range_start") == start and r.get("range_end") == end]
    if not mine:
        return None
    newest = max(mine, key=lambda r: r.get("finished_at") or "")
    return {**newest, "counts": json.loads(newest.get("counts") or "{}")}


def append_run(spark: SparkSession, location: str, summary: dict[str, Any], job_file: str) -> None:
    """Append the run manifest to the runs Delta table at `location` (or a .jsonl file)."""
    from backfill.io.delta import append_delta

    row = {
        "run_id": summary["run_id"], "job": summary["job"], "job_file": job_file,
        "finished_at": dt.datetime.now(dt.timezone.utc).isoformat(), "range_start": summary["start"],
        "range_end": summary["end"], "records_in": summary["records_in"], "duration_s": summary["duration_s"],
        "inputs": json.dumps(summary["inputs"]), "outputs": json.dumps(summary["sinks"]),
        "counts": json.dumps({k: summary[k] for k in ("records_read", "records_processed", "beyond_range",
                                                      "source_drops", "operators", "ledger")}),
        "code_version": code_version(),
    }
    if location.endswith(".jsonl"):  # a plain file of manifests, one per line
        Path(location).parent.mkdir(parents=True, exist_ok=True)
        with open(location, "a") as fh:
            fh.write(json.dumps(row) + "\n")
        return
    schema = ("run_id string, job string, job_file string, finished_at string, range_start long, range_end long, "
              "records_in long, duration_s double, inputs string, outputs string, counts string, code_version string")
    append_delta(spark, spark.createDataFrame([row], schema), location, metadata={"backfill.run_id": row["run_id"]})
