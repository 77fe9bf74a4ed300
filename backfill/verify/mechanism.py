"""Part: verify. `close_mechanism_differs`: the stream's final windows are what the other final mechanism emits
(docs/semantics.md §4.5, §10.4, §11.5).

`suppress(untilWindowCloses)` and `emitStrategy(onWindowClose())` emit different sliding and session windows:
suppress releases a window once its stream time reaches end + grace (+ gap), emit-on-close once stream time
passes it, and suppress releases a window again when a later record still updates it. Where the stream differs
from the backfill, the operator's own code recomputes its windows with the other mechanism (the same input,
order and stream times); a differing window that the recomputation reproduces exactly is named
`close_mechanism_differs`. Time windows are emitted alike by both (docs/semantics.md §4.5): nothing to recompute.
"""
from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from backfill.jobspec.models import OperatorSpec
from backfill.plan.definition import Plan
from backfill.verify.reconcile import MATCH, Comparison, reconcile

CAUSE = "close_mechanism_differs"
OTHER = {"suppress": "on_window_close", "on_window_close": "suppress"}
SAYS = {"suppress": "suppress(untilWindowCloses)", "on_window_close": "emitStrategy(onWindowClose())"}


def applies(op: OperatorSpec) -> bool:
    """An `emit: final` sliding or session aggregate: the two mechanisms emit different windows."""
    agg = op.aggregate
    return agg is not None and agg.emit == "final" and agg.window.type in ("sliding", "session")


def other_spec(op: OperatorSpec) -> OperatorSpec:
    """The operator with the other final mechanism."""
    agg = op.aggregate
    assert agg is not None
    return op.model_copy(update={"aggregate": agg.model_copy(update={"close": OTHER[agg.close_mechanism]})})


def compared(spark: SparkSession, plan: Plan, op: OperatorSpec, stream: DataFrame, cmp: Comparison,
             in_range: Callable[[DataFrame], DataFrame]) -> tuple[DataFrame, str]:
    """Per window either side of the other mechanism's comparison has (cmp.keys): `_alt_category`, its category
    against the stream (a window neither has is not there: the other mechanism explains the stream's lacking
    it), and what the cause's detail says. The other output is the operator's own result with `close` swapped
    (plan/evaluator.py `operator_windows`)."""
    from backfill.plan.evaluator import operator_windows  # the evaluator imports this package's users

    agg = op.aggregate
    assert agg is not None
    other = OTHER[agg.close_mechanism]
    alt = in_range(operator_windows(plan, spark, op.name, other_spec(op)))
    alt = alt.withColumn("key", alt["key"].cast("string"))
    numbered = "emit_seq" in alt.columns
    alt_cmp = Comparison(keys=cmp.keys, columns=cmp.columns, tolerances=cmp.tolerances, left=cmp.left,
                         right=cmp.right, left_order=("emit_seq",) if numbered else (),
                         right_order=cmp.right_order)
    result, _ = reconcile(alt, stream, alt_cmp)
    try:
        keys = result.select(*cmp.keys, F.col("category").alias("_alt_category")).localCheckpoint()
    finally:
        result.unpersist()
    detail = (f"the stream has what {SAYS[other]} emits here (the backfill recomputed the window with close: "
              f"{other}: it matches), the job says close: {agg.close_mechanism} ({SAYS[agg.close_mechanism]}); "
              f"if the application uses {SAYS[other]}, set close: {other}")
    return keys, detail


def reproduced(category: Column, missing: str) -> Column:
    """A differing window the other mechanism reproduces: it matches the stream there, or (a window the stream
    lacks) it lacks it too."""
    return F.coalesce(F.col("_alt_category") == MATCH, (category == missing) & F.col("_alt_category").isNull())
