"""The Kafka Streams test vectors, replayed through Kafka Streams itself (jvm/harness, TopologyTestDriver).

The golden tests check our engines against kafka-streams-examples.json; this checks the examples against
the real engine, every version set up, so a wrong vector cannot make a wrong golden test. Vectors that a
topology test driver cannot replay are listed in NOT_REPLAYABLE with the reason.
"""
from __future__ import annotations

import re
from typing import Any

import pytest

from backfill.conformance import harness
from tests.conftest import examples

pytestmark = pytest.mark.jvm
VERSIONS = ["4.4.0", "3.9.1"]
DAY = 86_400_000
CASES = examples()
NOT_REPLAYABLE = {
    "wagg-emit-large-interval-close": "moves the wall clock against the 1 s emit throttle, which the harness sets to 0",
    "suppress-release-boundary": "feeds windowed KTable records straight into the suppress processor",
    "join-outer-throttle-wallclock": "moves the wall clock against the outer join's 1 s throttle (set to 0 here)",
}
AGGREGATES = [c for c in CASES.values() if c["operator"].startswith("KStreamWindowAggregate")
              and c["id"] not in NOT_REPLAYABLE]
JOINS = [c for c in CASES.values() if c["operator"].startswith("KStream-KStream ") and c["id"] not in NOT_REPLAYABLE]


def _text(value: Any) -> str:
    return harness.NULL if value is None else str(value)


def _records(case: dict[str, Any]) -> list[str]:
    # a restart event is not replayed: the vector's outputs are those of one uninterrupted processor
    return ["\t".join(["R", {"left": "L", "right": "R"}.get(r.get("side"), "-"), _text(r["key"]), _text(r["value"]),
                       str(r["ts"] if isinstance(r["ts"], int) else 0)])
            for r in case["inputs"] if "key" in r]


def _replay(header: str, case: dict[str, Any], version: str) -> harness.Judged:
    text = "\n".join([header, "T\t0", *_records(case), "E"]) + "\n"
    reported, results = harness.replay(text, [0], version)
    assert reported == version
    assert results[0].error is None, results[0].error
    return results[0]


def _window_row(row: dict[str, Any]) -> tuple:
    if "window_start" in row:
        return row["key"], (row["window_start"], row["window_end"]), str(row["value"]), row["ts"]
    key, start, end = re.fullmatch(r"\[(.*)@(\d+)/(\d+)\]", row["key"]).groups()
    return key, (int(start), int(end)), str(row["value"]), row["ts"]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("case", AGGREGATES, ids=lambda c: c["id"])
def test_window_aggregate_vector(case: dict[str, Any], version: str) -> None:
    c = case["config"]
    emit = {"ON_WINDOW_CLOSE": "close", "ON_WINDOW_UPDATE": "updates"}[c["emit_strategy"]]
    init = re.search(r"initializer '([^']*)'", c["aggregator"]).group(1)
    # the processor-level vectors ran with a store retention of one day
    retention = f"\t{DAY}" if "retention 1 day" in c.get("harness", "") else ""
    got = _replay(f"S\t0\tagg\t{c['size_ms']}\t{c['advance_ms']}\t{c['grace_ms']}\t{emit}\tconcat:{init}{retention}",
                  case, version)
    assert got.rows == [_window_row(o) for o in case["expected_outputs"]]
    assert got.dropped == len(case["expected_dropped"])


@pytest.mark.parametrize("version", VERSIONS)
def test_emit_on_close_with_the_default_retention_never_emits_a_window_the_store_already_dropped(version: str) -> None:
    """The spec's hazard (4.4), confirmed by the real engine: with retention size + grace (the default) the
    fetch at D@25 skips window [5,15) of wagg-emit-from-last-emit-time-close, so B's second window is lost;
    the vector's one-day retention emits it. suppress(untilWindowCloses), backfill's `emit: final`, does not."""
    case = CASES["wagg-emit-from-last-emit-time-close"]
    header = "S\t0\tagg\t10\t5\t5\t{}\tconcat:0"
    on_close = _replay(header.format("close"), case, version)
    suppressed = _replay(header.format("final"), case, version)
    expected = [_window_row(o) for o in case["expected_outputs"]]
    lost = ("B", (5, 15), "0+2", 5)
    assert on_close.rows == [r for r in expected if r != lost]
    assert suppressed.rows == expected


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("emit,topic", [("updates", "output-raw"), ("final", "output-suppressed")])
def test_suppress_final_results_vector(emit: str, topic: str, version: str) -> None:
    case = CASES["suppress-final-time-windows"]
    c = case["config"]
    got = _replay(f"S\t0\tagg\t{c['size_ms']}\t{c['size_ms']}\t{c['grace_ms']}\t{emit}\tcount", case, version)
    assert got.rows == [_window_row(o) for o in case["expected_outputs"] if o["topic"] == topic]
    assert got.dropped == len(case["expected_dropped"])


def _join_window(c: dict[str, Any]) -> tuple[int, int, int]:
    if "before_ms" in c:
        return c["before_ms"], c["after_ms"], c["grace_ms"]
    difference = int(re.fullmatch(r"JoinWindows\.ofTimeDifferenceWithNoGrace\((\d+)ms\)", c["windows"]).group(1))
    return difference, difference, 0


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("case", JOINS, ids=lambda c: c["id"])
def test_join_vector(case: dict[str, Any], version: str) -> None:
    c = case["config"]
    before, after, grace = _join_window(c)
    got = _replay(f"S\t0\tjoin\t{c['join']}\t{before}\t{after}\t{grace}\t0\tplus", case, version)
    assert got.rows == [(str(o["key"]), None, o["value"], o["ts"]) for o in case["expected_outputs"]]
    assert got.dropped == len(case["expected_dropped"])


def test_every_vector_of_an_implemented_operator_is_replayed() -> None:
    implemented = [c["id"] for c in CASES.values()
                   if c["operator"].startswith(("KStreamWindowAggregate", "KStream-KStream ", "KStreamKStreamJoin",
                                                "count() + suppress", "KTableSuppressProcessor"))]
    replayed = {c["id"] for c in AGGREGATES + JOINS} | {"suppress-final-time-windows"}
    assert sorted(set(implemented) - replayed) == sorted(NOT_REPLAYABLE)
