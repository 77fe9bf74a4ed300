"""Part: foundation. The columns of a record between the parts of the Spark engine, declared once.

A record read by `io/sources.py` gains its timestamp in `time/extract.py` and its place in its task's
order in `order/tasks.py`; operators, the counting pass and the ledger read it. Every column that crosses
one of those borders is listed here with its type, who writes it and who reads it. A column whose name
starts with `_` is internal: never published. Columns an operator makes for itself and drops again
(e.g. a join's `_side`) stay private to its module. `check_declared` runs on the ordered records of
every run (a schema comparison, no Spark job), so an undeclared column cannot creep in.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from pyspark.sql import DataFrame

from backfill.errors import BackfillError


@dataclass(frozen=True)
class RecordColumn:
    """One column of the records frame: name, Spark type, the part that writes it, the parts that read it."""

    name: str
    type: str
    written_by: str
    read_by: str
    meaning: str


RECORD_COLUMNS: tuple[RecordColumn, ...] = (
    RecordColumn("source", "string", "io/sources", "all", "the job's source name"),
    RecordColumn("source_rank", "int", "io/sources", "order/tasks",
                 "declaration order of the source (a recorded order's tie-break; the heap's, after the topic name)"),
    RecordColumn("topic", "string", "io/sources", "plan/evaluator, ledger", "Kafka topic (default: the source's)"),
    RecordColumn("partition", "int", "io/sources", "order/tasks, ledger", "Kafka partition = the task"),
    RecordColumn("offset", "bigint", "io/sources", "order/tasks, ledger", "offset in the partition"),
    RecordColumn("key", "any", "io/sources", "operators, ledger", "record key (string, long, binary)"),
    RecordColumn("value", "any", "io/sources", "operators", "record value (string or a JSON struct)"),
    RecordColumn("timestamp", "bigint", "io/sources", "time/extract, operators (folds, joiners)",
                 "record timestamp, epoch ms"),
    RecordColumn("headers", "any", "io/sources", "operators (folds)", "record headers"),
    RecordColumn("seq", "bigint", "io/sources (order_by), order/tasks", "operators",
                 "1-based position in the task's processing order (records the task processes)"),
    RecordColumn("_problem", "string", "io/sources", "time/extract, ledger", "why the record is unreadable, or null"),
    RecordColumn("_where", "struct", "io/sources", "plan/evaluator (error messages), ledger",
                 "file and line text of a JSONL record"),
    RecordColumn("_raw_ts", "bigint", "time/extract", "ledger", "the timestamp the extractor saw, before policy"),
    RecordColumn("ts", "bigint", "time/extract", "all", "the event time the task uses (policy applied)"),
    RecordColumn("_drop", "string", "time/extract", "all",
                 "why the record never reaches an operator (unreadable..., invalid_timestamp), or null"),
    RecordColumn("_fatal", "string", "time/extract", "plan/evaluator", "a policy says fail on this record"),
    RecordColumn("_copies", "int", "order/offsets", "plan/offsets",
                 "how many identical copies of its offset were left out (null: none)"),
    RecordColumn("_gap", "bigint", "order/offsets", "plan/offsets",
                 "how many offsets of its queue are missing right before it (null: none, or not a gap)"),
    RecordColumn("_gap_ts", "bigint", "plan/offsets", "plan/offsets",
                 "with `_gap`: the partition time before the record (the newest timestamp before the gap)"),
    RecordColumn("_origin", "struct", "ops/repartition", "ledger",
                 "a re-keyed record's input record (source, topic, partition, offset); null otherwise"),
    RecordColumn("task", "int", "order/tasks", "all", "the task that processes it (its partition)"),
    RecordColumn("_table_value", "any", "ops/chained (as_table)", "ops/table_join",
                 "a table record of a join in its upstream's tasks (docs/semantics.md §18.7-§18.8): its value"),
    RecordColumn("_recorded_seq", "bigint", "order/tasks", "operators (rules)",
                 "the source's recorded order (order_by), kept when `seq` becomes the task's position"),
    RecordColumn("_partition_time", "bigint", "order/tasks", "order/tasks, ledger",
                 "partition time: max ts of its partition so far, this record included"),
    RecordColumn("_partition_time_before", "bigint", "order/tasks", "plan/evaluator (cool-down cut)",
                 "partition time before this record"),
    RecordColumn("_chunk", "bigint", "order/tasks (a large input, ordered chunk by chunk)",
                 "plan/fused (panes are grouped in their chunk, then in their task)",
                 "the chunk of offsets of its task the record was ordered in"),
)

# one per operator: `_stream_time_<index>`, the running max of ts over the records that advance it;
# a join adds `_l` and `_r`, its two window stores' times; a versioned table's store time is `_t`
STREAM_TIME = re.compile(r"_stream_time_\d+(_[lrt])?")

_TYPES = {c.name: c.type for c in RECORD_COLUMNS}


def check_declared(records: DataFrame) -> None:
    """Every column of `records` is declared here with its type (a bug otherwise, not a user error)."""
    for f in records.schema.fields:
        declared = "bigint" if STREAM_TIME.fullmatch(f.name) else _TYPES.get(f.name)
        actual = f.dataType.simpleString()
        if declared is None or declared not in ("any", actual.split("<")[0]):
            raise BackfillError(f"internal error: column {f.name} ({actual}) of the ordered records is not declared "
                                "in backfill/columns.py as such; declare it there")
