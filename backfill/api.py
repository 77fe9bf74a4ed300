"""Part: commands. The Python API: what `backfill plan`, `run`, `verify` and `diff` do, for a notebook or a program
with a Spark session of its own (docs/python-api.md). The command line is a thin layer over these functions, so
both give the same results.

    import backfill
    job = backfill.load_job("jobs/demo.yaml")
    print(job.plan())                                   # what a run would do; reads no data
    summary = job.run(spark, start="2024-01-01T00:00:00Z")  # the same data as `backfill run --json`
    outcome = job.verify(spark=spark, against={"clicks_per_user_1m": "data/stream/clicks_per_user_1m"})

Errors are the `BackfillError` family (backfill.errors: SpecError, SourceError, SessionError, PublishError, ...),
each one line naming the field or the record and the fix; nothing here exits the interpreter. A session given
as `spark=` is used as it is: it is checked (Delta, UTC), never stopped nor reconfigured.
"""
from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

from backfill.errors import SpecError

if TYPE_CHECKING:
    from backfill.jobspec.load import Job as JobFile
    from backfill.plan.definition import Plan
    from backfill.plan.strategy import Strategy
    from backfill.plan.evaluator import RunSummary
    from backfill.verify.runner import Outcome

Instant = Union[int, str, dt.datetime, None]
Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    return None


def instant_ms(value: Instant, option: str = "start") -> int | None:
    """An instant as epoch ms: epoch ms, an ISO-8601 text (as on the command line) or a datetime (naive: UTC)."""
    from backfill.jobspec.durations import INSTANT_HINT, parse_instant

    if value is None:
        return None
    if isinstance(value, bool):
        raise SpecError(f"{option} {value!r} is not an instant; {INSTANT_HINT}")
    if isinstance(value, int):
        return value
    if isinstance(value, dt.datetime):
        aware = value if value.tzinfo is not None else value.replace(tzinfo=dt.timezone.utc)
        return int(aware.timestamp() * 1000)
    try:
        return parse_instant(str(value))
    except ValueError:
        raise SpecError(f"{option} {value!r} is not an instant; {INSTANT_HINT}") from None


# ----------------------------------------------------------------------------- results


@dataclass(frozen=True)
class PlanResult:
    """What a run would do (`backfill plan`): `to_dict()` is `plan --json`, `str()` the text `plan` prints."""

    plan: Plan = field(repr=False)
    notes: tuple[str, ...] = ()
    strategies: tuple[Strategy, ...] = ()  # how a run would execute it (plan/strategy.py)

    def to_dict(self) -> dict[str, Any]:
        from backfill.plan.explainer import plan_dict

        data = plan_dict(self.plan)
        data["notes"] = [*data["notes"], *self.notes]
        data["strategies"] = [{"stage": s.stage, "how": s.how, "text": s.text} for s in self.strategies]
        return data

    def __str__(self) -> str:
        from backfill.plan.explainer import explain

        return "\n".join([explain(self.plan), *(s.line() for s in self.strategies),
                          *(f"note: {n}" for n in self.notes)])

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # IPython / Jupyter
        printer.text(str(self))


# ----------------------------------------------------------------------------- the functions the CLI calls


def plan_job(path: str | Path, start: Instant = None, end: Instant = None, spark: Any = None,
             profile: str | None = None) -> PlanResult:
    """`backfill plan`: the plan, and how the session would run it (the jar-less ordering over Spark Connect)."""
    from backfill.jobspec.load import load_job as load
    from backfill.plan import strategy
    from backfill.plan.builder import build_plan

    the_plan = build_plan(load(path), instant_ms(start, "--start"), instant_ms(end, "--end"))
    note = _session_note(spark, profile)
    chosen = strategy.strategies(the_plan, operator=note is None, input_bytes=strategy.file_bytes(the_plan))
    return PlanResult(the_plan, (note,) if note else (), tuple(chosen))


def _session_note(spark: Any, profile: str | None) -> str | None:
    """Without starting Spark: what the session a run would use cannot do (the given one's, a Connect one's);
    None: it reaches backfill's JVM operator."""
    from backfill import session

    if spark is not None:
        return session.operator_note(spark)
    if session.remote_url(profile, say=_quiet) is not None:
        return session.ORDERING_NOTE.format(why="a Spark Connect session")
    if not session.OPS_JAR.is_file():
        return session.ORDERING_NOTE.format(why=f"{session.OPS_JAR} is not built: run scripts/setup.sh")
    return None


def run_job(path: str | Path, start: Instant = None, end: Instant = None, *, spark: Any = None,
            profile: str | None = None, engine: str = "spark", progress: Progress = _quiet) -> Any:
    """`backfill run`: run the job on `spark` (else the profile's session) and publish; returns the RunSummary
    (`to_dict()` is `run --json`), or with engine="reference" the reference engine's result (nothing written)."""
    from backfill.jobspec.load import load_job as load
    from backfill.plan.builder import build_plan

    lo, hi = instant_ms(start, "--start"), instant_ms(end, "--end")
    the_plan = build_plan(load(path), lo, hi)
    if engine == "reference":
        from backfill.reference.engine import run_reference

        return run_reference(the_plan.job, lo, hi)
    if engine != "spark":
        raise SpecError(f"--engine {engine!r} is not an engine; use spark or reference")
    from backfill.io.lock import holding
    from backfill.plan.evaluator import run_plan

    with holding(the_plan.written_paths, the_plan.job.spec.name):
        session, notes = use_session(spark, profile, the_plan, the_plan.job.input_bytes())
        summary = run_plan(the_plan, session, progress)
        register_tables(session, the_plan.job)
    summary.warnings += notes
    return summary


def register_tables(spark: Any, job: JobFile) -> None:
    """Register the sink tables (`table:`) a publish created: the catalog then names the Delta table written at
    the location it gave (jobspec/load.py)."""
    import os

    for sink in job.spec.sinks.values():
        if sink.table and sink.path and os.path.isdir(os.path.join(sink.path, "_delta_log")):
            location = sink.path.replace("\\", "\\\\").replace("'", "\\'")
            spark.sql(f"CREATE TABLE IF NOT EXISTS {sink.table} USING delta LOCATION '{location}'")


def use_session(spark: Any, profile: str | None, plan: Plan, input_bytes: int | None) -> tuple[Any, list[str]]:
    """The session a command runs on (`spark`, else the profile's, the active one or a Connect one), checked for
    what the plan needs without changing it; the notes say what it does differently (the jar-less plan)."""
    from backfill.session import check_session, get_spark

    session = spark if spark is not None else get_spark(profile, input_bytes=input_bytes)
    return session, check_session(session, delta=needs_delta(plan))


def needs_delta(plan: Plan) -> bool:
    """Whether a run of the plan reads or writes a Delta table (a source, a sink, the runs table)."""
    formats = {s.format for s in plan.sources} | {s.format for s in plan.job.spec.sinks.values()}
    return "delta" in formats or (plan.runs_sink is not None and not plan.runs_sink.endswith(".jsonl"))


def verify_job(path: str | Path, against: Mapping[str, str] | Sequence[str] | None = None, *, spark: Any = None,
               start: Instant = None, end: Instant = None, columns: Mapping[str, str] | None = None,
               tolerance: Mapping[str, str] | Sequence[str] | None = None, report: str | Path | None = None,
               run: bool = False, commits: str | Path | None = None, corrections: str | Path | None = None,
               junit: str | Path | None = None, profile: str | None = None,
               progress: Progress = _quiet) -> Outcome:
    """`backfill verify`: reconcile the published outputs with the streaming application's; writes the report
    (report.json, index.html) and returns the Outcome (`to_dict()` is `verify --json`; `exit_code` 0 matched or
    explained, 1 otherwise). `against`: {operator: table or path} (else the job's `verify:` settings)."""
    from backfill.jobspec.load import load_job as load
    from backfill.plan.builder import build_plan
    from backfill.verify.reconcile import parse_tolerances
    from backfill.verify.restarts import read_commits
    from backfill.verify.runner import default_report_dir, targets_for, verify_plan

    lo, hi = instant_ms(start, "--start"), instant_ms(end, "--end")
    the_plan = build_plan(load(path), lo, hi)
    targets = targets_for(the_plan, _items(against))
    tolerances = parse_tolerances(_items(tolerance))
    committed = read_commits(Path(commits)) if commits is not None else None
    folder = Path(report) if report is not None else default_report_dir(the_plan.job.spec.name)
    summary = run_job(path, lo, hi, spark=spark, profile=profile, progress=progress).to_dict() if run else None
    session, _ = use_session(spark, profile, the_plan, _verify_bytes(the_plan, targets))
    outcome = verify_plan(session, the_plan, targets, dict(columns or {}), tolerances, folder, progress,
                          run=summary, commits=committed, corrections=Path(corrections) if corrections else None)
    _write(outcome, junit)
    return outcome


def diff_outputs(old: str, new: str, on: str | Sequence[str], *, columns: str | Sequence[str] | None = None,
                 tolerance: Mapping[str, str] | Sequence[str] | None = None, report: str | Path | None = None,
                 junit: str | Path | None = None, spark: Any = None, profile: str | None = None,
                 progress: Progress = _quiet) -> Outcome:
    """`backfill diff`: compare two outputs by key (`path` or `path@version`); writes the report and returns the
    Outcome (`to_dict()` is `diff --json`)."""
    from backfill.jobspec.load import local_bytes
    from backfill.session import check_session, get_spark
    from backfill.verify.reconcile import parse_tolerances
    from backfill.verify.runner import default_report_dir, diff_tables

    keys = [c for item in _names(on) for c in item.split(",") if c]
    folder = Path(report) if report is not None else default_report_dir("diff")
    session = spark if spark is not None else get_spark(profile, local_bytes([old, new]))
    check_session(session, delta=False)
    outcome = diff_tables(session, old, new, keys, parse_tolerances(_items(tolerance)), folder, progress,
                          only=[c for item in _names(columns) for c in item.split(",") if c])
    _write(outcome, junit)
    return outcome


def _write(outcome: Outcome, junit: str | Path | None) -> None:
    from backfill.verify.report import write_junit, write_report

    write_report(outcome)
    if junit is not None:
        write_junit(outcome, Path(junit))


def _items(given: Mapping[str, str] | Sequence[str] | None) -> list[str]:
    """{name: value} or ["name=value", ...] as the command line's NAME=VALUE items."""
    if given is None:
        return []
    if isinstance(given, Mapping):
        return [f"{k}={v}" for k, v in given.items()]
    if isinstance(given, str):
        return [given]
    return list(given)


def _names(given: str | Sequence[str] | None) -> list[str]:
    if given is None:
        return []
    return [given] if isinstance(given, str) else list(given)


def _verify_bytes(plan: Plan, targets: list[Any]) -> int | None:
    """The size of what a verify reads: the job's sources and the streaming outputs (None when unknown)."""
    import os

    from backfill.jobspec.load import local_bytes

    sources = plan.job.input_bytes()
    outputs = local_bytes(t.against if "://" in t.against else os.path.join(t.base or os.getcwd(), t.against)
                          for t in targets)
    return None if sources is None or outputs is None else sources + outputs


# ----------------------------------------------------------------------------- the job object


class Job:
    """A job file, loaded and checked (`backfill.load_job`): plan it, run it, verify it, diff its outputs."""

    def __init__(self, job: JobFile) -> None:
        self._job = job

    @property
    def path(self) -> Path:
        return self._job.path

    @property
    def name(self) -> str:
        return self._job.spec.name

    @property
    def spec(self) -> Any:
        """The job as typed models (backfill.jobspec.models.JobSpec)."""
        return self._job.spec

    def __repr__(self) -> str:
        return f"backfill.Job({self.name!r}, {str(self.path)!r})"

    def plan(self, start: Instant = None, end: Instant = None, spark: Any = None) -> PlanResult:
        """What a run would do: inputs, range, operators, sinks (reads no data)."""
        return plan_job(self.path, start, end, spark)

    def run(self, spark: Any = None, start: Instant = None, end: Instant = None, *, profile: str | None = None,
            engine: str = "spark", progress: Progress = _quiet) -> RunSummary:
        """Run the job and publish its outputs; `spark`: the session to use as it is (default: the profile's)."""
        return run_job(self.path, start, end, spark=spark, profile=profile, engine=engine, progress=progress)

    def verify(self, against: Mapping[str, str] | Sequence[str] | None = None, *, spark: Any = None,
               start: Instant = None, end: Instant = None, columns: Mapping[str, str] | None = None,
               tolerance: Mapping[str, str] | Sequence[str] | None = None, report: str | Path | None = None,
               run: bool = False, commits: str | Path | None = None, corrections: str | Path | None = None,
               junit: str | Path | None = None, progress: Progress = _quiet) -> Outcome:
        """Reconcile the published outputs with the streaming application's (`backfill verify`)."""
        return verify_job(self.path, against, spark=spark, start=start, end=end, columns=columns,
                          tolerance=tolerance, report=report, run=run, commits=commits, corrections=corrections,
                          junit=junit, progress=progress)

    def diff(self, old: str, new: str, on: str | Sequence[str] | None = None, *,
             columns: str | Sequence[str] | None = None, tolerance: Mapping[str, str] | Sequence[str] | None = None,
             report: str | Path | None = None, junit: str | Path | None = None, spark: Any = None) -> Outcome:
        """Compare two versions of an output (`backfill diff`). `old`/`new`: an operator of this job (its sink),
        or a table path (relative to the job file), each optionally `@version`. `on`: default the operator's
        key columns (key and window_start for a window, key and ts for a join)."""
        left, right = self._table(old), self._table(new)
        keys = on if on is not None else self._keys(old.rsplit("@", 1)[0])
        return diff_outputs(left, right, keys, columns=columns, tolerance=tolerance, report=report, junit=junit,
                            spark=spark)

    def _table(self, name: str) -> str:
        base, sep, version = name.rpartition("@") if "@" in name else (name, "", "")
        sink = self._job.spec.sinks.get(base)
        path = self._job.resolve(sink.path) if sink is not None and sink.path else self._job.resolve(base)
        return f"{path}{sep}{version}"

    def _keys(self, operator: str) -> list[str]:
        op = next((o for o in self._job.spec.operators if o.name == operator), None)
        if op is None:
            raise SpecError(f"diff: {operator!r} is not an operator of {self.path}; give on= (the key columns)")
        return ["key", "ts"] if op.join is not None else ["key", "window_start"]


def load_job(path: str | Path) -> Job:
    """Read and check a job file (docs/job-spec.md); SpecError with one line naming the field and the fix."""
    from backfill.jobspec.load import load_job as load

    return Job(load(path))


def jars(packages: bool = False) -> list[str]:
    """The jars a session of one's own needs for backfill (`backfill jars`): files, or Maven coordinates."""
    from backfill.session import job_jars

    return job_jars(packages=packages)


def diff(old: str, new: str, on: str | Sequence[str], **options: Any) -> Outcome:
    """Compare two outputs by key (`backfill diff OLD NEW --on ...`); options as `diff_outputs`."""
    return diff_outputs(old, new, on, **options)
