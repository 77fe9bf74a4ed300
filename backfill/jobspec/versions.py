"""Part: foundation. Kafka Streams versions: the job's `kafka_streams:` setting mapped, in one place, to the
rules that differ between releases.

Each difference was found by running the same random scenarios through the real libraries
(`backfill conformance`, TopologyTestDriver) and traced to the release that changed it:

- before 3.7 (KIP-962, KAFKA-12317): a record with a null key never reaches a stream-stream join (the
  join's window processor does not forward it), so it gives no result, is not counted as dropped and does
  not advance the join's stream time; a record with a null value is dropped and counted, also before the
  join's stream time advances. From 3.7 the stream time advances first and a left/outer side forwards a
  null-key record at once as a non-joined result.
- before 3.8 (KAFKA-15417): when the outer-join store is scanned for non-joined results whose window has
  closed, the processing record's side decides the look-ahead used for entries of both sides, and the
  scan stops at the first entry still open. From 3.8 each entry uses its own side's look-ahead, and the
  scan goes on past open entries of one side until it has met an open entry of each side.

- 3.5 (KIP-914): versioned tables; 3.6 (KIP-923): a grace period on stream-table joins. A left stream-table join
  forwards a null-key stream record (with a null table side) from 3.7 (KIP-962), as stream-stream joins do.

Window aggregations (tumbling, hopping) and table aggregations agree across all measured releases.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

CURRENT = "4.4"  # the newest line the project measures; the default profile
EARLIEST = (3, 4)  # the oldest line measured against the real library
MEASURED = ("3.4.1", "3.6.2", "3.7.2", "3.9.1", "4.4.0")  # releases the conformance runs use


@dataclass(frozen=True)
class Profile:
    """The rules of one Kafka Streams release line that backfill reproduces."""

    version: str
    # 3.7+: a null-key record reaches the join (outer sides forward it, others drop and count it);
    # before: it never reaches the join (no result, not counted, no stream-time advance)
    join_null_keys_reach_join: bool
    # 3.7+: the join's stream time advances before the null checks; before: only for records joined
    join_time_before_null_check: bool
    # 3.8+: per-side look-ahead in the outer-store scan; before: the processing side's, first open entry stops it
    outer_scan_per_side: bool
    # 3.5+ (KIP-914): versioned tables (a stream-table join reads the value as of the stream record's timestamp)
    versioned_tables: bool = True
    # 3.6+ (KIP-923): a grace period on a stream-table join (stream records wait in a buffer)
    table_join_grace: bool = True

    @property
    def label(self) -> str:
        """How `plan` shows it."""
        return f"Kafka Streams {self.version}" + (" (the default)" if self.version == CURRENT else "")


def parse(text: str) -> tuple[int, int]:
    """`3.6` or `3.6.2` as (major, minor); ValueError with what is allowed."""
    match = re.fullmatch(r"(\d+)\.(\d+)(?:\.\d+)?", text.strip())
    if not match:
        raise ValueError(f"{text!r} is not a Kafka Streams version; write the release line, e.g. \"3.6\" or "
                         "\"3.6.2\"")
    major, minor = int(match.group(1)), int(match.group(2))
    if (major, minor) < EARLIEST or major > int(CURRENT.split(".")[0]):
        raise ValueError(f"{text!r}: profiles exist for Kafka Streams {EARLIEST[0]}.{EARLIEST[1]} to the {CURRENT} "
                         f"line (measured: {', '.join(MEASURED)}); older lines are not measured yet")
    return major, minor


def profile(version: str | None) -> Profile:
    """The profile of a job's `kafka_streams:` value (None: the current line)."""
    line = parse(version or CURRENT)
    return Profile(version=f"{line[0]}.{line[1]}", join_null_keys_reach_join=line >= (3, 7),
                   join_time_before_null_check=line >= (3, 7), outer_scan_per_side=line >= (3, 8),
                   versioned_tables=line >= (3, 5), table_join_grace=line >= (3, 6))
