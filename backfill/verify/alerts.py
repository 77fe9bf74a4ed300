"""Part: verify. A rules operator's alerts against the alerts a live Flink job raised (docs/semantics.md §12.12).

An alert is identified by its rule and its transaction: (`rule_id`, `transaction_id`), the transaction's id
field (`transactionId`, as Flink's fraud-detection pattern has it) read from the alert's transaction. A rule
evaluates a transaction once, so each side has at most one alert per identity; the stream's extra copies are
duplicates. Compared: the grouping key (`key`) and the aggregate (`value`, as a number) where the stream has
them.

Causes come from evidence only: exact copies are `duplicate_delivery`; an alert only the stream raised, for a
transaction the run ledgered (so no rule evaluated it), is `ledgered_input`, with the ledger row's reason and the
record; everything else is `unexplained` with what each side raised, the transaction and the rule version (the
backfill's) in the sample, so a person sees the alert's contents on both sides.
"""
from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from backfill.errors import SpecError
from backfill.verify.catalogue import first_match
from backfill.verify.causes import repeats
from backfill.verify.reconcile import MATCH, Comparison

ID_FIELD = "transactionId"
KEYS = ("rule_id", "transaction_id")
COMPARED = ("key", "value")  # compared where the stream has them
MAP_HINT = ("map the stream's columns with --map (e.g. --map rule_id=ruleId --map transaction=triggeringEvent "
            "--map value=triggeringValue), or give the transaction's id as transaction_id")


def _text(transaction: Column, kind: T.DataType) -> Column:
    """A transaction as JSON text, from JSON text or a struct."""
    return F.to_json(transaction) if isinstance(kind, (T.StructType, T.MapType)) else transaction.cast("string")


def _id_of(transaction: Column, kind: T.DataType) -> Column:
    """The transaction's id: its `transactionId` field."""
    return F.get_json_object(_text(transaction, kind), f"$.{ID_FIELD}")


def backfill_alerts(raw: DataFrame) -> DataFrame:
    """The published alerts: KEYS, `key`, `value` (a number), `ts`, `emit_seq`, `transaction`, `rule`."""
    return raw.select(F.col("rule_id").cast("long").alias("rule_id"),
                      _id_of(F.col("transaction"), raw.schema["transaction"].dataType).alias("transaction_id"),
                      F.col("key").cast("string").alias("key"), F.col("value").cast("double").alias("value"), "ts",
                      "emit_seq", F.col("transaction").cast("string").alias("transaction"),
                      F.col("rule").cast("string").alias("rule"))


def stream_alerts(stream: DataFrame, where: str) -> DataFrame:
    """The stream's alerts in the same form: `rule_id`, and `transaction_id` or the `transaction` it carries;
    `key`, `value`, `partition`, `offset` where it has them. One line naming the fix where a column is lacking."""
    if "rule_id" not in stream.columns:
        raise SpecError(f"{where}: no column 'rule_id' (columns: {', '.join(stream.columns)}); {MAP_HINT}")
    if "transaction_id" in stream.columns:
        tid = F.col("transaction_id").cast("string")
    elif "transaction" in stream.columns:
        tid = _id_of(F.col("transaction"), stream.schema["transaction"].dataType)
    else:
        raise SpecError(f"{where}: no column 'transaction' or 'transaction_id' (columns: "
                        f"{', '.join(stream.columns)}); {MAP_HINT}")
    cols = [F.col("rule_id").cast("long").alias("rule_id"), tid.alias("transaction_id")]
    cols += [F.col("key").cast("string").alias("key")] if "key" in stream.columns else []
    cols += [F.col("value").cast("double").alias("value")] if "value" in stream.columns else []
    if "transaction" in stream.columns:
        cols.append(_text(F.col("transaction"), stream.schema["transaction"].dataType).alias("transaction"))
    cols += [F.col(c) for c in ("partition", "offset") if c in stream.columns]
    out = stream.select(*cols)
    unknown = out.where(F.col("transaction_id").isNull()).limit(1).count()
    if unknown:
        raise SpecError(f"{where}: an alert's transaction has no {ID_FIELD!r} field; {MAP_HINT}")
    return out


def comparison(stream: DataFrame) -> Comparison:
    """Keyed by (rule_id, transaction_id); `key` and `value` compared where the stream has them."""
    order = tuple(c for c in ("partition", "offset") if c in stream.columns)
    return Comparison(keys=KEYS, columns=tuple(c for c in COMPARED if c in stream.columns), left="backfill",
                      right="stream", left_order=("emit_seq",), right_order=order if len(order) == 2 else ())


def ledgered(ledger: DataFrame, transactions: DataFrame, operator: str) -> DataFrame:
    """The transactions the run ledgered for the rules operator (docs/semantics.md §12.12): `transaction_id`, and
    the ledger row's `_reason`, `_why` (its detail) and `_record` (the input record: partition, offset, ts).
    `transactions`: the operator's input as read (io/sources.py `read_source`); a ledgered record whose value
    has no transaction id (a null value) cannot be an alert's transaction and is left out."""
    rows = ledger.where(F.col("operator") == operator).select(
        "source", "partition", "offset", F.col("reason").alias("_reason"), F.col("detail").alias("_why"))
    read = transactions.select("source", "partition", "offset", F.col("timestamp").alias("_ts"),
                               _id_of(F.col("value"), transactions.schema["value"].dataType).alias("transaction_id"))
    record = F.struct("partition", "offset", F.col("_ts").alias("ts"), F.lit(None).cast("long").alias("st"),
                      F.concat(F.lit("ledgered: "), F.col("_reason")).alias("status"))
    found = read.join(rows, ["source", "partition", "offset"]).where(F.col("transaction_id").isNotNull())
    # the first ledger row of a transaction id (an id written twice is the stream's to tell apart, not ours)
    return found.groupBy("transaction_id").agg(F.min_by(F.struct("_reason", "_why", record.alias("_record")),
                                                        F.struct("partition", "offset")).alias("_l")) \
        .select("transaction_id", "_l._reason", "_l._why", "_l._record")


def attribute(result: DataFrame, cmp: Comparison, ledger: DataFrame | None = None) -> DataFrame:
    """Non-matching alerts with `cause`, `detail` and `records` (the evidence): exact copies; an alert only the
    stream has whose transaction `ledger` (`ledgered`) holds; else unexplained with what differs."""
    missing, extra = cmp.label("missing"), cmp.label("extra")
    nonmatch = result.where(F.col("category") != MATCH)
    if ledger is not None:
        nonmatch = nonmatch.join(F.broadcast(ledger), "transaction_id", "left")
    else:
        nonmatch = nonmatch.select("*", *[F.lit(None).cast(t).alias(c) for c, t in (
            ("_reason", "string"), ("_why", "string"),
            ("_record", "struct<partition:int,offset:long,ts:long,st:long,status:string>"))])
    why = F.concat(F.lit("the backfill ledgered this transaction ("), F.col("_reason"),
                   F.coalesce(F.concat(F.lit(": "), F.col("_why")), F.lit("")),
                   F.lit(", partition "), F.col("_record.partition").cast("string"), F.lit(" offset "),
                   F.col("_record.offset").cast("string"),
                   F.lit("), so no rule evaluated it; the live job did: it read the transaction otherwise"))
    cause, detail = first_match([
        *repeats(cmp),
        ((F.col("category") == extra) & F.col("_reason").isNotNull(), "ledgered_input", why),
        (F.col("category") == missing, "unexplained",
         "the backfill raised this alert and the stream did not: no evidence why"),
        (F.col("category") == extra, "unexplained",
         "the stream raised this alert and the backfill did not: no evidence why"),
        (None, "unexplained", F.concat(F.lit("the alerts differ in "), F.array_join("diff_columns", ", "),
                                       F.lit(": no evidence why")))])
    shown = F.when(cause == "ledgered_input", F.array("_record"))
    return nonmatch.withColumn("cause", cause).withColumn("detail", detail).withColumn("records", shown) \
        .drop("_reason", "_why", "_record")
