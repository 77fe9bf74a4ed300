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
