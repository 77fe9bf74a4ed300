"""One verified defects report per test run, shared by the reconciliation and browser tests."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def verified(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, dict[str, Any]]:
    """(report folder, exit code, report.json) of `backfill verify` on the defects timeline."""
    from backfill.session import get_spark
    from tests.verify.test_reconcile_causes import verify_defects

    get_spark("local")  # a live session (cluster tests may have stopped the previous one)

    return verify_defects(tmp_path_factory.mktemp("defects"))


def ran_job(folder: Path, job: str, rows: list[tuple[Any, Any, int, int]]) -> Path:
    """`job` (its source `s` reads inputs/s.jsonl) written to folder/job.yaml over `rows` (key, value, partition,
    timestamp; offsets in the order given, per partition), run by `backfill run`: the job's path."""
    from typer.testing import CliRunner

    from backfill.cli import app
    from tests.conftest import write_jsonl

    offsets: dict[int, int] = {}
    records = []
    for key, value, partition, ts in rows:
        records.append({"topic": "t", "partition": partition, "offset": offsets.get(partition, 0), "key": key,
                        "value": value, "timestamp": ts})
        offsets[partition] = offsets.get(partition, 0) + 1
    write_jsonl(folder / "inputs" / "s.jsonl", records)
    path = folder / "job.yaml"
    path.write_text(job)
    result = CliRunner().invoke(app, ["run", str(path), "--json"])
    assert result.exit_code == 0, result.stderr
    return path
