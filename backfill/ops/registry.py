"""Part: operators. Which Operator class runs which job operator: the one place a new operator registers."""
from __future__ import annotations

import dataclasses

from backfill.jobspec import versions
from backfill.jobspec.load import Job
from backfill.jobspec.models import OperatorSpec
from backfill.ops.aggregate import WindowAggregate
from backfill.ops.base import Operator
from backfill.ops.join import StreamJoin
from backfill.ops.rules import RulesOperator
from backfill.ops.session import SessionAggregate
from backfill.ops.sliding import SlidingAggregate
from backfill.ops.table_aggregate import TableAggregate
from backfill.ops.table_join import TableJoin

# by OperatorSpec.processor: the join's kind, rules, or the aggregate's window type
OPERATORS: dict[str, type[Operator]] = {
    "join": StreamJoin,
    "table_join": TableJoin,  # a join with `table:` (docs/semantics.md §17)
    "rules": RulesOperator,
    "tumbling": WindowAggregate,
    "hopping": WindowAggregate,
    "sliding": SlidingAggregate,
    "session": SessionAggregate,
    "table": TableAggregate,  # an aggregate without a window (docs/semantics.md §16)
}


def operator_for(job: Job, spec: OperatorSpec, index: int, sink: str | None, start: int | None,
                 end: int | None) -> Operator:
    """The planned operator for the job's operator number `index` over the range [start, end)."""
    op = OPERATORS[spec.processor].from_job(job, spec, index, sink, start, end)
    profile = versions.profile(job.spec.kafka_streams)
    return op if op.profile == profile else dataclasses.replace(op, profile=profile)
