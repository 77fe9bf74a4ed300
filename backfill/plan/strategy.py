"""Part: plan. The strategies a run executes its plan with, decided by the rules the run itself follows: how
each task's records are ordered (order/tasks.py `ordering`), whether the one pass runs the plan (`one_pass`,
plan/fused.py) and whether a large input's pane groups are spread before they are merged (order/tasks.py
`CHUNKED_ABOVE`). `plan` prints them before any data is read; `run` reports the ones it took (its summary's
`strategies`), so the two can be compared.

What `plan` cannot know without a session it says as a condition: whether backfill's JVM operator is reachable
(it is in a local session built by backfill with its jar; it is not over Spark Connect), and the input's size,
which `plan` takes from the files' bytes (the run decides on Spark's estimate of what it reads, at most that).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from backfill.jobspec.durations import format_duration
from backfill.jobspec.rekeys import copied, rekeys
from backfill.jobspec.topology import in_task, upstream, wheres
from backfill.ops.aggregate import WindowAggregate
from backfill.order import tasks
from backfill.plan import fused
from backfill.plan.definition import Plan

ORDERING = "ordering"
PASS = "pass"
ONE_PASS, ONE_PASS_SPREAD, BY_OPERATOR = "one_pass", "one_pass_spread", "by_operator"


@dataclass(frozen=True)
class Strategy:
    """One stage of a run and the way it runs."""

    stage: str  # "ordering", "ordering <operator> (...)", "pass"
    how: str  # an order/tasks.py ordering, or ONE_PASS / BY_OPERATOR
    text: str  # what it means, for a person

    def line(self) -> str:
        """As `plan` prints it."""
        return f"strategy: {self.stage}: {self.how} ({self.text})"


def one_pass(plan: Plan) -> WindowAggregate | None:
    """The operator the one pass (plan/fused.py) runs, counting included; None: the operators run one by one."""
    if any(op.spec is not None and wheres(op.spec) for op in plan.operators):  # a filter: ops/filters.py
        return None
    return fused.fusable(plan)


def pass_how(one: WindowAggregate | None, large: bool) -> str:
    """How the counting and the operators run: one pass (its pane groups spread by (task, key) before the
    merge when the input is large: order/tasks.py `spread_partitions`), or operator by operator."""
    if one is None:
        return BY_OPERATOR
    return ONE_PASS_SPREAD if large and one.panes() is not None else ONE_PASS


def rekeyed_stage(name: str) -> str:
    """The stage that orders operator `name`'s repartition topics (and the inputs it copies) per task."""
    return f"{ORDERING} {name} (repartition topic)"


def chained_stage(name: str) -> str:
    """The stage that orders the rows a chained operator `name` reads per task."""
    return f"{ORDERING} {name} (forwarded rows)"


def strategies(plan: Plan, operator: bool, input_bytes: int | None) -> list[Strategy]:
    """The strategies of a run of `plan`: `operator`, whether backfill's JVM operator is reachable;
    `input_bytes`, the input's size (None: unknown, e.g. a Kafka topic, which is never taken as large)."""
    large = input_bytes is not None and input_bytes > tasks.CHUNKED_ABOVE
    specs = plan.job.spec.operators
    first = [op for op in plan.operators if op.spec is None or upstream(op.spec, specs) is None]
    how = tasks.ordering(len(plan.sources) == 1, plan.given_order, operator, lambda: large)
    out = [Strategy(ORDERING, how, tasks.ORDERINGS[how] + _size(how, input_bytes))]
    for op in plan.operators:
        if op.spec is None:
            continue
        parts = len(rekeys(op.spec)) + len(copied(op.spec))
        if op not in first and not parts and not in_task(op.spec, specs):  # in_task: its upstream's order
            how = tasks.ordering(True, False, operator, lambda: False, chunkable=False)
            out.append(Strategy(chained_stage(op.name), how, tasks.ORDERINGS[how]))
        if parts:
            how = tasks.ordering(parts == 1, False, operator, lambda: False, chunkable=False)
            out.append(Strategy(rekeyed_stage(op.name), how, tasks.ORDERINGS[how]))
    one = one_pass(plan)
    how = pass_how(one, large)
    if one is None:
        out.append(Strategy(PASS, how, "the counting pass, then each operator over the ordered records; the one "
                            "pass needs one source and one tumbling or hopping aggregate with emit: final, no re-key, "
                            "no filter, and aggregations that read only the value and not the order"))
        return out
    panes = one.panes()
    text = f"operators.{one.name}: counted and aggregated in one pass over the ordered records"
    if panes is not None:
        text += f", by pane of {format_duration(panes.windows.advance)}, each pane merged into its windows"
        text += (f" after the pane groups are spread by (task, key): the input is above {_threshold()}" if large
                 else f", by task (spread by (task, key) first above {_threshold()} of input)")
    out.append(Strategy(PASS, how, text))
    return out


def _size(how: str, input_bytes: int | None) -> str:
    if input_bytes is None or how not in (tasks.CHUNKS, tasks.WINDOWS):
        return ""
    return f"; input about {input_bytes / 2**20:,.1f} MiB of files, chunks above {_threshold()}"


def _threshold() -> str:
    """order/tasks.py CHUNKED_ABOVE, for a person."""
    size = tasks.CHUNKED_ABOVE
    return f"{size >> 30} GiB" if size >= 1 << 30 else f"{size:,} bytes"


def file_bytes(plan: Plan) -> int | None:
    """The bytes of the files the sources read (a Delta table's data files, its log left out), or None when a
    source is no file or folder (a Kafka topic)."""
    total = 0
    for s in plan.sources:
        path = Path(s.location)
        if s.format == "kafka" or not path.exists():
            return None
        if path.is_file():
            total += path.stat().st_size
            continue
        for root, dirs, files in os.walk(path):
            dirs[:] = [d for d in dirs if not d.startswith(("_delta_log", "."))]
            total += sum(os.path.getsize(os.path.join(root, f)) for f in files if not f.startswith((".", "_")))
    return total
