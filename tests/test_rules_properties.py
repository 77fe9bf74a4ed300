"""Property tests: the rules operator on Spark (timeline on the driver, per-state kernel) equals the reference engine.

Random rule timelines (ACTIVE, PAUSE, DELETE, updates, CLEAR_STATE_ALL, DELETE_RULES_ALL; JSON and text
messages; counting and resetting rules) over transactions that arrive out of event-time order, with ties,
negative event times, invalid amounts and event times; every combination of order, rule versions and compat
in one job, whole and ranged.
"""
from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import given

from tests.golden.harness import run_job
from tests.seeds import SEEDS
from tests.test_properties import SETTINGS

pytestmark = [pytest.mark.spark, pytest.mark.slow]
CONFIGS = [(order, versions, compat) for order in ("arrival", "event_time") for versions in ("as_of_arrival", "final")
           for compat in ("intended", "demo")]
KEYS = ["paymentType", "payeeId", "beneficiaryId"]
OPS = ["=", "!=", ">=", "<=", ">", "<"]
SYMBOL_NAMES = {"=": "EQUAL", "!=": "NOT_EQUAL", ">=": "GREATER_EQUAL", "<=": "LESS_EQUAL", ">": "GREATER",
                "<": "LESS"}


def _rule(rng: random.Random, demo: bool) -> str:
    rid = rng.randint(1, 4)
    state = rng.choice(["ACTIVE"] * 5 + ["PAUSE", "DELETE"])
    keys = rng.sample(KEYS, rng.randint(0, 2))
    field = rng.choice(["paymentAmount"] * 3 + ["COUNT_FLINK", "COUNT_WITH_RESET_FLINK"])
    agg = rng.choice(["SUM", "SUM", "MIN"] if demo else ["SUM", "SUM", "MIN", "MAX", "AVG"])
    op = rng.choice(OPS)
    limit = rng.choice(["0", "1", "2", "3", "5.5", "8", "-1"])
    minutes = rng.choice([0, 1, 2, 5])
    if rng.random() < 0.5:
        return f"{rid},({state.lower()}),({'&'.join(keys)}),,({field}),({agg.lower()}),({op}),({limit}),({minutes})"
    return json.dumps({"ruleId": rid, "ruleState": state, "groupingKeyNames": keys, "unique": [],
                       "aggregateFieldName": field, "aggregatorFunctionType": agg,
                       "limitOperatorType": SYMBOL_NAMES[op], "limit": limit, "windowMinutes": minutes})


def _scenario(rng: random.Random, demo: bool) -> list[tuple[str, Any]]:
    events: list[tuple[str, Any]] = []
    now = rng.choice([0, 60_000, 3_000])
    for i in range(rng.randint(30, 50)):
        r = rng.random()
        if r < 0.12:
            events.append(("rules", _rule(rng, demo)))
        elif r < 0.14:
            control = rng.choice(["CLEAR_STATE_ALL", "EXPORT_RULES_CURRENT"] + ([] if demo else ["DELETE_RULES_ALL"]))
            events.append(("rules", json.dumps({"ruleState": "CONTROL", "controlType": control})))
        elif r < 0.15:
            events.append(("rules", "1,(active),(paymentType),,(paymentAmount),(sum),(~),(1),(1)"))  # bad operator
        else:
            now += rng.choice([0, 0, 1000, 15_000, 30_000, 61_000])
            t = now - rng.choice([0] * 6 + [1000, 45_000, 130_000, 400_000])
            if rng.random() < 0.03:
                t = -rng.randint(1, 2500)
            amount: Any = rng.choice(["1", "2", "2.50", "0", "-1", "3.25", 4, 0.5])
            if rng.random() < 0.03:
                amount = "n/a"
            elif rng.random() < 0.02:
                amount = "1e1"  # an exponent: that Spark partition is replayed with exact decimals
            tx = {"transactionId": i, "eventTime": t if rng.random() > 0.02 else "later",
                  "payeeId": rng.randint(1, 2), "beneficiaryId": rng.choice([7, 8]),
                  "paymentType": rng.choice(["CSH", "CRD"]), "paymentAmount": amount, "ingestionTimestamp": 1}
            if rng.random() < 0.05:  # a field-equal copy of the previous transaction (one entry in compat: demo)
                prev = [e for e in events if e[0] == "transactions"]
                if prev:
                    tx = dict(prev[-1][1])
            events.append(("transactions", tx))
    return events


def _job(n: int, ooo: list[str]) -> str:
    sources, operators, sinks = [], [], []
    for i, (order, versions, compat) in enumerate(CONFIGS[:n]):
        sources.append(f"  tx{i}: {{format: jsonl, path: inputs/tx{i}.jsonl, value: {{format: json}}, order_by: seq}}")
        sources.append(f"  rules{i}: {{format: jsonl, path: inputs/rules{i}.jsonl, order_by: seq}}")
        operators.append(f"""  - name: a{i}
    rules: {{input: tx{i}, rules: rules{i}, event_time: value.eventTime, order: {order}, rule_versions: {versions},
            compat: {compat}, out_of_orderness: {ooo[i]}}}""")
        sinks.append(f"  a{i}: {{format: jsonl, path: out/a{i}.jsonl}}")
    return "\n".join(["name: rules-properties", "sources:", *sources, "operators:", *operators, "sinks:", *sinks,
                      "  _ledger: {format: jsonl, path: out/ledger.jsonl}",
                      "  _runs: {format: jsonl, path: out/runs.jsonl}", ""])


def _inputs(i: int, events: list[tuple[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {f"tx{i}": [], f"rules{i}": []}
    for seq, (kind, body) in enumerate(events):
        rows = out[f"tx{i}" if kind == "transactions" else f"rules{i}"]
        rows.append({"topic": kind, "partition": seq % 2, "offset": len(rows), "key": None, "value": body,
                     "timestamp": 1000 * seq, "seq": seq})
    return out


def _alerts(rows: list[dict[str, Any]]) -> list[str]:
    return [json.dumps(r, sort_keys=True) for r in sorted(rows, key=lambda r: r["emit_seq"])]


def _ledger(rows: list[dict[str, Any]]) -> list[str]:
    return sorted(json.dumps({k: r[k] for k in ("source", "partition", "offset", "operator", "reason", "detail")},
                             sort_keys=True) for r in rows)


def test_spark_rules_equal_reference(tmp_path_factory, spark):
    """Eight configurations, 30-50 messages each, over a range."""
    @SETTINGS
    @given(seed=SEEDS)
    def check(seed: int) -> None:
        rng = random.Random(seed)
        inputs: dict[str, list[dict[str, Any]]] = {}
        for i, (_, _, compat) in enumerate(CONFIGS):
            inputs |= _inputs(i, _scenario(rng, compat == "demo"))
        ooo = [rng.choice(["0ms", "30s", "2m", "10m"]) for _ in CONFIGS]
        tmp = tmp_path_factory.mktemp("rules")
        # one run (eight operators): ranged, so the range cut is checked too
        for args in (("--start", str(rng.randint(0, 8) * 1000), "--end", str(rng.randint(20, 50) * 1000)),):
            spark_run = run_job(tmp / f"spark{len(args)}", _job(len(CONFIGS), ooo), inputs, *args)
            ref = run_job(tmp / f"ref{len(args)}", _job(len(CONFIGS), ooo), inputs, *args, engine="reference")
            assert spark_run.code == ref.code == 0, (seed, spark_run.stderr, ref.stderr)
            for i in range(len(CONFIGS)):
                assert _alerts(spark_run.outputs.get(f"a{i}", [])) == _alerts(ref.outputs.get(f"a{i}", [])), \
                    (seed, args, CONFIGS[i])
            assert _ledger(spark_run.ledger) == _ledger(ref.ledger), (seed, args)
        assert sum(len(v) for v in ref.outputs.values()) > 0, seed

    check()
