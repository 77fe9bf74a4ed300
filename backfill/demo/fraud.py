"""Part: commands. The rules part of `backfill demo`: payments and rule messages as a live Flink fraud-detection job
received them, the alerts it raised re-derived exactly (jobs/fraud_rules.yaml), and a back-test of a changed rule
over the same history (jobs/fraud_backtest.yaml) compared with them."""
from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

PAYMENTS = "data/payments"
LIVE = "data/gold/alerts"
BACKTEST = "data/gold/alerts_backtest"
START_MS = 1_704_067_200_000  # 2024-01-01T00:00:00Z
HOUR = 3_600_000
RULE_1 = {"ruleId": 1, "ruleState": "ACTIVE", "groupingKeyNames": ["payerId", "beneficiaryId"], "unique": [],
          "aggregateFieldName": "paymentAmount", "aggregatorFunctionType": "SUM", "limitOperatorType": "GREATER",
          "limit": 1000, "windowMinutes": 1440}
RULE_2 = "2,(active),(payerId),,(COUNT_FLINK),(sum),(>=),(12),(60)"  # 12 payments by one payer within an hour
RULE_2_LATER = "2,(active),(payerId),,(COUNT_FLINK),(sum),(>=),(10),(60)"  # tightened on the second day


def generate_payments(folder: Path, n: int = 6000, seed: int = 11) -> dict[str, Any]:
    """transactions.jsonl (2 partitions, arrival = record timestamp), rules.jsonl and rules_backtest.jsonl."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    arrivals = sorted(START_MS + rng.randint(0, 72 * HOUR) for _ in range(n))
    offsets = [0, 0]
    rows, late = [], 0
    for i, arrival in enumerate(arrivals):
        r = rng.random()
        payer = 1 if r < 0.05 else 2 if r < 0.08 else rng.randint(3, 200)  # two busy payers
        beneficiary = rng.choice([1, 2, 3]) if payer <= 2 else rng.randint(1, 15)
        event = arrival - rng.randint(0, 2000)
        if rng.random() < 0.04:  # a payment the live job received up to 20 minutes late
            event -= rng.randint(60_000, 20 * 60_000)
            late += 1
        cents = max(1, int(rng.gammavariate(2.0, 4000)))
        value = {"transactionId": i + 1, "eventTime": event, "payerId": payer, "beneficiaryId": beneficiary,
                 "paymentType": rng.choice(["CSH", "CRD"]), "paymentAmount": f"{cents // 100}.{cents % 100:02d}"}
        p = payer % 2
        rows.append({"topic": "payments", "partition": p, "offset": offsets[p], "key": str(payer), "value": value,
                     "timestamp": arrival})
        offsets[p] += 1
    (folder / "transactions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    messages = [(arrivals[20], json.dumps(RULE_1)), (arrivals[20], RULE_2),
                (arrivals[n // 3], "2,(active),(payerId)"),  # a broken message: the live job dropped it
                (arrivals[n // 2], RULE_2_LATER)]
    (folder / "rules.jsonl").write_text("".join(
        json.dumps({"topic": "rules", "partition": 0, "offset": i, "key": None, "value": text, "timestamp": ts - 1})
        + "\n" for i, (ts, text) in enumerate(messages)))
    backtest = [json.dumps({**RULE_1, "limit": 800}), RULE_2_LATER]
    (folder / "rules_backtest.jsonl").write_text("".join(
        json.dumps({"topic": "rules", "partition": 0, "offset": i, "key": None, "value": text,
                    "timestamp": START_MS - 1}) + "\n" for i, text in enumerate(backtest)))
    return {"transactions": n, "late": late, "rule_messages": len(messages)}


def _alerts(path: Path) -> dict[tuple[int, int], dict[str, Any]]:
    from backfill.io.delta import arrow_table

    rows = arrow_table(str(path)).to_pylist()
    return {(r["rule_id"], json.loads(r["transaction"])["transactionId"]): r for r in rows}


def backtest_summary(work: Path) -> dict[str, Any]:
    """Live alerts against the back-test's: how many more or fewer, and which."""
    live, test = _alerts(work / LIVE), _alerts(work / BACKTEST)
    more = sorted(set(test) - set(live))
    fewer = sorted(set(live) - set(test))
    changed = sorted(k for k in set(live) & set(test) if live[k]["value"] != test[k]["value"])
    return {"live_alerts": len(live), "backtest_alerts": len(test), "more": len(more), "fewer": len(fewer),
            "same_alert_other_value": len(changed),
            "more_examples": [_example(k, test[k]) for k in more[:5]],
            "fewer_examples": [_example(k, live[k]) for k in fewer[:5]]}


def _example(k: tuple[int, int], row: dict[str, Any]) -> dict[str, Any]:
    return {"rule_id": k[0], "transactionId": k[1], "value": row["value"], "key": row["key"]}


def explain_backtest(out: Console, summary: dict[str, Any], live_summary: dict[str, Any]) -> None:
    """What the live job alerted, what the changed rule would have, and the command that compares them."""
    ledger = live_summary["operators"]["alerts"]["dropped"]
    dropped = ", ".join(f"{n} {reason}" for reason, n in ledger.items() if n) or "none"
    out.print(f"\n[bold]Rules[/]: {live_summary['operators']['alerts']['outputs']:,} alerts re-derived from the live "
              f"job's input (arrival order, rules as they arrived); not evaluated: {dropped}.", highlight=False)
    out.print("Back-test: rule 1 at a limit of 800 instead of 1000, the final rules for all, event-time order:")
    table = Table(box=None, pad_edge=False)
    for col in ("", "alerts"):
        table.add_column(col, justify="left" if not col else "right")
    table.add_row("live (re-derived)", f"{summary['live_alerts']:,}")
    table.add_row("back-test", f"{summary['backtest_alerts']:,}")
    table.add_row("more in the back-test", f"{summary['more']:,}")
    table.add_row("fewer in the back-test", f"{summary['fewer']:,}")
    table.add_row("same alert, other value", f"{summary['same_alert_other_value']:,}")
    out.print(table)
    for what in ("more", "fewer"):
        for ex in summary[f"{what}_examples"][:3]:
            out.print(f"  {what}: rule {ex['rule_id']} on transaction {ex['transactionId']} {ex['key']} "
                      f"value {ex['value']}", highlight=False)
    out.print("Compare them yourself, with a report: [bold]backfill diff demo-output/data/gold/alerts "
              "demo-output/data/gold/alerts_backtest --on rule_id,transaction --columns value[/]", highlight=False)
