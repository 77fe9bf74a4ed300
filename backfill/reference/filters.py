"""Part: reference engine. `where`, one record at a time: KStream#filter before an operator (docs/semantics.md
§15). A record whose condition is not true never reaches the operator; it is counted as filtered."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from backfill.errors import SpecError
from backfill.jobspec.models import OperatorSpec
from backfill.jobspec.fields import RECORD_FIELDS
from backfill.jobspec.topology import where_field, wheres
from backfill.reference.expr import compile_scalar



class Filters:
    """Every operator's filters, compiled once; `passes` decides and counts."""

    def __init__(self, operators: list[OperatorSpec], counts: dict[str, int]) -> None:
        self.counts = counts
        self.compiled: dict[tuple[str, str], tuple[str, str, Callable[[Mapping[str, Any]], Any]]] = {}
        for op in operators:
            for source, sql in wheres(op).items():
                self.compiled[(op.name, source)] = (where_field(op, source), sql, compile_scalar(sql))
                counts.setdefault(op.name, 0)

    def passes(self, op: str, source: str, rec: dict[str, Any]) -> bool:
        """Whether `rec` of `source` reaches operator `op` (a null condition does not); counts it otherwise."""
        found = self.compiled.get((op, source))
        if found is None:
            return True
        where, sql, condition = found
        verdict = condition({f: rec.get(f) for f in RECORD_FIELDS})
        if verdict is not None and not isinstance(verdict, bool):
            raise SpecError(f"{where}: {sql!r} gives {type(verdict).__name__} values, not a boolean; write a "
                            f"condition, e.g. {sql} is not null")
        if verdict is not True:
            self.counts[op] += 1
        return verdict is True
