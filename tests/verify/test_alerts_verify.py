"""verify of a rules operator (docs/semantics.md §12.12): the alerts Flink itself raised (the rules judge's
MiniCluster job, tests/test_flink_conformance.py) against the backfill's re-derivation of the same messages, keyed
by (rule_id, transaction_id). Flink's own alerts reconcile to `match`; a copy is `duplicate_delivery`; a lost or
changed alert is `unexplained`, with the transaction and the rule version in the sample."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from backfill.cli import app
from backfill.conformance import flink
from tests.conftest import write_jsonl

pytestmark = [pytest.mark.spark, pytest.mark.slow]

MAP = ["--map", "rule_id=ruleId", "--map", "transaction=triggeringEvent", "--map", "value=triggeringValue"]


@pytest.fixture(scope="module")
def judged(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, list[dict[str, Any]]]:
    """(job, operator, Flink's alerts as the live job writes them: Alert JSON with the triggering event)."""
    scenarios = [sc for sc in flink.generate(40, 8) if sc.compat == "intended"]
    alerts = flink.judge(scenarios)
    sc = next(sc for sc in scenarios if len(alerts[sc.id]) >= 4
              and len({json.dumps(b, sort_keys=True) for k, b in sc.events if k == "transactions"})
              == sum(k == "transactions" for k, _ in sc.events))  # every transaction id once
    tmp = tmp_path_factory.mktemp("alerts")
    job = flink.write_job(tmp, [sc])
    ran = CliRunner().invoke(app, ["run", str(job), "--json"])
    assert ran.exit_code == 0, ran.stderr
    txs = [b for k, b in sc.events if k == "transactions"]
    rows = [{"ruleId": rule_id, "key": key, "triggeringEvent": txs[int(place.split("@")[1])],
             "triggeringValue": float(value)} for rule_id, key, place, value in alerts[sc.id]]
    return job, f"s{sc.id}", rows


def _verify(job: Path, operator: str, rows: list[dict[str, Any]], tmp: Path, *args: str) -> tuple[int, Any]:
    stream = write_jsonl(tmp / "alerts.jsonl", [{**r, "partition": 0, "offset": i} for i, r in enumerate(rows)])
    result = CliRunner().invoke(app, ["verify", str(job), "--json", "--against", f"{operator}={stream}",
                                      "--report", str(tmp / "report"), *args])
    assert result.exit_code in (0, 1), result.stdout + result.stderr
    return result.exit_code, json.loads(result.stdout)


def test_flinks_own_alerts_match(judged: tuple[Path, str, list[dict[str, Any]]], tmp_path: Path) -> None:
    job, operator, rows = judged
    code, report = _verify(job, operator, rows, tmp_path, *MAP)
    [section] = report["sections"]
    assert (code, report["verdict"]) == (0, "match")
    assert section["keys"] == ["rule_id", "transaction_id"] and section["columns"] == ["key", "value"]
    assert section["counts"]["match"] == len(rows) and sum(section["counts"].values()) == len(rows)


def test_a_copy_is_a_duplicate_a_lost_or_changed_alert_is_unexplained(
        judged: tuple[Path, str, list[dict[str, Any]]], tmp_path: Path) -> None:
    job, operator, rows = judged
    lost, changed, copied = rows[0], rows[1], rows[2]
    stream = [r for r in rows if r is not lost]
    stream = [{**r, "triggeringValue": r["triggeringValue"] + 1} if r is changed else r for r in stream]
    stream.append(dict(copied))
    code, report = _verify(job, operator, stream, tmp_path, *MAP)
    [section] = report["sections"]
    assert (code, report["verdict"]) == (1, "differences")
    assert {c: n for c, n in section["counts"].items() if n and c != "match"} == {
        "missing_in_stream": 1, "mismatch": 1, "duplicate_in_stream": 1}
    assert {c: n for c, n in section["causes"].items() if n} == {"duplicate_delivery": 1, "unexplained": 2}
    by = {(s["rule_id"], s["transaction_id"]): s for s in section["samples"] if s["category"] != "match"}
    gone = by[(lost["ruleId"], str(lost["triggeringEvent"]["transactionId"]))]
    assert gone["category"] == "missing_in_stream" and "the stream did not" in gone["detail"]
    assert json.loads(gone["l_transaction"])["transactionId"] == lost["triggeringEvent"]["transactionId"]
    assert gone["l_rule"] and gone["r_transaction"] is None
    other = by[(changed["ruleId"], str(changed["triggeringEvent"]["transactionId"]))]
    assert other["category"] == "mismatch" and other["diff_columns"] == ["value"]
    assert other["r_value"] == other["l_value"] + 1 and other["r_transaction"]


def test_alerts_without_a_rule_or_a_transaction_are_one_line(judged: tuple[Path, str, list[dict[str, Any]]],
                                                             tmp_path: Path) -> None:
    job, operator, rows = judged
    stream = write_jsonl(tmp_path / "alerts.jsonl", rows)
    for args, said in (([], "no column 'rule_id'"),
                       (["--map", "rule_id=ruleId"], "no column 'transaction' or 'transaction_id'")):
        result = CliRunner().invoke(app, ["verify", str(job), "--against", f"{operator}={stream}", *args])
        assert result.exit_code == 2, result.stdout + result.stderr
        error = [line for line in result.stderr.strip().splitlines() if said in line]  # after the progress lines
        assert len(error) == 1 and "--map rule_id=ruleId" in error[0], result.stderr
        assert result.stderr.strip().splitlines()[-1] == error[0]


def test_an_alert_on_a_transaction_the_run_ledgered_is_ledgered_input(
        judged: tuple[Path, str, list[dict[str, Any]]], tmp_path: Path) -> None:
    """The same messages and one more transaction, whose event time is not epoch ms: the run ledgers it
    (invalid_timestamp), so no rule evaluates it. An alert the stream raised on it is `ledgered_input`, with the
    ledger's reason and the record; an alert on a transaction the input does not have stays `unexplained`."""
    job, operator, rows = judged
    folder = tmp_path / "job"
    shutil.copytree(job.parent, folder, ignore=shutil.ignore_patterns("out"))
    [inputs] = (folder / "inputs").glob(f"transactions{operator[1:]}.jsonl")
    lines = [json.loads(line) for line in inputs.read_text().splitlines()]
    last = lines[-1]
    bad = {**last["value"], "transactionId": 990001, "eventTime": "soon"}
    write_jsonl(inputs, [*lines, {**last, "offset": last["offset"] + 1, "seq": last["seq"] + 1, "value": bad}])
    ran = CliRunner().invoke(app, ["run", str(folder / "job.yaml"), "--json"])
    assert ran.exit_code == 0, ran.stderr
    nowhere = {**bad, "transactionId": 990002, "eventTime": last["value"]["eventTime"]}
    extra = [{**rows[0], "triggeringEvent": tx, "triggeringValue": 1.0} for tx in (bad, nowhere)]
    code, report = _verify(folder / "job.yaml", operator, [*rows, *extra], tmp_path, *MAP)
    [section] = report["sections"]
    assert code == 1 and section["counts"]["extra_in_stream"] == 2 and section["counts"]["match"] == len(rows)
    assert {c: n for c, n in section["causes"].items() if n} == {"ledgered_input": 1, "unexplained": 1}
    by = {s["transaction_id"]: s for s in section["samples"] if s["category"] != "match"}
    shown = by["990001"]
    assert shown["cause"] == "ledgered_input" and "invalid_timestamp" in shown["detail"]
    assert [(r["partition"], r["offset"], r["status"]) for r in shown["records"]] == [
        (0, last["offset"] + 1, "ledgered: invalid_timestamp")]
    assert by["990002"]["cause"] == "unexplained"
