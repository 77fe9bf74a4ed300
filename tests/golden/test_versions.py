"""Golden timelines for the rules that changed between Kafka Streams releases (`kafka_streams:`), with the
outputs the real releases give (checked against them through TopologyTestDriver by the `jvm` test below).

- null keys: before 3.7 a null-key record never reaches a stream-stream join (no result, not counted as
  dropped, no stream-time advance); a null value is dropped before the join's stream time advances.
- the outer-store scan: before 3.8 the processing side's look-ahead decides for entries of both sides.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from backfill.cli import app
from backfill.conformance import check
from backfill.conformance.scenarios import Scenario, write_job


def _rec(side: str, offset: int, key: str | None, value: str | None, ts: int) -> dict[str, Any]:
    return {"side": side, "offset": offset, "key": key, "value": value, "timestamp": ts}


# left join, before 2 after 3 grace 1; task order: l0, l1, r0, l(null value)@30, l2
NULL_KEYS = Scenario(0, "join", {"how": "left", "before": 2, "after": 3, "grace": 1, "eager": False}, [
    _rec("left", 0, None, "l0", 5), _rec("left", 1, "a", "l1", 6), _rec("left", 2, "a", None, 30),
    _rec("left", 3, "b", "l2", 8), _rec("right", 0, "a", "r0", 7)])
# outer join, before 2 after 3 grace 1: l0 and r0 wait, l1 at 15 triggers the scan
OUTER_SCAN = Scenario(1, "join", {"how": "outer", "before": 2, "after": 3, "grace": 1, "eager": False}, [
    _rec("left", 0, "a", "l0", 10), _rec("right", 0, "b", "r0", 11), _rec("left", 1, "c", "l1", 15)])

# (version, scenario) -> (rows as (key, window, value, ts) in emission order, Kafka Streams' dropped records)
EXPECTED = {
    ("4.4.0", 0): ([(None, None, "l0|-", 5), ("a", None, "l1|r0", 7), ("b", None, "l2|-", 8)], 1),
    ("3.7.2", 0): ([(None, None, "l0|-", 5), ("a", None, "l1|r0", 7), ("b", None, "l2|-", 8)], 1),
    # l0 never reaches the join; the null value at 30 does not move stream time, so l2 still waits at the end
    ("3.6.2", 0): ([("a", None, "l1|r0", 7)], 1),
    ("4.4.0", 1): ([("a", None, "l0|-", 10), ("b", None, "-|r0", 11)], 0),
    # the left processor's look-ahead (3) keeps r0 (11 + 3 + 1 >= 15) open, and the scan stops there
    ("3.7.2", 1): ([("a", None, "l0|-", 10)], 0),
    ("3.6.2", 1): ([("a", None, "l0|-", 10)], 0),
}
SCENARIOS = [NULL_KEYS, OUTER_SCAN]


def _job(tmp: Path, version: str) -> Path:
    return write_job(tmp / version, [Scenario(s.id, s.kind, dict(s.config), [dict(r) for r in s.records])
                                     for s in SCENARIOS], name="versions", kafka_streams=version)


def _observed(summary: dict[str, Any], version: str) -> dict[int, tuple[list[tuple], int]]:
    index = check.Index(summary)
    out = {}
    for sc in SCENARIOS:
        seen = check.observe(sc, index, version)
        out[sc.id] = ([tuple(r) for r in seen.rows], seen.dropped)
    return out


@pytest.mark.parametrize("version", ["4.4.0", "3.7.2", "3.6.2"])
def test_reference_engine_follows_the_release(tmp_path: Path, version: str) -> None:
    summary, _ = check.reference_summary(_job(tmp_path, version))
    assert _observed(summary, version) == {i: EXPECTED[(version, i)] for i in (0, 1)}
    # l0: a result from 3.7 on, a null_key drop in the ledger before (the record is accounted for either way)
    null_keys = [(r["partition"], r["offset"]) for r in summary["ledger_rows"]
                 if r["reason"] == "null_key" and r["operator"] == NULL_KEYS.operator]
    assert null_keys == ([(0, 0)] if version == "3.6.2" else [])
    waiting = summary["incomplete"]
    assert any(r["ts"] == 8 for rows in waiting.values() for r in rows) == (version == "3.6.2")


@pytest.mark.spark
@pytest.mark.parametrize("version", ["4.4.0", "3.7.2", "3.6.2"])
def test_spark_engine_follows_the_release(tmp_path: Path, version: str) -> None:
    def execute(job: Path, engine: str) -> dict[str, Any]:
        result = CliRunner().invoke(app, ["run", str(job), "--json"])
        assert result.exit_code == 0, result.output
        return {}

    summary = check.spark_summary(_job(tmp_path, version), execute)
    assert _observed(summary, version) == {i: EXPECTED[(version, i)] for i in (0, 1)}
    null_keys = [(r["partition"], r["offset"]) for r in summary["ledger_rows"]
                 if r["reason"] == "null_key" and r["operator"] == NULL_KEYS.operator]
    assert null_keys == ([(0, 0)] if version == "3.6.2" else [])


@pytest.mark.jvm
@pytest.mark.parametrize("version", ["4.4.0", "3.7.2", "3.6.2"])
def test_the_expected_outputs_are_the_real_releases(tmp_path: Path, version: str) -> None:
    from backfill.conformance.harness import judge

    _, order = check.reference_summary(_job(tmp_path, version))
    scenarios = [Scenario(s.id, s.kind, dict(s.config), [dict(r) for r in s.records]) for s in SCENARIOS]
    check.attach_order(scenarios, order)
    reported, judged = judge(scenarios, version)
    assert reported == version
    assert {i: ([tuple(r) for r in judged[i].rows], judged[i].dropped) for i in (0, 1)} == \
        {i: EXPECTED[(version, i)] for i in (0, 1)}


def test_plan_shows_the_rules_in_force(tmp_path: Path) -> None:
    job = _job(tmp_path, "3.6.2")
    shown = CliRunner().invoke(app, ["plan", str(job)])
    assert shown.exit_code == 0 and "rules: Kafka Streams 3.6\n" in shown.stdout, shown.output
    default = job.read_text().replace('kafka_streams: "3.6.2"\n', "")
    (job.parent / "default.yaml").write_text(default)  # beside the job: its paths are relative to it
    shown = CliRunner().invoke(app, ["plan", str(job.parent / "default.yaml"), "--json"])
    assert shown.exit_code == 0 and '"kafka_streams": "4.4"' in shown.stdout


@pytest.mark.parametrize(("value", "message"), [
    ('"3.2"', "kafka_streams: '3.2': profiles exist for Kafka Streams 3.4 to the 4.4 line"),
    ('"latest"', "kafka_streams: 'latest' is not a Kafka Streams version; write the release line"),
    ('"5.0"', "kafka_streams: '5.0': profiles exist for Kafka Streams 3.4"),
])
def test_a_release_without_a_profile_is_refused_in_one_line(tmp_path: Path, value: str, message: str) -> None:
    job = _job(tmp_path, "3.6.2")
    job.write_text(job.read_text().replace('kafka_streams: "3.6.2"', f"kafka_streams: {value}"))
    shown = CliRunner().invoke(app, ["plan", str(job)])
    assert shown.exit_code == 2 and message in shown.stderr and shown.stderr.count("\n") == 1, shown.stderr


def test_an_unquoted_release_is_read_as_its_line(tmp_path: Path) -> None:
    job = _job(tmp_path, "3.6.2")
    job.write_text(job.read_text().replace('kafka_streams: "3.6.2"', "kafka_streams: 3.7"))
    shown = CliRunner().invoke(app, ["plan", str(job)])
    assert shown.exit_code == 0 and "rules: Kafka Streams 3.7\n" in shown.stdout, shown.output
