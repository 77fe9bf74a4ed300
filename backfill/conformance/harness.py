"""Part: conformance. Kafka Streams' TopologyTestDriver as a judge: the JVM harness of jvm/harness, one process per
version.

The harness reads tab-separated scenarios on stdin (see jvm/harness/.../Replay.java) and prints, per
(scenario, task), what the topology forwarded, in order, with timestamps, the task's `dropped-records-total`
metric, and which input records made it rise (read after each record is piped). Every version named in
jvm/pom.xml has its own classpath under `jvm/lib/kafka-streams-<version>/` (scripts/setup.sh resolves them).
"""
from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from backfill.conformance import topologies
from backfill.conformance.scenarios import Scenario
from backfill.jobspec.models import DAY_MS
from backfill.errors import SpecError
from backfill.session import SHORT_RUN_OPTIONS

LIB = Path(os.environ.get("BACKFILL_JVM_LIB", Path(__file__).resolve().parents[2] / "jvm" / "lib"))
NULL = "\\N"


@dataclass
class Judged:
    """What Kafka Streams did with one scenario: forwarded rows in order, dropped-record count, or an error.

    `refused`: input index (the scenario's processing order) -> how much the task's dropped-record metric rose
    while that record was processed (a windowed aggregate counts every window it refuses the record).
    `expired`: input index -> the (window start, window end, stream time) of every window Kafka Streams'
    skipped-record log says it refused that record for, in the order it said them."""

    rows: list[tuple] = field(default_factory=list)
    dropped: int = 0
    error: str | None = None
    refused: dict[int, int] = field(default_factory=dict)
    expired: dict[int, list[tuple[int, int, int]]] = field(default_factory=dict)


def versions() -> list[str]:
    """The Kafka Streams versions whose jars setup resolved, newest first."""
    found = [p.name.removeprefix("kafka-streams-") for p in LIB.glob("kafka-streams-*") if any(p.glob("*.jar"))]
    return sorted(found, key=lambda v: tuple(int(x) for x in v.split(".") if x.isdigit()), reverse=True)


def check_version(version: str) -> None:
    """A one-line error naming what exists, for a version without jars (or no harness at all)."""
    if not (LIB / "harness" / "backfill-harness.jar").exists():
        raise SpecError(f"{LIB / 'harness'}: the Kafka Streams harness is not built; run scripts/setup.sh once")
    if version not in versions():
        raise SpecError(f"--kafka-streams {version}: no jars for that version (available: "
                        f"{', '.join(versions()) or 'none'}); add it to jvm/pom.xml and run scripts/setup.sh")


def classpath(version: str) -> str:
    """The harness and one Kafka Streams version's jars, never another version's."""
    return os.pathsep.join([str(LIB / "harness" / "*"), str(LIB / f"kafka-streams-{version}" / "*")])


def _field(value: object) -> str:
    text = NULL if value is None else str(value)
    if "\t" in text or "\n" in text:
        raise ValueError(f"the harness protocol cannot carry {text!r}")
    return text


def encode(scenarios: list[Scenario]) -> str:
    """The harness input: one S line per scenario, its task's records in processing order, then E."""
    lines = []
    for sc in scenarios:
        c = sc.config
        # emit: final is suppress(untilWindowCloses) or emitStrategy(onWindowClose()), as the job says; for time
        # windows the latter with a window store that keeps every window (a day): with the default retention a
        # jump in stream time hides closed windows from the emitting fetch, which then never emits them, and
        # backfill does not model that for time windows (docs/semantics.md §4.5); it does for sliding windows
        # (§10.5), judged with the default retention
        emit = {"suppress": "final", "on_window_close": "close"}.get(c.get("close", ""), c.get("emit"))
        keep = f"\t{DAY_MS}" if emit == "close" and sc.kind == "aggregate" else ""
        if sc.kind in topologies.KINDS:
            lines.append(topologies.harness_line(sc.kind, sc.id, c))
        elif sc.kind == "aggregate":
            lines.append(f"S\t{sc.id}\tagg\t{c['size']}\t{c['advance']}\t{c['grace']}\t{emit}"
                         + (f"\tours{keep}" if keep else ""))
        elif sc.kind in ("session", "sliding"):
            width = c["gap"] if sc.kind == "session" else c["diff"]
            kind = "sess" if sc.kind == "session" else "slide"
            lines.append(f"S\t{sc.id}\t{kind}\t{width}\t{c['grace']}\t{emit}")
        else:
            lines.append(f"S\t{sc.id}\tjoin\t{c['how']}\t{c['before']}\t{c['after']}\t{c['grace']}\t{int(c['eager'])}")
        lines.append(f"T\t{sc.id}")
        for rec in sc.order:
            side = {"left": "L", "right": "R", "third": "T"}.get(rec["side"], "-")
            # a re-keyed scenario: the key and value the job has (scenarios.write_job)
            key, value = rec.get("job_key", rec["key"]), rec.get("job_value", sc.harness_value(rec))
            lines.append("\t".join(["R", side, _field(key), _field(value), str(rec["timestamp"])]))
        lines.append("E")
    return "\n".join(lines) + "\n"


def judge(scenarios: list[Scenario], version: str, timeout_s: float | None = None) -> tuple[str, dict[int, Judged]]:
    """Replay every scenario in one JVM; returns the version the JVM reported and the results by scenario id."""
    return replay(encode(scenarios), [sc.id for sc in scenarios], version, timeout_s)


def time_allowed(scenarios: int) -> float:
    """How long one JVM may take for a batch: 10 minutes, and 0.2 s more per scenario (a replay takes a few ms
    each on a quiet machine; 10,000 scenarios under load took more than the 10 minutes once)."""
    return 600 + 0.2 * scenarios


def replay(text: str, ids: list[int], version: str, timeout_s: float | None = None) -> tuple[str, dict[int, Judged]]:
    """Run the harness on its input text (the protocol of Replay.java); results for the scenario ids given."""
    check_version(version)
    # a replay is seconds of JVM time: the quick compiler only and one GC thread (about 10% faster here)
    command = ["java", "-Xss4m", *SHORT_RUN_OPTIONS, "-cp", classpath(version), "io.backfill.harness.Replay"]
    allowed = timeout_s if timeout_s is not None else time_allowed(len(ids))
    try:
        proc = subprocess.run(command, input=text, capture_output=True, text=True, timeout=allowed, check=False)
    except subprocess.TimeoutExpired:
        raise SpecError(f"the Kafka Streams {version} harness did not finish {len(ids):,} scenarios in "
                        f"{allowed:.0f} s; judge fewer at a time (--scenarios) on a busy machine") from None
    if proc.returncode != 0:
        tail = " ".join(proc.stderr.strip().splitlines()[-3:])
        raise SpecError(f"the Kafka Streams {version} harness failed (exit {proc.returncode}): {tail}")
    reported = "unknown"
    results: dict[int, Judged] = {i: Judged() for i in ids}
    for line in proc.stdout.splitlines():
        f = line.split("\t")
        if f[0] == "V":
            reported = f[1]
        elif f[0] == "O":
            key = None if f[3] == NULL else f[3]
            value = None if f[6] == NULL else f[6]
            window = (int(f[4]), int(f[5])) if f[4] != "-" else None
            results[int(f[1])].rows.append((key, window, value, int(f[7])))
        elif f[0] == "K":
            results[int(f[1])].refused[int(f[3])] = int(f[4])
        elif f[0] == "W":
            results[int(f[1])].expired.setdefault(int(f[3]), []).append((int(f[4]), int(f[5]), int(f[6])))
        elif f[0] == "D":
            results[int(f[1])].dropped = int(f[3])
        elif f[0] == "X":
            results[int(f[1])].error = f[3]
    return reported, results
