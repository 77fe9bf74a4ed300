"""Part: conformance. Random adversarial scenarios, and the backfill job that holds a batch of them.

A scenario is one operator configuration and the records of one task: ties in timestamps, records out of
order, records exactly at a window's end + grace, null keys and values, a hot key, empty inputs, hopping
windows whose advance does not divide their size, session gaps and sliding time differences from 1 ms,
joins with before != after, zero grace and a negative before or after. About one scenario in four (after every configuration is drawn once)
is large, as a real task is: tens to hundreds of records over up to eight keys with a hot one, stream time
moving on through many windows while records fall behind it by up to a few windows, timestamps from the epoch
or from a day in 2024 (epoch milliseconds in the trillions). A hopping and a sliding window are sized as
applications size them (minutes, seconds of grace): their tasks' timestamps spread over hours. A batch is
written as one job: each configuration is an operator, each scenario its own partition number (so its
own task: state and stream time never cross scenarios).
"""
from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backfill.conformance import topologies

KINDS = ("aggregate", "session", "sliding", "join", *topologies.KINDS)
WINDOWED = ("aggregate", "session", "sliding")
ONE_INPUT = (*WINDOWED, "table", "filter", "invalid")  # one source: `scenarios_in` (`invalid`: one per policy)
# (size, advance, grace) in ms: tumbling, hopping with advance dividing the size or not, zero grace
# and windows sized as applications size them (minutes, seconds of grace), whose tasks' timestamps spread over
# hours (SECOND: their unit); sessions too (their store's segments decide what emit-on-close still emits,
# docs/semantics.md §11.5). Not yet for joins: their stores drop whole segments, which backfill does not model
# there (docs/semantics.md §4.8)
AGG_WINDOWS = [(10, 10, 0), (10, 10, 5), (10, 5, 0), (10, 5, 7), (12, 5, 3), (6, 5, 1), (300_000, 60_000, 30_000)]
# (gap, grace) and (time difference, grace) in ms
SESSION_WINDOWS = [(3, 0), (5, 2), (10, 7), (1, 20), (30_000, 10_000)]
SLIDING_WINDOWS = [(3, 0), (5, 2), (10, 7), (1, 20), (30, 0), (60_000, 5_000)]
SECOND = 1000
LARGE_SHARE = 0.25  # of the scenarios drawn after every configuration once
LARGE_BASES = (0, 1_704_067_200_000)  # a large scenario's first timestamp: the epoch, or 2024-01-01 in ms
LARGE_KINDS = ("aggregate", "session", "sliding", "join", "filter", "invalid")
# (before, after, grace) in ms
JOIN_WINDOWS = [(2, 3, 1), (0, 5, 0), (5, 5, 2), (3, 0, 0), (-2, 5, 1), (4, -1, 0), (-3, 3, 2)]  # negative: a
# window that excludes the record's own time (before + after >= 0, as JoinWindows allows)
FOLD = "concat(acc, coalesce(value.p, '~'))"
MERGE = "concat(a, b)"  # session folds: the earlier session's text, then the later one's
ON_INVALID = {"skip": "skip", "pt": "partition_time"}  # an `invalid` configuration's policy, as the job spells it
JOINER = "concat(coalesce(left.value, '-'), '|', coalesce(right.value, '-'))"
VALUE_SCHEMA = {"type": "object", "properties": {"n": {"type": ["integer", "null"]}, "p": {"type": "string"},
                                                 "t": {"type": ["integer", "null"]}}}  # t: `invalid` kind only


@dataclass
class Scenario:
    """One configuration and one task's records (`side`: input, left or right; offsets per side)."""

    id: int
    kind: str
    config: dict[str, Any]
    records: list[dict[str, Any]]
    order: list[dict[str, Any]] = field(default_factory=list)  # processing order (from the reference engine)

    @property
    def operator(self) -> str:
        """The operator of the batch job that runs this scenario's configuration."""
        return "op_" + "_".join(str(v).lower().replace("-", "none") for v in self.config.values())

    @staticmethod
    def harness_value(rec: dict[str, Any]) -> Any:
        """The value as the harness reads it: `n,p` for aggregates (n may be null), the text for joins."""
        value = rec["value"]
        if isinstance(value, dict):
            n = "\\N" if value.get("n") is None else value["n"]
            return f"{n},{value['p']}" + (f",{value['t']}" if "t" in value else "")
        return value

    def to_dict(self) -> dict[str, Any]:
        """JSON form (the reproduction folder keeps it)."""
        return {"id": self.id, "kind": self.kind, "config": self.config, "records": self.records}


# emit: updates, and emit: final by each of Kafka Streams' two mechanisms (docs/semantics.md §4.5)
EMITS = ({"emit": "updates"}, {"emit": "final", "close": "suppress"}, {"emit": "final", "close": "on_window_close"})


def aggregate_configs() -> list[dict[str, Any]]:
    """Every window configuration in every emit mode."""
    return [{"size": s, "advance": a, "grace": g, **e} for s, a, g in AGG_WINDOWS for e in EMITS]


def session_configs() -> list[dict[str, Any]]:
    """Every session window in every emit mode."""
    return [{"gap": g, "grace": gr, **e} for g, gr in SESSION_WINDOWS for e in EMITS]


def sliding_configs() -> list[dict[str, Any]]:
    """Every sliding window in every emit mode."""
    return [{"diff": d, "grace": gr, **e} for d, gr in SLIDING_WINDOWS for e in EMITS]


def join_configs() -> list[dict[str, Any]]:
    """Every join window with every join type; the old eager windows for left and outer joins."""
    out = [{"how": h, "before": b, "after": a, "grace": g, "eager": False}
           for b, a, g in JOIN_WINDOWS for h in ("inner", "left", "outer")]
    out += [{"how": h, "before": 2, "after": 3, "grace": 1, "eager": True} for h in ("left", "outer")]
    return out


def generate(kind: str, count: int, seed: int) -> list[Scenario]:
    """`count` scenarios of one operator kind, drawn from the seed alone."""
    rng = random.Random(seed)
    configs = {"aggregate": aggregate_configs, "session": session_configs, "sliding": sliding_configs,
               "join": join_configs}.get(kind, lambda: topologies.configs(kind))()
    out = []
    for i in range(count):
        config = configs[i % len(configs)] if i < len(configs) else rng.choice(configs)  # every config at least once
        large = kind in LARGE_KINDS and i >= len(configs) and rng.random() < LARGE_SHARE
        if large:
            records = _large_records(rng, config, ("left", "right") if kind == "join" else ("input",))
        elif kind in ("table_join", "chain"):
            records = topologies.records(rng, kind, config)
        elif kind == "table":  # no window: timestamps drawn as for a tumbling 5 ms window
            records = _aggregate_records(rng, {"advance": 5, "grace": 0})
        else:
            records = _aggregate_records(rng, config) if kind in ONE_INPUT else _join_records(rng, config)
        if kind == "invalid":
            topologies.with_event_times(rng, records)
        for r in records:  # a key belongs to one scenario (final results carry no task)
            r["key"] = None if r["key"] is None else f"{r['key']}{i}"
        out.append(Scenario(i, kind, dict(config), records))
    return out


def drawn(kind: str, count: int, seed: int, keep: Callable[[dict[str, Any]], bool]) -> list[Scenario]:
    """The scenarios among the first `count` of `generate(kind, count, seed)` whose configuration `keep` selects,
    numbered again from 0 (a batch of one shape: each its own partition of a job)."""
    return [Scenario(i, sc.kind, sc.config, sc.records)
            for i, sc in enumerate(sc for sc in generate(kind, count, seed) if keep(sc.config))]


def _unit(c: dict[str, Any]) -> int:
    """The time unit of a small task's timestamps: ms for windows of milliseconds; for windows sized as
    applications size them, seconds and a millisecond either side (ties and exact boundaries kept)."""
    width = c.get("size") or c.get("gap") or c.get("diff") or c.get("after") or 0
    return SECOND if width >= SECOND else 1


def _scaled(rng: random.Random, ts: int, unit: int) -> int:
    return ts if unit == 1 else max(0, ts * unit + rng.choice([0, 0, 0, 1, -1]))


def _aggregate_records(rng: random.Random, c: dict[str, Any]) -> list[dict[str, Any]]:
    keys = ["a"] if rng.random() < 0.2 else ["a", "b", "c", "a", None]  # a hot key now and then
    unit = _unit(c)
    out: list[dict[str, Any]] = []
    high = 0
    for offset in range(rng.choice([0, *range(1, 16)])):
        roll = rng.random()
        if roll < 0.25 and out:  # right at a window's close: end + grace - stream time in {-1, 0, +1}
            step = c.get("advance") or c.get("gap") or c.get("diff")
            end = (high - c["grace"]) // step * step + rng.choice([-1, 0, 1])
            ts = max(end, 0)
        elif roll < 0.45 and out:  # a tie with a record already seen
            ts = rng.choice(out)["timestamp"]
        else:
            ts = _scaled(rng, rng.choice([rng.randint(0, 60), rng.choice([0, 1, 4, 5, 9, 10, 11, 14, 15, 19, 20, 30])]),
                         unit)
        high = max(high, ts)
        value = None if rng.random() < 0.12 else {"n": None if rng.random() < 0.15 else rng.randint(-3, 9),
                                                  "p": rng.choice("xyz")}
        out.append({"side": "input", "offset": offset, "key": rng.choice(keys), "value": value, "timestamp": ts})
    return out


def _large_records(rng: random.Random, c: dict[str, Any], sides: tuple[str, ...]) -> list[dict[str, Any]]:
    """A task as a real stream has it: many records and keys (one hot), stream time moving through many windows,
    records behind it by up to a few windows, ties, records at a window's close, null keys and values."""
    width = max(c.get("size") or c.get("gap") or c.get("diff") or c.get("before", 0) + c.get("after", 0), 1)
    keys = [f"k{n}" for n in range(rng.randint(3, 8))]
    base = rng.choice(LARGE_BASES)
    out: list[dict[str, Any]] = []
    for side in sides:
        high = base
        for offset in range(rng.randint(20, 200 // len(sides))):
            roll = rng.random()
            if roll < 0.6:  # on time: stream time moves on, by nothing (a tie) or by up to two windows
                high += rng.choice([0, 0, 1, 1, 2, 3, 5, width, 2 * width])
                ts = high
            elif roll < 0.85:  # behind stream time by up to three windows and the grace
                ts = max(base, high - rng.randint(1, 3 * width + c.get("grace", 0)))
            else:  # right at a window's close: end + grace - stream time in {-1, 0, +1}
                step = c.get("advance") or width
                ts = max(base, (high - c.get("grace", 0)) // step * step + rng.choice([-1, 0, 1]))
            key = keys[0] if rng.random() < 0.35 else rng.choice([*keys, None])
            if side == "input":
                value: Any = None if rng.random() < 0.08 else {
                    "n": None if rng.random() < 0.1 else rng.randint(-3, 9), "p": rng.choice("xyz")}
            else:
                value = None if rng.random() < 0.06 else f"{side[0]}{offset}"
            out.append({"side": side, "offset": offset, "key": key, "value": value, "timestamp": ts})
    return out


def _join_records(rng: random.Random, c: dict[str, Any]) -> list[dict[str, Any]]:
    keys = ["a"] if rng.random() < 0.2 else ["a", "b", "a", None]
    unit = _unit(c)
    out = []
    for side, prefix in (("left", "l"), ("right", "r")):
        for offset in range(rng.choice([0, *range(1, 10)])):
            ts = _scaled(rng, rng.choice([rng.randint(0, 30), rng.choice([0, 1, 2, 3, 5, 8, 10])]), unit)
            value = None if rng.random() < 0.1 else f"{prefix}{offset}"
            out.append({"side": side, "offset": offset, "key": rng.choice(keys), "value": value, "timestamp": ts})
    return out


def write_job(folder: Path, scenarios: list[Scenario], name: str = "conformance", kafka_streams: str | None = None
              ) -> Path:
    """One job for the batch: every scenario its own partition of shared sources, an operator per configuration.

    Every operator reads every scenario (a few thousand records: cheaper than a source per configuration);
    a scenario's rows are taken from its configuration's operator (task = partition = scenario id, keys
    unique to the scenario), the others are never looked at.
    """
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "in").mkdir(exist_ok=True)
    (folder / "value.json").write_text(json.dumps(VALUE_SCHEMA))
    partitions = max((sc.id for sc in scenarios), default=0) + 1
    kinds = {sc.kind for sc in scenarios}
    if len(kinds) > 1:
        raise ValueError(f"one operator kind per job, not {sorted(kinds)}")
    kind = kinds.pop() if kinds else "aggregate"
    windowed = kind in ONE_INPUT
    sides = {"input": "scenarios_in"} if windowed else {"left": "scenarios_l", "right": "scenarios_r"}
    value = "{format: json, schema: value.json}" if windowed else "{format: string}"
    # (side, source, timestamp, the scenarios it holds): an `invalid` batch has a source per on_invalid policy
    inputs = [(side, source, "{extractor: record, on_invalid: fail}", scenarios) for side, source in sides.items()]
    if kind == "invalid":
        inputs = [("input", topologies.source_of(kind, {"policy": p}, ""),
                   f"{{extractor: field, field: t, on_invalid: {ON_INVALID[p]}}}",
                   [sc for sc in scenarios if sc.config["policy"] == p]) for p in topologies.POLICIES]
    sources = []
    if kind == "chain":  # an enrichment chain's second table
        inputs.append(("third", "scenarios_t", "{extractor: record, on_invalid: fail}", scenarios))
    for sc in scenarios:  # a re-keyed scenario's keys as this job's partitioner needs them (the judge gets them too)
        if topologies.rekeyed(sc.config):
            for r in sc.records:
                r["job_key"], r["job_value"] = topologies.as_written(kind, sc.config, sc.id, partitions, r["side"],
                                                                     r["key"], r["value"])
    for side, source, timestamp, held in inputs:
        rows = [{"topic": source, "partition": sc.id, "offset": r["offset"], "key": r.get("job_key", r["key"]),
                 "value": r.get("job_value", r["value"]), "timestamp": r["timestamp"]} for sc in held
                for r in sc.records if r["side"] == side]
        (folder / "in" / f"{source}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        sources.append(f"  {source}: {{format: jsonl, path: in/{source}.jsonl, value: {value}, "
                       f"timestamp: {timestamp}, partitions: {partitions}}}")
    operators, sinks = [], []
    for op, c in sorted({sc.operator: sc.config for sc in scenarios}.items()):
        if kind in topologies.KINDS:
            read = {**sides, "third": "scenarios_t", "input": topologies.source_of(kind, c, sides.get("input", ""))}
            operators.append(topologies.operator_yaml(kind, op, c, read))
        elif windowed:
            merge = f", merge: \"{MERGE}\"" if kind == "session" else ""
            operators.append(f"  - name: {op}\n    aggregate:\n      input: {sides['input']}\n"
                             f"      window: {_window(kind, c)}\n"
                             f"      aggregations: {{c: count(), s: sum(value.n), f: {{fold: {{init: \"''\", "
                             f"step: \"{FOLD}\"{merge}}}}}}}\n      emit: {c['emit']}"
                             + (f"\n      close: {c['close']}" if "close" in c else ""))
        else:
            window = f"{{before: {c['before']}ms, after: {c['after']}ms, grace: {c['grace']}ms}}"
            operators.append(f"  - name: {op}\n    join:\n      left: {sides['left']}\n      right: {sides['right']}\n"
                             f"      how: {c['how']}\n      window: {window}\n      value: \"{JOINER}\"\n"
                             f"      eager: {str(c['eager']).lower()}")
        sinks.append(f"  {op}: {{format: jsonl, path: out/{op}.jsonl}}")
        if kind == "chain":  # its upstream: only counted, its rows are read downstream
            sinks.append(f"  {op}_up: {{format: none}}")
    sinks.append("  _ledger: {format: jsonl, path: out/ledger.jsonl}")
    job = folder / "job.yaml"
    rules = f"kafka_streams: \"{kafka_streams}\"\n" if kafka_streams else ""
    job.write_text(f"name: {name}\n{rules}sources:\n" + "\n".join(sources) + "\noperators:\n" + "\n".join(operators)
                   + "\nsinks:\n" + "\n".join(sinks) + "\n")
    return job


def _window(kind: str, c: dict[str, Any]) -> str:
    """The job's window of a windowed configuration."""
    if kind == "session":
        return f"{{type: session, gap: {c['gap']}ms, grace: {c['grace']}ms}}"
    if kind == "sliding":
        return f"{{type: sliding, time_difference: {c['diff']}ms, grace: {c['grace']}ms}}"
    if c["size"] == c["advance"]:
        return f"{{type: tumbling, size: {c['size']}ms, grace: {c['grace']}ms}}"
    return f"{{type: hopping, size: {c['size']}ms, advance: {c['advance']}ms, grace: {c['grace']}ms}}"
