"""The grace rule of time windows (docs/semantics.md §4.2), defined once on TimeWindows and called by the
operators and verify: a window accepts a record while its end is later than stream time - grace; it is closed
from end + grace on; the newest closed start inverts it."""
from __future__ import annotations

from typing import Any

import pytest

from backfill.ops.windows import TimeWindows

pytestmark = [pytest.mark.spark]


def test_accepts_closed_and_the_newest_closed_start_agree_at_every_boundary(spark: Any) -> None:
    from pyspark.sql import functions as F

    w = TimeWindows(size=60_000, advance=20_000, grace=5_000)
    start = 120_000  # ends at 180_000, closes at 185_000
    times = [None, 0, 179_999, 180_000, 184_999, 185_000, 185_001, 10**12]
    df = spark.createDataFrame([(t,) for t in times], "st long")
    rows = df.select("st", w.accepts(F.lit(start), F.col("st")).alias("a"), w.closed(F.lit(start), F.col("st"))
                     .alias("c"), (F.lit(start) <= w.last_closed_start(F.col("st"))).alias("l")).collect()
    got = {r["st"]: (r["a"], r["c"], r["l"]) for r in rows}
    assert got[None] == (None, None, None)  # no stream time yet: neither (and a record sets it first)
    for t in times[1:]:
        accepted = start + w.size > t - w.grace  # the spec's words
        assert got[t] == (accepted, not accepted, not accepted), t
    assert got[184_999][0] and got[185_000][1]
