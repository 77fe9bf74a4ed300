"""Part: foundation. The one range rule (plan, run, publish, verify): a row is in [start, end) by its range column.

The range column is a window start (aggregates), a timestamp (joins) or `range_time` (ledger rows).
A row without a value counts as -1: it belongs to every range that has no start, and to no other.
"""
from __future__ import annotations

import datetime as dt

from pyspark.sql import Column
from pyspark.sql import functions as F


def in_range(column: str, start: int | None, end: int | None) -> Column:
    """Column: True when `column` (null as -1) lies in [start, end); an open bound is no bound."""
    value = F.coalesce(F.col(column), F.lit(-1))
    cond = F.lit(True)
    if start is not None:
        cond = cond & (value >= F.lit(start))
    if end is not None:
        cond = cond & (value < F.lit(end))
    return cond


def instant(ms: int) -> str:
    """Epoch ms as a short UTC ISO-8601 instant (seconds when whole, else milliseconds): how ranges are shown."""
    value = dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc)
    return value.isoformat(timespec="seconds" if ms % 1000 == 0 else "milliseconds").replace("+00:00", "Z")
