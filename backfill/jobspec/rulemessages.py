"""Part: foundation. Rule messages of the lookback rule engine (docs/semantics.md §12.1): parsed from JSON or the 9-token text.

A rule message is data, read from the rules source; its format is part of the contract, like the job YAML,
so both engines (Spark and the reference) read it through this one parser. The golden test `fraud-rule-parse`
pins it. What a rule *does* is written twice, once per engine.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

STATES = ("ACTIVE", "PAUSE", "DELETE", "CONTROL")
AGGREGATORS = ("SUM", "AVG", "MIN", "MAX")
OPERATORS = {"=": "EQUAL", "!=": "NOT_EQUAL", ">=": "GREATER_EQUAL", "<=": "LESS_EQUAL", ">": "GREATER", "<": "LESS"}
CONTROLS = ("CLEAR_STATE_ALL", "CLEAR_STATE_ALL_STOP", "DELETE_RULES_ALL", "EXPORT_RULES_CURRENT")
COUNT_FIELDS = ("COUNT_FLINK", "COUNT_WITH_RESET_FLINK")  # each transaction counts 1 (docs/semantics.md §12.2)
MINUTE_MS = 60_000


class RuleMessageError(ValueError):
    """A rule message that the live job's deserializer would drop (it goes to the ledger as `invalid_rule`)."""


@dataclass(frozen=True)
class Rule:
    """One rule message, as the live job's deserializer builds it."""

    rule_id: int | None
    state: str
    keys: tuple[str, ...] = ()
    unique: tuple[str, ...] = ()
    field: str | None = None
    aggregator: str | None = None
    operator: str | None = None  # None: an unknown symbol, every evaluation fails
    limit: Decimal | None = None
    window_minutes: int | None = None
    control: str | None = None

    @property
    def window_ms(self) -> int:
        """W of the window [t - W, t]."""
        return (self.window_minutes or 0) * MINUTE_MS

    @property
    def counts(self) -> bool:
        """The magic count fields: every transaction contributes 1."""
        return self.field in COUNT_FIELDS

    @property
    def resets(self) -> bool:
        """COUNT_WITH_RESET_FLINK: an alert clears the key's state."""
        return self.field == "COUNT_WITH_RESET_FLINK"

    def to_json(self) -> str:
        """The rule as JSON text, with the field names of the rule messages (the `rule` column of alerts)."""
        out: dict[str, Any] = {"ruleId": self.rule_id, "ruleState": self.state,
                               "groupingKeyNames": list(self.keys), "unique": list(self.unique),
                               "aggregateFieldName": self.field, "aggregatorFunctionType": self.aggregator,
                               "limitOperatorType": self.operator,
                               "limit": None if self.limit is None else _JsonNumber(self.limit),
                               "windowMinutes": self.window_minutes}
        if self.control is not None:
            out["controlType"] = self.control
        return _dumps(out)


class _JsonNumber(str):
    """A decimal written as a JSON number with its own digits (json.dumps would quote it)."""


def _dumps(obj: dict[str, Any]) -> str:
    parts = []
    for k, v in obj.items():
        parts.append(f"{json.dumps(k)}:{v if isinstance(v, _JsonNumber) else json.dumps(v)}")
    return "{" + ",".join(parts) + "}"


def parse_rule(text: str) -> Rule:
    """A rule message: JSON (a line starting with `{`) or the 9-token text; raise RuleMessageError."""
    text = text.strip()
    if not text:
        raise RuleMessageError("empty rule message")
    rule = _from_json(text) if text.startswith("{") else _from_text(text)
    if rule.rule_id is None and rule.state != "CONTROL":
        raise RuleMessageError("ruleId is missing (only CONTROL messages may omit it)")
    if rule.state == "CONTROL" and rule.control not in CONTROLS:
        raise RuleMessageError(f"controlType {rule.control!r} is not one of {', '.join(CONTROLS)}")
    if rule.state in ("ACTIVE", "PAUSE"):
        if not rule.field or rule.aggregator is None or rule.limit is None or rule.window_minutes is None:
            raise RuleMessageError("an ACTIVE or PAUSE rule needs aggregateFieldName, aggregatorFunctionType, "
                                   "limit and windowMinutes")
        if rule.operator is None:
            raise RuleMessageError("limitOperatorType is missing or not one of =, !=, >=, <=, >, < (the live job "
                                   "would fail at the rule's first evaluation)")
        if rule.window_minutes < 0:
            raise RuleMessageError(f"windowMinutes must be >= 0, got {rule.window_minutes}")
    return rule


def _from_text(text: str) -> Rule:
    """`id,(state),(k1&k2),(unique),(field),(agg),(op-symbol),(limit),(windowMinutes)`."""
    tokens = text.split(",")
    if len(tokens) != 9:
        raise RuleMessageError(f"a text rule has 9 comma-separated tokens, this one has {len(tokens)}")
    t = [tok.strip().removeprefix("(").removesuffix(")").strip() for tok in tokens]
    state = t[1].upper()
    if state not in STATES:
        raise RuleMessageError(f"rule state {t[1]!r} is not one of {', '.join(STATES)}")
    agg = t[5].upper()
    if agg not in AGGREGATORS:
        raise RuleMessageError(f"aggregator {t[5]!r} is not one of {', '.join(AGGREGATORS)}")
    return Rule(rule_id=_int(t[0], "ruleId"), state=state, keys=_names(t[2]), unique=_names(t[3]),
                field=t[4] or None, aggregator=agg, operator=OPERATORS.get(t[6]), limit=_decimal(t[7], "limit"),
                window_minutes=_int(t[8], "windowMinutes"))


def _names(token: str) -> tuple[str, ...]:
    return tuple(n for n in token.split("&") if n)


def _from_json(text: str) -> Rule:
    try:
        raw = json.loads(text, parse_float=str, parse_int=str)
    except json.JSONDecodeError as exc:
        raise RuleMessageError(f"not valid JSON ({exc.msg})") from None
    if not isinstance(raw, dict):
        raise RuleMessageError("a JSON rule is an object")
    state = _enum(raw.get("ruleState"), STATES, "ruleState")
    agg = raw.get("aggregatorFunctionType")
    op = raw.get("limitOperatorType")
    return Rule(rule_id=_int(raw.get("ruleId"), "ruleId"), state=state or "",
                keys=_list(raw.get("groupingKeyNames"), "groupingKeyNames"),
                unique=_list(raw.get("unique"), "unique"), field=raw.get("aggregateFieldName"),
                aggregator=_enum(agg, AGGREGATORS, "aggregatorFunctionType"),
                operator=_enum(op, tuple(OPERATORS.values()), "limitOperatorType"),
                limit=_decimal(raw.get("limit"), "limit"),
                window_minutes=_int(raw.get("windowMinutes"), "windowMinutes"),
                control=_enum(raw.get("controlType"), CONTROLS, "controlType"))


def _enum(value: Any, allowed: tuple[str, ...], name: str) -> str | None:
    if value is None:
        return None
    if value not in allowed:
        raise RuleMessageError(f"{name} {value!r} is not one of {', '.join(allowed)}")
    return str(value)


def _list(value: Any, name: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RuleMessageError(f"{name} must be a list of field names")
    return tuple(value)


def _int(value: Any, name: str) -> int | None:
    if value is None or value == "":
        return None
    try:
        number = int(str(value))
    except ValueError:
        raise RuleMessageError(f"{name} {value!r} is not an integer") from None
    if not -2**31 <= number < 2**31:
        raise RuleMessageError(f"{name} {value} does not fit a Java int")
    return number


def _decimal(value: Any, name: str) -> Decimal | None:
    if value is None or value == "":
        return None
    try:
        number = Decimal(str(value))
    except InvalidOperation:
        raise RuleMessageError(f"{name} {value!r} is not a number") from None
    if not number.is_finite():
        raise RuleMessageError(f"{name} {value!r} is not a finite number")
    return number
