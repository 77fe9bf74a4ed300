"""Part: verify. What a restart of the streaming application did to its output, proved by recomputation.

At-least-once (the default guarantee), a crash and restart (docs/semantics.md, "Restarts"):

- The window store is restored from its changelog, which holds the effect of every record the crashed
  instance processed, including those after its last offset commit; the input is then read again from
  the committed offset, so the records between the commit and the crash are applied twice
  (`reprocessed_after_restart`: the stream's value equals the window recomputed, through the job's own
  aggregations, with a run of its records from the restart point on applied a second time).
- The restored store's own stream time is the newest window it holds (Kafka Streams'
  `AbstractRocksDBSegmentedBytesStore` raises `observedStreamTime` while restoring; its fetches ignore
  windows older than `observedStreamTime - retention + 1` and its `put` skips segments no longer live,
  "Skipping record for expired segment"), while the aggregation's own stream time starts over
  (processor-local, `KStreamWindowAggregate`): a window the restored store holds as expired takes
  records again, each aggregated from the initializer, so the stream emits the aggregate of the window's
  last record(s) alone (`state_lost_on_restore`: the stream's value equals the window recomputed from a
  later record of the restarted range on). The real engine showed it with event times near the wall
  clock and hours behind it alike: it depends on how far event time advanced between the commit and
  the crash (more than the retention), not on the wall clock.
- `suppress` keeps its buffer in memory and writes it to its changelog when the task commits
  (`InMemoryTimeOrderedKeyValueChangelogBuffer.flush`): windows it emitted after the last commit are
  restored into the buffer and emitted again (`reemitted`: a window closed, by the backfill's stream time,
  at or after the restart point, and emitted more than once).

A restart is only considered in a task with evidence of one: the application's committed offsets
(`--commits`), or what the stream shows: in `emit: final` outputs a window emitted again with another value
(a continuous run emits each final window once), in `emit: updates` outputs a window with more updates than
the backfill emitted (cache off, one update per accepted record: more means records processed again).
Without that evidence nothing here applies, and the causes are what they were.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from backfill.errors import SpecError
from backfill.verify.catalogue import RESTART_CAUSES
from backfill.verify.reconcile import value_hash

MAX_WINDOW_RECORDS = 250  # records of one window searched for the run applied twice, with committed offsets
MAX_WINDOW_RECORDS_UNKNOWN = 24  # the same without them (every run is a candidate: n * n / 2 variants)
DOUBLE, SUFFIX = 1, 2  # variant kinds: a run of records applied twice; only the last records of the window
_PHASE = 1 << 42  # fold order: records up to the run's end, then the run again, then the rest
_GROUPS_LINE = re.compile(r"^\s*(\S+)\s+(\S+)\s+(\d+)\s+(\d+|-)\s")


Commits = list[tuple[str | None, int, int]]  # (topic or None, partition, committed offset)


def read_commits(path: str | Path) -> Commits:
    """The application's committed offsets as (topic or None, partition, offset), from `path`.

    Accepted: a JSON list of {"partition", "offset"} (with "topic" when the group reads several), a JSON
    object {partition: offset}, or the text `kafka-consumer-groups.sh --describe --group G` prints
    (GROUP TOPIC PARTITION CURRENT-OFFSET ...).
    """
    where = Path(path)
    hint = ("give the committed offsets as JSON ([{\"partition\": 0, \"offset\": 123}, ...]) or the output of "
            "kafka-consumer-groups --describe --group <application.id>")
    if not where.is_file():
        raise SpecError(f"--commits {path}: no such file; {hint}")
    text = where.read_text()
    rows: Commits = []
    try:
        data: Any = json.loads(text)
    except json.JSONDecodeError:
        for line in text.splitlines():
            m = _GROUPS_LINE.match(line)
            if m and m[4] != "-" and not line.lstrip().startswith("GROUP"):
                rows.append((m[2], int(m[3]), int(m[4])))
    else:
        try:
            if isinstance(data, dict):
                rows = [(None, int(p), int(o)) for p, o in data.items()]
            else:
                rows = [(r.get("topic"), int(r["partition"]), int(r["offset"])) for r in data]
        except (TypeError, KeyError, ValueError, AttributeError):
            raise SpecError(f"--commits {path}: each entry needs an integer partition and offset; {hint}") from None
    if not rows:
        raise SpecError(f"--commits {path}: no committed offset found; {hint}")
    return rows


def commits_for(rows: Commits, topics: list[str], where: str) -> dict[int, int]:
    """The committed offset per input partition of the operator's topic(s)."""
    named = {t for t, _, _ in rows if t is not None}
    wanted = set(topics)
    out = {p: o for t, p, o in rows if t is None or len(named) <= 1 or t in wanted}
    if not out:
        raise SpecError(f"--commits {where}: no committed offset for the input topic(s) "
                        f"{', '.join(sorted(wanted))} (the file has {', '.join(sorted(named))})")
    return out


def changed_reemissions(stream: DataFrame, keys: tuple[str, ...], columns: tuple[str, ...]) -> DataFrame:
    """Windows of an `emit: final` output emitted more than once with different values: key, window_start."""
    return (stream.groupBy(*keys).agg(F.countDistinct(value_hash(columns)).alias("_values"))
            .where(F.col("_values") > 1).select(*keys))


def replayed_updates(compared: DataFrame, keys: tuple[str, ...]) -> DataFrame:
    """Windows of an `emit: updates` output with more updates than the backfill emitted (one per record it
    accepted, cache off): records were processed again. key, window_start. `compared`: the reconciliation
    (verify/reconcile.py `reconcile`), whose `_rows` and `_lrows` count each side's rows per window."""
    return compared.where(F.col("_rows") > F.col("_lrows")).select(*keys)


def variants(mem: DataFrame, points: dict[int, int | None]) -> DataFrame:
    """Each accepted member record exploded into the restart variants it belongs to, as many times as the
    variant applies it, with `seq` in the order the restarted application applied it.

    Variant ids: DOUBLE * 10^6 + i * 10^3 + j (records ranked i..j applied twice) and
    SUFFIX * 10^6 + i * 10^3 (only records ranked i.. counted); ranks are offsets within the window.
    Known commit offset: i is the first record at or after it. Unknown: every i.
    """
    known = {p: o for p, o in points.items() if o is not None}
    unknown = [p for p, o in points.items() if o is None]
    acc = mem.where((F.col("status") == "accepted")
                    & F.col("partition").isin(list(points)))
    one = Window.partitionBy("key", "window_start")
    acc = (acc.withColumn("_parts", F.size(F.collect_set("partition").over(one)))
           .where(F.col("_parts") == 1)  # a window fed by one task (a key read from one partition)
           .withColumn("_r", F.row_number().over(one.orderBy("offset")))
           .withColumn("_n", F.count(F.lit(1)).over(one).cast("int")))
    if known:
        commit = F.create_map(*[x for p, o in known.items() for x in (F.lit(p), F.lit(o))])[F.col("partition")]
        first_after = F.min(F.when(F.col("offset") >= commit, F.col("_r"))).over(one)
        lo = F.when(F.col("partition").isin(unknown), F.lit(1)).otherwise(first_after)
    else:
        lo = F.lit(1)
    limit = F.when(F.col("partition").isin(unknown), F.lit(MAX_WINDOW_RECORDS_UNKNOWN)).otherwise(
        F.lit(MAX_WINDOW_RECORDS))
    acc = acc.withColumn("_lo", lo).where(F.col("_lo").isNotNull() & (F.col("_n") <= limit))
    starts = F.when(F.col("partition").isin(unknown), F.sequence(F.lit(1), F.col("_n"))).otherwise(
        F.array(F.col("_lo")))
    r = F.col("_r")
    doubles = F.flatten(F.transform(starts, lambda i: F.transform(F.sequence(i, F.col("_n")), lambda j: F.struct(
        (F.lit(DOUBLE * 10**6) + i * 1000 + j).alias("variant"),
        F.when((r >= i) & (r <= j), 2).otherwise(1).alias("copies"), j.alias("_j")))))
    suffix_from = F.greatest(F.col("_lo"), F.lit(2))
    suffixes = F.transform(F.filter(F.sequence(F.lit(1), r), lambda i: i >= suffix_from), lambda i: F.struct(
        (F.lit(SUFFIX * 10**6) + i * 1000).alias("variant"), F.lit(1).alias("copies"), F.lit(None).cast("int")
        .alias("_j")))
    exploded = acc.select("*", F.explode(F.concat(doubles, suffixes)).alias("_v")).select(
        "*", F.explode(F.sequence(F.lit(1), F.col("_v.copies"))).alias("_copy"))
    phase = (F.when(F.col("_copy") == 2, F.lit(1)).when(F.col("_v._j").isNull() | (r <= F.col("_v._j")), F.lit(0))
             .otherwise(F.lit(2)))
    return exploded.select("*", F.col("_v.variant").alias("variant"),
                           (phase.cast("long") * F.lit(_PHASE) + F.col("offset")).alias("seq")).drop(
        "_v", "_copy", "_parts")


def choose(matched: DataFrame) -> DataFrame:
    """Per window, the restart variant that reproduces the stream: a run applied twice before a suffix,
    then the fewest records changed."""
    kind = F.floor(F.col("variant") / 10**6)
    i, j = F.floor(F.col("variant") / 1000) % 1000, F.col("variant") % 1000
    size = F.when(kind == DOUBLE, j - i + 1).otherwise(i)
    return matched.groupBy("key", "window_start").agg(
        F.min_by("variant", F.struct(kind, size)).alias("restart_variant"))


def variant_records(mem: DataFrame, chosen: DataFrame, limit: int = 12) -> DataFrame:
    """The records a chosen restart variant applied twice (DOUBLE) or counted alone (SUFFIX)."""
    one = Window.partitionBy("key", "window_start")
    ranked = (mem.where(F.col("status") == "accepted")
              .withColumn("_r", F.row_number().over(one.orderBy("offset"))).join(chosen, ["key", "window_start"]))
    kind = F.floor(F.col("restart_variant") / 10**6)
    i, j = F.floor(F.col("restart_variant") / 1000) % 1000, F.col("restart_variant") % 1000
    keep = F.when(kind == DOUBLE, (F.col("_r") >= i) & (F.col("_r") <= j)).otherwise(F.col("_r") >= i)
    status = F.when(kind == DOUBLE, F.lit("applied twice")).otherwise(F.lit("counted alone"))
    record = F.struct("partition", "offset", "ts", "st", status.alias("status"))
    return (ranked.where(keep).groupBy("key", "window_start").agg(
        F.slice(F.sort_array(F.collect_list(record)), 1, limit).alias("restart_records"),
        F.count(F.lit(1)).alias("restart_n"), F.min("offset").alias("restart_from"),
        F.max("offset").alias("restart_to")))


def first_reaching(records: DataFrame, closes: DataFrame, strict: bool = False) -> DataFrame:
    """Per (key, window_start, partition, `_close`) of `closes`: the offset of the partition's first record whose
    arrival brought stream time to `_close` (`strict`: past it), `closed_at`; null when none did. Stream time
    first reaches a value at the partition's first record with a timestamp at least that value."""
    ts = F.col("ts")
    return (records.select("partition", "offset", "ts").join(F.broadcast(closes), "partition")
            .where(ts > F.col("_close") if strict else ts >= F.col("_close"))
            .groupBy("key", "window_start").agg(F.min("offset").alias("closed_at")))


def incidents(attributed: DataFrame, points: dict[int, int | None], records: DataFrame,
              examples: int = 3) -> list[dict[str, Any]]:
    """Per restarted task: where it restarted (`_restart_at`, as the attribution derived it), what was
    reprocessed, how many windows each cause took."""
    rows = sorted(attributed.where(F.col("cause").isin(*RESTART_CAUSES) | F.col("_restart_at").isNotNull()).select(
        "key", "window_start", "cause", "restart_to", "_task", "_restart_at").collect(),
        key=lambda r: (r["window_start"], str(r["key"])))
    out = []
    for p in sorted(points):
        mine = [r for r in rows if r["_task"] == p]
        start = next((r["_restart_at"] for r in mine if r["_restart_at"] is not None), points[p])
        mine = [r for r in mine if r["cause"] in RESTART_CAUSES]
        if start is None and not mine:
            continue
        at = None
        if start is not None:
            first = records.where((F.col("partition") == p) & (F.col("offset") >= start)).agg(
                F.min_by(F.struct("ts", "offset"), "offset").alias("x")).first()
            if first is not None and first["x"] is not None:  # its stream time: the largest ts up to it
                st = records.where((F.col("partition") == p) & (F.col("offset") <= first["x"]["offset"])).agg(
                    F.max("ts").alias("st")).first()
                at = {"ts": first["x"]["ts"], "st": st["st"] if st is not None else None}
        out.append({
            "task": p, "partition": p, "committed_offset": points[p],
            "restart_offset": start, "restart_offset_from": "--commits" if points[p] is not None else "inferred",
            "reprocessed_through": max((r["restart_to"] for r in mine if r["cause"] == "reprocessed_after_restart"
                                        and r["restart_to"] is not None), default=None),
            "event_time_at_restart": at["ts"] if at else None, "stream_time_at_restart": at["st"] if at else None,
            "windows": {c: sum(1 for r in mine if r["cause"] == c) for c in RESTART_CAUSES},
            "examples": [{"key": r["key"], "window_start": r["window_start"], "cause": r["cause"]}
                         for c in RESTART_CAUSES for r in [x for x in mine if x["cause"] == c][:examples]],
        })
    return out
