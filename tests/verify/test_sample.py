"""The bundled streaming output of the demo is deterministic and carries the defects it claims."""
from __future__ import annotations

from pathlib import Path

from backfill.demo import generate_clicks, install_job
from backfill.demo.stream import simulate


def test_stream_sample_is_deterministic_with_restarts_duplicates_and_open_windows(tmp_path: Path) -> None:
    generate_clicks(str(tmp_path / "data/bronze/clicks"), n=6_000)
    job = install_job(tmp_path)
    rows, facts = simulate(job, "clicks_per_user_1m")
    again, _ = simulate(job, "clicks_per_user_1m")
    assert rows == again
    assert len(facts["restarts_before"]) == 3 and facts["duplicated"] == 2
    assert facts["still_open_at_archive_end"] > 0
    keys = [(r["key"], r["window_start"]) for r in rows]
    assert len(keys) - len(set(keys)) == 2  # two results written twice
    for part in (0, 1):
        offsets = [r["offset"] for r in rows if r["partition"] == part]
        assert offsets == list(range(len(offsets)))
