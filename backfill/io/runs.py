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

    from backfill.io.delta import arrow_table, is_delta_table

    if not is_delta_table(location):
        return False
    # a small table read without a Spark job (a Spark count here cost seconds per run)
    found = arrow_table(location, columns=["run_id"], filter=pc.field("run_id") == run_id)
    return found.num_rows > 0


def read_runs(location: str | None) -> list[dict[str, Any]]:
    """Every manifest of the runs table (a Delta table or a .jsonl file), oldest first; none when it is absent."""
    if location is None:
        return []
    rows: list[dict[str, Any]] = []
    if location.endswith(".jsonl"):
        if Path(location).is_file():
            with open(location) as fh:
                rows = [json.loads(line) for line in fh if line.strip()]
    else:
        from backfill.io.delta import arrow_table, is_delta_table

        if not is_delta_table(location):
            return []
        rows = arrow_table(location).to_pylist()  # small: one row per run and interval
    for row in rows:
        row.setdefault("status", None)
        row["status"] = row["status"] or "published"  # manifests written before scheduled runs
    return sorted(rows, key=lambda r: r.get("finished_at") or "")


def last_run(location: str | None, job: str, start: int | None, end: int | None) -> dict[str, Any] | None:
    """The newest published manifest of `job` over exactly [start, end) in the runs table, with its counts parsed."""
    mine = [r for r in read_runs(location) if r.get("job") == job and r.get("range_start") == start
            and r.get("range_end") == end and r["status"] == "published"]
    if not mine:
        return None
    newest = mine[-1]
    return {**newest, "counts": json.loads(newest.get("counts") or "{}")}


RUNS_SCHEMA = ("run_id string, job string, job_file string, finished_at string, range_start long, range_end long, "
               "records_in long, duration_s double, inputs string, outputs string, counts string, "
               "code_version string, status string, mode string, pass_id string, fingerprint string, "
               "records_out long, records_dropped long, error string, data_reach long")


def append_run(spark: SparkSession | None, location: str, summary: dict[str, Any], job_file: str) -> None:
    """Append the run manifest to the runs Delta table at `location` (or a .jsonl file).

    A manifest is `status: published` (a run's publish completed), or `failed` (a scheduled run stopped:
    `error` says why; nothing of its range was published by it). Scheduled runs add `mode` (due, restate),
    `pass_id` (intervals run in one pass share it), `fingerprint` (the input per source and partition:
    count, max offset, checksum; what `--restate` compares) and `data_reach` (the newest timestamp every
    partition had reached: an interval published with windows still open is run again once it grows).
    """
    sinks = summary.get("sinks") or {}
    row = {
        "run_id": summary["run_id"], "job": summary["job"], "job_file": job_file,
        "finished_at": dt.datetime.now(dt.timezone.utc).isoformat(), "range_start": summary["start"],
        "range_end": summary["end"], "records_in": summary.get("records_in", 0),
        "duration_s": summary.get("duration_s", 0.0),
        "inputs": json.dumps(summary.get("inputs") or {}), "outputs": json.dumps(sinks),
        "counts": json.dumps({k: summary[k] for k in ("records_read", "records_processed", "beyond_range",
                                                      "source_drops", "operators", "ledger", "duplicates", "gaps",
                                                      "gaps_not_checked") if k in summary}),
        "code_version": code_version(), "status": summary.get("status", "published"),
        "mode": summary.get("mode", "manual"), "pass_id": summary.get("pass_id"),
        "fingerprint": json.dumps(summary["fingerprint"]) if summary.get("fingerprint") is not None else None,
        "records_out": sum(int(v.get("rows") or 0) for k, v in sinks.items() if k != "_ledger"),
        "records_dropped": summary.get("ledger_rows", 0), "error": summary.get("error"),
        "data_reach": summary.get("data_reach"),
    }
    if location.endswith(".jsonl"):  # a plain file of manifests, one per line
        Path(location).parent.mkdir(parents=True, exist_ok=True)
        with open(location, "a") as fh:
            fh.write(json.dumps(row) + "\n")
        return
    _append_delta_row(location, row)


_ARROW_TYPES = {"string": "string", "long": "int64", "double": "float64"}


def _append_delta_row(location: str, row: dict[str, Any]) -> None:
    """One commit appending one manifest, written from the driver (a Spark job per manifest cost a second);
    a runs table written before scheduled runs gets the new columns added (schema merge)."""
    import pyarrow as pa
    from deltalake import CommitProperties, write_deltalake

    from backfill.errors import PublishError

    fields = [pa.field(name, _ARROW_TYPES[kind]) for name, kind in
              (part.strip().split(" ") for part in RUNS_SCHEMA.split(","))]
    table = pa.Table.from_pylist([row], schema=pa.schema(fields))
    try:
        write_deltalake(location, table, mode="append", schema_mode="merge",
                        commit_properties=CommitProperties(custom_metadata={
                            "userMetadata": json.dumps({"backfill.run_id": row["run_id"]})}))
    except Exception as exc:  # noqa: BLE001 - one line, as every publish error
        raise PublishError(f"{location}: appending the run manifest failed ({str(exc).strip().splitlines()[0]})"
                           "; nothing was appended") from None
