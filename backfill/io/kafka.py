"""Part: io. Kafka topics as sources: offsets resolved once, then read by Spark's own Kafka source on executors.

Before reading, the run asks the broker (with a bounded timeout) for the topic's partitions, their log
start and end offsets, and, for a ranged run with the record-timestamp extractor, the first offset at or
after each time bound (Kafka's time index): the run then reads exactly `[from, until)` per partition,
and the offsets go into the run manifest, so a rerun can read the same records. Records deleted by
retention are never skipped silently: a run that needs them stops and says which partitions lost how many.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from backfill.errors import SourceError
from backfill.io.security import librdkafka, spark_options
from backfill.jobspec.models import KafkaSpec, SecuritySpec, SourceSpec

TIMEOUT_S = 15.0


@dataclass(frozen=True)
class OffsetRange:
    """The offsets one run reads of one partition: [start, end), and the partition's log start and end."""

    partition: int
    start: int
    end: int
    log_start: int
    log_end: int

    @property
    def records(self) -> int:
        """How many records the range holds."""
        return max(self.end - self.start, 0)


# End offsets are the last stable offset (a transaction still open ends the range before its first record),
# and reads skip aborted transactions: the records a Kafka Streams application consumed or committed.
READ_COMMITTED = {"isolation.level": "read_committed"}


def client_config(bootstrap: str, security: SecuritySpec | None = None, where: str = "kafka") -> dict[str, Any]:
    """librdkafka settings for short-lived admin and consumer clients (quiet: errors are ours to report), with the
    source's `kafka.security` (io/security.py)."""
    return {"bootstrap.servers": bootstrap, "log_level": 0, "socket.timeout.ms": int(TIMEOUT_S * 1000),
            "group.id": "backfill-planner", "enable.auto.commit": False,
            **librdkafka(security, f"{where}.security")}


def partitions(bootstrap: str, topic: str, where: str, security: SecuritySpec | None = None) -> list[int]:
    """The topic's partition numbers; one-line errors for an unreachable broker, refused credentials or an
    unknown topic."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    failures: list[str] = []
    config = {**client_config(bootstrap, security, where), "error_cb": lambda e: failures.append(e.str())}
    admin = AdminClient(config)
    try:
        meta = admin.list_topics(timeout=TIMEOUT_S)
    except KafkaException as exc:
        admin.poll(1)  # serves the error callbacks: why the connection failed
        refused = next((f for f in failures if "authentication" in f.lower() or "ssl handshake" in f.lower()), None)
        if refused is not None:
            raise SourceError(f"{where}.security: the broker at {bootstrap} refused the connection: "
                              f"{refused.split(': ', 1)[-1][:200]}; check the credentials and the CA file") from None
        raise SourceError(f"{where}.bootstrap: no Kafka broker answered at {bootstrap} within {TIMEOUT_S:.0f} s "
                          f"({exc.args[0].str() if exc.args else exc}); check the address and that it runs") from None
    if topic not in meta.topics or meta.topics[topic].error is not None:
        known = ", ".join(sorted(t for t in meta.topics if not t.startswith("__"))[:10]) or "none"
        raise SourceError(f"{where}.topic: {bootstrap} has no topic {topic!r} (topics: {known})")
    return sorted(meta.topics[topic].partitions)


def resolve(spec: KafkaSpec, where: str, read_from: int | None, read_until: int | None,
            by_time: bool) -> list[OffsetRange]:
    """The offsets to read per partition (see the module docstring for the rules)."""
    from confluent_kafka import Consumer, TopicPartition

    parts = partitions(spec.bootstrap, spec.topic, where, spec.security)
    consumer = Consumer({**client_config(spec.bootstrap, spec.security, where), **READ_COMMITTED})
    try:
        marks = {p: consumer.get_watermark_offsets(TopicPartition(spec.topic, p), timeout=TIMEOUT_S) for p in parts}
        starts = _bound(consumer, spec.topic, parts, read_from, marks, low=True) if by_time and read_from is not None \
            else {p: marks[p][0] for p in parts}
        ends = _bound(consumer, spec.topic, parts, read_until, marks, low=False) if by_time and read_until is not None \
            else {p: marks[p][1] for p in parts}
    finally:
        consumer.close()
    starts = _explicit(spec.start, starts, "start", where)
    ends = _explicit(spec.end, ends, "end", where)
    ranges = [OffsetRange(p, starts[p], max(ends[p], starts[p]), marks[p][0], marks[p][1]) for p in parts]
    _check_retention(ranges, spec, where)
    return ranges


def _bound(consumer: Any, topic: str, parts: list[int], ms: int, marks: dict[int, tuple[int, int]],
           low: bool) -> dict[int, int]:
    """Per partition, the first offset whose time-index entry is >= ms (Kafka's offsetsForTimes).

    The index holds each partition's running maximum timestamp, so every record before that offset has a
    timestamp < ms: reading from it (low) loses nothing at or after ms; reading up to and including it
    (not low: the first record at or after the cool-down bound, which the run still processes) is what
    the cool-down rule needs. No such offset: the end of the log.
    """
    from confluent_kafka import TopicPartition

    found = consumer.offsets_for_times([TopicPartition(topic, p, ms) for p in parts], timeout=TIMEOUT_S)
    out = {}
    for tp in found:
        end = marks[tp.partition][1]
        offset = tp.offset if tp.offset >= 0 else end
        out[tp.partition] = offset if low else min(offset + 1, end)
    return out


def _explicit(given: dict[str, int] | str | int | None, resolved: dict[int, int], which: str,
              where: str) -> dict[int, int]:
    """`kafka.start/end` in the job: `earliest`/`latest`, or {partition: offset} overriding the resolved ones."""
    if given is None or given in ("earliest", "latest"):
        return resolved
    if not isinstance(given, dict):
        raise SourceError(f"{where}.{which}: {given!r} is not earliest, latest or {{partition: offset}}")
    out = dict(resolved)
    for part, offset in given.items():
        if int(part) not in out:
            raise SourceError(f"{where}.{which}: the topic has no partition {part}")
        out[int(part)] = int(offset)
    return out


def _check_retention(ranges: list[OffsetRange], spec: KafkaSpec, where: str) -> None:
    """Stop when records the run may need were deleted by the topic's retention.

    Explicit offsets below the log start are gone for certain; a run that starts at the log start of a
    truncated partition may have needed the deleted head (unless `kafka.start: earliest` accepts it).
    """
    lost = [(r, r.log_start - r.start) for r in ranges if r.start < r.log_start]
    if spec.start != "earliest":
        lost += [(r, r.log_start) for r in ranges if r.log_start > 0 and r.start == r.log_start]
    if lost:
        shown = ", ".join(f"partition {r.partition}: {n} records before offset {r.log_start}" for r, n in lost)
        raise SourceError(f"{where}: records the run needs were deleted by the topic's retention ({shown}); read "
                          "an archive of the topic (backfill archive) or set kafka.start: earliest to accept "
                          "what is left")


def read_kafka(spark: SparkSession, spec: KafkaSpec, ranges: list[OffsetRange], headers: bool = True) -> DataFrame:
    """The records of the ranges, read by Spark's Kafka source (one split per partition range); without
    `headers`, the source does not decode them (no column)."""
    starting = {spec.topic: {str(r.partition): r.start for r in ranges}}
    ending = {spec.topic: {str(r.partition): r.end for r in ranges}}
    df = (spark.read.format("kafka").option("kafka.bootstrap.servers", spec.bootstrap)
          .option("subscribe", spec.topic).option("startingOffsets", json.dumps(starting))
          .option("endingOffsets", json.dumps(ending)).option("includeHeaders", str(headers).lower())
          .option("failOnDataLoss", "true")
          # what a consumer of the topic sees: never the records of aborted (or still open) transactions
          .option("kafka.isolation.level", "read_committed")
          .options(**spark_options(spec.security)).load())
    return df.withColumnRenamed("timestampType", "timestamp_type")


def read_topic(spark: SparkSession, source: SourceSpec, name: str, read_from: int | None,
               read_until: int | None, headers: bool = True) -> tuple[DataFrame, list[OffsetRange]]:
    """A `format: kafka` source: its offset ranges for this run and the records in them."""
    assert source.kafka is not None
    by_time = source.timestamp.extractor == "record" and source.timestamp.on_invalid != "partition_time"
    ranges = resolve(source.kafka, f"sources.{name}.kafka", read_from, read_until, by_time)
    return read_kafka(spark, source.kafka, ranges, headers), ranges


def compacted(bootstrap: str, topic: str, security: SecuritySpec | None = None) -> bool | None:
    """Whether the topic's cleanup.policy compacts (compaction removes records from inside the log, so an offset
    without a record may be one the application saw); None when the broker does not say."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, ConfigResource

    admin = AdminClient(client_config(bootstrap, security))
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    try:
        configs = admin.describe_configs([resource])[resource].result(TIMEOUT_S)
    except (KafkaException, TimeoutError, ValueError, TypeError):
        return None
    policy = configs.get("cleanup.policy")
    return None if policy is None or policy.value is None else "compact" in policy.value


def create_topic(bootstrap: str, topic: str, partitions: int, security: SecuritySpec | None = None) -> None:
    """Create a topic (one replica, no retention by time or size: archived data is often old)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(client_config(bootstrap, security))  # keep the client alive until the future resolves
    futures = admin.create_topics([NewTopic(topic, partitions, 1, config={"retention.ms": "-1"})])
    futures[topic].result(TIMEOUT_S)


def produce(bootstrap: str, topic: str, records: list[dict[str, Any]], security: SecuritySpec | None = None) -> int:
    """Write records ({partition, key, value, timestamp, headers}: bytes or text) in order; returns the count."""
    from confluent_kafka import Producer

    config = {k: v for k, v in client_config(bootstrap, security).items() if k not in ("group.id", "enable.auto.commit")}
    producer = Producer({**config, "linger.ms": 20, "enable.idempotence": True})
    failed: list[str] = []

    def report(err: Any, _msg: Any) -> None:
        if err is not None:
            failed.append(str(err))

    for i, rec in enumerate(records):
        producer.produce(topic, key=_bytes(rec.get("key")), value=_bytes(rec.get("value")),
                         partition=rec.get("partition", -1), timestamp=rec.get("timestamp") or 0,
                         headers=[(k, _bytes(v)) for k, v in (rec.get("headers") or {}).items()], on_delivery=report)
        if i % 10_000 == 0:
            producer.poll(0)
    producer.flush(TIMEOUT_S * 4)
    if failed:
        raise SourceError(f"kafka {bootstrap}/{topic}: {len(failed)} records were not written ({failed[0]})")
    return len(records)


def _bytes(value: Any) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    return value.encode() if isinstance(value, str) else json.dumps(value).encode()
