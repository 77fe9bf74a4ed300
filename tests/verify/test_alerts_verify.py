"""verify of a rules operator (docs/semantics.md §12.12): the alerts Flink itself raised (the rules judge's
MiniCluster job, tests/test_flink_conformance.py) against the backfill's re-derivation of the same messages, keyed
by (rule_id, transaction_id). Flink's own alerts reconcile to `match`; a copy is `duplicate_delivery`; an alert on a
transaction the run ledgered is `ledgered_input`; Flink's alerts of an order in which a rule version arrived one
transaction later or earlier are `rule_version_differs`; a lost or changed alert is `unexplained`, with the
transaction and the rule version in the sample."""
from __future__ import annotations

import dataclasses
import json
import shutil
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from backfill.cli import app
from backfill.conformance import flink
from backfill.jobspec.rulemessages import COUNT_FIELDS
from tests.conftest import write_jsonl
from tests.verify.browser import Browser

pytestmark = [pytest.mark.spark, pytest.mark.slow]

MAP = ["--map", "rule_id=ruleId", "--map", "transaction=triggeringEvent", "--map", "value=triggeringValue"]


@pytest.fixture(scope="module")
def flinks() -> tuple[list[Any], dict[Any, Any]]:
    """The judge's scenarios (seed 8) and the alerts Flink raised on each."""
    scenarios = [sc for sc in flink.generate(40, 8) if sc.compat == "intended"]
    return scenarios, flink.judge(scenarios)


def _once(sc: Any) -> bool:
    """Every transaction id of the scenario once."""
    return len({json.dumps(b, sort_keys=True) for k, b in sc.events if k == "transactions"}) == sum(
        k == "transactions" for k, _ in sc.events)


def _ran(tmp: Path, sc: Any, alerts: dict[Any, Any]) -> tuple[Path, str, list[dict[str, Any]]]:
    """(job, operator, Flink's alerts as the live job writes them: Alert JSON with the triggering event)."""
    job = flink.write_job(tmp, [sc])
    ran = CliRunner().invoke(app, ["run", str(job), "--json"])
    assert ran.exit_code == 0, ran.stderr
    txs = [b for k, b in sc.events if k == "transactions"]
    rows = [{"ruleId": rule_id, "key": key, "triggeringEvent": txs[int(place.split("@")[1])],
             "triggeringValue": float(value)} for rule_id, key, place, value in alerts[sc.id]]
    return job, f"s{sc.id}", rows


@pytest.fixture(scope="module")
def judged(flinks: tuple[list[Any], dict[Any, Any]], tmp_path_factory: pytest.TempPathFactory
           ) -> tuple[Path, str, list[dict[str, Any]]]:
    scenarios, alerts = flinks
    sc = next(sc for sc in scenarios if len(alerts[sc.id]) >= 4 and _once(sc))
    return _ran(tmp_path_factory.mktemp("alerts"), sc, alerts)


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


def _next_to_its_rule(job: Path, operator: str, alert: dict[str, Any]) -> bool:
    """Whether a message of the alert's rule lies next to its transaction in the recorded order (no other
    transaction between them): a race that could have put the other rule version in force."""
    read = {kind: [json.loads(line) for line in (job.parent / "inputs" / f"{kind}{operator[1:]}.jsonl")
                   .read_text().splitlines()] for kind in ("transactions", "rules")}
    tx_seqs = sorted(r["seq"] for r in read["transactions"])
    [seq] = [r["seq"] for r in read["transactions"]
             if r["value"]["transactionId"] == alert["triggeringEvent"]["transactionId"]]
    mine = [r["seq"] for r in read["rules"] if json.loads(r["value"]).get("ruleId") == alert["ruleId"]]
    return any(not [t for t in tx_seqs if min(m, seq) < t < max(m, seq)] for m in mine)


def test_a_copy_is_a_duplicate_a_lost_or_changed_alert_is_unexplained(
        judged: tuple[Path, str, list[dict[str, Any]]], tmp_path: Path) -> None:
    """The lost alert's transaction is not next to a message of its rule: moving the rule's first message past
    it would remove the alert too, but that race is not open, and the alert stays unexplained."""
    job, operator, rows = judged
    lost = next(r for r in rows if not _next_to_its_rule(job, operator, r))
    changed, copied = [r for r in rows if r is not lost][:2]
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
    _window_gives_flinks_value(gone, lost)
    other = by[(changed["ruleId"], str(changed["triggeringEvent"]["transactionId"]))]
    assert other["category"] == "mismatch" and other["diff_columns"] == ["value"]
    assert other["r_value"] == other["l_value"] + 1 and other["r_transaction"]
    _window_gives_flinks_value(other, changed)
    page = (tmp_path / "report" / "index.html").read_text()
    shown = [x for x in section["samples"] if x.get("l_window")]
    assert len(shown) >= 2 and page.count("class=window") == len(shown) and "rule version in force" in page
    _read_in_a_browser(tmp_path, section, operator)


def _read_in_a_browser(tmp: Path, section: dict[str, Any], operator: str) -> None:
    """Headless Chromium: the alerts section leads with what nothing explains, in alerts; a click on a cause
    shows its samples only, each with its transaction and its window open; the page loads nothing else."""
    page = Browser(tmp / "profile")
    try:
        page.open((tmp / "report" / "index.html").resolve().as_uri())
        assert page.js("document.querySelector('#first-look').textContent").startswith(
            f"Start here: 2 alerts of {operator} differ and nothing explains them.")
        visible = "Array.from(document.querySelectorAll('.sample')).filter(e => !e.hidden).map(e => e.dataset.cause)"
        assert len(page.js(visible)) == len(section["samples"])
        page.click(".chip[data-cause='unexplained']")
        assert page.js(visible) == ["unexplained"] * 2
        windows = ("Array.from(document.querySelectorAll('.sample')).filter(e => !e.hidden).map(e => "
                   "e.querySelector('details.window').open && e.querySelector('details.window').offsetHeight > 0)")
        assert page.js(windows) == [True, True]
        shot = Path(__file__).resolve().parents[2] / "test-artifacts" / "verify-alerts-report.png"
        page.screenshot(shot)
        assert shot.stat().st_size > 20_000
        assert page.requests and all(u.startswith(("file:", "data:")) for u in page.requests), page.requests
    finally:
        page.close()


def test_each_alerts_window_aggregates_to_flinks_value(flinks: tuple[list[Any], dict[Any, Any]],
                                                       tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Flink's own alerts of the scenario with the most alerts of rules with a window: every sampled alert
    shows the transactions its window held, and they aggregate by its rule to Flink's value. A state larger
    than the driver replays is shown without its window, and a note says so."""
    scenarios, alerts = flinks

    def windowed(sc: Any) -> int:
        minutes = {}
        for kind, body in sc.events:
            try:
                msg = json.loads(body) if kind == "rules" else None
            except ValueError:
                continue
            if isinstance(msg, dict) and msg.get("ruleId") is not None:
                minutes[msg["ruleId"]] = msg.get("windowMinutes") or 0
        return sum(bool(minutes.get(rule_id)) for rule_id, *_ in alerts[sc.id])

    sc = max((sc for sc in scenarios if _once(sc)), key=windowed)
    job, operator, rows = _ran(tmp_path / "job", sc, alerts)
    code, report = _verify(job, operator, rows, tmp_path, *MAP)
    [section] = report["sections"]
    assert (code, report["verdict"]) == (0, "match")
    by = {(r["ruleId"], str(r["triggeringEvent"]["transactionId"])): r for r in rows}
    shown = [s for s in section["samples"] if s.get("l_window") is not None]
    assert shown and len(shown) == len(section["samples"])
    by_window = {(s["rule_id"], s["transaction_id"]): s["l_window"] for s in shown}
    assert max(len(s["l_window"]) for s in shown) >= 2
    for sample in shown:
        _window_gives_flinks_value(sample, by[(sample["rule_id"], sample["transaction_id"])])
    monkeypatch.setattr("backfill.ops.rules.WINDOW_STATE_LIMIT", 1)
    _, report = _verify(job, operator, rows, tmp_path / "capped", *MAP)
    [section] = report["sections"]
    big = [s for s in section["samples"] if len(by_window[(s["rule_id"], s["transaction_id"])]) > 1]
    unshown = [s for s in section["samples"] if s.get("l_window") is None]
    assert big and all(s in unshown for s in big)
    assert any(n.startswith(f"windows: {len(unshown)} sampled alert(s)") for n in section["notes"]), section["notes"]


def _window_gives_flinks_value(sample: dict[str, Any], flinks: dict[str, Any]) -> None:
    """The transactions the sample shows in the backfill's window (docs/semantics.md §12.13) share the alert's
    grouping key, end with its transaction, and aggregate by its rule to the value Flink raised the alert with."""
    rule, window = json.loads(sample["l_rule"]), sample["l_window"]
    tx = flinks["triggeringEvent"]
    assert window and all(json.loads(w["value"])[k] == tx[k] for w in window for k in rule["groupingKeyNames"])
    assert tx["transactionId"] in {json.loads(w["value"])["transactionId"] for w in window}
    assert max(w["ts"] for w in window) == tx["eventTime"]
    field = rule["aggregateFieldName"]
    xs = [Decimal(1) if field in COUNT_FIELDS else Decimal(str(json.loads(w["value"])[field])) for w in window]
    agg = rule["aggregatorFunctionType"]
    value = sum(xs) if agg == "SUM" else min(xs) if agg == "MIN" else max(xs) if agg == "MAX" else sum(xs) / len(xs)
    assert float(value) == pytest.approx(flinks["triggeringValue"]), (rule, window)


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


@pytest.fixture(scope="module", params=["after", "before"])
def raced(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
          ) -> tuple[Path, str, list[dict[str, Any]], dict[str, Any], str]:
    """A scenario whose live job had a later version of a rule arrive one transaction later (`after`) or earlier
    (`before`) than the recorded order says: (the job of the recorded order, its operator, Flink's alerts of the
    raced order, the transaction the message went past, the side). Flink judges both orders; a race is chosen
    whose alerts differ only on that transaction, and where the stream raises an alert the recorded order does
    not give."""
    side = request.param
    scenarios = [sc for sc in flink.generate(80, 17) if sc.compat == "intended"]
    variants = []
    for sc in scenarios:
        txs = [b for k, b in sc.events if k == "transactions"]
        if len({json.dumps(b, sort_keys=True) for b in txs}) != len(txs):
            continue
        seen: set[int] = set()
        for i, (kind, body) in enumerate(sc.events[:-1]):
            rule_id = json.loads(body).get("ruleId") if kind == "rules" else None
            nxt_kind, nxt = sc.events[i + 1]
            nxt_id = json.loads(nxt).get("ruleId") if nxt_kind == "rules" else None
            # a later version of a rule just before a transaction (after: the stream had it next), or a
            # transaction just before a later version (before: the stream had the version first)
            if side == "after" and rule_id in seen and nxt_kind == "transactions":
                tx = nxt
            elif side == "before" and kind == "transactions" and nxt_id in seen:
                tx = body
            else:
                tx = None
            if tx is not None:
                events = [*sc.events[:i], sc.events[i + 1], sc.events[i], *sc.events[i + 2:]]
                variants.append((sc, tx, dataclasses.replace(sc, id=1000 + len(variants), events=events)))
            if rule_id is not None:
                seen.add(rule_id)
    judged = flink.judge([*scenarios, *[v for _, _, v in variants]])
    for sc, tx, raced_sc in variants:
        txs = [b for k, b in sc.events if k == "transactions"]
        place = txs.index(tx)
        ours, theirs = set(judged[sc.id]), set(judged[raced_sc.id])
        differ = ours ^ theirs
        if differ and theirs - ours and {int(p.split("@")[1]) for _, _, p, _ in differ} == {place}:
            break
    else:
        pytest.fail(f"no rule race ({side}) among the scenarios changes an alert")
    job, operator, rows = _ran(tmp_path_factory.mktemp("raced"), sc, {sc.id: judged[raced_sc.id]})
    return job, operator, rows, tx, side


def test_an_alert_of_the_other_rule_version_is_rule_version_differs(
        raced: tuple[Path, str, list[dict[str, Any]], dict[str, Any], str], tmp_path: Path) -> None:
    """Flink's alerts of the raced order against the backfill of the recorded one: every difference is on the
    transaction the rule message went past, and the operator rerun with that message on the other side of it
    gives each exactly. The same alert with a value no version gives stays unexplained."""
    job, operator, rows, tx, side = raced
    code, report = _verify(job, operator, rows, tmp_path, *MAP)
    [section] = report["sections"]
    differing = {c: n for c, n in section["counts"].items() if n and c != "match"}
    assert differing, section["counts"]
    assert {c: n for c, n in section["causes"].items() if n} == {"rule_version_differs": sum(differing.values())}
    assert code == 0
    for s in (s for s in section["samples"] if s["category"] != "match"):
        assert s["transaction_id"] == str(tx["transactionId"]) and f"arriving {side} this transaction" in s["detail"]
        message, transaction = s["records"]
        assert message["status"] == f"rule message: moved {side} the transaction"
        assert transaction["status"] == "transaction"
    # where the stream has the alert, the rerun that gives it shows its window: by the other rule version, it
    # aggregates to Flink's value of the raced order
    by_row = {(r["ruleId"], str(r["triggeringEvent"]["transactionId"])): r for r in rows}
    theirs = [s for s in section["samples"] if s["category"] != "match" and s["r_value"] is not None]
    assert theirs
    for s in theirs:
        assert s["r_rule"] != s.get("l_rule")
        _window_gives_flinks_value({"l_rule": s["r_rule"], "l_window": s["r_window"]},
                                   by_row[(s["rule_id"], s["transaction_id"])])
    # a value neither version gives
    extra = next(s for s in section["samples"] if s["category"] != "match" and s["r_value"] is not None)
    wrong = [{**r, "triggeringValue": r["triggeringValue"] + 1000}
             if (r["ruleId"], str(r["triggeringEvent"]["transactionId"])) == (extra["rule_id"], extra["transaction_id"])
             else r for r in rows]
    _, report = _verify(job, operator, wrong, tmp_path, *MAP)
    [section] = report["sections"]
    by = {(s["rule_id"], s["transaction_id"]): s["cause"] for s in section["samples"] if s["category"] != "match"}
    assert by[(extra["rule_id"], extra["transaction_id"])] == "unexplained"


@pytest.fixture(scope="module")
def held_variants() -> tuple[list[tuple[Any, Any]], dict[Any, Any]]:
    """Flink's alerts (seed 17, intended scenarios) with the watermark after every element and, per scenario,
    with it stopped at every third transaction for the rest of the scenario (as an idle input holds it back):
    ([(scenario, the scenario with a hold)], the alerts of each by id)."""
    scenarios = [sc for sc in flink.generate(80, 17) if sc.compat == "intended"]
    variants = [(sc, dataclasses.replace(sc, id=1000 + n, hold=i))
                for n, (sc, i) in enumerate((sc, i) for sc in scenarios for i, (kind, _) in enumerate(sc.events)
                                            if kind == "transactions" and i % 3 == 0)]
    return variants, flink.judge([*scenarios, *[v for _, v in variants]])


@pytest.fixture(scope="module")
def held(held_variants: tuple[list[tuple[Any, Any]], dict[Any, Any]], tmp_path_factory: pytest.TempPathFactory
         ) -> tuple[Path, str, list[dict[str, Any]], dict[str, Any]]:
    """A scenario whose live job's watermark stopped at a transaction: (the job of the scenario, its operator, the
    alerts Flink raised with the watermark stopped, the transaction it stopped at); of the scenarios whose
    transaction ids are unique, the hold that changes the most alerts."""
    variants, judged = held_variants

    def changed(variant: tuple[Any, Any]) -> int:
        sc, v = variant
        return len(set(judged[sc.id]) ^ set(judged[v.id])) if _once(sc) else 0

    sc, variant = max(variants, key=changed)
    assert changed((sc, variant)) >= 2, "no hold of the watermark changes an alert"
    job, operator, rows = _ran(tmp_path_factory.mktemp("held"), sc, {sc.id: judged[variant.id]})
    return job, operator, rows, sc.events[variant.hold][1]


def test_an_alert_of_a_held_watermark_is_watermark_held(
        held: tuple[Path, str, list[dict[str, Any]], dict[str, Any]], tmp_path: Path) -> None:
    """Flink's alerts with the watermark held against the backfill's (the watermark after every transaction):
    every difference is `watermark_held`, its evidence the transaction the watermark stopped at (after the one
    Flink's watermark last reached: its timers fired there), the alert's transaction and the transactions the
    held state kept; where the stream has the alert, the held window aggregates by the rule to Flink's value. The
    same alert with a value no hold gives stays unexplained."""
    job, operator, rows, stopped = held
    code, report = _verify(job, operator, rows, tmp_path, *MAP)
    [section] = report["sections"]
    differing = {c: n for c, n in section["counts"].items() if n and c != "match"}
    assert differing, section["counts"]
    assert {c: n for c, n in section["causes"].items() if n} == {"watermark_held": sum(differing.values())}
    assert code == 0 and report["verdict"] == "explained"
    read = [json.loads(line) for line in (job.parent / "inputs" / f"transactions{operator[1:]}.jsonl")
            .read_text().splitlines()]
    offset = {r["value"]["transactionId"]: r["offset"] for r in read}
    for s in (s for s in section["samples"] if s["category"] != "match"):
        assert "watermark held from the transaction" in s["detail"]
        start, transaction, *kept = s["records"]
        assert start["status"] == "watermark held from here" and start["offset"] > offset[stopped["transactionId"]]
        assert transaction["status"] == "transaction" and kept
        assert all(k["status"] == "kept: the run's watermark had evicted it" for k in kept)
    by_row = {(r["ruleId"], str(r["triggeringEvent"]["transactionId"])): r for r in rows}
    theirs = [s for s in section["samples"] if s["category"] != "match" and s["r_value"] is not None]
    assert theirs
    for s in theirs:
        assert s["r_rule"] == s["l_rule"] and len(s["r_window"]) > len(s.get("l_window") or [])
        _window_gives_flinks_value({"l_rule": s["r_rule"], "l_window": s["r_window"]},
                                   by_row[(s["rule_id"], s["transaction_id"])])
    extra = theirs[0]
    wrong = [{**r, "triggeringValue": r["triggeringValue"] + 1000}
             if (r["ruleId"], str(r["triggeringEvent"]["transactionId"])) == (extra["rule_id"], extra["transaction_id"])
             else r for r in rows]
    _, report = _verify(job, operator, wrong, tmp_path / "wrong", *MAP)
    [section] = report["sections"]
    by = {(s["rule_id"], s["transaction_id"]): s["cause"] for s in section["samples"] if s["category"] != "match"}
    assert by[(extra["rule_id"], extra["transaction_id"])] == "unexplained"


def test_the_held_replay_gives_flinks_alerts_of_each_held_watermark(
        held_variants: tuple[list[tuple[Any, Any]], dict[Any, Any]], spark: Any, tmp_path: Path) -> None:
    """The replay `watermark_held` rests on (ops/rules.py `held_watermark`, docs/semantics.md §12.14), judged by
    Flink on every scenario of a seed in which stopping the watermark at a transaction changes an alert (the latest
    such stop of each): Flink's watermark reached that transaction and no later one, so held from the first
    eviction after it, the replay gives, for every evaluation from there on (alert or not), exactly what Flink
    raised with the watermark stopped; where no eviction lies between, the run's own evaluation is Flink's."""
    from backfill.jobspec.load import load_job
    from backfill.ops.rules import HOLDS_TRIED, held_watermark
    from backfill.plan.builder import build_plan
    from backfill.plan.evaluator import operator_rerun

    variants, judged = held_variants
    by_id = {sc.id: sc for sc, _ in variants}
    held_at: dict[int, list[Any]] = {}  # per scenario, each stop of the watermark that changes an alert
    for sc, v in variants:
        if set(judged[v.id]) != set(judged[sc.id]):
            held_at.setdefault(sc.id, []).append(v)
    assert len(held_at) >= 5 and sum(map(len, held_at.values())) >= 20, held_at.keys()
    plan = build_plan(load_job(flink.write_job(tmp_path, [by_id[i] for i in sorted(held_at)])), None, None)
    evaluations = alerts_compared = 0
    for sid, held in sorted(held_at.items()):
        sc = by_id[sid]
        processed, _ = operator_rerun(plan, spark, f"s{sid}")
        operator = next(o for o in plan.operators if o.name == f"s{sid}")
        txs = [b for k, b in sc.events if k == "transactions"]
        rules = sorted({json.loads(b)["ruleId"] for k, b in sc.events if k == "rules" and "ruleId" in json.loads(b)})
        found = held_watermark(operator, processed, [(r, 0, o) for r in rules for o in range(len(txs))])
        ours = {(r, int(p.split("@")[1])): Decimal(value) for r, _, p, value in judged[sc.id]}
        for v in held:
            stopped = sum(k == "transactions" for k, _ in sc.events[:v.hold])  # the offset of its transaction
            theirs = {(r, int(p.split("@")[1])): Decimal(value) for r, _, p, value in judged[v.id]}
            for (rule_id, _, offset), tries in found.items():
                if offset < stopped:
                    continue
                hold = [h for h in tries if h.hold[1] > stopped]
                if len(hold) == HOLDS_TRIED:  # the eviction after the stop may be further back than those tried
                    continue
                if not hold:  # no eviction from the stop to here: the run's own evaluation, as Flink's per element
                    assert theirs.get((rule_id, offset)) == ours.get((rule_id, offset)), (sid, rule_id, offset)
                    continue
                h = hold[-1]  # the earliest eviction after the stop (the list is latest first)
                got = Decimal(h.value) if h.alerted else None
                assert got == theirs.get((rule_id, offset)), (sid, v.hold, rule_id, offset, got, h)
                evaluations += 1
                alerts_compared += got is not None
    assert evaluations >= 200 and alerts_compared >= 100, (evaluations, alerts_compared)
