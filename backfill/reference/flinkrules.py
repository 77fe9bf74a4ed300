"""Part: reference engine. The lookback rule engine (docs/semantics.md §12), one message at a time, as literally as it reads.

Rule messages and transactions are replayed on one arrival axis (the recorded `seq`, else the record
timestamp; a rule before a transaction at the same place, then partition and offset). With `order: arrival`
everything happens in that order, as in the live job at parallelism 1: DynamicKeyFunction forks each
transaction once per rule it holds, DynamicAlertFunction stores it in its key's state, evaluates ACTIVE
rules over [t - W, t], registers a cleanup timer at t floored to the second, and the watermark (largest event
time seen minus the out-of-orderness, once a rule has arrived) fires timers that evict entries older than the
timer minus the widest window. With `order: event_time` each key's forks run sorted by event time, with no
timers (Flink BATCH). Nothing here is shared with the Spark engine.
"""
from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from backfill.errors import SourceError
from backfill.jobspec.models import OperatorSpec
from backfill.jobspec.rulemessages import Rule, RuleMessageError, parse_rule
from backfill.reference.records import json_object, json_text, ledger_row, plain

JAVA_MIN = -2**63
NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")
DOUBLE_MIN = Decimal("4.9E-324")
DOUBLE_MAX = Decimal("1.7976931348623157E+308")
AVG_PLACES = 10


class WouldFail(SourceError):
    """compat: demo, and the published code would throw here (the live job fails)."""


@dataclass
class Event:
    """A rule message or a transaction on the arrival axis."""

    axis: tuple[Any, ...]
    rec: dict[str, Any]
    rule: Rule | None = None
    problem: str | None = None
    doc: dict[str, Any] | None = None
    t: int | None = None


@dataclass
class State:
    """One key's windowState: event time -> transactions (a set), and its pending cleanup timers."""

    entries: dict[int, list[tuple[Any, dict[str, Any]]]] = field(default_factory=lambda: defaultdict(list))
    timers: dict[int, int] = field(default_factory=dict)  # timer time -> watermark when registered


def run_rules(op: OperatorSpec, txs: list[dict[str, Any]], rule_recs: list[dict[str, Any]], given_order: bool,
              result: Any) -> None:
    """Replay the operator; alerts go to result.outputs[op.name], ledger rows to result.ledger."""
    spec = op.rules
    assert spec is not None
    events = []
    for rec in rule_recs:
        ev = Event(_axis(rec, 0, given_order), rec)
        try:
            ev.rule = parse_rule(rec["value"] if isinstance(rec["value"], str) else json.dumps(rec["value"]))
        except RuleMessageError as exc:
            ev.problem = str(exc)
        events.append(ev)
    for rec in txs:
        ev = Event(_axis(rec, 1, given_order), rec)
        ev.doc = json_object(rec["value"])
        raw = rec["ts"] if spec.event_time == "timestamp" else (ev.doc or {}).get(spec.event_time[6:])
        ev.t = _long(raw)
        events.append(ev)
    events.sort(key=lambda e: e.axis)
    engine = _Engine(op, result)
    for ev in events:
        if ev.rec["source"] == spec.rules:
            if ev.problem is not None:
                result.ledger.append(ledger_row(ev.rec, op.name, "invalid_rule", ev.rec["ts"], None, None,
                                                detail=ev.problem, range_time=ev.rec["ts"]))
                continue
            assert ev.rule is not None
            engine.rule_message(ev.rule)
        else:
            engine.transaction(ev)
        engine.after_event()
    engine.finish()


def _axis(rec: dict[str, Any], kind: int, given_order: bool) -> tuple[Any, ...]:
    first = rec["seq"] if given_order else rec["ts"]
    return (first, kind, rec["partition"], rec["offset"])


def _long(raw: Any) -> int | None:
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        return raw if JAVA_MIN <= raw < 2**63 else None
    if isinstance(raw, str) and re.fullmatch(r"[+-]?\d+", raw):
        n = int(raw)
        return n if JAVA_MIN <= n < 2**63 else None
    return None


def text_of(value: Any) -> str:
    """Java's String.valueOf of a transaction field, as read from JSON."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Decimal):
        return plain(value)
    if isinstance(value, (dict, list)):
        return json_text(value)
    return str(value)


def amount(value: Any) -> Decimal | None:
    """The field as a number (BigDecimal of its text), or None when it is not one."""
    if value is None or isinstance(value, (bool, dict, list)):
        return None
    if isinstance(value, float):
        return Decimal(repr(value))
    text = text_of(value) if not isinstance(value, str) else value
    return Decimal(text) if NUMBER.match(text) else None


class _Engine:
    """DynamicKeyFunction + DynamicAlertFunction at parallelism 1 (or their BATCH counterparts)."""

    def __init__(self, op: OperatorSpec, result: Any) -> None:
        spec = op.rules
        assert spec is not None
        self.op, self.spec, self.result = op, spec, result
        self.arrival = spec.order == "arrival"
        self.final = spec.rule_versions == "final"
        self.demo = spec.compat == "demo"
        self.rules: dict[int, Rule] = {}
        self.widest: Rule | None = None
        self.states: dict[Any, State] = defaultdict(State)
        self.max_t: int | None = None
        self.rules_seen = False
        self.wm = JAVA_MIN
        self.pending: list[tuple[Any, dict[str, Any], Rule]] = []  # event_time order: forks, run at the end
        self.final_rules: dict[int, Rule] = {}
        self.seq = 0
        self.alerts: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    # ---------------------------------------------------------------- rules
    def rule_message(self, rule: Rule) -> None:
        self.rules_seen = True
        if rule.state in ("ACTIVE", "PAUSE"):
            assert rule.rule_id is not None
            self.rules[rule.rule_id] = rule
            if rule.state == "ACTIVE" and (self.widest is None or rule.window_ms > self.widest.window_ms):
                self.widest = rule
        elif rule.state == "DELETE":
            self.rules.pop(rule.rule_id, None)  # type: ignore[arg-type]
        elif rule.control == "DELETE_RULES_ALL":
            if self.demo and len(self.rules) + (self.widest is not None) >= 2:
                raise WouldFail(f"operators.{self.op.name}: compat: demo: DELETE_RULES_ALL with "
                                f"{len(self.rules)} rules would fail the published job "
                                "(ConcurrentModificationException); use compat: intended")
            self.rules.clear()
            self.widest = None
        elif rule.control == "CLEAR_STATE_ALL" and self.arrival and not self.final:
            for state in self.states.values():
                state.entries.clear()

    def finish(self) -> None:
        if not self.arrival or self.final:
            self._run_sorted()
        self.alerts.sort(key=lambda a: a[0])
        for n, (_, row) in enumerate(self.alerts, start=1):
            self.result.outputs[self.op.name].append({**row, "emit_seq": n})

    # ---------------------------------------------------------------- transactions
    def transaction(self, ev: Event) -> None:
        rec = ev.rec
        if ev.doc is None or ev.t is None:
            reason, detail = ("null_value", None) if ev.doc is None else (
                "invalid_timestamp", f"event_time {self.spec.event_time} is not epoch milliseconds")
            self.result.ledger.append(ledger_row(rec, self.op.name, reason, rec["ts"], None, None, detail=detail,
                                                 range_time=rec["ts"]))
            return
        if self.final:  # the final rule set, for every transaction: known only at the end
            self.pending.append((ev.axis, {"ev": ev}, None))  # type: ignore[arg-type]
            return
        # every transaction with an event time moves the watermark, forked or not (the extractor comes first)
        self.max_t = ev.t if self.max_t is None else max(self.max_t, ev.t)
        forks = [self.rules[i] for i in sorted(self.rules)]
        if not self._check(ev, forks):
            return
        for rule in forks:
            if self.arrival:
                self._process(ev, rule)
            else:
                self.pending.append((ev.axis, {"ev": ev}, rule))

    def _check(self, ev: Event, forks: list[Rule]) -> bool:
        """A transaction no rule sees, or whose aggregated field is not a number, goes to the ledger."""
        rec = ev.rec
        if not forks:
            self.result.ledger.append(ledger_row(rec, self.op.name, "no_rule", rec["ts"], None, None,
                                                 range_time=rec["ts"]))
            return False
        assert ev.doc is not None
        for rule in forks:
            if not rule.counts and amount(ev.doc.get(rule.field or "")) is None:
                self.result.ledger.append(ledger_row(
                    rec, self.op.name, "invalid_field", rec["ts"], None, None, range_time=rec["ts"],
                    detail=f"rule {rule.rule_id}: {rule.field} is not a number"))
                return False
        return True

    def _run_sorted(self) -> None:
        """Flink BATCH: per key, forks sorted by (event time, arrival, rule id); final rules if asked."""
        forks: list[tuple[Any, Event, Rule]] = []
        rules = self.rules if self.final else None
        if self.final:
            self.widest = None
            for rule in rules.values():  # type: ignore[union-attr]
                if rule.state == "ACTIVE" and (self.widest is None or rule.window_ms > self.widest.window_ms):
                    self.widest = rule
        if self.arrival and rules is not None:  # final rules, arrival order: replay with the watermark as it was
            self.max_t, self.wm, self.rules_seen = None, JAVA_MIN, True
            chosen = [rules[i] for i in sorted(rules)]
            for _, holder, _ in sorted(self.pending, key=lambda p: p[0]):
                ev = holder["ev"]
                self.max_t = ev.t if self.max_t is None else max(self.max_t, ev.t)
                if self._check(ev, chosen):
                    for rule in chosen:
                        self._process(ev, rule)
                self.after_event()
            return
        for axis, holder, rule in self.pending:
            ev = holder["ev"]
            if rules is not None:
                chosen = [rules[i] for i in sorted(rules)]
                if not self._check(ev, chosen):
                    continue
                forks += [(axis, ev, r) for r in chosen]
            else:
                forks.append((axis, ev, rule))
        for axis, ev, rule in sorted(forks, key=lambda f: (f[1].t, f[0], f[2].rule_id)):
            self._process(ev, rule)

    def _state_key(self, rule: Rule, key: str) -> Any:
        return key if self.demo else (rule.rule_id, key)

    def _process(self, ev: Event, rule: Rule) -> None:
        """DynamicAlertFunction.processElement (docs/semantics.md §12.4) for one fork."""
        assert ev.doc is not None and ev.t is not None
        key = "{" + ";".join(f"{name}={text_of(ev.doc.get(name))}" for name in rule.keys) + "}"
        state = self.states[self._state_key(rule, key)]
        ident = json_text(ev.doc) if self.demo else (ev.rec["source"], ev.rec["partition"], ev.rec["offset"])
        bucket = state.entries[ev.t]
        if all(i != ident for i, _ in bucket):
            bucket.append((ident, ev.doc))
        if rule.state != "ACTIVE":
            return
        t, w = ev.t, rule.window_ms
        if self.arrival:
            timer = int(t / 1000) * 1000 if t >= 0 else -((-t) // 1000) * 1000  # Java's division truncates
            state.timers.setdefault(timer, self.wm)
        values = [Decimal(1) if rule.counts else amount(doc.get(rule.field or ""))
                  for ts in sorted(state.entries) if t - w <= ts <= t for _, doc in state.entries[ts]]
        value = self._aggregate(rule, [v for v in values if v is not None], ev)
        if _holds(value, rule):
            if rule.resets:
                state.entries.clear()
            order = (ev.axis, rule.rule_id) if self.arrival else (t, ev.axis, rule.rule_id)
            self.alerts.append((order, {"rule_id": rule.rule_id, "key": key, "value": plain(value),
                                        "transaction": _tx_text(ev.rec["value"]), "ts": ev.rec["ts"],
                                        "rule": rule.to_json()}))

    def _aggregate(self, rule: Rule, values: list[Decimal], ev: Event) -> Decimal:
        where = (f"operators.{self.op.name}: compat: demo: rule {rule.rule_id} on {ev.rec['source']} "
                 f"{ev.rec['partition']}@{ev.rec['offset']}")
        agg = rule.aggregator
        if agg == "SUM":
            return sum(values, Decimal(0))
        if agg == "AVG":
            if self.demo:
                raise WouldFail(f"{where}: AVG would fail the published job (NullPointerException); "
                                "use compat: intended")
            return (sum(values, Decimal(0)) / len(values)).quantize(Decimal(1).scaleb(-AVG_PLACES), ROUND_HALF_UP)
        if agg == "MAX":
            if self.demo and any(v < DOUBLE_MIN for v in values):
                raise WouldFail(f"{where}: MAX of a value <= 0 would fail the published job "
                                "(IllegalArgumentException); use compat: intended")
            return max(values)
        if self.demo and any(v > DOUBLE_MAX for v in values):
            raise WouldFail(f"{where}: MIN of a value above the largest double would fail the published job")
        return min(values)

    # ---------------------------------------------------------------- watermark and timers
    def after_event(self) -> None:
        """The watermark after a message; when it rises, every due timer fires (timer time order)."""
        if not self.arrival or not self.rules_seen or self.max_t is None:
            return
        wm = self.max_t - self.spec.out_of_orderness
        if wm <= self.wm:
            return
        self.wm = wm
        for state in self.states.values():
            for timer in sorted(t for t in state.timers if t <= wm):
                del state.timers[timer]
                if self.widest is None:
                    continue
                threshold = timer - self.widest.window_ms
                for ts in [ts for ts in state.entries if ts < threshold]:
                    del state.entries[ts]


def _holds(value: Decimal, rule: Rule) -> bool:
    limit = rule.limit
    assert limit is not None
    return {"EQUAL": value == limit, "NOT_EQUAL": value != limit, "GREATER": value > limit, "LESS": value < limit,
            "GREATER_EQUAL": value >= limit, "LESS_EQUAL": value <= limit}[rule.operator or ""]


def _tx_text(value: Any) -> str:
    return value if isinstance(value, str) else json_text(value)
