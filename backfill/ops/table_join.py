"""Part: operators. Stream-table joins (docs/semantics.md §17): KStream#join / leftJoin(KTable), on records already
in task order.

The table's topic is a queue of the stream's task (same sub-topology): its records are put into the table's
store as the task takes them and emit nothing. A stream record is joined with the table as the task has it
then. A plain table (`KeyValueStore`): the latest value of the key in processing order, a null value a delete;
found per (task, key) with one window over both inputs. A versioned table (`versioned:`, KIP-914): the version
with the largest timestamp at or before the stream record's; a put older than the store's stream time minus the
history is refused (`expired`), and a read older than that finds only the key's latest version, if that one is
old enough. Found with a range join on (task, key). With `versioned.grace` (KIP-923), stream records wait in a
buffer until the join's stream time passes their timestamp by the grace, then are joined in timestamp order,
with the table as it is then; a record already older than that is joined at once. Which record releases which
is sequential: a small kernel per task replays the buffer over the stream records' timestamps only.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from backfill.jobspec.fields import JOINER_FIELDS
from backfill.errors import SourceError, SpecError
from backfill.jobspec import versions
from backfill.jobspec.durations import format_duration
from backfill.jobspec.models import JoinSpec, OperatorSpec
from backfill.jobspec.rekeys import join_streams, rekey_why
from backfill.jobspec.topology import in_task, upstream
from backfill.ledger import NULL_KEY, ledger_rows
from backfill.ops.base import Operator, OperatorCounts, OperatorResult, around, check_null_drops, join_reads
from backfill.ops.expressions import joiner_sql
from backfill.session import computed_once

if TYPE_CHECKING:
    import pandas as pd
    from backfill.jobspec.load import Job

NULL_VALUE = "null_value"
EXPIRED = "expired"  # a versioned table's put older than its history: refused (Kafka Streams counts it dropped)
NO_TABLE_VALUE = "no_table_value"  # an inner join's stream record without a table value: no row, no ledger row
TABLE_VALUE = "_table_value"  # a table record's value, in a join in its upstream's tasks (§18.7-§18.8)
STRIDE = 2**20  # emit_seq = the releasing record's seq * STRIDE + the release position


@dataclass(frozen=True)
class TableJoin(Operator):
    """A KStream-KTable join, inner or left, with a plain or a versioned table."""

    noun = "stream-table join"

    # what run() found, counted by settle() (an inner join's unmatched records, the rows emitted)
    found: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    # in the tasks of the operator it reads (docs/semantics.md §18.7-§18.8): a table aggregate's rows as its
    # table records (ops/chained.py as_table), or a stream-table join's rows as its stream; the table's value
    # in TABLE_VALUE
    in_task: bool = False

    range_column = "ts"  # a join row's range is its (stream record's) timestamp
    reads_all = True  # the table is the latest value of every key since the beginning
    HIDDEN = (*Operator.HIDDEN, "found")

    @classmethod
    def from_job(cls, job: Job, spec: OperatorSpec, index: int, sink: str | None, start: int | None,
                 end: int | None) -> TableJoin:
        """Co-partitioned inputs with one key serde; versioned tables where the release has them."""
        join = spec.join
        assert join is not None and join.table is not None
        where = f"{job.path}: operators.{spec.name}.join"
        joiner_sql(join.value, f"{where}.value")
        rules = versions.profile(job.spec.kafka_streams)
        if join.versioned is not None and not rules.versioned_tables:
            raise SpecError(f"{where}.versioned: Kafka Streams {rules.version} has no versioned tables (3.5+, "
                            "KIP-914); remove versioned or set kafka_streams: to the release the application runs")
        if join.versioned is not None and join.versioned.grace and not rules.table_join_grace:
            raise SpecError(f"{where}.versioned.grace: Kafka Streams {rules.version} has no grace period on "
                            "stream-table joins (3.6+, KIP-923); use grace: 0ms")
        if join.where is not None and join.where.right:
            raise SpecError(f"{where}.where.right: a filter on the table (KTable#filter) is not supported yet; "
                            "filter the table's topic before the job, or filter the stream side (where.left)")
        if join.left == join.table:
            raise SpecError(f"{where}.table: the table and the stream are one source; declare the topic twice")
        rekey = join.group_by.left if join.group_by is not None else None
        up = upstream(spec, job.spec.operators)  # its table (§18.7) or its stream (§18.8), or none
        if rekey is None:
            formats = {s: job.spec.sources[_key_source(s, job)].key.format for s in (join.left, join.table)}
            if len(set(formats.values())) > 1:
                raise SpecError(f"{where}: key formats differ ({join.left}: {formats[join.left]}, {join.table}: "
                                f"{formats[join.table]}); a stream and its table share one key serde")
        v = join.versioned
        text = (f"{join.how} with table {join.table}" + (
            f" (versioned: history {format_duration(v.history_retention)}, grace {format_duration(v.grace)})"
            if v is not None else " (the latest value per key)"))
        why = ["a stream-table join: every record of both inputs is read, whatever the range (the table holds every "
               "key's latest value since the beginning); table records are put into the table as the task takes "
               "them, and emit nothing"]
        if rekey is not None:
            why += rekey_why(spec)
        chained = up is not None and in_task(spec, job.spec.operators)
        if chained and up.name == join.table:
            why.append(f"the table is operator {up.name}'s store, read in its tasks: each stream record is joined with "
                       f"the aggregate as the records of {up.name}'s input processed before it in the task left it")
        elif chained:
            why.append(f"the stream is operator {up.name}'s rows, in its tasks: each row is joined with the table as "
                       "the task had it when it took the record that made the row")
        return cls(name=spec.name, kind="join", inputs=(join.left, join.table), window=text, emit="updates",
                   sink=sink, spec=spec, index=index, profile=rules, why=tuple(why), in_task=chained)

    @property
    def join_spec(self) -> JoinSpec:
        """The job's join."""
        assert self.spec is not None and self.spec.join is not None
        return self.spec.join

    def expressions(self) -> list[str] | None:
        """Its joiner (`value`), re-keys and filters."""
        assert self.spec is not None
        return [self.join_spec.value, *around(self.spec)]

    @property
    def streams(self) -> tuple[str, str]:
        """The `source` of the stream's records and of the table's as the join's tasks read them: the job's
        sources, or a re-keyed stream's repartition topic and the table read as it is (docs/semantics.md §17.7)."""
        assert self.spec is not None
        return join_streams(self.spec)

    def reads(self) -> frozenset[str] | None:
        """As a stream-stream join (ops/base.py join_reads)."""
        assert self.spec is not None
        return join_reads(self.spec)

    def stream_time_columns(self) -> dict[str, Column]:
        """A versioned table's store time (its accepted puts) and the join's own (stream records it takes)."""
        if self.join_spec.versioned is None:
            return {}
        live = F.col("_drop").isNull() & F.col("key").isNotNull()
        stream, table = self.streams
        return {f"{self.stream_time}_t": live & (F.col("source") == table),
                self.stream_time: live & (F.col("source") == stream) & F.col("value").isNotNull()}

    def _forwards_null_keys(self) -> bool:
        """A left join forwards a null-key stream record with a null table side (3.7+, KIP-962)."""
        return self.join_spec.how == "left" and self.profile.join_null_keys_reach_join

    def count_columns(self, live: Column, late: dict[str, Column] | None = None) -> list[Column]:
        """Records in; skipped null keys (both inputs) and null values (stream); forwarded null keys."""
        base = F.col("_drop").isNull() & live
        left, right = self.streams
        stream, table = base & (F.col("source") == left), base & (F.col("source") == right)
        null_key = F.col("key").isNull()
        forwarded = stream & null_key & F.col("value").isNotNull() & F.lit(self._forwards_null_keys())
        return [F.count(F.when(stream | table, 1)).alias(self.stat("in")),
                F.count(F.when((stream & null_key & ~forwarded) | (table & null_key), 1)).alias(self.stat("nullkey")),
                F.count(F.when(stream & ~null_key & F.col("value").isNull(), 1)).alias(self.stat("nullvalue")),
                F.count(F.when(table & ~null_key, 1)).alias(self.stat("puts")),
                F.count(F.when(forwarded, 1)).alias(self.stat("fwd"))]

    def counts(self, rows: list[Any]) -> OperatorCounts:
        """Inputs and null drops; the rest follows from what the join found (settle)."""
        counts = OperatorCounts(kind="join", dropped={"null_key": 0, "null_value": 0})
        puts = forwarded = 0
        for r in rows:
            counts.records_in += r[self.stat("in")]
            counts.dropped["null_key"] += r[self.stat("nullkey")]
            counts.dropped["null_value"] += r[self.stat("nullvalue")]
            puts += r[self.stat("puts")]
            forwarded += r[self.stat("fwd")]
        v = self.join_spec.versioned
        if forwarded and v is not None and v.grace:
            raise SourceError(f"operators.{self.name}: {forwarded} stream record(s) with a null key reach a left join "
                              "with a grace period, where Kafka Streams 3.7+ fails (a NullPointerException in the "
                              "join's buffer); filter them (where: {left: \"key is not null\"}) as the application "
                              "must")
        self.found["puts"] = puts
        return counts

    def run(self, processed: DataFrame, dropped: DataFrame, counts: OperatorCounts) -> OperatorResult:
        """One row per stream record joined (or, left, not); the ledger's null keys, null values, expired puts."""
        j = self.join_spec
        left, right = self.streams
        recs = processed.where(F.col("source").isin(left, right) & F.col("_drop").isNull())
        st = self.stream_time
        store_time = F.col(f"{st}_t") if j.versioned is not None else F.lit(None).cast("long")
        recs = recs.withColumn("_store_time", store_time)
        stream = recs.where(F.col("source") == left)
        table = recs.where((F.col("source") == right) & F.col("key").isNotNull())
        if self.in_task:  # the table's value beside the stream's, in a column of its own
            table = table.withColumn("value", F.col(TABLE_VALUE))
        joinable = stream.where(F.col("key").isNotNull() & F.col("value").isNotNull())
        v = j.versioned
        expired = table.where(F.lit(False))
        pending: DataFrame | None = None
        held: list[DataFrame] = []  # the grace buffer's kernel output, stored once (released with the result)
        if v is None:
            found = _latest(joinable, table)
        else:
            accepted = table.where(F.col("ts") >= F.col("_store_time") - F.lit(v.history_retention))
            expired = table.where(F.col("ts") < F.col("_store_time") - F.lit(v.history_retention))
            released = _released(joinable, v.grace, held) if v.grace else joinable.withColumn(
                "_at", F.col("seq")).withColumn("_pos", F.lit(0).cast("long"))
            if v.grace:
                pending = released.where(F.col("_at").isNull())
                released = released.where(F.col("_at").isNotNull())
            found = _as_of(released, _erased(accepted), recs, v.history_retention)
        if self._forwards_null_keys():
            nulls = stream.where(F.col("key").isNull() & F.col("value").isNotNull())
            found = found.unionByName(nulls.withColumn("_right", F.lit(None).cast(found.schema["_right"].dataType))
                                      .withColumn("_at", F.col("seq")).withColumn("_pos", _place(nulls)),
                                      allowMissingColumns=True)
        found = found.persist(StorageLevel.MEMORY_AND_DISK)
        self.found["frame"] = found
        self.found["pending"] = pending
        rows = found.where(F.col("_right").isNotNull() | F.lit(j.how == "left"))
        left = F.struct(*[F.col(c).alias(c) for c in JOINER_FIELDS])
        output = rows.select("key", left.alias("left"), F.col("_right").alias("right"), "ts", "task", "_at", "_pos") \
            .select("key", F.expr(j.value).alias("value"), "ts",
                    (F.col("_at") * F.lit(STRIDE) + F.col("_pos")).cast("long").alias("emit_seq"), "task")
        ledger = self._ledger(recs, expired)
        incomplete = pending.select("ts", "task", "seq") if pending is not None else None
        return OperatorResult(output=output, ledger=ledger, range_column="ts", incomplete=incomplete,
                              cached=(found, *held))

    def _ledger(self, recs: DataFrame, expired: DataFrame) -> DataFrame:
        """Null keys (a stream record unless forwarded; every table record), null values, refused puts."""
        st = F.col("_store_time")
        stream = F.col("source") == self.streams[0]
        null_key = F.col("key").isNull() & ~(stream & F.col("value").isNotNull() & F.lit(self._forwards_null_keys()))
        return ledger_rows(recs.where(null_key), reason=NULL_KEY, operator=self.name, stream_time=st,
                           range_time=F.col("ts")).unionByName(
            ledger_rows(recs.where(stream & F.col("key").isNotNull() & F.col("value").isNull()), reason=NULL_VALUE,
                        operator=self.name, stream_time=st, range_time=F.col("ts"))).unionByName(
            ledger_rows(expired, reason=EXPIRED, operator=self.name, stream_time=st, range_time=F.col("ts"),
                        detail=F.lit("a versioned table's put older than its history retention: refused")))

    def settle(self, counts: OperatorCounts, ledger: Mapping[str, int]) -> None:
        """Null drops must be in the ledger; the join's own counts: rows, unmatched stream records, waiting."""
        check_null_drops(self.name, counts, ledger, ("null_key", "null_value"))
        counts.dropped["expired"] = ledger.get(EXPIRED, 0)
        found: DataFrame = self.found["frame"]
        pending: DataFrame | None = self.found.get("pending")
        got = found.agg(F.count(F.when(F.col("_right").isNotNull(), 1)).alias("matched"),
                        F.count(F.when(F.col("_right").isNull(), 1)).alias("unmatched")).first()
        waiting = pending.count() if pending is not None else 0
        matched, unmatched = int(got["matched"]), int(got["unmatched"])
        if self.join_spec.how == "inner":
            counts.dropped[NO_TABLE_VALUE] = unmatched
            unmatched = 0
        counts.contributing = self.found["puts"] - counts.dropped["expired"] + matched + unmatched + waiting


def _key_source(name: str, job: Job) -> str:
    """The source whose key serde an input has: itself, or the first input of the operator it names."""
    while name not in job.spec.sources:
        name = job.spec.operator(name).inputs[0]
    return name


def _right_struct(prefix: str = "") -> Column:
    """The joiner's view of a table record (right.*)."""
    return F.struct(*[F.col(f"{prefix}{c}").alias(c) for c in JOINER_FIELDS])


def _latest(joinable: DataFrame, table: DataFrame) -> DataFrame:
    """A plain table: each stream record with the latest table record of its key before it, if not a delete."""
    marked = F.struct(_right_struct().alias("r"))  # never null on a table record, even a delete
    both = joinable.withColumn("_t", F.lit(None).cast(table.select(marked.alias("m")).schema["m"].dataType)) \
        .unionByName(table.select("task", "key", "seq", marked.alias("_t")), allowMissingColumns=True)
    # a table row made by the stream record itself (an aggregate of the join's own stream, docs/semantics.md
    # §18.7) comes before it: the aggregate's processor takes the record first
    before = Window.partitionBy("task", "key").orderBy("seq", F.col("_t").isNull()) \
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    latest = F.last("_t", ignorenulls=True).over(before)
    out = both.withColumn("_last", latest).where(F.col("_t").isNull())
    right = F.when(F.col("_last.r.value").isNotNull(), F.col("_last.r"))
    return out.withColumn("_right", right).withColumn("_at", F.col("seq")).withColumn(
        "_pos", _place(joinable)).drop("_t", "_last")


def _place(stream: DataFrame) -> Column:
    """A stream row's place among the rows at its seq: 0, but for a stream-stream join's rows read in its tasks,
    several at the record that forwarded them (`_pos`, docs/semantics.md §18.8)."""
    return F.col("_pos") if "_pos" in stream.columns else F.lit(0).cast("long")


def _as_of(released: DataFrame, accepted: DataFrame, recs: DataFrame, history: int) -> DataFrame:
    """A versioned table: each stream record, read when `_at` releases it, gets the version of its key with the
    largest timestamp (a later put of the same timestamp replaces it) at or before its own, among the puts taken
    before `_at`. A read older than the store's time at `_at` minus the history finds the key's latest version
    only (if that one is at or before the record)."""
    at_time = recs.select(F.col("task").alias("_a_task"), F.col("seq").alias("_a_seq"),
                          F.col("_store_time").alias("_at_store_time"))
    r = released.join(at_time, (F.col("task") == F.col("_a_task")) & (F.col("_at") == F.col("_a_seq")), "left") \
        .drop("_a_task", "_a_seq")
    versions_ = accepted.select(*[F.col(c).alias(f"_v_{c}") for c in dict.fromkeys(("task", "seq", *JOINER_FIELDS))],
                                F.col("_erased").alias("_v_erased"))
    on = (F.col("task") == F.col("_v_task")) & (F.col("key") == F.col("_v_key")) & (F.col("_v_seq") < F.col("_at")) \
        & (F.col("_v_erased").isNull() | (F.col("_v_erased") > F.col("_at")))
    pairs = r.join(versions_, on, "left")
    order = F.struct(F.col("_v_ts"), F.col("_v_seq"))
    candidate = F.when(F.col("_v_ts") <= F.col("ts"), F.struct(order.alias("o"), _right_struct("_v_").alias("r")))
    best = pairs.groupBy(F.col("task").alias("_b_task"), F.col("seq").alias("_b_seq")).agg(
        F.max(candidate).alias("_best"), F.max("_v_ts").alias("_latest_ts"))
    grouped = r.join(best, (F.col("task") == F.col("_b_task")) & (F.col("seq") == F.col("_b_seq"))).drop(
        "_b_task", "_b_seq")
    fresh = F.col("ts") >= F.col("_at_store_time") - F.lit(history)
    visible = F.col("_best").isNotNull() & F.col("_best.r.value").isNotNull() & (
        fresh | (F.col("_best.o._v_ts") == F.col("_latest_ts")))
    return grouped.withColumn("_right", F.when(visible, F.col("_best.r"))).drop("_best", "_latest_ts",
                                                                                "_at_store_time")


def _erased(accepted: DataFrame) -> DataFrame:
    """A versioned table's puts with `_erased`: the seq from which a put no longer counts (null: never). A null put
    at the timestamp of the key's only version removes it and leaves no trace (the store's latest value is
    deleted, and no older version records where it ended): Kafka Streams then reads nothing there, and a later,
    older put becomes the latest version (measured on 3.6.2 to 4.4.0). Replayed per (task, key)."""
    rows = accepted.select("task", "key", "seq", "ts", F.col("value").isNull().alias("_null"))
    schema = f"task int, key {accepted.schema['key'].dataType.simpleString()}, seq long, _erased long"

    def run(pdf: pd.DataFrame) -> pd.DataFrame:
        import pandas as pd  # in the Python worker

        pdf = pdf.sort_values("seq")
        erased: dict[int, int] = {}
        versions: dict[int, list[int]] = {}  # ts -> the puts that made the version (null ones: a delete)
        nulls: dict[int, bool] = {}
        for s, t, null in zip(pdf["seq"].tolist(), pdf["ts"].tolist(), pdf["_null"].tolist()):
            if null and len(versions) == 1 and t in versions and not nulls[t]:
                for put in versions[t] + [s]:
                    erased[put] = s
                versions, nulls = {}, {}
                continue
            versions[t] = versions.get(t, []) + [s]
            nulls[t] = bool(null)
        return pd.DataFrame({"task": pdf["task"], "key": pdf["key"], "seq": pdf["seq"],
                             "_erased": [erased.get(s) for s in pdf["seq"].tolist()]}).astype({"_erased": "Int64"})

    marks = rows.groupBy("task", "key").applyInPandas(run, schema).select("task", "seq", "_erased")
    return accepted.join(marks, ["task", "seq"])


def _released(joinable: DataFrame, grace: int, held: list[DataFrame]) -> DataFrame:
    """Each stream record with the seq of the record that releases it from the grace buffer (`_at`; null: still
    waiting at the end of the data) and its place among the records released there (`_pos`)."""
    rows = joinable.select("task", "seq", "ts", "key")
    schema = "task int, seq long, _at long, _pos long"

    def run(pdf: pd.DataFrame) -> pd.DataFrame:
        import pandas as pd  # in the Python worker

        pdf = pdf.sort_values("seq")
        at, pos = buffer_releases(pdf["seq"].tolist(), pdf["ts"].tolist(), [_serialized(k) for k in pdf["key"]],
                                  grace)
        return pd.DataFrame({"task": pdf["task"], "seq": pdf["seq"], "_at": at, "_pos": pos}).astype(
            {"_at": "Int64", "_pos": "Int64"})

    placed = computed_once(rows.groupBy("task").applyInPandas(run, schema))
    held.append(placed)
    return joinable.join(placed, ["task", "seq"])


def _serialized(key: Any) -> bytes:
    """A key as its serde writes it: the buffer's store orders equal timestamps by these bytes."""
    if isinstance(key, (bytes, bytearray)):
        return bytes(key)
    if isinstance(key, int):
        return int(key).to_bytes(8, "big", signed=True)
    return str(key).encode("utf-8")


def buffer_releases(seq: list[int], ts: list[int], keys: list[bytes], grace: int
                    ) -> tuple[list[int | None], list[int | None]]:
    """Replay one task's grace buffer (KIP-923) over its stream records in order: for each, the seq of the record
    at which it is joined and its place there. The join's stream time is the largest timestamp so far; a record
    older than stream time minus the grace is joined at once; any other waits, and every processed record
    releases the waiting records at or before stream time minus the grace, in the order of the buffer's store:
    timestamp, then the serialized key, then arrival (measured on 3.6.2 and 4.4.0)."""
    import heapq

    at: dict[int, int] = {}
    pos: dict[int, int] = {}
    waiting: list[tuple[int, bytes, int]] = []
    time = -1
    for s, t, k in zip(seq, ts, keys):
        time = max(time, t)
        if t < time - grace:
            at[s], pos[s] = s, 0
            continue
        heapq.heappush(waiting, (t, k, s))
        n = 0
        while waiting and waiting[0][0] <= time - grace:
            _, _, w = heapq.heappop(waiting)
            at[w], pos[w] = s, n
            n += 1
    return [at.get(s) for s in seq], [pos.get(s) for s in seq]
