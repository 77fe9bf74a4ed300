"""Part: scheduling. The scheduled forms of the commands: `run --due/--restate`, `plan --due`, `runs`."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from backfill.errors import SpecError


def run_scheduled(job_path: Path, *, until: int | None, restate: str | None, max_intervals: int | None,
                  due: bool, profile: str | None, out: Console, err: Console, as_json: bool) -> dict[str, Any]:
    """Take the lock, decide, publish; returns what happened (`status`: done, nothing_due, busy)."""
    from backfill.io.runs import read_runs
    from backfill.jobspec.load import load_job
    from backfill.plan.builder import build_plan
    from backfill.scheduling.due import decide, describe_interval, restate_period, run_decision, schedule_of
    from backfill.scheduling.lock import Busy, acquire

    _check_max(max_intervals)
    job = load_job(job_path)
    schedule = schedule_of(job)
    period = restate_period(restate)
    runs = build_plan(job).runs_sink
    assert runs is not None
    say = (lambda line: err.print(line, highlight=False, soft_wrap=True)) if as_json else \
        (lambda line: out.print(line, highlight=False, soft_wrap=True))
    lock = acquire(runs, job.spec.name, schedule.lock_timeout)
    if isinstance(lock, Busy):
        say(f"job {job.spec.name}: nothing done: another scheduler is running it: {lock.describe()}")
        return {"status": "busy", "holder": lock.holder}
    try:
        from backfill.session import get_spark

        lock.renew(doing="deciding")
        spark = get_spark(profile, input_bytes=job.input_bytes())
        decision = decide(job, spark, read_runs(runs), until=until, now=int(time.time() * 1000),
                          restate_ms=period, max_intervals=max_intervals, due=due)
        for line in decision.lines():
            say(line)
        if not decision.work:
            return {"status": "nothing_due", "decision": decision.to_dict(), "intervals": []}
        progress = (lambda stage: err.print(f"[dim]- {stage}[/]", highlight=False)) if not as_json else \
            (lambda _: None)
        parts = run_decision(job, spark, decision, lock, lambda part: say(describe_interval(part)), progress)
        rows = sum(int(s.get("rows") or 0) for p in parts for n, s in p["sinks"].items() if n != "_ledger")
        restated = sum(p["mode"] == "restate" for p in parts)
        say(f"job {job.spec.name}: {_n(len(parts), 'interval')} published ({restated} restated), {rows:,} rows out; "
            "every record accounted for in each")
        return {"status": "done", "decision": decision.to_dict(), "intervals": parts}
    finally:
        lock.release()


def plan_scheduled(job_path: Path, *, until: int | None, restate: str | None, max_intervals: int | None,
                   due: bool, profile: str | None, out: Console, as_json: bool) -> None:
    """`plan --due`: the decision, nothing run (reads the runs table and scans the sources' timestamps)."""
    from backfill.io.runs import read_runs
    from backfill.jobspec.load import load_job
    from backfill.plan.builder import build_plan
    from backfill.scheduling.due import decide, restate_period
    from backfill.session import get_spark

    _check_max(max_intervals)
    job = load_job(job_path)
    runs = build_plan(job).runs_sink
    decision = decide(job, get_spark(profile), read_runs(runs), until=until, now=int(time.time() * 1000),
                      restate_ms=restate_period(restate), max_intervals=max_intervals, due=due)
    if as_json:
        print(json.dumps(decision.to_dict(), indent=2))
        return
    for line in decision.lines():
        out.print(line, highlight=False, soft_wrap=True)
    if decision.work:
        out.print("[dim]nothing was run: `backfill run` with the same options publishes these[/]", highlight=False)


def show_runs(job_path: Path, *, out: Console, as_json: bool, limit: int) -> None:
    """`backfill runs JOB`: the runs table, newest last (and who holds the scheduler lock, if anyone)."""
    from backfill.io.runs import read_runs
    from backfill.jobspec.load import load_job
    from backfill.plan.builder import build_plan
    from backfill.scheduling.intervals import instant
    from backfill.scheduling.lock import _newest, lock_dir

    job = load_job(job_path)
    runs = build_plan(job).runs_sink
    assert runs is not None
    rows = [_row(r) for r in read_runs(runs) if r.get("job") == job.spec.name]
    rows = rows[-limit:] if limit else rows
    if as_json:
        for row in rows:
            print(json.dumps(row, default=str))
        return
    from backfill.jobspec.durations import format_duration

    table = Table("interval", "status", "mode", "in", "out", "dropped", "s", "versions", "finished", box=None)
    table.columns[0].no_wrap = True
    for r in rows:
        if r["start"] is not None and r["end"] is not None:
            span = f"{instant(r['start'])} +{format_duration(r['end'] - r['start'])}"
        else:
            span = f"{instant(r['start']) if r['start'] is not None else '-inf'} .. " \
                   f"{instant(r['end']) if r['end'] is not None else '+inf'}"
        status = {"published": "[green]published[/]", "failed": "[red]failed[/]"}.get(r["status"], r["status"])
        versions = ", ".join(f"{n} v{v}" for n, v in r["versions"].items())
        table.add_row(span, status, r["mode"], f"{r['records_in']:,}", f"{r['records_out']:,}",
                      f"{r['records_dropped']:,}", f"{r['duration_s']:.1f}", versions, r["finished_at"][:19])
    out.print(table)
    failed = [r for r in rows if r["status"] == "failed"]
    for r in failed[-3:]:
        out.print(f"[red]failed[/] {instant(r['start'])}: {r['error']}", highlight=False, soft_wrap=True)
    newest = _newest(lock_dir(runs)) if lock_dir(runs).is_dir() else None
    if newest is not None and newest[1].get("state") == "held":
        h = newest[1]
        out.print(f"scheduler lock: held by run {h['run']} on {h['host']} (pid {h['pid']}) since {h['since']}, "
                  f"renewed {h['renewed']}" + (f": {h['doing']}" if h.get("doing") else ""), highlight=False)
    if not rows:
        out.print(f"no runs yet in {runs}", highlight=False)


def _row(r: dict[str, Any]) -> dict[str, Any]:
    outputs = json.loads(r.get("outputs") or "{}")
    counts = json.loads(r.get("counts") or "{}")
    out = r.get("records_out")
    if out is None:  # manifests written before scheduled runs
        out = sum(int(v.get("rows") or 0) for k, v in outputs.items() if k != "_ledger")
    dropped = r.get("records_dropped")
    if dropped is None:
        dropped = sum((counts.get("ledger") or {}).values())
    return {"run_id": r["run_id"], "start": r.get("range_start"), "end": r.get("range_end"), "status": r["status"],
            "mode": r.get("mode") or "manual", "records_in": int(r.get("records_in") or 0), "records_out": int(out),
            "records_dropped": int(dropped), "duration_s": float(r.get("duration_s") or 0.0),
            "versions": {k: v["version"] for k, v in outputs.items() if v.get("version") is not None},
            "finished_at": r.get("finished_at") or "", "pass_id": r.get("pass_id"), "error": r.get("error")}


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _check_max(max_intervals: int | None) -> None:
    if max_intervals is not None and max_intervals < 1:
        raise SpecError(f"--max-intervals {max_intervals}: give 1 or more")
