"""Golden timelines for the lookback rule engine (docs/semantics.md §12) via `backfill run`, on both engines.

The rule-engine cases of flink-examples.json: rule parsing, the grouping-key string, same-timestamp
transactions, cleanup by watermark, the three answers of the worked example (event time, arrival, arrival
with eviction), two rules sharing a key, the aggregators' edge cases.
"""
from __future__ import annotations

import json
from typing import Any

import pytest

from backfill.jobspec.rulemessages import parse_rule
from tests.conftest import flink_examples
from tests.golden.harness import run_job

ENGINES = ["spark", "reference"]
CASES = flink_examples("fraud")


def rules_job(order: str = "arrival", versions: str = "as_of_arrival", compat: str = "intended",
              out_of_orderness: str = "500ms") -> str:
    """Transactions (JSON values, event time in value.eventTime) and rule messages on one recorded order."""
    return f"""
name: golden-rules
sources:
  transactions: {{format: jsonl, path: inputs/transactions.jsonl, key: {{format: string}}, value: {{format: json}},
                 timestamp: {{extractor: record}}, order_by: seq}}
  rules: {{format: jsonl, path: inputs/rules.jsonl, value: {{format: string}}, order_by: seq}}
operators:
  - name: alerts
    rules:
      input: transactions
      rules: rules
      event_time: value.eventTime
      order: {order}
      rule_versions: {versions}
      compat: {compat}
      out_of_orderness: {out_of_orderness}
sinks:
  alerts: {{format: jsonl, path: out/alerts.jsonl}}
  _ledger: {{format: jsonl, path: out/ledger.jsonl}}
  _runs: {{format: jsonl, path: out/runs.jsonl}}
"""


def inputs(events: list[tuple[str, Any, int]]) -> dict[str, list[dict[str, Any]]]:
    """(kind, rule text or transaction, record timestamp) in arrival order -> the two sources' records."""
    out: dict[str, list[dict[str, Any]]] = {"transactions": [], "rules": []}
    for seq, (kind, body, ts) in enumerate(events):
        rows = out[kind]
        value = body if kind == "rules" else body
        rows.append({"topic": kind, "partition": 0, "offset": len(rows), "key": None, "value": value,
                     "timestamp": ts, "seq": seq})
    return out


def rule_text(rule: dict[str, Any] | str) -> str:
    return rule if isinstance(rule, str) else json.dumps(rule)


def alerts(got) -> list[tuple]:
    """(rule id, transactionId, value) in emission order."""
    rows = sorted(got.outputs.get("alerts", []), key=lambda r: r["emit_seq"])
    return [(r["rule_id"], json.loads(r["transaction"])["transactionId"], r["value"]) for r in rows]


def test_rule_messages_parse_as_the_live_job_reads_them():
    case = CASES["fraud-rule-parse"]
    for given, expected in zip(case["inputs"], case["expected_outputs"]):
        text = given["plain"] if "plain" in given else json.dumps(given["json"])
        rule = parse_rule(text)
        got = {"ruleId": rule.rule_id, "ruleState": rule.state, "groupingKeyNames": list(rule.keys),
               "unique": list(rule.unique), "aggregateFieldName": rule.field,
               "aggregatorFunctionType": rule.aggregator, "limitOperatorType": rule.operator,
               "limit": str(rule.limit), "windowMinutes": rule.window_minutes}
        assert got == expected


@pytest.mark.spark
@pytest.mark.parametrize("engine", ENGINES)
def test_grouping_key_string_names_each_field_in_rule_order(tmp_path, spark, engine):
    case = CASES["fraud-dynamic-key"]
    tx = case["inputs"][1]["transaction"]
    rule = case["config"]["rule"]
    # the rule as given aggregates a field this transaction does not have: the live job would fail there
    got = run_job(tmp_path / "given", rules_job(), inputs([("rules", rule, 12), ("transactions", tx, 15)]),
                  engine=engine)
    assert got.code == 0, got.stderr
    assert [(r["reason"], r["detail"]) for r in got.ledger] == [("invalid_field", "rule 1: totalFare is not a number")]
    # counting instead: the alert shows the key the transaction was forked under, at the record's timestamp
    counting = rule.replace("(totalFare),(SUM),(>),(50)", "(COUNT_FLINK),(SUM),(>=),(1)")
    got = run_job(tmp_path / "count", rules_job(), inputs([("rules", counting, 12), ("transactions", tx, 15)]),
                  engine=engine)
    assert got.code == 0, got.stderr
    [alert] = got.outputs["alerts"]
    expected = case["expected_outputs"][0]
    assert (alert["key"], alert["rule_id"], alert["ts"]) == (expected["keyed"]["key"], expected["keyed"]["ruleId"],
                                                             expected["record_ts"])


@pytest.mark.spark
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("order", ["arrival", "event_time"])
def test_same_timestamp_transactions_are_sequential_not_peers(tmp_path, spark, engine, order):
    case = CASES["fraud-same-timestamp"]
    events = [("rules", case["config"]["rule"], 1)]
    events += [("transactions", i["transaction"], i["record_ts"]) for i in case["inputs"][1:]]
    got = run_job(tmp_path, rules_job(order), inputs(events), engine=engine)
    assert got.code == 0, got.stderr
    expected = case["expected_outputs"][0]
    assert alerts(got) == [(1, expected["alert"]["triggeringEvent"], expected["alert"]["triggeringValue"])]
    assert got.outputs["alerts"][0]["ts"] == expected["record_ts"]
    assert got.outputs["alerts"][0]["key"] == "{paymentType=CSH}"


@pytest.mark.spark
@pytest.mark.parametrize("engine", ENGINES)
def test_cleanup_by_watermark_keeps_what_a_late_event_still_sees(tmp_path, spark, engine):
    case = CASES["fraud-cleanup-watermarks"]
    events = [("rules", case["config"]["rule"], 1)]
    events += [("transactions", i["transaction"], i["record_ts"]) for i in case["inputs"] if "transaction" in i]
    # the test's watermarks are the largest event time so far minus two minutes
    got = run_job(tmp_path, rules_job("arrival", out_of_orderness="2m"), inputs(events), engine=engine)
    assert got.code == 0, got.stderr
    expected = case["expected_outputs"][0]["alert"]
    assert alerts(got) == [(1, expected["triggeringEvent"], expected["triggeringValue"])]


@pytest.mark.spark
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("mode", ["mode_A_event_time_order (= Flink BATCH)", "mode_B1_arrival_order_no_eviction",
                                  "mode_B2_arrival_order_with_eviction"])
def test_worked_example_gives_three_answers_by_mode(tmp_path, spark, engine, mode):
    case = CASES["fraud-modes-example"]
    txs = {t["transactionId"]: t for t in case["inputs"]["transactions"]}
    events = [("rules", rule_text(case["config"]["rule"]), 0)]
    events += [("transactions", txs[i], txs[i]["eventTime"]) for i in case["inputs"]["arrival_order"]]
    job = {"mode_A": rules_job("event_time"), "mode_B1": rules_job("arrival", out_of_orderness="1000d"),
           "mode_B2": rules_job("arrival", out_of_orderness="2m")}[mode[:7].rstrip("_")]
    got = run_job(tmp_path, job, inputs(events), engine=engine)
    assert got.code == 0, got.stderr
    assert alerts(got) == [(1, tx, value) for tx, value in case["expected_outputs"][mode]["alerts"]]


@pytest.mark.spark
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("compat", ["demo", "intended"])
@pytest.mark.parametrize("order", ["arrival", "event_time"])
def test_two_rules_with_one_key_run_transaction_major(tmp_path, spark, engine, compat, order):
    case = CASES["fraud-tie-order-multi-rule"]
    events = [("rules", f"{r['ruleId']},(active),(paymentType),,(COUNT_FLINK),(SUM),(>=),(2),(1)", 0)
              for r in case["config"]["rules"]]
    events += [("transactions", t, t["eventTime"]) for t in case["inputs"]["transactions"]]
    got = run_job(tmp_path, rules_job(order, compat=compat), inputs(events), engine=engine)
    assert got.code == 0, got.stderr
    expected = case["expected_outputs"]["transaction_major"]["alerts"]
    assert [(f"r{r}", tx) for r, tx, _ in alerts(got)] == [tuple(a) for a in expected]


def _tx(i: int, amount: str, t: int = 1000) -> dict[str, Any]:
    return {"transactionId": i, "eventTime": t, "payeeId": 1, "beneficiaryId": 2, "paymentType": "CSH",
            "paymentAmount": amount, "ingestionTimestamp": 1}


@pytest.mark.spark
@pytest.mark.parametrize("engine", ENGINES)
def test_aggregators_as_the_demo_computes_them_and_where_it_fails(tmp_path, spark, engine):
    case = CASES["fraud-aggregator-edge-cases"]
    for n, (given, expected) in enumerate(zip(case["inputs"], case["expected_outputs"])):
        values = given.get("values") or ["1"] * given.get("values_count", 0)
        if not values:
            continue  # an empty window cannot happen: the transaction is in its own window
        field = given.get("aggregateFieldName", "paymentAmount")
        rule = f"1,(active),(paymentType),,({field}),({given['aggregator']}),(>=),(-1000),(10)"
        events = [("rules", rule, 0)] + [("transactions", _tx(i, v), 1000 + i) for i, v in enumerate(values)]
        got = run_job(tmp_path / f"demo{n}", rules_job(compat="demo"), inputs(events), engine=engine)
        if "error" in expected:
            assert got.code == 2 and "would fail the published job" in got.stderr, (given, got.stderr)
            kind = expected["error"].split()[0]
            assert kind in got.stderr
            # as intended, the same data computes
            got = run_job(tmp_path / f"intended{n}", rules_job(), inputs(events), engine=engine)
            assert got.code == 0, got.stderr
            assert alerts(got)[-1][2] == ("10" if given["aggregator"] == "AVG" else max(values))
            continue
        assert got.code == 0, got.stderr
        assert alerts(got)[-1][2] == expected["result"], given


@pytest.mark.spark
@pytest.mark.parametrize("engine", ENGINES)
def test_every_record_is_accounted_for(tmp_path, spark, engine):
    """A transaction before any rule, one without event time, one with a non-number, a bad rule message."""
    events = [("transactions", _tx(1, "5"), 1), ("rules", "not a rule", 2),
              ("rules", "1,(active),(paymentType),,(paymentAmount),(SUM),(>),(0),(10)", 3),
              ("transactions", {**_tx(2, "5"), "eventTime": "soon"}, 4), ("transactions", _tx(3, "five"), 5),
              ("transactions", _tx(4, "5"), 6)]
    got = run_job(tmp_path, rules_job(), inputs(events), engine=engine)
    assert got.code == 0, got.stderr
    reasons = sorted((r["reason"], r["offset"]) for r in got.ledger)
    assert reasons == [("invalid_field", 2), ("invalid_rule", 0), ("invalid_timestamp", 1), ("no_rule", 0)]
    assert alerts(got) == [(1, 4, "5")]
