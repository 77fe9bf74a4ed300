"""Part: order. One record per offset (docs/semantics.md §7.2), checked where the ordering has them side by side.

Kafka gives one record per (topic, partition, offset); an archive may hold an offset twice. The ordering
spreads the records by task and sorts each queue by offset, so the copies of an offset are adjacent there;
this check is one pass over that order (no shuffle of its own):

- copies with the same `_copy` (io/sources.py: a hash of key, value, timestamp and headers as stored) are
  one record: the first goes on with `_copies`, how many were left out;
- copies that differ make the offset unreadable: every copy goes on with `_drop` = conflicting_offset, no
  timestamp (it moves no time and reaches no operator) and `_problem` saying what differs;
- `_gap`: how many offsets of the queue are missing right before a record (null: none, or its queue's first).

backfill's operator does it (jvm/ops `OffsetCopies`) where the records stream through `RunningValues`;
elsewhere Spark windows over the same spread and sort do it, with the same values.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from backfill.ledger import CONFLICTING_OFFSET
from backfill.session import jvm_operator

COPY = "_copy"  # io/sources.py: what makes two copies of an offset one record (null: not checked)
CONFLICTING = CONFLICTING_OFFSET  # the `_drop` of a copy of an offset whose copies differ (its ledger reason)
_CONFLICT = "_conflict"
_RARE = "_rare"  # order/tasks.py: the ledger's columns of a record, packed for the ordering's shuffle
# what the copies of an offset are compared by, to say what differs: column, label
COMPARED = (("key", "key"), ("ts", "timestamp"), ("value", "value"))
USE_OPERATOR = True  # tests: False checks with Spark's windows alone, to compare both


def without_check(df: DataFrame) -> DataFrame:
    """Records checked by nothing (a repartition topic's, which the ordering derives): no copies, no gaps."""
    return df.withColumns({"_copies": F.lit(None).cast("int"), "_gap": F.lit(None).cast("long")})


def one_copy_per_offset(df: DataFrame, queue: Sequence[str], streamed: bool = False,
                        clear: Sequence[str] = ()) -> DataFrame:
    """`df` spread by task (each queue in one Spark partition) with one record per offset of each `queue`
    (columns naming it), `_copies` and `_gap`; conflicting copies marked as unreadable, and the boolean
    `clear` columns false for them (what the running values count). `streamed`: sorted by (queue, offset)
    within each Spark partition already (backfill's operator passes over them as they lie); otherwise Spark's
    windows sort them as the windows after them do."""
    if COPY not in df.columns:
        return without_check(df)
    operator = _operator(df) if streamed else None
    checked = _by_operator(df, queue, operator) if operator is not None else _by_windows(df, queue)
    return _marked(checked, clear).drop(_CONFLICT)


def _operator(df: DataFrame) -> Any | None:
    """jvm/ops OffsetCopies, or None where its jar is not loaded or not reachable (Spark Connect)."""
    return jvm_operator(df.sparkSession, "OffsetCopies") if USE_OPERATOR else None


def _compared(df: DataFrame) -> list[tuple[str, str]]:
    return [(c, label) for c, label in COMPARED if c in df.columns]


def _by_operator(df: DataFrame, queue: Sequence[str], operator: Any) -> DataFrame:
    compared = _compared(df)
    partitions = int(df.sparkSession.conf.get("spark.sql.shuffle.partitions") or 200)
    jdf = operator.apply(df._jdf, list(queue), "offset", COPY, [c for c, _ in compared],
                         [label for _, label in compared], "task", partitions)
    return DataFrame(jdf, df.sparkSession)


def _by_windows(df: DataFrame, queue: Sequence[str]) -> DataFrame:
    """The same as the operator with Spark's windows: one per offset (the copies), then one per queue in offset
    order (the gaps). Both are partitioned by columns the spread by task satisfies, and the second one's order
    is a prefix of the first's: Spark sorts once."""
    copies = Window.partitionBy(*queue, "offset", F.col(COPY).isNull()).orderBy(COPY)  # unchecked ones apart
    whole = copies.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    checked = F.col("offset").isNotNull() & F.col(COPY).isNotNull()
    n = F.count(F.lit(1)).over(whole)
    differs = checked & (F.min(COPY).over(whole) != F.max(COPY).over(whole))
    parts = []
    for column, label in _compared(df):
        seen = _hashed(df, column) if column == "value" else F.col(column)
        some_null = (F.count(column).over(whole) > 0) & (F.count(column).over(whole) < n)
        apart = (F.min(seen).over(whole) != F.max(seen).over(whole)) | some_null
        shown = F.lit(label)
        if isinstance(df.schema[column].dataType, (T.LongType, T.IntegerType)):
            values = F.array_join(F.array_sort(F.collect_set(F.col(column).cast("long")).over(whole)), ", ")
            shown = F.concat(F.lit(f"{label} ("), values, F.lit(")"))
        parts.append(F.when(apart, shown))
    what = F.concat_ws(", ", *parts) if parts else F.lit("")
    first = F.row_number().over(copies) == 1
    out = (df.withColumns({"_n": n, "_differs": differs, "_first": first, "_what": what})
           .where(F.col("_first") | ~checked | F.col("_differs"))
           .withColumns({"_copies": F.when(checked & ~F.col("_differs") & (F.col("_n") > 1),
                                           (F.col("_n") - 1).cast("int")),
                         _CONFLICT: F.when(F.col("_differs"), F.col("_what"))})
           .drop("_n", "_differs", "_first", "_what"))
    previous = F.lag("offset").over(Window.partitionBy(*queue).orderBy("offset"))
    missing = F.col("offset") - previous - 1
    return out.withColumn("_gap", F.when(missing > 0, missing))


def _hashed(df: DataFrame, column: str) -> Column:
    """A column as a hash that compares it (a map has no hash in Spark: its JSON text is hashed)."""
    if "map<" in df.schema[column].dataType.simpleString():
        return F.xxhash64(F.to_json(column))
    return F.xxhash64(column)


def problem(what: Column) -> Column:
    """Why a copy of an offset is unreadable: what its copies differ in."""
    return F.concat(F.lit("its copies differ in "), F.when(what != "", what).otherwise(
        F.lit("headers or value fields this job does not read")))


def _marked(df: DataFrame, clear: Sequence[str]) -> DataFrame:
    """Conflicting copies as unreadable records: `_drop`, `_problem`, no `ts` (the timestamp the extractor saw
    stays as `_raw_ts`, for the ledger), and the `clear` columns false."""
    conflict = F.col(_CONFLICT).isNotNull()
    changed: dict[str, Column] = {"_drop": F.when(conflict, F.lit(CONFLICTING)).otherwise(F.col("_drop")),
                                  "ts": F.when(~conflict, F.col("ts"))}
    text = problem(F.col(_CONFLICT))
    if _RARE in df.columns:  # packed for the shuffle (order/tasks.py): the problem and raw timestamp inside
        kind = df.schema[_RARE].dataType
        assert isinstance(kind, T.StructType)
        fields = {f: F.col(f"{_RARE}.{f}") for f in kind.fieldNames()}
        fields["_problem"] = text
        if "_raw_ts" in fields:
            fields["_raw_ts"] = F.coalesce(F.col(f"{_RARE}._raw_ts"), F.col("ts"))
        changed[_RARE] = F.when(conflict, F.struct(*[v.alias(k) for k, v in fields.items()])) \
            .otherwise(F.col(_RARE))
    if "_problem" in df.columns:
        changed["_problem"] = F.when(conflict, text).otherwise(F.col("_problem"))
    for name in clear:
        changed[name] = F.col(name) & ~conflict
    return df.withColumns(changed)

