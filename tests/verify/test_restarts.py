"""Verify after a restart of an at-least-once application: each effect gets its cause, proved by recomputation.

One task (partition 0), tumbling 10 s, grace 2 s, emit final, count and an ordered fold. The application
committed offset 4, crashed after applying offsets 4-8, and restarted from offset 4. The hand-written
streaming output shows what the real engine does then (tests/kafka/test_live_stream.py has the real one):
records applied twice, a window that had expired in the restored store (only its last record counted), a
window closed after the commit emitted again from the restored suppress buffer.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from backfill.cli import app
from backfill.verify.catalogue import CAUSES
from tests.conftest import write_jsonl
from tests.verify.test_reconcile_causes import JOB as DEFECTS_JOB

pytestmark = [pytest.mark.spark, pytest.mark.slow]

# the defects test's job (tumbling 10 s, grace 2 s, count and an ordered fold), emitting final results
JOB = DEFECTS_JOB.replace("verify-defects", "verify-restarts").replace("EMIT", "final")

# (offset, key, value, ts), partition 0
INPUT = [
    (0, "a", "a1", 1000), (1, "b", "b1", 2000), (2, "a", "a2", 3000), (3, "c", "c1", 11000),
    (4, "a", "a3", 12000),  # stream time 12000 closes [0, 10s): a@0 and b@0 close here, after the commit
    # d1 comes behind stream time (13000): "the stream dropped d1 as late" gives d's value too, but the restart
    # proven here explains it (the restarted task's stream time starts over, it drops fewer records, never more)
    (5, "c", "c2", 13000), (6, "d", "d1", 12500), (7, "c", "c3", 15000), (8, "d", "d2", 16000),
    (9, "e", "e1", 25000), (10, "e", "e2", 26000), (11, "f", "f1", 41000),
]
COMMITTED = 4  # the crash came after offset 8: offsets 4-8 were applied before it and again after it


def _row(key: str, start: int, n: int, trail: str) -> dict[str, Any]:
    return {"key": key, "window_start": start, "window_end": start + 10_000, "n": n, "trail": trail}


# the streaming output in write order: (row, category, cause) for the last row of each window
STREAM = [
    (_row("b", 0, 1, "b1"), "match", None),
    (_row("a", 0, 2, "a1a2"), None, None),  # emitted before the crash ...
    (_row("c", 10_000, 3, "c1c2c3"), None, None),  # ... and this one too, right
    # after the restart: suppress's buffer, restored as of the commit, emits a@0 again
    (_row("a", 0, 2, "a1a2"), "duplicate_in_stream", "reemitted"),
    (_row("a", 10_000, 2, "a3a3"), "mismatch", "reprocessed_after_restart"),  # a3 applied twice
    (_row("c", 10_000, 5, "c1c2c3c2c3"), "mismatch", "reprocessed_after_restart"),  # c2, c3 again
    (_row("d", 10_000, 1, "d2"), "mismatch", "state_lost_on_restore"),  # expired in the restored store
    (_row("e", 20_000, 2, "e1e2"), "match", None),
]


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory, spark_module: Any) -> Path:
    """The job, run once (its published output and ledger are what every test verifies against)."""
    tmp = tmp_path_factory.mktemp("restarts")
    write_jsonl(tmp / "inputs" / "s.jsonl", [{"topic": "t", "partition": 0, "offset": o, "key": k, "value": v,
                                              "timestamp": t} for o, k, v, t in INPUT])
    (tmp / "job.yaml").write_text(JOB)
    result = CliRunner().invoke(app, ["run", str(tmp / "job.yaml"), "--json"])
    assert result.exit_code == 0, result.stderr
    return tmp / "job.yaml"


def _stream(tmp: Path, rows: list[dict[str, Any]]) -> Path:
    return write_jsonl(tmp / "stream" / "agg.jsonl",
                       [{**row, "partition": 0, "offset": i} for i, row in enumerate(rows)])


def _verify(tmp: Path, job: Path, *args: str, rows: list[dict[str, Any]] | None = None) -> tuple[int, dict[str, Any]]:
    stream = _stream(tmp, rows if rows is not None else [row for row, _, _ in STREAM])
    result = CliRunner().invoke(app, ["verify", str(job), "--json", "--against", f"agg={stream}",
                                      "--report", str(tmp / "report"), *args])
    assert result.exit_code in (0, 1), result.stdout + result.stderr
    return result.exit_code, json.loads(result.stdout)


EXPECTED = {(r["key"], r["window_start"]): (cat, cause) for r, cat, cause in STREAM if cat not in (None, "match")}


@pytest.mark.parametrize("commits", ["consumer-groups", "none"])
def test_each_restart_effect_gets_its_cause(tmp_path: Path, job: Path, commits: str) -> None:
    args: list[str] = []
    if commits == "consumer-groups":  # what kafka-consumer-groups.sh --describe prints
        (tmp_path / "commits.txt").write_text(
            "\nGROUP           TOPIC   PARTITION  CURRENT-OFFSET  LOG-END-OFFSET  LAG  CONSUMER-ID  HOST  CLIENT-ID\n"
            f"clicks-app      t       0          {COMMITTED}               12              8    -            -     -\n")
        args = ["--commits", str(tmp_path / "commits.txt")]
    code, report = _verify(tmp_path, job, *args)
    assert code == 0
    section = report["sections"][0]
    got = {(s["key"], s["window_start"]): (s["category"], s["cause"]) for s in section["samples"]
           if s["category"] != "match"}
    assert got == EXPECTED
    assert report["verdict"] == "explained"
    # every cause of the catalogue is counted, the ones not found as 0
    assert report["causes"] == {**{c: 0 for c in CAUSES}, "reprocessed_after_restart": 2, "reemitted": 1,
                                "state_lost_on_restore": 1}
    by_key = {(s["key"], s["window_start"]): s for s in section["samples"]}
    # the proof: which records were applied twice or counted alone, at which offsets
    c = by_key[("c", 10_000)]
    assert [(r["offset"], r["status"]) for r in c["records"]] == [(5, "applied twice"), (7, "applied twice")]
    assert (c["restart_n"], c["restart_from"], c["restart_to"], c["task"]) == (2, 5, 7, 0)
    d = by_key[("d", 10_000)]
    assert [(r["offset"], r["status"]) for r in d["records"]] == [(8, "counted alone")]
    again = by_key[("a", 0)]
    assert again["closed_at"] == 4 and "keeps the last emission, which is right" in again["detail"]
    # without the committed offsets, the restart point is inferred: the earliest record applied twice
    [task] = section["restarts"]
    assert task["windows"] == {"reprocessed_after_restart": 2, "reemitted": 1, "state_lost_on_restore": 1,
                               "stale_after_restart": 0}
    assert (task["task"], task["restart_offset"], task["reprocessed_through"]) == (0, 4, 7)
    assert task["examples"][0] == {"key": "a", "window_start": 10_000, "cause": "reprocessed_after_restart"}
    assert task["restart_offset_from"] == ("inferred" if commits == "none" else "--commits")
    page = (tmp_path / "report" / "index.html").read_text()
    assert "Incident: the application restarted" in page and "reprocessed_after_restart" in page


def test_corrections_repair_the_serving_table(tmp_path: Path, job: Path, spark: Any) -> None:
    """--corrections writes the windows to republish; applied to the stream's compacted table, verify matches."""
    from delta.tables import DeltaTable

    (tmp_path / "commits.json").write_text(json.dumps({"0": COMMITTED}))
    _, report = _verify(tmp_path, job, "--commits", str(tmp_path / "commits.json"), "--corrections",
                     str(tmp_path / "fix"))
    fixes = report["sections"][0]["corrections"]
    assert (fixes["rows"], fixes["by_correction"], fixes["format"]) == (3, {"replace": 3}, "delta")
    rows = spark.read.format("delta").load(fixes["path"])
    assert sorted((r["key"], r["window_start"], r["n"], r["trail"], r["cause"]) for r in rows.collect()) == [
        ("a", 10_000, 1, "a3", "reprocessed_after_restart"), ("c", 10_000, 3, "c1c2c3", "reprocessed_after_restart"),
        ("d", 10_000, 2, "d1d2", "state_lost_on_restore")]
    # the serving table: the stream's output compacted (last row per window), then repaired with a merge
    serving = str(tmp_path / "serving")
    last = {(r["key"], r["window_start"]): r for r, _, _ in STREAM}
    spark.createDataFrame(list(last.values())).write.format("delta").save(serving)
    fix = rows.where("correction in ('replace', 'insert')").drop("correction", "cause")
    (DeltaTable.forPath(spark, serving).alias("t").merge(fix.alias("f"), "t.key = f.key and t.window_start = "
                                                         "f.window_start")
     .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())
    result = CliRunner().invoke(app, ["verify", str(job), "--json", "--against", f"agg={serving}",
                                      "--report", str(tmp_path / "report2")])
    assert result.exit_code == 0, result.stdout + result.stderr
    again = json.loads(result.stdout)
    assert again["verdict"] == "match", again["counts"]


def test_no_restart_evidence_no_restart_cause(tmp_path: Path, job: Path) -> None:
    """The same wrong values without a re-emitted window or committed offsets: no restart is claimed."""
    once = [row for i, (row, _, _) in enumerate(STREAM) if i not in (2, 3)]  # no window emitted twice
    code, report = _verify(tmp_path, job, rows=once)
    assert code == 1
    # a, c: unexplained; d: without a restart, the stream dropping d1 (behind stream time) as late explains it
    assert (report["causes"]["unexplained"], report["causes"]["late_drop_differs"]) == (2, 1)
    assert report["sections"][0]["restarts"] == []
    assert not any(report["causes"][c] for c in ("reprocessed_after_restart", "reemitted", "state_lost_on_restore"))


# emit: updates, cache off: one update per record; after the restart offsets 4-8 are processed again
UPDATES = [("a", 0, 1, "a1"), ("b", 0, 1, "b1"), ("a", 0, 2, "a1a2"), ("c", 10_000, 1, "c1"),
           ("a", 10_000, 1, "a3"), ("c", 10_000, 2, "c1c2"), ("d", 10_000, 1, "d1"), ("c", 10_000, 3, "c1c2c3"),
           ("d", 10_000, 2, "d1d2"),
           # the restart: a3, c2 and c3 again onto the restored windows; d's window had expired in the store
           ("a", 10_000, 2, "a3a3"), ("c", 10_000, 4, "c1c2c3c2"), ("d", 10_000, 1, "d1"),
           ("c", 10_000, 5, "c1c2c3c2c3"), ("d", 10_000, 1, "d2"),
           ("e", 20_000, 1, "e1"), ("e", 20_000, 2, "e1e2"), ("f", 40_000, 1, "f1")]


@pytest.fixture(scope="module")
def updates_job(tmp_path_factory: pytest.TempPathFactory, spark_module: Any) -> Path:
    """The same job with emit: updates, run once."""
    tmp = tmp_path_factory.mktemp("restarts-updates")
    write_jsonl(tmp / "inputs" / "s.jsonl", [{"topic": "t", "partition": 0, "offset": o, "key": k, "value": v,
                                              "timestamp": t} for o, k, v, t in INPUT])
    (tmp / "job.yaml").write_text(JOB.replace("emit: final", "emit: updates"))
    ran = CliRunner().invoke(app, ["run", str(tmp / "job.yaml"), "--json"])
    assert ran.exit_code == 0, ran.stderr
    return tmp / "job.yaml"


@pytest.mark.parametrize("commits", [True, False])
def test_an_update_stream_replayed_after_a_restart(tmp_path: Path, updates_job: Path, commits: bool) -> None:
    """Without committed offsets, the updates beyond one per record show the restart."""
    (tmp_path / "commits.json").write_text(json.dumps({"0": COMMITTED}))
    args = ["--commits", str(tmp_path / "commits.json")] if commits else []
    code, report = _verify(tmp_path, updates_job, *args, rows=[_row(*u) for u in UPDATES])
    got = {(s["key"], s["window_start"]): s["cause"] for s in report["sections"][0]["samples"]
           if s["category"] != "match"}
    assert got == {("a", 10_000): "reprocessed_after_restart", ("c", 10_000): "reprocessed_after_restart",
                   ("d", 10_000): "state_lost_on_restore"}
    assert (code, report["verdict"]) == (0, "explained")
    [task] = report["sections"][0]["restarts"]
    assert task["restart_offset"] == 4 and task["restart_offset_from"] == ("--commits" if commits else "inferred")


def test_commits_files_as_users_have_them(tmp_path: Path) -> None:
    from backfill.verify.restarts import commits_for, read_commits

    one = tmp_path / "one.json"
    one.write_text(json.dumps([{"topic": "clicks", "partition": 0, "offset": 7}, {"partition": 1, "offset": 9}]))
    assert commits_for(read_commits(one), [], "x") == {0: 7, 1: 9}
    two = tmp_path / "two.txt"  # a group reading two topics: only the operator's input counts
    two.write_text("GROUP TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG CONSUMER-ID HOST CLIENT-ID\n"
                   "app clicks 0 7 9 2 - - -\napp orders 0 3 3 0 - - -\napp clicks 1 - 4 - - - -\n")
    assert commits_for(read_commits(two), ["clicks"], "x") == {0: 7}


def test_bad_commits_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text(JOB)
    write_jsonl(tmp_path / "inputs" / "s.jsonl", [])
    (tmp_path / "commits.json").write_text(json.dumps([{"partition": "zero"}]))
    result = CliRunner().invoke(app, ["verify", str(tmp_path / "job.yaml"), "--commits", str(tmp_path / "commits.json"),
                                      "--against", "agg=x"])
    assert result.exit_code == 2
    assert result.stderr.strip().count("\n") == 0 and "--commits" in result.stderr and "partition" in result.stderr
