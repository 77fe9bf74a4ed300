"""Part: verify. The one catalogue of causes: each cause's name, family, severity, meaning and colour.

The attribution (verify/causes.py, verify/joins.py, verify/restarts.py), the result's counts (verify/runner.py),
the report (verify/report.py) and the docs' table of causes (README.md, checked by tests) all read it, so a cause
is added or renamed here and nowhere else (docs/semantics.md §8).

A cause is attributed by one table of (condition, cause, detail) rows, strongest evidence first (`first_match`):
the cause and its detail come from the same row, so they cannot disagree.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import Column
from pyspark.sql import functions as F


@dataclass(frozen=True)
class Cause:
    """One cause verify can name for a differing window or join row."""

    name: str
    family: str  # what shows it: "window" (any windowed output), "restart", "join", "alerts", "mechanism", "none"
    severity: int  # the order a reader should look at causes in: 0 first
    colour: str  # in the report: explained causes muted, what nothing explains red
    meaning: str  # one sentence for the report's table of causes


# in the order the result lists its counts; severity: what no evidence explains, then what corrupted the stream's
# values, then what explains a difference without anything to repair
CATALOGUE: tuple[Cause, ...] = (
    Cause("late_drop_differs", "window", 6, "#5d7fa3",
          "the record set differs by records one side dropped as late and the other did not (stream time differed: "
          "restart, live edge); the records are shown"),
    Cause("range_boundary", "window", 19, "#c8ccd2",
          "a window the stream has, incomplete in the data read (not closed by the end of the data, or starting "
          "before it), or a window straddling a bound of the streaming output the evidence shows (the declared "
          "range, or where the stream's output of its task starts or ends)"),
    Cause("tie_order", "window", 17, "#8aa39b",
          "an order-sensitive aggregation over records with equal timestamps: their order is not knowable"),
    Cause("duplicate_delivery", "window", 10, "#9fb3c8",
          "the stream wrote the same result more than once (at-least-once delivery)"),
    Cause("missing_input", "window", 1, "#b9770e", "the archived input has an offset gap while the window was open"),
    Cause("ledgered_input", "alerts", 2, "#a0522d",
          "an alert only the stream raised, for a transaction the backfill ledgered and so never evaluated (its "
          "ledger row's reason: a null value, an event time that is not epoch ms, no rule yet, a field that is not "
          "a number): the live job read that transaction otherwise; the record is shown"),
    Cause("reprocessed_after_restart", "restart", 3, "#8e6c8a",
          "after a restart, records processed between the last commit and the crash were applied a second time "
          "(the restored state already held them); the records are shown"),
    Cause("reemitted", "restart", 9, "#c2b0c1",
          "a window emitted again after a restart (suppress's buffer restored as of the last commit); a compacted "
          "table keeps the last emission"),
    Cause("state_lost_on_restore", "restart", 4, "#a17fa0",
          "after a restart, the window had expired in the restored store: the stream counted only its last "
          "records; the records are shown"),
    Cause("stale_after_restart", "restart", 5, "#b391ae",
          "a session the stream emitted after a restart as it stood at the last commit, beside the session it had "
          "become: the restored suppress buffer still held it (the crash lost the tombstone that retired it); the "
          "records before the restart point reproduce it, and a compacted table must delete it"),
    Cause("session_merge_differs", "window", 11, "#7fa38f",
          "the other side has a different session of the same key within a gap of this one: the records merged "
          "differently (processing order, or what the store still held)"),
    Cause("expired_differs", "join", 7, "#6c8fb3",
          "a join row pairs two records, and the earlier was past its store's retention when the later arrived on "
          "one side only (the order decided it); the records are shown"),
    Cause("partner_after_close", "join", 8, "#7d9bb8",
          "a non-joined row: whether its window closed before its partner arrived depends on how the partitions "
          "interleaved; the records are shown"),
    Cause("emit_throttle", "join", 16, "#b5c7b0",
          "a non-joined row of the outer store, same values, written at another position: the stream emits them "
          "when its wall-clock throttle allows (1 s by default), the backfill at once"),
    Cause("processing_order", "join", 13, "#a9b8a4",
          "a join row, same values, written at another position: the task processed its records in another order "
          "(live edge, ties)"),
    Cause("rule_version_differs", "alerts", 14, "#a3a08a",
          "an alert the operator itself gives once a message of its rule arrives on the other side of the "
          "transaction: the live job had the other rule version in force (the arrival order of the rules and the "
          "transactions); the message and the transaction are shown"),
    Cause("watermark_held", "alerts", 15, "#b3a98f",
          "an alert the rule's evaluation gives with the watermark held from an earlier transaction on (no cleanup "
          "timer fired since): the live job's watermark lagged (an idle input, periodic emission), so its state "
          "still held transactions the backfill had evicted; those transactions are shown"),
    Cause("close_mechanism_differs", "mechanism", 12, "#9a8fb8",
          "the stream has what the other final mechanism (suppress or emit-on-close) emits: the operator "
          "recomputed with it gives exactly the stream's rows; set `close` to it"),
    Cause("cache_coalesced", "mechanism", 18, "#b8c9d9",
          "the stream's updates of the window are a coalescing of the backfill's (each one of them, in order, the "
          "same last): what the record cache's flushes forward"),
    Cause("unexplained", "none", 0, "#c0392b", "no evidence explains it: a real logic difference"),
)
BY_NAME = {c.name: c for c in CATALOGUE}
CAUSES = tuple(c.name for c in CATALOGUE)
SEVERITY = tuple(c.name for c in sorted(CATALOGUE, key=lambda c: c.severity))


def family(name: str) -> tuple[str, ...]:
    """The causes of one family, in the catalogue's order."""
    return tuple(c.name for c in CATALOGUE if c.family == name)


RESTART_CAUSES = family("restart")
JOIN_CAUSES = family("join")


def first_match(table: Sequence[tuple[Column | None, str | None, Column | str | None]]) -> tuple[Column, Column]:
    """The cause and detail columns of a table of (condition, cause, detail) rows: the first row whose condition
    holds gives both. The last row's condition is None (otherwise); its cause None leaves both null (no cause
    found here). A detail given as text is a literal."""
    *rows, (last, fallback, fallback_detail) = table
    assert last is None and all(cond is not None for cond, _, _ in rows), "only the last row is 'otherwise'"
    for _, name, _ in table:
        assert name is None or name in BY_NAME, f"{name} is not in the catalogue of causes"

    def lit(value: Column | str | None) -> Column:
        return value if isinstance(value, Column) else F.lit(value).cast("string")

    if not rows:
        return lit(fallback), lit(fallback_detail)
    # one flat CASE per column (a nested one would deepen the plan a Spark Connect client encodes)
    (cond, name, text), *more = rows
    cause, detail = F.when(cond, lit(name)), F.when(cond, lit(text))
    for cond, name, text in more:
        cause, detail = cause.when(cond, lit(name)), detail.when(cond, lit(text))
    return cause.otherwise(lit(fallback)), detail.otherwise(lit(fallback_detail))
