"""jobs/clicks_impressions.yaml: left and outer joins over the bundled sample, Spark equal to the reference."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from backfill.cli import app
from tests.conftest import REPO, read_jsonl

pytestmark = [pytest.mark.spark, pytest.mark.slow]
OPS = ("click_attribution", "impression_outcome")


def _copy_example(tmp: Path) -> Path:
    """The job, its sample and schemas in the same layout, so the job's relative paths hold."""
    shutil.copytree(REPO / "jobs" / "samples", tmp / "jobs" / "samples")
    shutil.copy(REPO / "jobs" / "clicks_impressions.yaml", tmp / "jobs")
    shutil.copytree(REPO / "schemas", tmp / "schemas")
    return tmp / "jobs" / "clicks_impressions.yaml"


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory, spark_module: object) -> tuple[Path, dict, dict]:
    """The example job run once on Spark over its whole sample: (job file, summary, rows per sink)."""
    job = _copy_example(tmp_path_factory.mktemp("example"))
    run = CliRunner().invoke(app, ["run", str(job), "--json"])
    assert run.exit_code == 0, run.stderr
    out = job.parent.parent / "out" / "clicks_impressions"
    return job, json.loads(run.stdout), {name: read_jsonl(out / f"{name}.jsonl") for name in (*OPS, "ledger")}


def test_clicks_impressions_example_runs_and_matches_the_reference(example):
    job, summary, full = example
    ref_run = CliRunner().invoke(app, ["run", str(job), "--json", "--engine", "reference"])
    assert ref_run.exit_code == 0, ref_run.stderr
    ref = json.loads(ref_run.stdout)
    for name in OPS:
        assert sorted(json.dumps(r, sort_keys=True) for r in full[name]) == sorted(
            json.dumps(r, sort_keys=True) for r in ref["outputs"][name])
        assert summary["operators"][name]["incomplete_windows"] == len(ref["incomplete"][name])
    unattributed = [r for r in full["click_attribution"] if r["value"]["impression_ad"] is None]
    assert 0 < len(unattributed) < len(full["click_attribution"])
    assert any(r["key"] is None for r in unattributed)  # a click without a user: forwarded at once (10.2 step 2)
    assert {(r["value"]["shown"] is None, r["value"]["clicked"] is None) for r in full["impression_outcome"]} == {
        (False, False), (False, True), (True, False)}
    assert summary["ledger"] == {"null_value": 8}  # 4 null-valued impressions, skipped by each join


def test_a_ranged_run_writes_exactly_the_full_runs_rows_in_range(example, tmp_path):
    """--start/--end select join rows by ts; the warm-up makes them equal to a full run's (emit_seq aside:
    a ranged run numbers fewer records)."""
    _, _, full = example
    job = _copy_example(tmp_path)
    out = tmp_path / "out" / "clicks_impressions"
    ranged = CliRunner().invoke(app, ["run", str(job), "--start", "2026-01-01T00:08:00Z",
                                      "--end", "2026-01-01T00:12:00Z"])
    assert ranged.exit_code == 0, ranged.stderr
    lo, hi = 1_767_225_600_000 + 8 * 60_000, 1_767_225_600_000 + 12 * 60_000

    def rows(rs: list[dict], col: str) -> list[str]:
        return sorted(json.dumps({k: v for k, v in r.items() if k != "emit_seq"}, sort_keys=True) for r in rs
                      if lo <= r[col] < hi)

    for name, col in [(OPS[0], "ts"), (OPS[1], "ts"), ("ledger", "range_time")]:
        assert rows(read_jsonl(out / f"{name}.jsonl"), col) == rows(full[name], col)
        assert len(rows(full[name], col)) > (0 if name == "ledger" else 100)


def test_the_example_stream_sample_is_what_the_simulation_writes():
    """jobs/samples/click_attribution_stream.jsonl is scripts/join_sample.py's output (regenerated, equal)."""
    from backfill.demo.join_stream import simulate_join

    rows, facts = simulate_join(REPO / "jobs" / "clicks_impressions.yaml", "click_attribution")
    assert rows == read_jsonl(REPO / "jobs" / "samples" / "click_attribution_stream.jsonl")
    assert (len(facts["throttled"]), len(facts["lagged"]), len(facts["duplicated"]), len(facts["ran_on"])) \
        == (2, 2, 2, 1)


def test_verify_explains_every_planted_difference_of_the_join(example):
    """`backfill verify` on the example (its `verify` section): each planted difference with its cause, the
    proof attached, nothing unexplained (exit 0)."""
    from backfill.demo.join_stream import simulate_join

    job, _, _ = example
    _, facts = simulate_join(job, "click_attribution")
    report = job.parent.parent / "verify-report"
    done = CliRunner().invoke(app, ["verify", str(job), "--report", str(report)])
    assert done.exit_code == 0, done.stderr
    out = json.loads((report / "report.json").read_text())
    assert out["verdict"] == "explained"
    assert {c: n for c, n in out["causes"].items() if n} == {"emit_throttle": 2, "partner_after_close": 2,
                                                            "duplicate_delivery": 2, "range_boundary": 1}
    section = out["sections"][0]
    assert section["counts"]["match"] == 648 and section["counts"]["moved_in_stream"] == 2
    found = {(s["cause"], f"{s['key']}@{s['ts']}") for s in section["samples"] if s["cause"]}
    assert {("emit_throttle", x) for x in facts["throttled"]} <= found
    assert {("partner_after_close", x) for x in facts["lagged"]} <= found
    assert {("duplicate_delivery", x) for x in facts["duplicated"]} <= found
    assert {("range_boundary", x) for x in facts["ran_on"]} <= found
    lagged = next(s for s in section["samples"] if s["cause"] == "partner_after_close")
    assert [r["status"] for r in lagged["inputs"]] == ["unmatched record", "partner"]
    assert "before its joined row" in lagged["detail"]
