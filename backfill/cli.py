"""Part: commands. The `backfill` command: plan, run, runs, inspect, verify, diff, demo, archive, doctor, server,
jars. A thin layer over the Python API (backfill/api.py): the same functions, printed.

Exit codes: 0 ok, 1 differences or failed expectations, 2 error (one clear line on stderr).
"""
from __future__ import annotations

import json
import os
import sys
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Iterator, Optional

import typer
from rich.console import Console

from backfill.errors import BackfillError, SpecError
from backfill.execute import execute

app = typer.Typer(help="Re-derive what a Kafka Streams application emitted, exactly, in PySpark batch jobs.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
# piped output (CI logs, files) is not wrapped at Rich's 80-column default; a terminal keeps its width
_PIPE_WIDTH = None if os.environ.get("COLUMNS") else 120
err = Console(stderr=True, width=None if sys.stderr.isatty() else _PIPE_WIDTH)
out = Console(width=None if sys.stdout.isatty() else _PIPE_WIDTH)

JobArg = Annotated[Path, typer.Argument(help="The job YAML (see docs/job-spec.md).", show_default=False)]
StartOpt = Annotated[Optional[str], typer.Option(
    "--start", help="First window start to write: ISO-8601 instant or epoch ms (inclusive).")]
EndOpt = Annotated[Optional[str], typer.Option(
    "--end", help="End of the range by window start: ISO-8601 instant or epoch ms (exclusive).")]
JunitOpt = Annotated[Optional[Path], typer.Option(
    "--junit", help="Also write the verdict as JUnit XML: one test case per operator, failed when differences "
    "are unexplained (diff: any difference) or expectations failed.", show_default=False)]
ProfileOpt = Annotated[Optional[str], typer.Option(
    "--profile", help="Spark profile from conf/ (local, cluster); default $BACKFILL_PROFILE or local.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout.")]
DueOpt = Annotated[bool, typer.Option(
    "--due", help="Scheduled: the job's schedule intervals not yet published whose data is complete, up to "
                  "now - lag (or --until), each published as its own range.")]
UntilOpt = Annotated[Optional[str], typer.Option(
    "--until", help="With --due/--restate: the bound instead of now - lag (ISO-8601 or epoch ms).")]
MaxOpt = Annotated[Optional[int], typer.Option(
    "--max-intervals", help="With --due: publish at most this many intervals (the oldest first).")]
RestateOpt = Annotated[Optional[str], typer.Option(
    "--restate", help="Republish the intervals published in this period before the bound (e.g. 2d) whose input "
                      "changed since (late data).")]
EngineOpt = Annotated[str, typer.Option(
    "--engine", help="spark (default) or reference (the record-at-a-time oracle; small inputs only).")]
RemoteOpt = Annotated[Optional[str], typer.Option(
    "--remote", help="Run on a Spark Connect server, sc://HOST:PORT (default $SPARK_REMOTE; else the resident "
                     "engine of `backfill server` when it runs; else a session of its own).", show_default=False)]


def _version(value: bool) -> None:
    if value:
        from backfill.doctor import versions

        for line in versions():
            print(line)
        raise typer.Exit(0)


@app.callback()
def _main(version: Annotated[bool, typer.Option(
        "--version", help="Print backfill's, Spark's, Delta's and the Kafka Streams profiles' versions and exit.",
        callback=_version, is_eager=True)] = False) -> None:
    """Re-derive what a Kafka Streams application emitted, exactly, in PySpark batch jobs."""


def parse_instant(text: str | None, option: str) -> int | None:
    """An ISO-8601 instant or epoch milliseconds, as epoch ms."""
    from backfill.api import instant_ms

    return instant_ms(text, option)


@contextmanager
def handled(remote: str | None = None) -> Iterator[None]:
    """Map errors to exit codes with one line on stderr; never a traceback for a user error. `remote`: the
    command's sessions are Spark Connect sessions to that address."""
    from backfill.session import remote as connect_to

    try:
        with connect_to(remote):
            yield
    except BackfillError as exc:
        err.print(f"[bold red]error:[/] {one_line(str(exc))}", highlight=False, soft_wrap=True)
        raise typer.Exit(exc.exit_code) from None
    except typer.Exit:
        raise
    except Exception as exc:  # noqa: BLE001 - the one place that turns failures into exit codes
        message = _spark_message(exc)
        if os.environ.get("BACKFILL_DEBUG"):
            traceback.print_exc()
        err.print(f"[bold red]error:[/] {one_line(message)}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None


_BREAKS = "\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"  # what str.splitlines() splits on


def one_line(message: str) -> str:
    """The message as one line (a value carrying a line break shows it escaped), safe from Rich markup."""
    from rich.markup import escape

    return escape("".join(repr(c)[1:-1] if c in _BREAKS else c for c in message.strip()))


def _spark_message(exc: Exception) -> str:
    """First line of a Spark analysis error (a bad expression in the job), else an internal-error line."""
    name = type(exc).__name__
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else name
    if "AnalysisException" in name or "ParseException" in name or "PySparkValueError" in name:
        return f"Spark rejected an expression of the job: {first}"
    if "JAVA_GATEWAY_EXITED" in first:
        from backfill.session import jvm_log

        own = os.environ.get("BACKFILL_JAVA_OPTIONS")
        return ("the Spark driver JVM did not start: check that `java -version` is Java 17"
                + (f" and that BACKFILL_JAVA_OPTIONS ({own}) are options it accepts" if own else "")
                + f"; the JVM's own message is in {jvm_log() or 'the output above'}")
    return f"internal error ({name}: {first}); rerun with BACKFILL_DEBUG=1 for the traceback and report it"


@app.command()
def plan(job: JobArg, start: StartOpt = None, end: EndOpt = None, as_json: JsonOpt = False, due: DueOpt = False,
         until: UntilOpt = None, max_intervals: MaxOpt = None, restate: RestateOpt = None,
         profile: ProfileOpt = None, remote: RemoteOpt = None) -> None:
    """Show what a run would do: inputs, output range, warm-up and cool-down, operators, sinks. Reads no data
    (with --due/--restate: the intervals a scheduled run would publish; reads the sources' timestamps)."""
    from backfill.api import plan_job

    with handled(remote):
        if due or restate is not None:
            _no_range(start, end, "--due/--restate")
            from backfill.scheduling.command import plan_scheduled

            plan_scheduled(job, until=parse_instant(until, "--until"), restate=restate, max_intervals=max_intervals,
                           due=due, profile=profile, out=out, as_json=as_json)
            return
        _scheduled_only(until, max_intervals)
        planned = plan_job(job, parse_instant(start, "--start"), parse_instant(end, "--end"), profile=profile)
        if as_json:
            print(json.dumps(planned.to_dict(), indent=2))
        else:
            out.print(str(planned), highlight=False, soft_wrap=True, markup=False)


@app.command()
def run(job: JobArg, start: StartOpt = None, end: EndOpt = None, as_json: JsonOpt = False,
        profile: ProfileOpt = None, engine: EngineOpt = "spark", due: DueOpt = False, until: UntilOpt = None,
        max_intervals: MaxOpt = None, restate: RestateOpt = None, remote: RemoteOpt = None) -> None:
    """Run the job: re-derive every operator's output for the range and publish it (Delta: replace the range).

    With --due and/or --restate: the job's schedule decides the ranges (one scheduler at a time; a second
    one exits 0 saying which run holds the lock)."""
    with handled(remote):
        if due or restate is not None:
            _no_range(start, end, "--due/--restate")
            if engine != "spark":
                raise SpecError("--engine: scheduled runs (--due/--restate) publish, which only the spark engine does")
            from backfill.scheduling.command import run_scheduled

            result = run_scheduled(job, until=parse_instant(until, "--until"), restate=restate,
                                   max_intervals=max_intervals, due=due, profile=profile, out=out, err=err,
                                   as_json=as_json)
            if as_json:
                print(json.dumps(result, indent=2, default=str))
            return
        _scheduled_only(until, max_intervals)
        summary = execute(job, parse_instant(start, "--start"), parse_instant(end, "--end"), profile, engine, err,
                          quiet=as_json)
        if as_json:
            print(json.dumps(summary, indent=2, default=str))
        elif engine == "reference":  # it writes nothing: its rows are in --json
            rows = ", ".join(f"{name} {len(r):,}" for name, r in summary["outputs"].items())
            drops = ", ".join(f"{reason} {n:,}" for reason, n in summary["ledger"].items()) or "none"
            out.print(f"reference engine: {summary['records_in']:,} records read; rows: {rows}; ledger: {drops}; "
                      "nothing is written (--json prints every row)", highlight=False)
        else:
            from backfill.summary import print_summary

            print_summary(out, summary)


def _no_range(start: str | None, end: str | None, what: str) -> None:
    if start is not None or end is not None:
        raise SpecError(f"--start/--end: {what} takes its ranges from the job's schedule; drop --start/--end, or "
                        "drop --due/--restate to run one range by hand")


def _scheduled_only(until: str | None, max_intervals: int | None) -> None:
    if until is not None or max_intervals is not None:
        raise SpecError("--until/--max-intervals: only with --due or --restate (a scheduled run); for one range "
                        "use --start/--end")


@app.command()
def runs(job: JobArg, as_json: JsonOpt = False,
         limit: Annotated[int, typer.Option("--limit", help="Newest rows to show (0: all).")] = 0) -> None:
    """Show the job's runs table: each published (or failed) interval with its records in/out/dropped, duration
    and output versions, and who holds the scheduler lock."""
    with handled():
        from backfill.scheduling.command import show_runs

        show_runs(job, out=out, as_json=as_json, limit=limit)


@app.command()
def inspect(job: JobArg, start: StartOpt = None, end: EndOpt = None, profile: ProfileOpt = None,
            engine: EngineOpt = "spark",
            limit: Annotated[int, typer.Option("--limit", help="Rows to show (0: all).")] = 50,
            as_json: JsonOpt = False, remote: RemoteOpt = None) -> None:
    """Show the processing order per task: task, seq, record, timestamp and each operator's stream time."""
    from backfill.plan.builder import build_plan
    from backfill.jobspec.load import load_job

    with handled(remote):
        the_plan = build_plan(load_job(job), parse_instant(start, "--start"), parse_instant(end, "--end"))
        if engine == "reference":
            from backfill.reference.engine import run_reference

            order = run_reference(the_plan.job, the_plan.start, the_plan.end).order
            rows = [r for task in sorted(order) for r in order[task]]
        else:
            from backfill.plan.evaluator import ordered_records
            from backfill.session import get_spark

            df = ordered_records(the_plan, get_spark(profile)).orderBy("task", "seq")
            rows = [r.asDict() for r in (df.limit(limit).collect() if limit else df.collect())]
        rows = rows[:limit] if limit else rows
        if as_json:
            for r in rows:
                print(json.dumps(r, default=str))
            return
        from rich.table import Table

        table = Table(*(rows[0].keys() if rows else ["(no records)"]), box=None)
        for r in rows:
            table.add_row(*[str(v) for v in r.values()])
        out.print(table)


@app.command()
def demo(profile: ProfileOpt = None, as_json: JsonOpt = False, kafka: Annotated[bool, typer.Option(
        "--kafka", help="Through a local Kafka broker: produce the clicks to a topic, archive it, run the job "
                        "from the topic and from the archive, and check both give identical outputs.")] = False,
         avro: Annotated[bool, typer.Option(
             "--avro", help="With --kafka: a secured cluster (SASL_SSL, SCRAM) and a schema registry; the clicks "
                            "produced as Avro in two schema versions.")] = False,
         remote: RemoteOpt = None) -> None:
    """Generate the bundled click sample (2 partitions, a few percent late records) and run jobs/demo.yaml."""
    with handled(remote):
        if avro and not kafka:
            raise SpecError("--avro: the Avro variant runs through Kafka; add --kafka")
        if kafka:
            from backfill.demo import run_kafka_demo

            if not run_kafka_demo(out, err, profile=profile, as_json=as_json, avro=avro):
                raise typer.Exit(1)
            return
        from backfill.demo import run_demo

        run_demo(out, err, profile=profile, as_json=as_json)


@app.command()
def conformance(
        kafka_streams: Annotated[list[str] | None, typer.Option(
            "--kafka-streams", help="Kafka Streams version to judge with (repeatable; default: every version "
                                    "set up in jvm/lib).")] = None,
        operator: Annotated[list[str] | None, typer.Option(
            "--operator", help="aggregate, session, sliding, join, table, table_join, filter, chain, invalid "
                               "(judged by Kafka Streams), order (the merge of a task's queues, judged by a live "
                               "Kafka Streams application on a local broker) or "
                               "rules (judged by Flink); repeatable; default: all but order.")] = None,
        scenarios: Annotated[int, typer.Option("--scenarios", help="Random scenarios per operator kind.")] = 300,
        seed: Annotated[int, typer.Option("--seed", help="Seed of the scenarios (same seed, same scenarios).")] = 0,
        engine: Annotated[str, typer.Option("--engine", help="spark, reference or both.")] = "both",
        failures: Annotated[Path, typer.Option("--failures", help="Where differing scenarios are written, "
                                                                  "shrunk, as job folders.")] = Path("conformance-failures"),
        where: Annotated[list[str] | None, typer.Option(
            "--where", help="FIELD=V1,V2: only the drawn scenarios whose configuration's FIELD is one of the "
                            "values, e.g. how=inner,suppress (repeatable; every one must hold; the fields: "
                            "docs/job-spec.md, Conformance).")] = None,
        profile: ProfileOpt = None, as_json: JsonOpt = False) -> None:
    """Run random adversarial scenarios through backfill's engines and the real engine (Kafka Streams, Flink for
    rules); exit 1 on any difference."""
    import tempfile

    from rich.table import Table

    from backfill.conformance.check import run_kind
    from backfill.conformance.harness import check_version, versions
    from backfill.conformance.scenarios import KINDS

    with handled():
        kinds = operator or [*KINDS, "rules"]
        for kind in kinds:
            if kind not in (*KINDS, "order", "rules"):
                raise SpecError(f"--operator {kind!r}: conformance covers {', '.join(KINDS)}, order, rules")
        engines = {"both": ("spark", "reference"), "spark": ("spark",), "reference": ("reference",)}.get(engine)
        if engines is None:
            raise SpecError(f"--engine {engine!r}: use spark, reference or both")
        if scenarios < 1:
            raise SpecError(f"--scenarios {scenarios}: give at least 1")
        selected: dict[str, set[str]] = {}
        for clause in where or []:
            name, eq, values = clause.partition("=")
            if not eq or not name.strip() or not values.strip():
                raise SpecError(f"--where {clause!r}: write FIELD=VALUE[,VALUE...], e.g. how=inner,suppress")
            selected[name.strip()] = {v.strip() for v in values.split(",")}
        if selected and any(k in ("order", "rules") for k in kinds):
            raise SpecError("--where: selects configurations of the Kafka Streams operator kinds, not order or rules")
        chosen = kafka_streams or versions()
        for version in (chosen or ["(none)"]) if any(k != "rules" for k in kinds) else []:
            check_version(version)

        def run_ours(job: Path, which: str) -> dict[str, Any]:
            return execute(job, None, None, profile, which, err, quiet=True)

        rows = []
        with tempfile.TemporaryDirectory(prefix="backfill-conformance-") as work:
            def progress(line: str) -> None:
                if not as_json:
                    err.print(f"[dim]{line}[/]", highlight=False)

            for kind in kinds:
                judge = "Flink" if kind == "rules" else f"Kafka Streams {', '.join(chosen)}"
                progress(f"- {kind}: {scenarios} scenarios (seed {seed}), engines {', '.join(engines)}, {judge}")
                if kind == "rules":
                    from backfill.conformance.flink import run_rules

                    rows += run_rules(scenarios, seed, engines, run_ours, Path(work), failures, progress=progress)
                    continue
                if kind == "order":
                    from backfill.conformance.order import run_order
                    from backfill.session import get_spark

                    session = get_spark(profile) if "spark" in engines else None
                    rows += [(v, run_order(scenarios, seed, v, engines, Path(work), failures, spark=session,
                                           progress=progress)) for v in chosen]
                    continue
                rows += run_kind(kind, scenarios, seed, chosen, engines, run_ours, Path(work), failures,
                                 progress=progress, where=selected)
        differing = sum(len(r.differences) for _, r in rows)
        if as_json:
            print(json.dumps({"seed": seed, "results": [{"kafka_streams": v, **r.to_dict()} for v, r in rows],
                              "differences": differing}, indent=2, default=str))
        else:
            table = Table(box=None, pad_edge=False)
            for col in ("judge", "operator", "scenarios", "records", "judge's outputs", "judge's drops",
                        *(f"agree ({e})" for e in engines), "differ"):
                table.add_column(col, justify="left" if col in ("judge", "operator") else "right")
            for version, r in rows:
                judge_name = version if version.startswith("Flink") else f"Kafka Streams {version}"
                table.add_row(judge_name, r.kind, f"{r.scenarios:,}", f"{r.records:,}", f"{r.outputs:,}",
                              f"{r.dropped:,}", *(f"{r.agreeing[e]:,}" if e in r.agreeing else "-" for e in engines),
                              f"{len(r.differences):,}")
            out.print(table)
            for version, r in rows:
                for engine, n in getattr(r, "first_offer", {}).items():
                    if n:
                        out.print(f"order ({engine}, Kafka Streams {version}): {n} task(s) whose two queues start with "
                                  "the same timestamp took the other first offering (the consumer handed the later-"
                                  "named partition over first, docs/semantics.md §2.4); the rest of their order "
                                  "agrees", highlight=False)
            for _, r in rows:
                for d in r.differences:
                    if d.repro:
                        sid = d.scenario if isinstance(d.scenario, int) else d.scenario.id
                        out.print(f"difference: {d.engine} on {r.kind} scenario {sid}: {d.repro}", highlight=False)
        if differing:
            raise typer.Exit(1)


@app.command()
def archive(bootstrap: Annotated[str, typer.Option("--bootstrap", help="Kafka bootstrap servers, host:port.")],
            topic: Annotated[str, typer.Option("--topic", help="The topic to archive.")],
            to: Annotated[Path, typer.Option("--to", help="The Kafka-archive Delta table (created if missing).")],
            security: Annotated[Optional[Path], typer.Option(
                "--security", help="A YAML file of the cluster's kafka.security settings (protocol, mechanism, "
                "username, password as ${env:NAME} or ${file:PATH}, ca_file).", show_default=False)] = None,
            profile: ProfileOpt = None, as_json: JsonOpt = False, remote: RemoteOpt = None) -> None:
    """Copy a topic's new records into a Kafka-archive Delta table (only offsets not archived yet)."""
    from backfill.io.archive import archive_topic
    from backfill.io.lock import holding
    from backfill.jobspec.load import load_security

    with handled(remote), holding([str(to.resolve())], f"archive {topic}"):
        from backfill.session import get_spark

        settings = load_security(security) if security is not None else None

        def progress(line: str) -> None:  # one line per partition: what is archived now
            if not as_json:
                err.print(line, highlight=False)

        result = archive_topic(get_spark(profile), bootstrap, topic, str(to.resolve()), progress, settings)
        if as_json:
            print(json.dumps(result, indent=2))
        else:
            version = f", table version {result['version']}" if result["version"] is not None else ""
            out.print(f"archived {result['records']:,} new records of {topic} into {result['path']}{version}",
                      highlight=False)


@app.command()
def doctor(job: Annotated[Optional[Path], typer.Argument(
               help="A job file: also check it, its inputs, and its brokers' and schema registries' reachability.",
               show_default=False)] = None,
           profile: ProfileOpt = None, remote: RemoteOpt = None, as_json: JsonOpt = False,
           no_spark: Annotated[bool, typer.Option("--no-spark", help="Do not start a Spark session.")] = False) -> None:
    """Check what backfill needs here: Java, Maven, the jars, a Spark session (and with JOB its brokers and
    registries); one line each with what to do. Exit 2 when something a run needs fails."""
    from backfill.doctor import diagnose

    with handled(remote):
        checks = diagnose(job, profile, spark=not no_spark)
        if as_json:
            print(json.dumps([c.to_dict() for c in checks], indent=2))
        else:
            colour = {"ok": "green", "warn": "yellow", "fail": "red"}
            from rich.markup import escape

            for c in checks:
                out.print(f"[{colour[c.status]}]{escape(c.line())}[/]", highlight=False, soft_wrap=True)
        if any(c.status == "fail" for c in checks):
            raise typer.Exit(2)


@app.command()
def jars(as_json: JsonOpt = False, packages: Annotated[bool, typer.Option(
        "--packages", help="Print the Maven coordinates (spark.jars.packages) instead of the jar files.")] = False
         ) -> None:
    """Print the jars a Spark session needs for backfill (Delta, Spark's Kafka source, backfill's operators), comma
    separated, for spark-submit --jars or spark.jars (see README: spark-submit, YARN, Kubernetes)."""
    from backfill.api import jars as job_jars

    with handled():
        found = job_jars(packages=packages)
        print(json.dumps(found, indent=2) if as_json else ",".join(found))


@app.command("setup-jars")
def setup_jars(as_json: JsonOpt = False) -> None:
    """Resolve the pinned jars (Delta, Spark's Kafka source) from Maven through Spark's own resolver (Ivy) into
    backfill's jar folder, once: for an installed wheel (a checkout has scripts/setup.sh)."""
    from backfill.session import setup_jars as resolve

    with handled():
        found = resolve(lambda line: err.print(f"[dim]{line}[/]", highlight=False))
        if as_json:
            print(json.dumps(found, indent=2))
        else:
            out.print(f"{len(found)} jars in {Path(found[0]).parent if found else '-'}", highlight=False)


server_app = typer.Typer(help="The resident engine: a Spark Connect server on 127.0.0.1 with backfill's jars, kept warm "
                                "between commands (they use it while it runs, and say so).", no_args_is_help=True)
app.add_typer(server_app, name="server")


@server_app.command("start")
def server_start(port: Annotated[int, typer.Option("--port", help="The port on 127.0.0.1.")] = 15002,
                 idle_timeout: Annotated[str, typer.Option(
                     "--idle-timeout", help="End the server after this long without a command (e.g. 30m, 2h).")] = "30m",
                 profile: ProfileOpt = None, as_json: JsonOpt = False) -> None:
    """Start the resident engine and wait until it answers (a second start says it runs already)."""
    from backfill import server

    with handled():
        state = server.start(port, idle_timeout, profile, say=lambda line: err.print(f"[dim]{line}[/]", highlight=False))
        if as_json:
            print(json.dumps(state, indent=2))
        elif state["already"]:
            out.print(f"already running: {server.line(state)}", highlight=False, soft_wrap=True)
        else:
            out.print(server.line(state), highlight=False, soft_wrap=True)


@server_app.command("status")
def server_status(as_json: JsonOpt = False) -> None:
    """Print the resident engine's state in one line (running or not)."""
    from backfill import server

    with handled():
        state = server.status()
        if as_json:
            print(json.dumps(state, indent=2))
        else:
            out.print(server.line(state), highlight=False, soft_wrap=True)


@server_app.command("stop")
def server_stop() -> None:
    """End the resident engine (its JVM, its supervisor)."""
    from backfill import server

    with handled():
        state = server.stop(say=lambda line: err.print(line, highlight=False))
        out.print(f"resident engine: stopped (was {state['url']}, pid {state['pid']})" if state else
                  "resident engine: not running", highlight=False, soft_wrap=True)


AgainstOpt = Annotated[Optional[list[str]], typer.Option(
    "--against", help="OPERATOR=TABLE_OR_PATH: the streaming output of an operator (Delta, parquet or jsonl; "
    "path@version for a Delta version; kafka://HOST:PORT/TOPIC for its output topic). Repeat for several "
    "operators.")]
MapOpt = Annotated[Optional[list[str]], typer.Option(
    "--map", help="col=source_col: our column name = the streaming output's column. Repeatable.")]
ToleranceOpt = Annotated[Optional[list[str]], typer.Option(
    "--tolerance", help="col=abs:0.01, col=rel:1e-6 or col=abs:0.01,rel:1e-6. Repeatable.")]
ReportOpt = Annotated[Optional[Path], typer.Option(
    "--report", help="Report folder (index.html, report.json); default reports/<job>-<timestamp>/.")]


@app.command()
def verify(job: JobArg, against: AgainstOpt = None, maps: MapOpt = None, tolerance: ToleranceOpt = None,
           report: ReportOpt = None, run_first: Annotated[bool, typer.Option(
               "--run", help="Run the job first (same range), then verify what it published.")] = False,
           commits: Annotated[Optional[Path], typer.Option(
               "--commits", help="The application's committed input offsets when it restarted (JSON list of "
               "partition/offset, or kafka-consumer-groups --describe output): restarts are then reconciled "
               "from there.", show_default=False)] = None,
           corrections: Annotated[Optional[Path], typer.Option(
               "--corrections", help="Write the windows to republish (the backfill's values where a cause shows "
               "the stream's are wrong) to OUT/<operator>, in the sink's format.", show_default=False)] = None,
           junit: JunitOpt = None, start: StartOpt = None, end: EndOpt = None, profile: ProfileOpt = None,
           as_json: JsonOpt = False, remote: RemoteOpt = None) -> None:
    """Reconcile the backfill's published output with the streaming application's output, with causes."""
    from backfill.api import verify_job

    with handled(remote):
        with _status("verifying", as_json) as progress:
            outcome = verify_job(job, against or [], start=parse_instant(start, "--start"),
                                 end=parse_instant(end, "--end"), columns=_pairs(maps or [], "--map", "col=source_col"),
                                 tolerance=tolerance or [], report=report, run=run_first, commits=commits,
                                 corrections=corrections, junit=junit, profile=profile, progress=progress)
        _finish(outcome, as_json)


@app.command()
def diff(old: Annotated[str, typer.Argument(help="The old output: table path, or path@version.", show_default=False)],
         new: Annotated[str, typer.Argument(help="The new output: table path, or path@version.", show_default=False)],
         on: Annotated[list[str], typer.Option("--on", help="Key columns (comma-separated or repeated).")],
         columns: Annotated[Optional[list[str]], typer.Option(
             "--columns", help="Compare only these columns (comma-separated or repeated; default: every column "
                               "both have, keys and bookkeeping aside).")] = None,
         tolerance: ToleranceOpt = None, report: ReportOpt = None, profile: ProfileOpt = None,
         as_json: JsonOpt = False, junit: JunitOpt = None, remote: RemoteOpt = None) -> None:
    """Compare two outputs by key (reprocessing after a logic change): same comparison and report, no causes."""
    from backfill.api import diff_outputs

    with handled(remote):
        with _status("comparing", as_json) as progress:
            outcome = diff_outputs(old, new, on, columns=columns or [], tolerance=tolerance or [], report=report,
                                   junit=junit, profile=profile, progress=progress)
        _finish(outcome, as_json)


def _pairs(items: list[str], option: str, shape: str) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise SpecError(f"{option} {item!r}: use {shape}")
        out[name.strip()] = value.strip()
    return out


@contextmanager
def _status(what: str, quiet: bool) -> Iterator[Any]:
    """A spinner on a terminal, dim progress lines otherwise, nothing with --json."""
    if quiet:
        yield lambda _: None
    elif sys.stderr.isatty():
        with err.status(what, spinner="dots") as status:
            yield status.update
    else:
        yield lambda stage: err.print(f"[dim]- {stage}[/]", highlight=False)


def _finish(outcome: Any, as_json: bool) -> None:
    """Print the verdict (the API wrote the report and the JUnit XML), exit 0 (matched or explained) or 1."""
    page = outcome.report_dir / "index.html"
    if as_json:
        print(json.dumps(outcome.to_json(), indent=2, default=str))
    else:
        from backfill.summary import print_verification

        print_verification(out, outcome, page)
    if outcome.exit_code:
        raise typer.Exit(outcome.exit_code)


def main() -> None:
    """Console-script entry point: exits as soon as the command is done.

    With a Spark session, the interpreter's normal exit waits seconds for the JVM's shutdown; everything
    is already written and committed then, and the JVM ends by itself once its parent is gone (it
    watches its stdin), so leave at once.
    """
    from backfill.session import end_connect_session, one_shot_process

    one_shot_process()
    try:
        app()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    if "pyspark" in sys.modules:
        try:  # a Spark Connect server keeps a session's state until it is released (or times out)
            end_connect_session()
        except Exception:  # noqa: BLE001 - the command is done; a server gone meanwhile changes nothing
            pass
    sys.stdout.flush()
    sys.stderr.flush()
    if "pyspark" in sys.modules and _spark_running():
        os._exit(code)
    sys.exit(code)


def _spark_running() -> bool:
    from pyspark.sql import SparkSession

    return SparkSession.getActiveSession() is not None


if __name__ == "__main__":
    main()
