"""Scheduled backfills (`run --due/--restate`, `plan --due`, `runs`): what is due, data readiness, late data,
one scheduler at a time, and that interval-by-interval publishing adds up to one backfill of the whole day."""
from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from typer.testing import CliRunner

from backfill.cli import app
from backfill.demo import ARCHIVE_SCHEMA
from backfill.scheduling import lock as locks
from backfill.scheduling.intervals import Coverage, Interval, contiguous, grid, published
from backfill.jobspec.models import ScheduleSpec

REPO = Path(__file__).resolve().parent.parent
H, M = 3_600_000, 60_000
T0 = 1_704_067_200_000  # 2024-01-01T00:00:00Z
DAY = 12 * H  # the scheduled scenario's length
GRACE = "1m"
# records of interval 6 held back from the archive at first: they arrive late (filling their offsets)
LATE = (T0 + 6 * H + 10 * M, T0 + 6 * H + 40 * M)


def _records(hours: float = 27, seed: int = 1) -> list[dict[str, Any]]:
    """Two partitions of clicks from T0 - 1h on, a record every 30-150 s per partition, 5% up to 10 min late."""
    rng = random.Random(seed)
    out = []
    for part in range(2):
        keys = [f"u{k}" for k in range(8) if k % 2 == part]  # a key lives in one partition
        t, offset = T0 - H, 0
        while t < T0 + hours * H:
            t += rng.randint(30_000, 150_000)
            ts = t - (rng.randint(0, 600_000) if rng.random() < 0.05 else 0)
            out.append({"topic": "clicks", "partition": part, "offset": offset, "key": rng.choice(keys),
                        "value": json.dumps({"amount": rng.randint(1, 100)}), "timestamp": ts, "headers": []})
            offset += 1
    return out


def _write(path: Path, rows: list[dict[str, Any]], mode: str) -> None:
    cols = {n: [r[n] for r in rows] for n in ARCHIVE_SCHEMA.names}
    write_deltalake(str(path), pa.table(cols, schema=ARCHIVE_SCHEMA), mode=mode)


def _job(root: Path, name: str = "hourly-clicks", schedule: str | None = "{interval: 1h, lag: 15m, start: "
         "'2024-01-01T00:00:00Z'}", out: str = "gold") -> Path:
    (root / "jobs").mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "schemas" / "click.json", root / "click.json")
    job = root / "jobs" / f"{name}.yaml"
    job.write_text(f"""
name: {name}
{f'schedule: {schedule}' if schedule else ''}
sources:
  clicks: {{format: delta, path: ../bronze, value: {{format: json, schema: ../click.json}}}}
operators:
  - name: tumble
    aggregate:
      input: clicks
      window: {{type: tumbling, size: 10m, grace: {GRACE}}}
      aggregations: {{n: count(), amount: sum(value.amount)}}
      emit: final
sinks:
  tumble: {{format: delta, path: ../{out}/tumble}}
  _ledger: {{format: delta, path: ../{out}/ledger}}
""")
    return job


def _cli(*args: str, code: int = 0) -> Any:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == code, result.stdout + result.stderr
    return result


def _run_json(*args: str) -> dict[str, Any]:
    return json.loads(_cli("run", *args, "--json").stdout)


def _iso(ms: int) -> str:
    return str(ms)


def _rows(path: Path, cols: tuple[str, ...]) -> list[tuple]:
    return sorted((tuple(r[c] for c in cols) for r in DeltaTable(str(path)).to_pyarrow_table().to_pylist()), key=repr)


def _published_ranges(table: Path) -> Counter:
    """How often each range was committed to a table, from its Delta history."""
    seen: Counter = Counter()
    for commit in DeltaTable(str(table)).history():
        meta = json.loads(commit.get("userMetadata") or "{}")
        if "backfill.range" in meta:
            seen[tuple(json.loads(meta["backfill.range"]))] += 1
    return seen


@pytest.mark.spark
@pytest.mark.slow
def test_half_a_day_of_hourly_intervals_with_an_outage_and_late_data(tmp_path, spark):
    """12 hourly intervals (half a day: the day cost 166 s of CI for the same paths): published on time, then a 5-interval outage caught up in one pass, then late records
    for one published interval restated; the result equals one backfill of the whole day, row for row."""
    everything = _records(hours=DAY / H + 2)  # and a little beyond it
    late = [r for r in everything if LATE[0] <= r["timestamp"] < LATE[1] and r["offset"] % 3 == 0]
    assert len(late) >= 8
    _write(tmp_path / "bronze", [r for r in everything if r not in late], "overwrite")
    job = str(_job(tmp_path))

    first = _run_json(job, "--due", "--until", _iso(T0 + 3 * H))  # hours 0-2, one pass
    assert [(p["start"], p["end"]) for p in first["intervals"]] == [(T0 + h * H, T0 + (h + 1) * H) for h in range(3)]
    assert len({p["pass_id"] for p in first["intervals"]}) == 1
    assert _run_json(job, "--due", "--until", _iso(T0 + 4 * H))["decision"]["due"] == [[T0 + 3 * H, T0 + 4 * H]]
    # the scheduler is down for hours 4-8; at 10:00 it catches up, 4-9 in one pass with one warm-up
    caught = _run_json(job, "--due", "--until", _iso(T0 + 10 * H))
    assert [p["start"] for p in caught["intervals"]] == [T0 + h * H for h in range(4, 10)]
    assert len({p["pass_id"] for p in caught["intervals"]}) == 1
    assert caught["intervals"][0]["records_read"]["clicks"] == caught["intervals"][-1]["records_read"]["clicks"]
    rest = _run_json(job, "--due", "--until", _iso(T0 + DAY))
    assert [p["start"] for p in rest["intervals"]] == [T0 + h * H for h in range(10, 12)]
    assert _run_json(job, "--due", "--until", _iso(T0 + DAY))["status"] == "nothing_due"

    _write(tmp_path / "bronze", late, "append")  # late records for 06:00-07:00, which is already published
    planned = json.loads(_cli("plan", job, "--due", "--restate", "2d", "--until", _iso(T0 + DAY), "--json").stdout)
    assert planned["due"] == [] and [r["interval"] for r in planned["restate"]] == [[T0 + 6 * H, T0 + 7 * H]]
    assert planned["unchanged"] == 11
    restated = _run_json(job, "--due", "--restate", "2d", "--until", _iso(T0 + DAY))
    assert [(p["start"], p["mode"]) for p in restated["intervals"]] == [(T0 + 6 * H, "restate")]

    # the version history: every interval committed once, the restated one twice, nothing else
    expected = Counter({(T0 + h * H, T0 + (h + 1) * H): 1 for h in range(12)})
    expected[(T0 + 6 * H, T0 + 7 * H)] = 2
    assert _published_ranges(tmp_path / "gold" / "tumble") == expected
    runs = [json.loads(line) for line in _cli("runs", job, "--json").stdout.splitlines()]
    assert len(runs) == 13 and {r["status"] for r in runs} == {"published"}
    assert Counter(r["mode"] for r in runs) == Counter({"due": 12, "restate": 1})

    # one backfill of the whole day over the same (completed) input, into other tables
    whole = _job(tmp_path, name="whole-day", schedule=None, out="whole")
    _cli("run", str(whole), "--start", _iso(T0), "--end", _iso(T0 + DAY), "--json")
    cols = ("key", "window_start", "window_end", "n", "amount", "ts")
    assert _rows(tmp_path / "gold" / "tumble", cols) == _rows(tmp_path / "whole" / "tumble", cols)
    assert len(_rows(tmp_path / "gold" / "tumble", cols)) > 12 * 20
    # the ledgers agree too, except for a record that arrived after its interval's cool-down: a run of that
    # interval counts it (past cool-down), the whole-day run processes and drops it
    ledger_cols = ("partition", "offset", "reason", "window_start", "stream_time", "range_time")
    union, day = set(_rows(tmp_path / "gold" / "ledger", ledger_cols)), set(_rows(tmp_path / "whole" / "ledger",
                                                                                   ledger_cols))
    cooled = {r for r in day if r[4] < (r[5] - T0) // H * H + T0 + H + M}
    assert day and cooled <= union <= day


@pytest.mark.spark
@pytest.mark.slow
def test_plan_due_waits_for_every_partition_and_says_which(tmp_path, spark, monkeypatch):
    rows = [r for r in _records(hours=6) if r["partition"] == 0 or r["timestamp"] < T0 + 3 * H + 20 * M]
    _write(tmp_path / "bronze", rows, "overwrite")
    job = str(_job(tmp_path))
    result = _cli("plan", job, "--due", "--until", "2024-01-01T06:00:00Z")
    text = " ".join(result.stdout.split())
    assert "3 due" in text and "waiting 2024-01-01T03:00:00Z .. 2024-01-01T04:00:00Z" in text
    assert "must reach 2024-01-01T04:15:00Z" in text and "partition 1 reaches 2024-01-01T03:" in text
    assert "2 later intervals wait too" in text and "nothing was run" in text
    planned = json.loads(_cli("plan", job, "--due", "--max-intervals", "2", "--until", _iso(T0 + 6 * H),
                              "--json").stdout)
    assert planned["due"] == [[T0, T0 + H], [T0 + H, T0 + 2 * H]] and planned["deferred"] == 1
    assert not (tmp_path / "gold").exists()  # plan runs nothing
    # many intervals are fingerprinted a chunk per scan: the same fingerprints whatever the chunk
    from backfill.jobspec.load import load_job
    from backfill.scheduling import due, survey

    def fingerprints() -> dict:
        return due.decide(load_job(job), spark, [], until=T0 + 3 * H, now=0, restate_ms=None,
                          max_intervals=None).fingerprints

    whole = fingerprints()
    monkeypatch.setattr(survey, "CHUNK", 2)
    assert fingerprints() == whole and len(whole) == 3 and all(whole.values())


@pytest.mark.spark
def test_a_second_scheduler_exits_0_naming_the_run_that_holds_the_lock(tmp_path, spark):
    _write(tmp_path / "bronze", _records(hours=3), "overwrite")
    job = _job(tmp_path)
    runs = str(tmp_path / "gold" / "ledger_runs")
    held = locks.acquire(runs, "hourly-clicks", 600_000, run_id="other-run")
    assert isinstance(held, locks.SchedulerLock)
    try:
        held.renew(doing="publishing 2024-01-01T01:00:00Z .. 2024-01-01T02:00:00Z")
        result = _cli("run", str(job), "--due", "--until", _iso(T0 + 2 * H))
        text = " ".join(result.stdout.split())
        assert "nothing done: another scheduler is running it: run other-run" in text
        assert "publishing 2024-01-01T01:00:00Z" in text
        assert not (tmp_path / "gold" / "tumble").exists()
        assert "scheduler lock: held by run other-run" in " ".join(_cli("runs", str(job)).stdout.split())
    finally:
        held.release()
    assert [p["start"] for p in _run_json(str(job), "--due", "--until", _iso(T0 + 2 * H))["intervals"]] == [T0, T0 + H]


@pytest.mark.spark
@pytest.mark.slow
def test_two_schedulers_fired_at_once_publish_each_interval_once(tmp_path):
    """Two real processes: one publishes, the other exits 0 saying who runs; each interval committed once."""
    _write(tmp_path / "bronze", _records(hours=4), "overwrite")
    job = _job(tmp_path)
    cmd = [sys.executable, "-m", "backfill.cli", "run", str(job), "--due", "--until", _iso(T0 + 3 * H)]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    said = [" ".join(o[0].split()) for o in outs]
    assert sum("another scheduler is running it" in s for s in said) == 1, said
    assert sum("3 intervals published" in s for s in said) == 1, said
    assert _published_ranges(tmp_path / "gold" / "tumble") == Counter(
        {(T0 + h * H, T0 + (h + 1) * H): 1 for h in range(3)})


def test_the_lock_is_taken_by_exactly_one_of_many_racing_schedulers(tmp_path):
    runs = str(tmp_path / "runs")
    won: list[Any] = []
    barrier = threading.Barrier(8)

    def race() -> None:
        barrier.wait()
        won.append(locks.acquire(runs, "job", 600_000))

    threads = [threading.Thread(target=race) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    holders = [w for w in won if isinstance(w, locks.SchedulerLock)]
    assert len(holders) == 1 and len(won) == 8
    holders[0].release()
    again = locks.acquire(runs, "job", 600_000)
    assert isinstance(again, locks.SchedulerLock)
    again.release()


def test_a_stale_lock_is_taken_over_and_its_old_holder_stops_before_publishing(tmp_path):
    runs = str(tmp_path / "runs")
    old = locks.acquire(runs, "job", 60_000)
    assert isinstance(old, locks.SchedulerLock)
    old._stop.set()  # the holder hangs: it no longer renews
    ticket = locks.lock_dir(runs) / "00000001.json"
    data = json.loads(ticket.read_text())
    data.update(host="another-host", renewed_s=time.time() - 120)  # not renewed for 2 minutes, elsewhere
    ticket.write_text(json.dumps(data))
    new = locks.acquire(runs, "job", 60_000)
    assert isinstance(new, locks.SchedulerLock) and new.ticket["took_over"] == 1
    with pytest.raises(Exception, match="taken over by ticket 2"):
        old.check()
    new.check()
    new.release()
    old.release()  # not the holder any more: writes nothing
    assert sorted(p.name for p in locks.lock_dir(runs).glob("*.json")) == \
        ["00000001.json", "00000002.json", "00000003.json"]


def test_a_lock_of_a_dead_process_on_this_host_is_stale_at_once(tmp_path):
    runs = str(tmp_path / "runs")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    folder = locks.lock_dir(runs)
    folder.mkdir(parents=True)
    import socket

    (folder / "00000001.json").write_text(json.dumps({"state": "held", "run": "killed", "host": socket.gethostname(),
                                                      "pid": int(dead.stdout), "since": "x", "renewed": "x",
                                                      "renewed_s": time.time()}))
    taken = locks.acquire(runs, "job", 600_000)
    assert isinstance(taken, locks.SchedulerLock) and taken.ticket["took_over"] == 1
    taken.release()


def test_the_interval_grid_and_what_counts_as_published():
    schedule = ScheduleSpec(interval="1h", lag="15m", start="2024-01-01T00:00:00Z")
    assert grid(schedule, T0 - 5 * H, T0 + 2 * H + 1) == [Interval(T0, T0 + H), Interval(T0 + H, T0 + 2 * H)]
    unanchored = ScheduleSpec(interval="1h")
    assert grid(unanchored, T0 + 30 * M, T0 + 3 * H)[0] == Interval(T0, T0 + H)  # aligned to the epoch
    rows = [{"job": "j", "status": "published", "range_start": T0, "range_end": T0 + H},
            {"job": "j", "status": "failed", "range_start": T0 + H, "range_end": T0 + 2 * H},
            {"job": "other", "status": "published", "range_start": T0 + 2 * H, "range_end": T0 + 3 * H}]
    assert list(published(rows, "j")) == [Interval(T0, T0 + H)]
    # a manual run over [00:30, 03:00) and an interval [00:00, 01:00): together they cover 00:00-03:00
    cover = Coverage([Interval(T0 + 30 * M, T0 + 3 * H), Interval(T0, T0 + H), Interval(T0 + 5 * H, T0 + 6 * H)])
    assert [cover.covers(Interval(T0 + h * H, T0 + (h + 1) * H)) for h in range(7)] == \
        [True, True, True, False, False, True, False]
    assert not cover.covers(Interval(T0 - H, T0))
    assert contiguous([Interval(T0 + 3 * H, T0 + 4 * H), Interval(T0, T0 + H), Interval(T0 + H, T0 + 2 * H)]) == [
        [Interval(T0, T0 + H), Interval(T0 + H, T0 + 2 * H)], [Interval(T0 + 3 * H, T0 + 4 * H)]]


@pytest.mark.parametrize(("schedule", "args", "message"), [
    ("{interval: 1h, lag: 30s}", ["run", "--due"], "schedule.lag: 30s is shorter than the grace of operators.tumble"),
    ("{interval: 0ms}", ["plan"], "schedule.interval: must be > 0"),
    ("{interval: 1h, lag: 15m, start: yesterday}", ["plan"], "schedule.start: 'yesterday' is not an instant"),
    ("{interval: 1h, lag: 15m, every: 2h}", ["plan"], "schedule.every"),
    (None, ["run", "--due"], "schedule: the job has no schedule; add e.g. `schedule: {interval: 1h, lag: 15m}`"),
    ("{interval: 1h, lag: 15m}", ["run", "--due", "--start", "0"], "--start/--end: --due/--restate takes its ranges"),
    ("{interval: 1h, lag: 15m}", ["run", "--until", "0"], "--until/--max-intervals: only with --due or --restate"),
    ("{interval: 1h, lag: 15m}", ["run", "--restate", "soon"], "--restate: 'soon' is not a duration"),
    ("{interval: 1h, lag: 15m}", ["plan", "--due", "--max-intervals", "0"], "--max-intervals 0: give 1 or more"),
])
def test_schedule_mistakes_are_one_line_errors(tmp_path, schedule, args, message):
    (tmp_path / "bronze" / "_delta_log").mkdir(parents=True)
    job = _job(tmp_path, schedule=schedule)
    result = CliRunner().invoke(app, [args[0], str(job), *args[1:]])
    assert result.exit_code == 2, result.stdout + result.stderr
    text = " ".join(result.stderr.split())
    assert message in text and len(result.stderr.strip().splitlines()) == 1, text


@pytest.mark.spark
@pytest.mark.slow
def test_an_interval_published_with_a_session_still_open_is_reopened_once_the_data_grows(tmp_path, spark):
    """A session that starts in an interval can outgrow it: published while open (not emitted, counted),
    the interval is run again once every partition's data reaches further, and then holds the session."""
    def clicks(part: int, key: str, first: int, last: int, every: int, offset: int) -> list[dict[str, Any]]:
        return [{"topic": "clicks", "partition": part, "offset": offset + i, "key": key,
                 "value": json.dumps({"amount": 1}), "timestamp": t, "headers": []}
                for i, t in enumerate(range(first, last + 1, every))]

    # partition 0: "bot" clicks every 20 s from 00:20 (a session gap is 30 s); partition 1: "v" every minute
    bot = clicks(0, "bot", T0 + 20 * M, T0 + 50 * M, 20_000, 0)
    v = clicks(1, "v", T0, T0 + 50 * M, M, 0)
    _write(tmp_path / "bronze", bot + v, "overwrite")
    job = _job(tmp_path, schedule="{interval: 30m, lag: 2m, start: '2024-01-01T00:00:00Z'}")
    job.write_text(job.read_text().replace("{type: tumbling, size: 10m, grace: 1m}",
                                           "{type: session, gap: 30s, grace: 10s}"))
    first = _run_json(str(job), "--due", "--until", _iso(T0 + 30 * M))
    assert [p["start"] for p in first["intervals"]] == [T0]
    assert first["intervals"][0]["operators"]["tumble"]["incomplete_windows"] == 1  # the bot's session
    sessions = _rows(tmp_path / "gold" / "tumble", ("key", "window_start", "window_end", "n"))
    assert [s for s in sessions if s[0] == "bot"] == []
    assert _run_json(str(job), "--due", "--until", _iso(T0 + 30 * M))["status"] == "nothing_due"  # no new data

    # u's first click, a minute after the bot's last, closes the bot's session; five minutes later it would close
    # it with a put that drops the session's store segment, and the stream would never emit it (docs/semantics.md
    # §11.5)
    more = clicks(0, "bot", T0 + 50 * M + 20_000, T0 + 60 * M, 20_000, len(bot)) + \
        clicks(0, "u", T0 + 61 * M, T0 + 70 * M, M, len(bot) + 30) + clicks(1, "v", T0 + 51 * M, T0 + 70 * M, M, len(v))
    _write(tmp_path / "bronze", more, "append")
    again = _run_json(str(job), "--due", "--until", _iso(T0 + 30 * M))
    assert [(p["start"], p["mode"]) for p in again["intervals"]] == [(T0, "reopen")]
    assert again["intervals"][0]["operators"]["tumble"]["incomplete_windows"] == 0
    sessions = _rows(tmp_path / "gold" / "tumble", ("key", "window_start", "window_end", "n"))
    assert [s for s in sessions if s[0] == "bot"] == [("bot", T0 + 20 * M, T0 + 60 * M, 121)]
    whole = _job(tmp_path, name="whole", schedule=None, out="whole")
    whole.write_text(whole.read_text().replace("{type: tumbling, size: 10m, grace: 1m}",
                                               "{type: session, gap: 30s, grace: 10s}"))
    _cli("run", str(whole), "--start", _iso(T0), "--end", _iso(T0 + 30 * M), "--json")
    assert sessions == _rows(tmp_path / "whole" / "tumble", ("key", "window_start", "window_end", "n"))


@pytest.mark.spark
def test_a_failing_interval_stops_the_run_with_one_line_and_a_failed_row(tmp_path, spark):
    rows = _records(hours=3)
    for r in rows:
        r["key"] = "shared"  # one key in both partitions: a final output would not be unique per window
    _write(tmp_path / "bronze", rows, "overwrite")
    job = str(_job(tmp_path))
    result = CliRunner().invoke(app, ["run", job, "--due", "--until", _iso(T0 + 2 * H)])
    assert result.exit_code == 2
    assert "key 'shared' occurs in several partitions" in " ".join(result.stderr.split())
    runs = [json.loads(line) for line in _cli("runs", job, "--json").stdout.splitlines()]
    assert [(r["start"], r["status"], r["mode"]) for r in runs] == [(T0, "failed", "due")]
    assert "several partitions" in runs[0]["error"]
    assert not (tmp_path / "gold" / "tumble").exists()  # nothing published
