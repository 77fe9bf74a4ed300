"""Part: checks. Conservation before publish: every record an operator received is accounted for.

records in == contributing + dropped (by reason) + filtered (by its `where`, each count found on its own), and
the late ledger rows equal the late (record, window)
pairs counted record by record in the counting pass: two independent derivations that must agree, or
nothing is published.

An identical copy of an offset (docs/semantics.md §7.3) is no record: the ordering leaves it out before any
operator sees it, so it is in no operator's records in; the run counts it under `duplicates`, and the rows a
source holds are its `records_read` plus its `duplicates`. Each copy of an offset whose copies differ is a
record (a `conflicting_offset` ledger row of its source, never an operator's).

A chained operator's records in are the rows its upstream forwarded, counted twice: in the counting pass over
what it read, and on the upstream's output (docs/semantics.md §18.6).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from backfill.errors import PublishError
from backfill.ops.base import Operator, OperatorCounts


def check_conservation(operators: Iterable[Operator], counts: Mapping[str, OperatorCounts],
                       ledger: Mapping[tuple[str | None, str], int]) -> dict[str, int]:
    """Settle each operator's counts from its ledger rows per reason, then check them; the late rows per operator."""
    late: dict[str, int] = {}
    for op in operators:
        mine = {reason: n for (name, reason), n in ledger.items() if name == op.name}
        c = counts[op.name]
        op.settle(c, mine)
        late[op.name] = mine.get("late", 0)
        if late[op.name] != c.late_pairs or not c.balanced:
            raise PublishError(f"operators.{op.name}: conservation check failed (late ledger rows {late[op.name]}, "
                               f"late pairs {c.late_pairs}, in {c.records_in}, contributing {c.contributing}, "
                               f"dropped {c.dropped}, filtered {c.filtered}); nothing was published")
    return late


def conservation_rows(late: Mapping[str, int], counts: Mapping[str, OperatorCounts]) -> list[dict[str, Any]]:
    """Per operator: records in, contributing + dropped, late ledger rows, late pairs (the ledger suite's table)."""
    return [{"operator": name, "records_in": c.records_in,
             "accounted": c.contributing + sum(c.dropped.values()) + c.filtered,
             "late_ledger_rows": late.get(name, 0), "late_pairs": c.late_pairs} for name, c in counts.items()]


def check_chains(chained: Mapping[str, Mapping[str, Any]], counts: Mapping[str, OperatorCounts]) -> None:
    """A chained operator receives every row its upstream forwarded (docs/semantics.md §18.6): its records in
    (filtered ones included) equal the rows counted on the upstream's output itself, not on what it read (a
    chained join's: less the records of the source it reads beside them, `beside`)."""
    for name, chain in chained.items():
        got = counts[name].records_in - chain.get("beside", 0)
        if got != chain["forwarded"]:
            raise PublishError(f"operators.{name}: conservation check failed ({got} records in, {chain['forwarded']} "
                               f"rows forwarded by operators.{chain['from']}); nothing was published")
