"""Part: verify. A rules operator's alerts against the alerts a live Flink job raised (docs/semantics.md §12.12).

An alert is identified by its rule and its transaction: (`rule_id`, `transaction_id`), the transaction's id
field (`transactionId`, as Flink's fraud-detection pattern has it) read from the alert's transaction. A rule
evaluates a transaction once, so each side has at most one alert per identity; the stream's extra copies are
duplicates. Compared: the grouping key (`key`) and the aggregate (`value`, as a number) where the stream has
them.

Causes come from evidence only: exact copies are `duplicate_delivery`; an alert only the stream raised, for a
transaction the run ledgered (so no rule evaluated it), is `ledgered_input`, with the ledger row's reason and the
record; an alert the operator itself gives once a version of its rule arrives on the other side of the
transaction (the operator rerun with that one message moved) is `rule_version_differs`, with the message and the
transaction; an alert its evaluation gives with the watermark held from an earlier transaction on (no cleanup timer
firing since: the live job's watermark lagged) is `watermark_held`, with the transactions the held state still had;
everything else is `unexplained` with what each side raised, the transaction and the rule version (the
backfill's) in the sample, so a person sees the alert's contents on both sides.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from backfill.errors import SpecError
from backfill.ops.rules import HOLD_STEPS, WINDOW_STATE_LIMIT
from backfill.verify.catalogue import first_match
from backfill.verify.causes import repeats
from backfill.verify.reconcile import MATCH, Comparison, Tolerance

ID_FIELD = "transactionId"
MAX_RERUNS = 8  # operator reruns a verify spends on rule versions (each a run of the operator over its input)
RECORD = "struct<partition:int,offset:long,ts:long,st:long,status:string>"
KEYS = ("rule_id", "transaction_id")
COMPARED = ("key", "value")  # compared where the stream has them
MAP_HINT = ("map the stream's columns with --map (e.g. --map rule_id=ruleId --map transaction=triggeringEvent "
            "--map value=triggeringValue), or give the transaction's id as transaction_id")


def _text(transaction: Column, kind: T.DataType) -> Column:
    """A transaction as JSON text, from JSON text or a struct."""
    return F.to_json(transaction) if isinstance(kind, (T.StructType, T.MapType)) else transaction.cast("string")


def transaction_id(transaction: Column, kind: T.DataType) -> Column:
    """The transaction's id: its `transactionId` field (a value of type `kind`: JSON text or a struct)."""
    return F.get_json_object(_text(transaction, kind), f"$.{ID_FIELD}")


def backfill_alerts(raw: DataFrame) -> DataFrame:
    """The published alerts: KEYS, `key`, `value` (a number), `ts`, `emit_seq`, `transaction`, `rule`."""
    return raw.select(F.col("rule_id").cast("long").alias("rule_id"),
                      transaction_id(F.col("transaction"), raw.schema["transaction"].dataType).alias("transaction_id"),
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
        tid = transaction_id(F.col("transaction"), stream.schema["transaction"].dataType)
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
    tid = transaction_id(F.col("value"), transactions.schema["value"].dataType)
    read = transactions.select("source", "partition", "offset", F.col("timestamp").alias("_ts"),
                               tid.alias("transaction_id"))
    record = F.struct("partition", "offset", F.col("_ts").alias("ts"), F.lit(None).cast("long").alias("st"),
                      F.concat(F.lit("ledgered: "), F.col("_reason")).alias("status"))
    found = read.join(rows, ["source", "partition", "offset"]).where(F.col("transaction_id").isNotNull())
    # the first ledger row of a transaction id (an id written twice is the stream's to tell apart, not ours)
    return found.groupBy("transaction_id").agg(F.min_by(F.struct("_reason", "_why", record.alias("_record")),
                                                        F.struct("partition", "offset")).alias("_l")) \
        .select("transaction_id", "_l._reason", "_l._why", "_l._record")


@dataclass(frozen=True)
class Moved:
    """A rule message put on the other side of a differing alert's transaction."""

    rule_id: int
    transaction_id: str
    partition: int  # the rule message's
    offset: int
    ts: int
    side: str  # "after" (it arrived before the transaction in the run) or "before"
    position: int  # its new place on the arrival axis
    tx: tuple[int, int, int]  # the transaction's partition, offset, ts


def _moves(processed: DataFrame, spec: Any, wanted: list[tuple[int, str]]) -> tuple[str, list[Moved]]:
    """Per differing alert (rule, transaction), the nearest message of its rule on each side of the transaction
    on the arrival axis (docs/semantics.md §12.3: the recorded `seq`, else the record timestamp; a rule message
    comes before a transaction at the same place), each as a move to just across the transaction."""
    axis = "_recorded_seq" if "_recorded_seq" in processed.columns else "ts"
    live = processed.where(F.col("_drop").isNull())
    messages: dict[int, list[tuple[int, int, int, int]]] = {}
    for r in live.where(F.col("source") == spec.rules).select(axis, "partition", "offset", "ts", F.col("value").cast(
            "string").alias("text")).collect():
        try:
            rule_id = json.loads(r["text"] or "null").get("ruleId")
        except (ValueError, AttributeError):
            continue
        if isinstance(rule_id, int):
            messages.setdefault(rule_id, []).append((r[axis], r["partition"], r["offset"], r["ts"]))
    ids = sorted({t for _, t in wanted})
    tid = transaction_id(F.col("value"), processed.schema["value"].dataType)
    txs = {r["tid"]: r for r in live.where(F.col("source") == spec.input).select(
        axis, "partition", "offset", "ts", tid.alias("tid")).where(F.col("tid").isin(ids)).collect()}
    moves = []
    for rule_id, tid in wanted:
        tx = txs.get(tid)
        if tx is None:
            continue
        here = (tx[axis], 1, tx["partition"], tx["offset"])
        mine = sorted(messages.get(rule_id, []), key=lambda m: (m[0], 0, m[1], m[2]))
        before = [m for m in mine if (m[0], 0, m[1], m[2]) < here]
        after = [m for m in mine if (m[0], 0, m[1], m[2]) > here]
        spot = (tx["partition"], tx["offset"], tx["ts"])
        if before:  # the version in force came later in the live job: the one before it applied
            m = before[-1]
            moves.append(Moved(rule_id, tid, m[1], m[2], m[3], "after", tx[axis] + 1, spot))
        if after:  # the next version came earlier
            m = after[0]
            moves.append(Moved(rule_id, tid, m[1], m[2], m[3], "before", tx[axis], spot))
    return axis, _adjacent(live.where(F.col("source") == spec.input), axis, moves, messages)


def _adjacent(transactions: DataFrame, axis: str, moves: list[Moved],
              messages: dict[int, list[tuple[int, int, int, int]]]) -> list[Moved]:
    """The moves whose message has no other transaction between it and the alert's transaction on the arrival
    axis: the race the recording leaves open (the two sources' next messages). A message further away would
    explain any alert (moving a rule's first message past a transaction removes every alert it raised)."""
    if not moves:
        return []
    point = "struct<a0:bigint,a1:int,p:int,o:bigint>"
    at = {(r, p, o): a0 for r, ms in messages.items() for a0, p, o, _ in ms}
    bounds = []
    for i, m in enumerate(moves):
        msg = (at[(m.rule_id, m.partition, m.offset)], 0, m.partition, m.offset)
        tx = (m.position if m.side == "before" else m.position - 1, 1, m.tx[0], m.tx[1])
        lo, hi = (msg, tx) if m.side == "after" else (tx, msg)
        bounds.append((i, lo, hi))
    spark = transactions.sparkSession
    spans = spark.createDataFrame(bounds, f"i int, lo {point}, hi {point}")
    here = F.struct(F.col(axis).cast("bigint").alias("a0"), F.lit(1).alias("a1"),
                    F.col("partition").cast("int").alias("p"), F.col("offset").cast("bigint").alias("o"))
    between = {r["i"] for r in transactions.select(here.alias("x")).join(
        F.broadcast(spans), (F.col("x") > F.col("lo")) & (F.col("x") < F.col("hi"))).select("i").distinct().collect()}
    return [m for i, m in enumerate(moves) if i not in between]


def _agrees(mine: dict[str, Any] | None, row: dict[str, Any], cmp: Comparison) -> bool:
    """The operator's alert (None: none) is the stream's side of a differing row."""
    if row["category"] == cmp.label("missing"):
        return mine is None
    if mine is None:
        return False
    for column in cmp.columns:
        a, b = mine[column], row[f"r_{column}"]
        if column == "value" and a is not None and b is not None:
            tol = cmp.tolerances.get(column, Tolerance())
            if abs(a - b) > tol.abs + tol.rel * abs(b):
                return False
        elif a != b:
            return False
    return True


def rule_versions(rows: list[dict[str, Any]], cmp: Comparison, spec: Any, processed: DataFrame,
                  rerun: Callable[[DataFrame], DataFrame], say: Callable[[str], None],
                  contents: Callable[[DataFrame, int, int, int], list[Any] | None] | None = None,
                  windows: dict[tuple[int, str], tuple[list[Any], str]] | None = None
                  ) -> tuple[DataFrame, str | None]:
    """`rule_version_differs` evidence (docs/semantics.md §12.12): per differing alert (`rows`, `differing`), the
    operator rerun with the nearest message of its rule moved to the other side of its transaction (each side
    tried; at most MAX_RERUNS reruns in all); where the rerun gives the stream's side exactly, (rule_id,
    transaction_id, `_vdetail`, `_vrecords`). And a note when the reruns did not reach every differing alert. With `contents`
    (the adjusted input, rule id, transaction partition, offset -> the window, §12.13), `windows` gets the
    window of each alert the rerun gives, by (rule_id, transaction_id): the stream's side as reproduced."""
    spark = processed.sparkSession
    axis, moves = _moves(processed, spec, [(r["rule_id"], r["transaction_id"]) for r in rows])
    by_key = {(r["rule_id"], r["transaction_id"]): r for r in rows}
    found: list[tuple[Any, ...]] = []
    explained: set[tuple[int, str]] = set()
    tried: set[tuple[int, str, str]] = set()
    movable = {(m.rule_id, m.transaction_id) for m in moves}
    if moves:
        say(f"trying the rule versions on either side of {len(movable)} differing alert(s) (at most "
            f"{min(len(moves), MAX_RERUNS)} rerun(s) of the operator)")
    for m in moves:
        if (m.rule_id, m.transaction_id) in explained:
            continue  # the other side needs no rerun
        if len(tried) == MAX_RERUNS:
            break
        tried.add((m.rule_id, m.transaction_id, m.side))
        is_it = (F.col("source") == spec.rules) & (F.col("partition") == m.partition) & (F.col("offset") == m.offset)
        adjusted = processed.withColumn(axis, F.when(is_it, F.lit(m.position)).otherwise(F.col(axis)))
        got = [r.asDict() for r in backfill_alerts(rerun(adjusted)).where(
            (F.col("rule_id") == m.rule_id) & (F.col("transaction_id") == m.transaction_id)).collect()]
        if not _agrees(got[0] if got else None, by_key[(m.rule_id, m.transaction_id)], cmp):
            continue
        detail = (f"with the message of rule {m.rule_id} at partition {m.partition} offset {m.offset} arriving "
                  f"{m.side} this transaction (in the run it came {'before' if m.side == 'after' else 'after'}), "
                  "the operator gives the stream's side exactly: the live job had the other version of the rule "
                  "in force (which of two sources' messages comes first is the live job's arrival order)")
        explained.add((m.rule_id, m.transaction_id))
        if got and contents is not None and windows is not None:
            window = contents(adjusted, m.rule_id, m.tx[0], m.tx[1])
            if window is not None:
                windows[(m.rule_id, m.transaction_id)] = (window, got[0]["rule"])
        found.append((m.rule_id, m.transaction_id, detail, [
            (m.partition, m.offset, m.ts, None, f"rule message: moved {m.side} the transaction"),
            (*m.tx, None, "transaction")]))
    schema = f"rule_id long, transaction_id string, _vdetail string, _vrecords array<{RECORD}>"
    note = None
    left = movable - explained - {(r, t) for r, t, _ in tried}
    if left:
        note = (f"rule versions: {MAX_RERUNS} reruns of the operator tried the differing alerts in (rule_id, "
                f"transaction_id) order; {len(left)} were not tried")
    return spark.createDataFrame(found, schema), note


def differing(result: DataFrame, cmp: Comparison) -> list[dict[str, Any]]:
    """The differing alerts a rerun or a replay may explain (not copies), the first 200 in (rule_id,
    transaction_id) order."""
    duplicate = cmp.label("duplicate")
    return [r.asDict() for r in result.where((F.col("category") != MATCH) & (F.col("category") != duplicate))
            .orderBy(*KEYS).limit(200).collect()]


def held_watermarks(rows: list[dict[str, Any]], cmp: Comparison, spec: Any, processed: DataFrame,
                    held: Callable[[list[tuple[int, int, int]]], dict[tuple[int, int, int], list[Any]]],
                    windows: dict[tuple[int, str], list[tuple[int, int, int]]] | None = None
                    ) -> tuple[DataFrame, str | None]:
    """`watermark_held` evidence (docs/semantics.md §12.14): per differing alert (`rows`), its rule's evaluation of its
    transaction replayed with the watermark held from each of the latest evictions before it (`held`: ops/rules.py
    `held_watermark`); where one gives the stream's side exactly, (rule_id, transaction_id, `_hdetail`,
    `_hrecords`): the transaction the watermark stopped at, the alert's, and the transactions the held state still
    had that the run's watermark had evicted. A transaction id on more than one record is not tried. With
    `windows`, the held evaluation's window (partition, offset, ts) by (rule_id, transaction_id). And a note when
    some differing alerts were not replayed."""
    spark = processed.sparkSession
    schema = f"rule_id long, transaction_id string, _hdetail string, _hrecords array<{RECORD}>"
    ids = sorted({r["transaction_id"] for r in rows})
    if not ids:
        return spark.createDataFrame([], schema), None
    tid = transaction_id(F.col("value"), processed.schema["value"].dataType)
    places: dict[str, list[tuple[int, int]]] = {}
    for r in processed.where((F.col("source") == spec.input) & F.col("_drop").isNull()).select(
            "partition", "offset", tid.alias("tid")).where(F.col("tid").isin(ids)).collect():
        places.setdefault(r["tid"], []).append((r["partition"], r["offset"]))
    at = {(r["rule_id"], r["transaction_id"]): places[r["transaction_id"]][0] for r in rows
          if len(places.get(r["transaction_id"], [])) == 1}
    tries = held([(int(rule_id), p, o) for (rule_id, _), (p, o) in at.items()])
    found = []
    for r in rows:
        key = (r["rule_id"], r["transaction_id"])
        if key not in at:
            continue
        tx = at[key]
        for h in tries.get((int(r["rule_id"]), tx[0], tx[1]), []):
            mine = {"key": h.key, "value": float(h.value)} if h.alerted and h.value is not None else None
            if not h.kept or not _agrees(mine, r, cmp):
                continue
            detail = (f"with the watermark held from the transaction at partition {h.hold[0]} offset {h.hold[1]} on "
                      "(no cleanup timer firing from there to this transaction), the operator gives the stream's "
                      f"side exactly: the live job's watermark lagged (an idle input holds it back; periodic "
                      f"emission), so its state still held {len(h.kept)} transaction(s) the run's watermark had "
                      "evicted")
            evidence = [(*h.hold, None, "watermark held from here"), (*h.at, None, "transaction"),
                        *[(*k, None, "kept: the run's watermark had evicted it") for k in h.kept]]
            found.append((r["rule_id"], r["transaction_id"], detail, evidence))
            if windows is not None and mine is not None:
                windows[key] = h.window
            break
    unreplayed = sum((int(rule_id), *tx) not in tries for (rule_id, _), tx in at.items())
    note = (f"watermark holds: {unreplayed} differing alert(s) were not replayed (a state of more than "
            f"{WINDOW_STATE_LIMIT:,} transactions, or past the {HOLD_STEPS:,} replayed transactions a verify spends)"
            if unreplayed else None)
    return spark.createDataFrame(found, schema), note


def attribute(result: DataFrame, cmp: Comparison, ledger: DataFrame | None = None,
              versions: DataFrame | None = None, holds: DataFrame | None = None) -> DataFrame:
    """Non-matching alerts with `cause`, `detail` and `records` (the evidence): exact copies; an alert only the
    stream has whose transaction `ledger` (`ledgered`) holds; an alert the other rule version gives
    (`versions`, `rule_versions`); one a held watermark gives (`holds`, `held_watermarks`); else unexplained with
    what differs."""
    missing, extra = cmp.label("missing"), cmp.label("extra")
    nonmatch = result.where(F.col("category") != MATCH)
    if ledger is not None:
        nonmatch = nonmatch.join(F.broadcast(ledger), "transaction_id", "left")
    else:
        nonmatch = nonmatch.select("*", *[F.lit(None).cast(t).alias(c) for c, t in (
            ("_reason", "string"), ("_why", "string"), ("_record", RECORD))])
    if versions is not None:
        nonmatch = nonmatch.join(F.broadcast(versions), list(KEYS), "left")
    else:
        nonmatch = nonmatch.select("*", F.lit(None).cast("string").alias("_vdetail"),
                                   F.lit(None).cast(f"array<{RECORD}>").alias("_vrecords"))
    if holds is not None:
        nonmatch = nonmatch.join(F.broadcast(holds), list(KEYS), "left")
    else:
        nonmatch = nonmatch.select("*", F.lit(None).cast("string").alias("_hdetail"),
                                   F.lit(None).cast(f"array<{RECORD}>").alias("_hrecords"))
    why = F.concat(F.lit("the backfill ledgered this transaction ("), F.col("_reason"),
                   F.coalesce(F.concat(F.lit(": "), F.col("_why")), F.lit("")),
                   F.lit(", partition "), F.col("_record.partition").cast("string"), F.lit(" offset "),
                   F.col("_record.offset").cast("string"),
                   F.lit("), so no rule evaluated it; the live job did: it read the transaction otherwise"))
    cause, detail = first_match([
        *repeats(cmp),
        ((F.col("category") == extra) & F.col("_reason").isNotNull(), "ledgered_input", why),
        (F.col("_vdetail").isNotNull(), "rule_version_differs", F.col("_vdetail")),
        (F.col("_hdetail").isNotNull(), "watermark_held", F.col("_hdetail")),
        (F.col("category") == missing, "unexplained",
         "the backfill raised this alert and the stream did not: no evidence why"),
        (F.col("category") == extra, "unexplained",
         "the stream raised this alert and the backfill did not: no evidence why"),
        (None, "unexplained", F.concat(F.lit("the alerts differ in "), F.array_join("diff_columns", ", "),
                                       F.lit(": no evidence why")))])
    shown = F.when(cause == "ledgered_input", F.array("_record")).when(
        cause == "rule_version_differs", F.col("_vrecords")).when(cause == "watermark_held", F.col("_hrecords"))
    return nonmatch.withColumn("cause", cause).withColumn("detail", detail).withColumn("records", shown) \
        .drop("_reason", "_why", "_record", "_vdetail", "_vrecords", "_hdetail", "_hrecords")
