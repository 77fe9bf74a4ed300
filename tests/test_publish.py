"""Range backfills published to Delta: exact at the range edges, idempotent, crash-safe (docs/semantics.md §6)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from deltalake import DeltaTable
from typer.testing import CliRunner

from backfill.cli import app
from backfill.demo import generate_clicks

pytestmark = [pytest.mark.spark, pytest.mark.slow]
REPO = Path(__file__).resolve().parent.parent
MINUTE = 60_000
T0 = 1_704_067_200_000  # 2024-01-01T00:00:00Z, the sample's first timestamp


HOPPING = "{type: hopping, size: 5m, advance: 1m, grace: 30s}"


def _job(tmp: Path, emit: str = "updates", window: str = HOPPING) -> Path:
    (tmp / "jobs").mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "schemas" / "click.json", tmp / "click.json")
    job = tmp / "jobs" / "clicks.yaml"
    job.write_text(f"""
name: clicks-range
sources:
  clicks: {{format: delta, path: ../bronze, value: {{format: json, schema: ../click.json}}}}
operators:
  - name: hop
    aggregate:
      input: clicks
      window: {window}
      aggregations: {{n: count(), amount: sum(value.amount)}}
      emit: {emit}
sinks:
  hop: {{format: delta, path: ../gold/hop}}
  _ledger: {{format: delta, path: ../ledger}}
""")
    return job


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("range")
    generate_clicks(str(root / "bronze"), n=4000, partitions=2, seed=3)
    return root


def _run(job: Path, *args: str) -> None:
    result = CliRunner().invoke(app, ["run", str(job), "--json", *args])
    assert result.exit_code == 0, result.stderr


def _rows(path: Path, cols: tuple[str, ...]) -> list[tuple]:
    """The rows, floats to 9 digits: a session's SQL sum of doubles is added in Spark's aggregation order, which
    the partitioning of a run may change in the last bit (579.32 against 579.3199999999999 once)."""
    table = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    rounded = (tuple(round(r[c], 9) if isinstance(r[c], float) else r[c] for c in cols) for r in table)
    return sorted(rounded, key=repr)  # repr: tombstones hold nulls


def _ranked(rows: list[tuple]) -> list[tuple]:
    """emit_seq numbers one run's emissions; compare each window's updates by their order instead."""
    if not rows or len(rows[0]) < 7:
        return rows
    ranked, seen = [], {}
    for r in sorted(rows, key=lambda r: r[6]):
        seen[(r[0], r[1])] = seen.get((r[0], r[1]), 0) + 1
        ranked.append((*r[:6], seen[(r[0], r[1])]))
    return sorted(ranked, key=repr)


@pytest.mark.parametrize("window", [HOPPING, "{type: sliding, time_difference: 20s, grace: 30s}",
                                    "{type: session, gap: 20s, grace: 30s}"])
@pytest.mark.parametrize("emit", ["updates", "final"])
def test_range_run_equals_the_full_run_inside_the_range(tmp_path, sample, spark, emit, window):
    """Warm-up and cool-down are exact: the same rows as a full replay, for the windows in range."""
    full, ranged = tmp_path / "full", tmp_path / "ranged"
    for root in (full, ranged):
        shutil.copytree(sample / "bronze", root / "bronze")
    _run(_job(full, emit, window))
    start, end = T0 + 3 * MINUTE, T0 + 9 * MINUTE + 30_000  # an end that is not on a window boundary
    _run(_job(ranged, emit, window), "--start", str(start), "--end", str(end))
    cols = ("key", "window_start", "window_end", "n", "amount", "ts") + (("emit_seq",) if emit == "updates" else ())
    expected = _ranked([r for r in _rows(full / "gold" / "hop", cols) if start <= r[1] < end])
    assert expected and _ranked(_rows(ranged / "gold" / "hop", cols)) == expected
    ledger_cols = ("offset", "partition", "reason", "window_start", "stream_time")
    late = [r[:-1] for r in _rows(full / "ledger", ledger_cols + ("range_time",)) if start <= r[-1] < end]
    got = _rows(ranged / "ledger", ledger_cols)
    if "sliding" not in window:
        assert sorted(late, key=repr) == got
    else:  # the cool-down (end + D + grace) is shorter than the sample's lateness: a straggler refused by a
        # window in range after it is past the cool-down (counted, not processed), so not in this ledger
        cut = end + 20_000 + 30_000
        assert {r for r in late if r[4] is None or r[4] < cut} <= set(got) <= set(late)


def test_rerunning_a_range_replaces_exactly_that_range(tmp_path, sample, spark):
    shutil.copytree(sample / "bronze", tmp_path / "bronze")
    job = _job(tmp_path)
    _run(job)
    table = tmp_path / "gold" / "hop"
    before = _rows(table, ("key", "window_start", "n", "emit_seq"))
    version = DeltaTable(str(table)).version()
    start, end = T0 + 4 * MINUTE, T0 + 8 * MINUTE
    _run(job, "--start", str(start), "--end", str(end))
    _run(job, "--start", str(start), "--end", str(end))
    assert DeltaTable(str(table)).version() == version + 2  # one commit per run
    assert _ranked(_rows(table, ("key", "window_start", "n", "emit_seq")))  # non-empty
    assert _rows(table, ("key", "window_start", "n")) == [r[:3] for r in before]


def test_a_run_killed_before_its_commit_leaves_the_table_as_it_was(tmp_path, sample, spark):
    shutil.copytree(sample / "bronze", tmp_path / "bronze")
    job = _job(tmp_path)
    _run(job)
    table = tmp_path / "gold" / "hop"
    version, before = DeltaTable(str(table)).version(), _rows(table, ("key", "window_start", "n"))
    env = {**os.environ, "BACKFILL_FAULT": "before_commit"}
    proc = subprocess.run([sys.executable, "-m", "backfill.cli", "run", str(job), "--start", str(T0),
                           "--end", str(T0 + 6 * MINUTE)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == -9  # SIGKILL right before the Delta commit
    assert DeltaTable(str(table)).version() == version
    assert _rows(table, ("key", "window_start", "n")) == before


def test_plan_explains_warm_up_and_cool_down(tmp_path, sample):
    shutil.copytree(sample / "bronze", tmp_path / "bronze")
    result = CliRunner().invoke(app, ["plan", str(_job(tmp_path)), "--start", "2024-01-01T00:10:00Z",
                                      "--end", "2024-01-01T00:20:00Z"])
    assert result.exit_code == 0, result.stderr
    assert "warm-up: records with timestamp >= 1704067800000" in result.stdout
    # last window start in range 00:19, closes at 00:19 + 5m + 30s
    assert "close when stream time reaches 1704068670000" in result.stdout


def test_final_output_refuses_a_key_kept_by_two_tasks(tmp_path, spark):
    """emit: final is unique per (key, window_start) only if each key lives in one partition: else refuse."""
    (tmp_path / "jobs").mkdir()
    records = [(0, 0, "u", 1_000), (0, 1, "v", 2_000), (1, 0, "u", 3_000), (0, 2, "v", 200_000)]
    (tmp_path / "in.jsonl").write_text("".join(
        f'{{"topic": "t", "partition": {p}, "offset": {o}, "key": "{k}", "value": "x", "timestamp": {ts}}}\n'
        for p, o, k, ts in records))
    job = tmp_path / "jobs" / "split.yaml"
    job.write_text("""
name: split
sources:
  s: {format: jsonl, path: ../in.jsonl}
operators:
  - name: agg
    aggregate: {input: s, window: {type: tumbling, size: 1m, grace: 0ms}, aggregations: {n: count()}, emit: final}
sinks:
  agg: {format: delta, path: ../gold}
""")
    result = CliRunner().invoke(app, ["run", str(job)])
    assert result.exit_code == 2, result.output  # an error, not a difference
    assert "operators.agg: key 'u' occurs in several partitions" in result.stderr
    assert "nothing was published" in result.stderr
    assert not (tmp_path / "gold" / "_delta_log").exists()
