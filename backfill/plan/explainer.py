"""Part: plan. Show a plan: as text for people, as a dict for --json."""
from __future__ import annotations

import datetime as dt
from typing import Any

from backfill.jobspec.rekeys import copied, rekeys
from backfill.jobspec.topology import upstream
from backfill.plan.definition import Plan


def instant(ms: int | None) -> str:
    """Epoch ms as ISO-8601 UTC (or 'unbounded')."""
    if ms is None:
        return "unbounded"
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.timezone.utc).isoformat().replace("+00:00", "Z")


def plan_dict(plan: Plan) -> dict[str, Any]:
    """The plan as JSON-ready data."""
    return {"job": plan.job.spec.name, "file": str(plan.job.path), "kafka_streams": plan.kafka_streams,
            "start": plan.start, "end": plan.end,
            "sources": [s.describe() for s in plan.sources], "operators": [o.describe() for o in plan.operators],
            "ledger": plan.ledger_sink, "runs": plan.runs_sink, "notes": list(plan.notes), "chains": chains(plan)}


def chains(plan: Plan) -> dict[str, str]:
    """Each chained operator -> the operator whose forwarded rows it reads (docs/semantics.md §18)."""
    specs = plan.job.spec.operators
    return {op.name: up.name for op in specs if (up := upstream(op, specs)) is not None}


def _topology(plan: Plan) -> list[str]:
    """One line per operator over sources that others read: the chain, each reader after what it reads."""
    reads = chains(plan)

    def chain(name: str) -> str:
        after = [c for c, up in reads.items() if up == name]
        if not after:
            return name
        shown = [chain(c) for c in after]
        return f"{name} -> {shown[0] if len(shown) == 1 else '(' + ', '.join(shown) + ')'}"

    heads = [o.name for o in plan.operators if o.name not in reads and o.name in reads.values()]
    return [f"topology: {chain(h)} (each reads the rows the one before forwards, in the task that forwarded them; "
            "docs/semantics.md §18)" for h in heads]


def _range_column(plan: Plan) -> str:
    """What --start/--end select: window starts of aggregates, timestamps of join rows."""
    # a table aggregate's and a stream-table join's rows are selected by timestamp, as a join's
    kinds = {"aggregate" if o.range_column == "window_start" else "rules" if o.kind == "rules" else "join"
             for o in plan.operators}
    return {frozenset({"join"}): "timestamp", frozenset({"aggregate"}): "window start",
            frozenset({"rules"}): "timestamp of the alert's transaction"}.get(
        frozenset(kinds), "window start (aggregates) or timestamp (joins, alerts)")


def explain(plan: Plan) -> str:
    """A few lines a person reads before running: inputs, range, operators, warm-up and cool-down."""
    flink = all(o.kind == "rules" for o in plan.operators)
    lines = [f"job {plan.job.spec.name} ({plan.job.path})",
             "rules: Flink's fraud-detection pattern (lookback rules, docs/semantics.md §12)" if flink else
             f"rules: Kafka Streams {plan.kafka_streams}"
             + (" (the default; set kafka_streams: to the version the application runs)"
                if plan.job.spec.kafka_streams is None else ""),
             f"outputs: {_range_column(plan)} in [{instant(plan.start)}, {instant(plan.end)})"]
    for s in plan.sources:
        bounds = "; every record, whatever the range" if s.reads_all else ""
        if s.read_from is not None:
            bounds = f"; event time from {instant(s.read_from)}"
        if s.read_until is not None:
            bounds += f"{'' if bounds else '; event time'} until the first record per partition at/after " \
                      f"{instant(s.read_until)}"
        order = s.order if not flink else "arrival by " + ("its recorded order (seq)" if s.spec is not None and
                                                         s.spec.order_by else "the record timestamp")
        lines.append(f"source {s.name}: {s.format} {s.location}; timestamp = {s.timestamp} "
                     f"(invalid: {s.on_invalid}); order = {order}{bounds}")
    lines.extend(_topology(plan))
    for o in plan.operators:
        state = "" if o.implemented else f"  [NOT IMPLEMENTED: {o.not_implemented_reason}]"
        topics = [r.topic for r in rekeys(o.spec)] + [src for src, _ in copied(o.spec)] if o.spec is not None else []
        tasks = "per state key" if o.kind == "rules" else \
            f"tasks = partitions of {' and '.join(topics)}" if topics else \
            f"tasks = the tasks of {chains(plan)[o.name]} (its forwarded rows)" if o.name in chains(plan) else \
            "tasks = input partitions"
        lines.append(f"operator {o.name}: {o.kind} {o.window}, emit {o.emit} over {', '.join(o.inputs)}; {tasks}"
                     + f" -> {o.sink or '(no sink: counted only)'}{state}")
        lines.extend(f"  {why}" for why in o.why)
    lines.append(f"ledger -> {plan.ledger_sink or '(no _ledger sink: counted only)'}; runs -> {plan.runs_sink}")
    lines.extend(f"note: {n}" for n in plan.notes)
    return "\n".join(lines)
