"""A live Kafka Streams session-window application, hard-killed mid-way and restarted, reconciled by
`backfill run` + `backfill verify` from the archives of its input and output topics (docs/semantics.md §9.5).

The application (jvm/harness, io.backfill.harness.Live with `sessions`) runs the demo job's user_sessions
operator (gap 30 s, grace 10 s, count / sum / fold, released by suppress) on the real broker of the test suite,
with the demo's clicks (2 partitions, stragglers, keyless records). It halts (no close, no commit) some hundred
records after its last commit; on restart the session store is restored from its changelog, which already holds
those records, and they are processed again. The test knows which records the crashed instance applied after
its commit, so it knows which sessions were fed twice; verify must name each effect, proved by recomputation.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from backfill.cli import app
from tests.kafka.test_live_stream import ROOT, hard_killed_run

pytestmark = [pytest.mark.live, pytest.mark.kafka, pytest.mark.spark, pytest.mark.jvm, pytest.mark.slow]


def _job(tmp: Path, clicks: Path, stream: Path) -> Path:
    """The demo job's user_sessions operator, as the application runs it (suppress), over the archives."""
    spec = yaml.safe_load((ROOT / "jobs" / "demo.yaml").read_text())
    spec["name"] = "live-sessions"
    spec["sources"]["clicks"]["path"] = str(clicks)
    spec["sources"]["clicks"]["value"]["schema"] = str(ROOT / "schemas" / "click.json")
    spec["operators"] = [op for op in spec["operators"] if op["name"] == "user_sessions"]
    spec["operators"][0]["aggregate"]["close"] = "suppress"
    spec["sinks"] = {"user_sessions": {"format": "delta", "path": str(tmp / "gold")},
                     "_ledger": {"format": "delta", "path": str(tmp / "ledger")}}
    # sums of doubles: the stream adds them in its own order (and twice, for records applied twice)
    spec["verify"] = {"user_sessions": {"against": str(stream), "tolerance": {"amount": "abs:0.000001"}}}
    job = tmp / "live.yaml"
    job.write_text(yaml.safe_dump(spec, sort_keys=False))
    return job


def test_a_session_application_hard_killed_midway_reconciles(kafka_broker: Any, spark: Any, tmp_path: Path) -> None:
    records, _, commits, twice, commits_file = hard_killed_run(kafka_broker, spark, tmp_path, mode="sessions")
    job = _job(tmp_path, tmp_path / "in", tmp_path / "out")
    ran = CliRunner().invoke(app, ["run", str(job), "--json"])
    assert ran.exit_code == 0, ran.stderr
    checked = CliRunner().invoke(app, ["verify", str(job), "--json", "--report", str(tmp_path / "report"),
                                       "--commits", str(commits_file)])
    assert checked.exit_code in (0, 1), checked.stderr
    verdict = json.loads(checked.stdout)
    [section] = verdict["sections"]
    causes = {c: n for c, n in section["causes"].items() if n}
    print(json.dumps({"commits": commits, "applied_twice": {p: (min(o), max(o), len(o)) for p, o in twice.items()
                                                            if o},
                      "counts": section["counts"], "causes": causes, "restarts": section["restarts"],
                      "unexplained": [s for s in section["samples"] if s["cause"] == "unexplained"][:6]},
                     default=str))
    # every difference is a restart's effect, each proved by recomputation (docs/semantics.md §9.5): records
    # applied twice onto the restored sessions, sessions released again from the restored suppress buffer, the
    # sessions the replayed records formed alone where the restored store had expired theirs, and the sessions as
    # they stood at the commit, which the buffer still held (their tombstones were lost with the crash)
    assert verdict["verdict"] == "explained" and checked.exit_code == 0, causes
    assert set(causes) <= {"reprocessed_after_restart", "reemitted", "state_lost_on_restore", "stale_after_restart"}
    assert causes["reprocessed_after_restart"] > 0
    # where event time advanced more than the session store's retention (gap + grace: 40 s) over the records
    # replayed, the restored store had expired sessions they belonged to: sessions only the stream has
    offsets: dict[int, int] = {}
    ts_at: dict[tuple[int, int], int] = {}
    for r in records:
        ts_at[(r["partition"], offsets.setdefault(r["partition"], 0))] = r["timestamp"]
        offsets[r["partition"]] += 1
    span = {p: max(ts_at[(p, o)] for o in offs) - min(ts_at[(p, o)] for o in offs) for p, offs in twice.items() if offs}
    if max(span.values()) > 40_000:
        assert causes.get("state_lost_on_restore", 0) + causes.get("stale_after_restart", 0) > 0, span
    assert {t["task"]: (t["committed_offset"], t["restart_offset_from"]) for t in section["restarts"]} == {
        p: (o, "--commits") for p, o in commits.items()}
    for x in section["samples"]:
        if x["cause"] == "reprocessed_after_restart":  # the records applied twice came after the commit
            assert x["restart_from"] >= commits[x["task"]] and {r["status"] for r in x["records"]} == {"applied twice"}
            assert x["r_clicks"] - x["l_clicks"] == x["restart_n"]
        if x["cause"] in ("state_lost_on_restore", "stale_after_restart"):  # a session only the stream has
            assert x["category"] == "extra_in_stream" and twice.get(x["task"])  # in a task that replayed records
