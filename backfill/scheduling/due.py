"""Part: scheduling. `backfill run --due / --restate` and `backfill plan --due`: decide, then run in passes.

Decide (reads the runs table and scans the sources once, scheduling/survey.py):
- due: grid intervals up to `--until` (default: now - lag) that no published manifest covers, oldest first,
  each only once every partition of every source has data past max(end + lag, the time its outputs
  settle); the first interval that is not ready stops the list (later ones are not ready either), and the
  reason is printed;
- restate: published intervals ending within the `--restate` period before that bound whose input
  fingerprint differs from the one recorded when they were published.
Run: under the job's scheduler lock (scheduling/lock.py), the chosen intervals grouped into contiguous
passes; each pass reads and computes once (one warm-up) and publishes every interval as its own range
with its own manifest. The first failure stops everything after it, with one line; what was published
before it stays published.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import SparkSession

from backfill.errors import BackfillError, SpecError
from backfill.jobspec.durations import format_duration
from backfill.jobspec.load import Job
from backfill.jobspec.models import ScheduleSpec
from backfill.plan.builder import build_plan
from backfill.plan.definition import Plan
from backfill.scheduling.intervals import Coverage, Interval, contiguous, grid, instant, published
from backfill.scheduling.survey import Bounds, Survey, changed, survey


@dataclass
class Decision:
    """What a scheduled run would do, and why."""

    job: str
    until: int
    due: list[Interval] = field(default_factory=list)
    restate: dict[Interval, list[str]] = field(default_factory=dict)  # what changed in its input
    reopen: dict[Interval, int] = field(default_factory=dict)  # published with this many windows/rows open
    reach: int | None = None  # how far every partition's data reaches now (None: a partition has none)
    waiting: list[tuple[Interval, str]] = field(default_factory=list)  # the first interval not ready, and why
    waiting_after: int = 0  # the intervals after it up to the bound (not ready either)
    deferred: int = 0  # due but beyond --max-intervals
    unchanged: int = 0
    no_fingerprint: list[Interval] = field(default_factory=list)  # published by a manual run: not comparable
    published: int = 0
    bounds: dict[Interval, Bounds] = field(default_factory=dict)
    fingerprints: dict[Interval, dict[str, Any]] = field(default_factory=dict)

    @property
    def work(self) -> list[Interval]:
        """Every interval to publish, in order."""
        return sorted(set(self.due) | set(self.restate) | set(self.reopen))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (plan --due --json, run --due --json)."""
        return {"job": self.job, "until": self.until, "published": self.published,
                "due": [[iv.start, iv.end] for iv in self.due],
                "restate": [{"interval": [iv.start, iv.end], "changed": why}
                            for iv, why in sorted(self.restate.items())],
                "waiting": [{"interval": [iv.start, iv.end], "reason": why} for iv, why in self.waiting],
                "waiting_after": self.waiting_after,
                "reopen": [{"interval": [iv.start, iv.end], "open": n} for iv, n in sorted(self.reopen.items())],
                "deferred": self.deferred, "unchanged": self.unchanged,
                "no_fingerprint": [[iv.start, iv.end] for iv in self.no_fingerprint]}

    def lines(self) -> list[str]:
        """What a person reads before the run starts (and all `plan --due` prints)."""
        out = [f"job {self.job}: {self.published} interval{'' if self.published == 1 else 's'} published; until "
               f"{instant(self.until)}: {len(self.due)} due, {len(self.restate)} to restate"
               + (f", {len(self.reopen)} to reopen" if self.reopen else "")]
        for group in contiguous(self.due):
            out.append(f"  due     {Interval(group[0].start, group[-1].end)} ({len(group)} interval"
                       f"{'s' if len(group) > 1 else ''}, one pass)")
        for iv, n in sorted(self.reopen.items()):
            out.append(f"  reopen  {iv}: published with {n} windows or rows still open; its data has grown since")
        for iv, why in sorted(self.restate.items()):
            out.append(f"  restate {iv}: input changed since published: {'; '.join(why[:3])}"
                       + (f" (+{len(why) - 3} more)" if len(why) > 3 else ""))
        if self.deferred:
            out.append(f"  later   {self.deferred} more due intervals (--max-intervals)")
        for iv, why in self.waiting:
            more = self.waiting_after
            out.append(f"  waiting {iv}: {why}" + (f"; {more} later intervals wait too" if more else ""))
        if self.unchanged:
            out.append(f"  {self.unchanged} published intervals in the restate period: input unchanged")
        if self.no_fingerprint:
            out.append(f"  {len(self.no_fingerprint)} published intervals in the restate period were published by a "
                       "manual run (no input fingerprint): run them with --start/--end to restate them")
        return out


def schedule_of(job: Job) -> ScheduleSpec:
    """The job's schedule, or a one-line error saying how to add one."""
    if job.spec.schedule is None:
        raise SpecError(f"{job.path}: schedule: the job has no schedule; add e.g. `schedule: {{interval: 1h, lag: "
                        "15m}` (docs/job-spec.md#schedule), or run a range with --start/--end")
    return job.spec.schedule


def decide(job: Job, spark: SparkSession, runs: list[dict[str, Any]], *, until: int | None, now: int,
           restate_ms: int | None, max_intervals: int | None, due: bool = True) -> Decision:
    """The intervals to publish now (see the module docstring).

    Two scans of the sources: how far each partition reaches (from the first candidate's warm-up on), then
    the fingerprints of the intervals chosen (due ones are published with theirs, restate candidates are
    compared). Only the ready intervals, and the first one that is not, get a plan built.
    """
    schedule = schedule_of(job)
    bound = until if until is not None else now - schedule.lag
    done = published(runs, job.spec.name)
    decision = Decision(job=job.spec.name, until=bound)
    exact = {iv: row for iv, row in done.items() if iv.end - iv.start == schedule.interval}
    coverage = Coverage(list(done))
    sources = sorted({s for op in job.spec.operators for s in op.inputs})
    first = schedule.start_ms
    if first is None and exact:
        first = min(iv.start for iv in exact)
    if due and first is None:  # nothing published, no schedule.start: from the first record's interval
        first = survey(spark, job, sources, {}, None).earliest
        if first is None:
            decision.waiting.append((Interval(bound, bound), "the sources have no record with a valid timestamp"))
            return decision
    if first is not None:
        decision.published = sum(1 for iv in grid(schedule, first, bound) if coverage.covers(iv))
    candidates = [iv for iv in grid(schedule, first, bound) if not coverage.covers(iv)] if due and first is not None \
        else []
    restating = sorted(iv for iv in exact if bound - restate_ms < iv.end <= bound) if restate_ms is not None else []
    # published while windows (sessions, waiting join rows) were still open: run again once the data grew
    still_open = {iv: n for iv, row in exact.items() if due and iv.end <= bound and (n := _open(row))}
    needed: dict[Interval, int] = {}
    if candidates or still_open:
        first_iv = min([*candidates[:1], *still_open])
        reach = survey(spark, job, sources, {}, _bounds(build_plan(job, first_iv.start, first_iv.end), schedule,
                                                        first_iv)[2])
        decision.reach = _reach(reach, sources)
        for i, iv in enumerate(candidates):
            decision.bounds[iv], needed[iv], _ = _bounds(build_plan(job, iv.start, iv.end), schedule, iv)
            why = _not_ready(reach, sources, needed[iv])
            if why is not None:  # later intervals need later data still: not ready either
                decision.waiting.append((iv, why))
                decision.waiting_after = len(candidates) - i - 1
                break
            decision.due.append(iv)
        for iv, n in still_open.items():
            before = exact[iv].get("data_reach")
            if decision.reach is not None and (before is None or decision.reach > before):
                decision.reopen[iv] = n
    restating = [iv for iv in restating if iv not in decision.reopen]
    chosen = sorted(set(decision.due) | set(restating) | set(decision.reopen))
    if max_intervals is not None and len(chosen) > max_intervals:
        chosen = chosen[:max_intervals]
        decision.deferred = sum(1 for iv in [*decision.due, *decision.reopen] if iv not in set(chosen))
        decision.due = [iv for iv in decision.due if iv in set(chosen)]
        decision.reopen = {iv: n for iv, n in decision.reopen.items() if iv in set(chosen)}
        restating = [iv for iv in restating if iv in set(chosen)]
    for iv in [*restating, *decision.reopen]:
        decision.bounds[iv] = _bounds(build_plan(job, iv.start, iv.end), schedule, iv)[0]
    if not chosen:
        return decision
    wanted = {iv: decision.bounds[iv] for iv in chosen}
    lows = [lo for b in wanted.values() for lo, _ in b.values()]
    found = survey(spark, job, sources, wanted, None if any(lo is None for lo in lows) else min(lows))
    for iv in restating:
        recorded = exact[iv].get("fingerprint")
        if recorded is None:
            decision.no_fingerprint.append(iv)
            continue
        diff = changed(recorded, found.fingerprints.get(iv, {}))
        if diff:
            decision.restate[iv] = diff
        else:
            decision.unchanged += 1
    decision.fingerprints = {iv: found.fingerprints.get(iv, {}) for iv in decision.work}
    return decision


def _bounds(plan: Plan, schedule: ScheduleSpec, iv: Interval) -> tuple[Bounds, int, int | None]:
    """Per source, the event-time range a run of `iv` reads; the time every source must reach; the lowest
    time any source reads (None: a source is read whole)."""
    needed = max([iv.end + schedule.lag] + [op.settled_by(iv.end) for op in plan.operators])
    bounds = {}
    for sp in plan.sources:
        lo = None if sp.reads_all else sp.read_from if sp.read_from is not None else iv.start
        bounds[sp.name] = (lo, sp.read_until if sp.read_until is not None else needed)
    lows = [lo for lo, _ in bounds.values()]
    return bounds, needed, None if any(lo is None for lo in lows) else min(lows)


def _open(row: dict[str, Any]) -> int:
    """Windows (or join rows) its run left open in its interval, from its manifest's counts."""
    counts = json.loads(row.get("counts") or "{}") if isinstance(row.get("counts"), str) else row.get("counts") or {}
    return sum(int(op.get("incomplete_windows") or 0) for op in (counts.get("operators") or {}).values())


def _reach(found: Survey, sources: list[str]) -> int | None:
    """The newest time every partition of every source has reached (None: a partition has no record)."""
    values = [ts for s in sources for ts in found.reach.get(s, {}).values()]
    return None if not values or any(ts is None for ts in values) else min(values)


def _not_ready(found: Survey, sources: list[str], needed: int) -> str | None:
    for source in sources:
        short = found.short_of(source, needed)
        if not found.reach.get(source):
            return f"sources.{source} has no records yet; its data must reach {instant(needed)}"
        if short:
            shown = ", ".join(f"partition {p} reaches {instant(ts) if ts is not None else 'nothing (no records)'}"
                              for p, ts in short[:3]) + (f" (+{len(short) - 3} more)" if len(short) > 3 else "")
            return f"data of sources.{source} must reach {instant(needed)} (end + lag, settled outputs): {shown}"
    return None


def run_decision(job: Job, spark: SparkSession, decision: Decision, lock: Any, report: Any,
                 progress: Any) -> list[dict[str, Any]]:
    """Publish every interval of the decision in contiguous passes; returns the interval summaries.

    `report(line)` prints one finished interval; on a failure a `failed` manifest names the interval that
    did not publish, and the error goes up (the CLI prints it as one line).
    """
    from backfill.io.lock import holding
    from backfill.io.runs import append_run
    from backfill.plan.evaluator import Intervals, run_plan

    done: list[dict[str, Any]] = []
    for group in contiguous(decision.work):
        the_plan = build_plan(job, group[0].start, group[-1].end)
        modes = {iv: "restate" if iv in decision.restate else "reopen" if iv in decision.reopen else "due"
                 for iv in group}
        published_now: set[tuple[int, int]] = set()

        def before_publish(bounds: tuple[int, int]) -> None:
            lock.check()
            lock.renew(doing=f"publishing {Interval(*bounds)}")

        started = time.time()
        try:
            with holding(the_plan.written_paths, job.spec.name):
                summary = run_plan(the_plan, spark, progress, Intervals(
                    bounds=[(iv.start, iv.end) for iv in group],
                    fingerprints={(iv.start, iv.end): decision.fingerprints.get(iv, {}) for iv in group},
                    modes={(iv.start, iv.end): m for iv, m in modes.items()}, before_publish=before_publish,
                    reach=decision.reach,
                    on_published=lambda part: (published_now.add((part["start"], part["end"])),
                                               report(part))))
            done += summary.intervals
        except BaseException as exc:
            failed = next(iv for iv in group if (iv.start, iv.end) not in published_now)
            _record_failure(spark, the_plan, failed, modes[failed], exc, time.time() - started, append_run)
            raise
    return done


def _record_failure(spark: SparkSession, plan: Plan, failed: Interval, mode: str, exc: BaseException, seconds: float,
                    append: Any) -> None:
    """A `failed` manifest for the interval that did not publish (best effort: the error is what matters)."""
    if isinstance(exc, KeyboardInterrupt) or plan.runs_sink is None:
        return
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if not isinstance(exc, BackfillError):
        message = f"{type(exc).__name__}: {message}"
    try:
        append(spark, plan.runs_sink, {"run_id": f"failed-{int(time.time() * 1000)}", "job": plan.job.spec.name,
                                       "start": failed.start, "end": failed.end, "status": "failed",
                                       "mode": mode, "duration_s": round(seconds, 3), "error": message[:1000]},
               job_file=str(plan.job.path))
    except Exception:  # noqa: BLE001 - never hide the run's own error behind this one
        pass


def describe_interval(part: dict[str, Any]) -> str:
    """One line per published interval: range, mode, rows out, ledger rows, versions."""
    versions = ", ".join(f"{name} v{sink['version']}" for name, sink in part["sinks"].items()
                         if sink.get("version") is not None)
    rows = sum(int(s.get("rows") or 0) for name, s in part["sinks"].items() if name != "_ledger")
    verb = {"restate": "restated", "reopen": "reopened"}.get(part["mode"], "published")
    return (f"{verb} {Interval(part['start'], part['end'])}: "
            f"{part['records_in']:,} records in, {rows:,} rows out, {part['ledger_rows']:,} dropped"
            + (f" ({versions})" if versions else "") + f", {part['duration_s']:.1f} s")


def restate_period(text: str | None) -> int | None:
    """`--restate 2d` as ms."""
    if text is None:
        return None
    from backfill.jobspec.durations import parse_duration

    try:
        value = parse_duration(text)
    except ValueError as exc:
        raise SpecError(f"--restate: {exc}") from None
    if value <= 0:
        raise SpecError(f"--restate {text}: give a positive period, e.g. --restate 2d")
    return value


__all__ = ["Decision", "decide", "run_decision", "describe_interval", "restate_period", "schedule_of",
           "format_duration"]
