"""Crashes and races against real processes: SIGKILL at every stage of a run, two runs at once.

Every table must be at its previous content or at the new one after a kill, never in between; the next
run completes a half-finished publish (or cleans what a killed run staged) and ends where a clean run ends.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import read_jsonl, write_jsonl

pytestmark = [pytest.mark.spark, pytest.mark.slow]
JOB = """
name: crashes
sources:
  s: {format: jsonl, path: in.jsonl}
operators:
  - name: agg
    aggregate: {input: s, window: {type: tumbling, size: 10s, grace: 2s}, aggregations: {n: count()}, emit: final}
sinks:
  agg: {format: delta, path: out/agg}
  _ledger: {format: jsonl, path: out/ledger.jsonl}
  _runs: {format: jsonl, path: out/runs.jsonl}
"""


def _records(n: int, late_every: int) -> list[dict[str, Any]]:
    return [{"topic": "t", "partition": i % 2, "offset": i // 2, "key": f"k{i % 2}-{i // 2 % 3}", "value": "v",
             "timestamp": 1000 * i - (9000 if late_every and i > 10 and i % late_every == 0 else 0)} for i in range(n)]


def _cli(folder: Path, *args: str, fault: str | None = None) -> subprocess.Popen[str]:
    env = {**os.environ, "BACKFILL_FAULT": fault or ""}
    return subprocess.Popen([sys.executable, "-m", "backfill.cli", "run", str(folder / "job.yaml"), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)


def _kill_at(folder: Path, line: str, *args: str) -> None:
    """Run and SIGKILL the whole process group as soon as it prints `line` (a progress line)."""
    proc = _cli(folder, *args)
    assert proc.stderr is not None
    for text in proc.stderr:
        if line in text:
            os.killpg(proc.pid, signal.SIGKILL)
            break
    proc.wait(120)


def _state(folder: Path) -> tuple[list[tuple[Any, ...]], list[dict[str, Any]]]:
    """The Delta output (read without Spark) and the JSONL ledger, sorted."""
    from deltalake import DeltaTable

    agg = sorted(tuple(r.values()) for r in DeltaTable(str(folder / "out" / "agg")).to_pyarrow_table().to_pylist())
    ledger = sorted(read_jsonl(folder / "out" / "ledger.jsonl"), key=lambda r: json.dumps(r, sort_keys=True))
    return agg, ledger


def _setup(folder: Path, records: list[dict[str, Any]]) -> Path:
    folder.mkdir()
    (folder / "job.yaml").write_text(JOB)
    write_jsonl(folder / "in.jsonl", records)
    return folder


def test_a_run_killed_at_any_stage_leaves_every_table_whole_and_the_next_run_completes(tmp_path):
    old_input, new_input = _records(60, 0), _records(60, 0) + _records(90, 7)[60:]
    expected = _setup(tmp_path / "expected", new_input)
    subject = _setup(tmp_path / "subject", old_input)
    runs = [_cli(expected), _cli(subject)]  # two folders, two runs at once
    for r in runs:
        r.communicate(timeout=300)
    assert [r.returncode for r in runs] == [0, 0]
    new, old = _state(expected), _state(subject)
    assert old != new
    write_jsonl(subject / "in.jsonl", new_input)  # late data arrived: the range must be republished

    _kill_at(subject, "- staging outputs")
    assert _state(subject) == old  # staged, never committed
    for point in ("before_commit", "between_commits", "before_manifest"):
        assert _cli(subject, fault=point).wait(300) == -signal.SIGKILL
        assert _state(subject)[0] in (old[0], new[0]) and _state(subject)[1] in (old[1], new[1])
    # between_commits committed the output but not the ledger: the journal says so
    assert list((subject / "out").glob("runs.jsonl.pending/*.json"))

    final = _cli(subject)
    out, err = final.communicate(timeout=300)
    assert final.returncode == 0, err
    assert _state(subject) == new
    assert not list((subject / "out").glob("*.staging-*")) and not list((subject / "out").glob("*.pending/*"))
    runs = read_jsonl(subject / "out" / "runs.jsonl")
    assert len({r["run_id"] for r in runs}) == len(runs)  # no manifest twice
    completed = [r for r in runs if json.loads(r["outputs"]).get("agg")]
    assert len(completed) >= 3  # the baseline, the rolled-forward publish, the final run


def test_two_runs_of_the_same_tables_at_once_one_wins_the_other_stops_cleanly(tmp_path):
    folder = _setup(tmp_path / "race", _records(60, 5))
    first = _cli(folder)
    assert first.stderr is not None
    for text in first.stderr:
        if "- reading sources" in text:
            break
    second = subprocess.run([sys.executable, "-m", "backfill.cli", "run", str(folder / "job.yaml")],
                            capture_output=True, text=True, timeout=120)
    assert second.returncode == 2
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1 and "another backfill run is writing it" in lines[0] and "nothing was written" in lines[0]
    first.stderr.read()
    assert first.wait(300) == 0
    runs = read_jsonl(folder / "out" / "runs.jsonl")
    assert len(runs) == 1 and _state(folder)[0]


def test_leftover_staging_of_a_killed_run_is_removed_by_the_next_run(tmp_path):
    folder = _setup(tmp_path / "left", _records(30, 0))
    for leftover in ("agg.staging-deadbeef", "ledger.jsonl.staging-cafe/new"):  # what a run killed mid-stage leaves
        (folder / "out" / leftover).mkdir(parents=True)
        (folder / "out" / leftover / "part-00000.parquet").write_bytes(b"half written")
    proc = _cli(folder)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert not list((folder / "out").glob("*.staging-*"))
