"""The Python API (backfill/api.py, docs/python-api.md): `load_job(...).plan/run/verify/diff` on a session the caller
made give what the command line gives, errors are BackfillErrors (never a SystemExit), and a session given is used
as it is: checked, never stopped nor reconfigured."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import backfill
from backfill.cli import app
from backfill.errors import BackfillError, SessionError, SpecError
from tests.conftest import delta_tables

TABLES = ("gold/clicks_per_user_1m", "gold/clicks_per_user_5m_hop", "gold/user_sessions", "ledger/clicks")
# what differs between two runs of the same job by construction: ids, times, where it wrote
VOLATILE = {"run_id", "duration_s", "records_per_s", "sinks", "inputs", "code_version"}


def demo_folder(root: Path, records: int = 1_500) -> Path:
    """The demo's job, schemas, a click sample and its simulated streaming output under `root`; the job file."""
    from backfill.demo import SOURCE, STREAM, STREAM_OPERATOR, generate_clicks, install_job
    from backfill.demo.stream import write_stream_sample

    generate_clicks(str(root / SOURCE), n=records)
    job = install_job(root)
    write_stream_sample(job, STREAM_OPERATOR, root / STREAM)
    return job


def stable(summary: dict[str, Any]) -> dict[str, Any]:
    """A run summary as JSON carries it (task numbers as text keys), without what differs by construction."""
    return {k: v for k, v in json.loads(json.dumps(summary, default=str)).items() if k not in VOLATILE}


def stable_outcome(outcome: dict[str, Any], *folders: Path | str) -> dict[str, Any]:
    """A verify/diff result without its times and the run it came with, its tables' folders (and the id of the
    run it read) named alike."""
    out = {k: v for k, v in outcome.items() if k not in ("started_at", "duration_s", "run")}
    out["sections"] = [{k: v for k, v in s.items() if k != "seconds"} for s in outcome["sections"]]
    text = json.dumps(out, sort_keys=True, default=str)
    for folder in folders:
        text = text.replace(str(folder), "<folder>")
    return json.loads(text)


def cli(*args: str) -> dict[str, Any]:
    """A `backfill` command as the command line runs it, on the process's own session; its --json."""
    done = CliRunner().invoke(app, [*args, "--json"])
    assert done.exit_code == 0, done.stdout[-1000:] + done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.mark.spark
@pytest.mark.slow
def test_the_api_on_a_session_the_caller_made_gives_what_the_cli_gives(tmp_path, spark):
    via_cli, via_api = demo_folder(tmp_path / "cli"), demo_folder(tmp_path / "api")
    user = spark.newSession()  # the caller's own session (its own settings; the same Spark)
    # as many shuffle partitions as the session the command line runs on here: a sum of doubles depends on the
    # order Spark adds them in (1498.22 against 1498.2199999999998), and the tables are compared exactly
    user.conf.set("spark.sql.shuffle.partitions", spark.conf.get("spark.sql.shuffle.partitions"))
    job = backfill.load_job(via_api)
    assert job.name == "clicks-demo" and isinstance(job.plan(), backfill.PlanResult)
    assert job.plan().to_dict() == {**json.loads(CliRunner().invoke(app, ["plan", str(via_api), "--json"]).stdout)}

    ran = cli("run", str(via_cli))
    summary = job.run(spark=user)
    assert stable(summary.to_dict()) == stable(ran)
    assert summary.records_in == 1_500 and summary.operators["clicks_per_user_1m"].outputs > 0
    assert delta_tables(tmp_path / "api", TABLES) == delta_tables(tmp_path / "cli", TABLES)

    verified = CliRunner().invoke(app, ["verify", str(via_cli), "--report", str(tmp_path / "cli-report"), "--json"])
    assert verified.exit_code == 0, verified.output
    outcome = job.verify(spark=user, report=tmp_path / "api-report")
    assert outcome.verdict == "explained" and outcome.exit_code == 0
    assert stable_outcome(outcome.to_json(), tmp_path / "api", summary.run_id) == \
        stable_outcome(json.loads(verified.stdout), tmp_path / "cli", ran["run_id"])
    assert (tmp_path / "api-report" / "index.html").is_file()

    # a second version of an output against the first: nothing changed
    job.run(spark=user)
    compared = job.diff("clicks_per_user_1m@0", "clicks_per_user_1m", spark=user, report=tmp_path / "diff")
    assert compared.verdict == "match" and compared.counts["match"] == summary.operators["clicks_per_user_1m"].outputs
    table = tmp_path / "api" / "data" / "gold" / "clicks_per_user_1m"
    by_cli = CliRunner().invoke(app, ["diff", f"{table}@0", str(table), "--on", "key,window_start", "--json",
                                      "--report", str(tmp_path / "diff-cli")])
    assert stable_outcome(compared.to_json()) == stable_outcome(json.loads(by_cli.stdout))
    assert user.conf.get("spark.sql.session.timeZone") == "UTC" and user.range(1).count() == 1  # still usable


def small_job(folder: Path) -> Path:
    """A one-record JSONL job."""
    from tests.conftest import write_jsonl

    write_jsonl(folder / "in.jsonl", [{"topic": "t", "partition": 0, "offset": 0, "key": "k", "value": "v",
                                       "timestamp": 1000}])
    job = folder / "job.yaml"
    job.write_text("name: small\nsources:\n  s: {format: jsonl, path: in.jsonl}\noperators:\n  - name: agg\n"
                   "    aggregate: {input: s, window: {type: tumbling, size: 10s, grace: 0ms}, aggregations: "
                   "{n: count()}}\nsinks:\n  agg: {format: jsonl, path: out/agg.jsonl}\n"
                   "  _ledger: {format: jsonl, path: out/ledger.jsonl}\n")
    return job


def test_errors_are_backfill_errors_with_the_cli_s_line_never_a_system_exit(tmp_path):
    with pytest.raises(SpecError, match="no such job file"):
        backfill.load_job(tmp_path / "nope.yaml")
    path = small_job(tmp_path)
    job = backfill.load_job(path)
    with pytest.raises(SpecError) as raised:
        job.run(start="yesterday")
    line = CliRunner().invoke(app, ["run", str(path), "--start", "yesterday"]).stderr
    assert line.strip() == f"error: {raised.value}"  # the same line
    with pytest.raises(SpecError, match="is not an engine; use spark or reference"):
        job.run(engine="flink")
    with pytest.raises(SpecError, match="is not an operator of"):
        job.diff("nope", "nope@1")
    assert issubclass(SessionError, BackfillError) and SessionError.exit_code == 2


def test_instants_are_epoch_ms_iso_text_or_datetimes():
    import datetime as dt

    from backfill.api import instant_ms

    assert instant_ms(1_704_067_200_000) == instant_ms("2024-01-01T00:00:00Z") == 1_704_067_200_000
    assert instant_ms(dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)) == 1_704_067_200_000
    assert instant_ms(dt.datetime(2024, 1, 1)) == 1_704_067_200_000  # naive: UTC
    with pytest.raises(SpecError, match="is not an instant"):
        instant_ms(True)


@pytest.mark.spark
def test_a_session_in_another_time_zone_is_refused_in_one_line_and_left_as_it_was(tmp_path, spark):
    job = small_job(tmp_path)
    user = spark.newSession()
    user.conf.set("spark.sql.session.timeZone", "America/New_York")
    with pytest.raises(SessionError) as raised:
        backfill.load_job(job).run(spark=user)
    assert "\n" not in str(raised.value) and "spark.sql.session.timeZone=UTC" in str(raised.value)
    assert user.conf.get("spark.sql.session.timeZone") == "America/New_York"  # not reconfigured
    assert user.range(2).count() == 2  # not stopped
    assert not (tmp_path / "out" / "agg.jsonl").exists()
    user.conf.set("spark.sql.session.timeZone", "UTC")
    done = backfill.load_job(job).run(spark=user)
    assert done.records_in == 1 and done.warnings == []  # the test's session has backfill's operator
