"""The rules operator's part of the job contract: what `plan` says, and a one-line error for every malformed field."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from backfill.cli import app
from backfill.jobspec.rulemessages import RuleMessageError, parse_rule

JOB = """
name: rules-spec
{semantics}
sources:
  transactions: {{format: jsonl, path: tx.jsonl, key: {{format: string}}, value: {{format: json}},
                 timestamp: {{extractor: record}}, order_by: seq}}
  rules:        {{format: jsonl, path: rules.jsonl, value: {{format: string}}, order_by: seq}}
operators:
  - name: alerts
    rules:
      input: transactions
      rules: rules
{fields}
{extra}
sinks:
  alerts: {{format: jsonl, path: out/alerts.jsonl}}
{sinks}
"""


def _job(tmp: Path, fields: str = "      event_time: value.eventTime", extra: str = "", sinks: str = "",
         semantics: str = "") -> Path:
    (tmp / "tx.jsonl").write_text("")
    (tmp / "rules.jsonl").write_text("")
    path = tmp / "job.yaml"
    path.write_text(JOB.format(fields=fields, extra=extra, sinks=sinks, semantics=semantics))
    return path


def _plan(path: Path, *args: str):
    return CliRunner().invoke(app, ["plan", str(path), *args])


def test_plan_speaks_of_arrival_and_alerts(tmp_path):
    got = _plan(_job(tmp_path, semantics="semantics: flink"), "--start", "0", "--end", "1000")
    assert got.exit_code == 0, got.stderr
    assert "rules: Flink's fraud-detection pattern" in got.stdout
    assert "outputs: timestamp of the alert's transaction" in got.stdout
    assert "order = arrival by its recorded order (seq); every record, whatever the range" in got.stdout
    assert "order arrival, rule versions as_of_arrival, compat intended, watermark: largest event time - 500ms" \
        in got.stdout
    data = json.loads(_plan(_job(tmp_path), "--json").stdout)
    assert [s["reads_all"] for s in data["sources"]] == [True, True]


@pytest.mark.parametrize(("fields", "says"), [
    ("      event_time: eventTime", "event_time 'eventTime': use value.<field>"),
    ("      order: sometimes", "order"),
    ("      rule_versions: latest", "rule_versions"),
    ("      compat: flink19", "compat"),
    ("      out_of_orderness: -5s", "out_of_orderness"),
    ("      windw: 5m", "windw"),
])
def test_a_malformed_field_is_one_line_naming_it(tmp_path, fields, says):
    got = _plan(_job(tmp_path, fields))
    assert got.exit_code == 2
    lines = got.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], got.stderr


def test_rules_cannot_come_from_the_transactions(tmp_path):
    got = _plan(_job(tmp_path, "      event_time: value.eventTime").parent / "job.yaml")
    assert got.exit_code == 0
    path = tmp_path / "job.yaml"
    path.write_text(path.read_text().replace("rules: rules\n", "rules: transactions\n"))
    got = _plan(path)
    assert got.exit_code == 2 and "the rule messages come from their own source" in got.stderr


def test_another_operator_may_not_read_a_rules_source(tmp_path):
    extra = """  - name: counts
    aggregate: {input: transactions, window: {type: tumbling, size: 1m, grace: 0ms}, aggregations: {n: count()}}"""
    got = _plan(_job(tmp_path, extra=extra, sinks="  counts: {format: none}"))
    assert got.exit_code == 2 and "operators.counts reads a source of the rules operator alerts" in got.stderr


def test_semantics_flink_is_for_rules_operators_only(tmp_path):
    extra = """  - name: counts
    aggregate: {input: other, window: {type: tumbling, size: 1m, grace: 0ms}, aggregations: {n: count()}}"""
    path = _job(tmp_path, extra=extra, sinks="  counts: {format: none}", semantics="semantics: flink")
    path.write_text(path.read_text().replace("operators:", "  other: {format: jsonl, path: tx.jsonl}\noperators:"))
    got = _plan(path)
    assert got.exit_code == 2 and "semantics: flink applies to rules operators only; operators.counts" in got.stderr


@pytest.mark.parametrize(("text", "says"), [
    ("1,(active),(a),,(f),(sum),(>)", "9 comma-separated tokens"),
    ("1,(resting),(a),,(f),(sum),(>),(1),(1)", "rule state"),
    ("1,(active),(a),,(f),(median),(>),(1),(1)", "aggregator"),
    ("1,(active),(a),,(f),(sum),(~),(1),(1)", "limitOperatorType"),
    ("1,(active),(a),,(f),(sum),(>),(one),(1)", "limit"),
    ("1,(active),(a),,(f),(sum),(>),(1),(-1)", "windowMinutes must be >= 0"),
    ('{"ruleState": "ACTIVE", "aggregateFieldName": "f"}', "ruleId is missing"),
    ('{"ruleState": "CONTROL", "controlType": "REBOOT"}', "controlType"),
    ("{not json", "not valid JSON"),
])
def test_a_rule_message_the_live_job_would_drop_says_why(text, says):
    with pytest.raises(RuleMessageError, match=says):
        parse_rule(text)


def test_rule_json_keeps_the_limit_digits():
    rule = parse_rule('{"ruleId": 7, "ruleState": "PAUSE", "groupingKeyNames": ["payerId"], '
                      '"aggregateFieldName": "paymentAmount", "aggregatorFunctionType": "MAX", '
                      '"limitOperatorType": "LESS_EQUAL", "limit": 12.50, "windowMinutes": "30"}')
    assert json.loads(rule.to_json()) == {
        "ruleId": 7, "ruleState": "PAUSE", "groupingKeyNames": ["payerId"], "unique": [],
        "aggregateFieldName": "paymentAmount", "aggregatorFunctionType": "MAX", "limitOperatorType": "LESS_EQUAL",
        "limit": 12.50, "windowMinutes": 30}
    assert '"limit":12.50' in rule.to_json()
