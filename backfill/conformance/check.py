"""Part: conformance. Run backfill's engines and Kafka Streams on the same scenarios and compare them, scenario by
scenario.

What is compared, per scenario (one task):
- aggregates: every forwarded row (key, window, count|sum|fold, timestamp), in emission order for
  `emit: updates`, as a set for `emit: final` (suppression's emission order across keys is not part of
  the contract); and the task's dropped records (Kafka Streams' `dropped-records-total`) against the
  ledger's `late` and `null_key` rows, record by record: the metric is read after every input record, so
  the judge says which record was dropped and how often (once per window refused); and each late record's
  refused windows with the stream time of the refusal, as Kafka Streams' skipped-record log names them, against
  the `late` rows' window bounds and stream time;
- joins: every forwarded row (key, value, timestamp) in emission order; dropped records against the
  ledger's `null_key` and `null_value` rows (an `expired` write is not a dropped record in Kafka Streams;
  before 3.7 a null-key record never reaches the join, so it is not counted there either).

Our engines run each job under the profile of the version that judges it (`kafka_streams:`), once per
release line that has rules of its own.
"""
from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backfill.conformance import topologies
from backfill.conformance.harness import Judged, judge
from backfill.conformance.scenarios import Scenario, drawn, generate, write_job
from backfill.errors import SpecError
from backfill.jobspec import versions as ks_versions
from backfill.jobspec.rekeys import NOT_REPARTITIONED
from backfill.ops.table_join import STRIDE as TABLE_JOIN_STRIDE


NULL_KEY_BEFORE_TOPIC = "null_key_before_topic"


def dropped_reasons(kind: str, version: str | None) -> tuple[str, ...]:
    """The ledger reasons Kafka Streams' dropped-records metric counts, for an operator kind and version."""
    if kind in topologies.KINDS:
        return topologies.dropped_reasons(kind)
    if kind in ("aggregate", "session"):
        return ("late", "null_key")
    if kind == "sliding":  # one dropped record per refused update, as the ledger has one row per refused window
        return ("late", "null_key", "null_value")
    return ("null_key", "null_value") if ks_versions.profile(version).join_null_keys_reach_join else ("null_value",)


def counted_drops(sc: Scenario, version: str | None) -> dict[str | None, tuple[str, ...]]:
    """Per operator of a scenario's configuration, the ledger reasons its task's dropped-records metric counts:
    a chain's upstream counts as its own kind does, its downstream as a window aggregate; an invalid timestamp
    skipped is a row of the source (operator None), the task's dropped record all the same."""
    if sc.kind == "invalid":
        return {sc.operator: ("late", "null_key"), None: ("invalid_timestamp",)}
    if sc.kind != "chain":
        return {sc.operator: dropped_reasons(sc.kind, version)}
    up = {"tjoin": "table_join", "sjoin": "join", "agg": "aggregate", "sess": "session",
          "slide": "sliding", "rtjoin": "table_join", "atjoin": "table",
          "atself": "table", "ttjoin": "table_join", "ajoin": "table",
          "sjt": "join", "tsj": "table_join", "asj": "table"}[sc.config["up"]]
    down = "table_join" if sc.config["up"] in topologies.TABLE_JOIN_DOWN else \
        "join" if sc.config["up"] in topologies.STREAM_JOIN_DOWN else "aggregate"
    return {sc.operator: dropped_reasons(down, version), f"{sc.operator}_up": dropped_reasons(up, version)}


# (job path, engine) -> summary dict with outputs and ledger rows (backfill.cli.execute, injected)
Execute = Callable[[Path, str], dict[str, Any]]


@dataclass
class Observed:
    """One engine's view of one scenario, in the comparable form."""

    rows: list[tuple]
    dropped: int
    refused: dict[tuple[str, int], int] = field(default_factory=dict)  # (side, offset) -> ledger rows
    # (side, offset) -> (window start, window end, stream time) of each `late` row, sorted
    windows: dict[tuple[str, int], list[tuple[int, int, int]]] = field(default_factory=dict)


# a conformance job's source names end with their side
SIDES = {"_in": "input", "_l": "left", "_r": "right", "_t": "third"}


def side_of(source: str) -> str:
    """The scenario side of a conformance job's source (`input`, `left` or `right`)."""
    return next(v for k, v in SIDES.items() if source.endswith(k))


def refused_by_kafka_streams(sc: Scenario, theirs: Judged) -> dict[tuple[str, int], int]:
    """The judge's dropped records by (side, offset): its input indexes are the scenario's processing order."""
    return {(sc.order[i]["side"], sc.order[i]["offset"]): n for i, n in theirs.refused.items()}


def expired_by_kafka_streams(sc: Scenario, theirs: Judged) -> dict[tuple[str, int], list[tuple[int, int, int]]]:
    """The windows Kafka Streams' skipped-record log refused each record for, by (side, offset), sorted."""
    return {(sc.order[i]["side"], sc.order[i]["offset"]): sorted(w) for i, w in theirs.expired.items()}


@dataclass
class Difference:
    """A scenario on which an engine and Kafka Streams disagree."""

    scenario: Scenario
    engine: str
    ours: Observed
    theirs: Judged
    repro: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON form for --json and the reproduction folder."""
        return {"scenario": self.scenario.id, "operator": self.scenario.kind, "config": self.scenario.config,
                "engine": self.engine, "ours": {"rows": self.ours.rows, "dropped": self.ours.dropped,
                                                "refused": _shown(self.ours.refused),
                                                "expired": _shown(self.ours.windows)},
                "kafka_streams": {"rows": self.theirs.rows, "dropped": self.theirs.dropped,
                                  "refused": _shown(refused_by_kafka_streams(self.scenario, self.theirs)),
                                  "expired": _shown(expired_by_kafka_streams(self.scenario, self.theirs)),
                                  "error": self.theirs.error}, "repro": self.repro}


def _shown(by_record: dict[tuple[str, int], Any]) -> dict[str, Any]:
    """`side@offset` -> count (or windows), for JSON."""
    return {f"{side}@{offset}": n for (side, offset), n in sorted(by_record.items())}


@dataclass
class KindResult:
    """Per operator kind: how many scenarios, how many agreed with Kafka Streams, per engine."""

    kind: str
    scenarios: int
    records: int
    outputs: int
    dropped: int = 0
    expired: int = 0  # the refused windows Kafka Streams' skipped-record log named
    agreeing: dict[str, int] = field(default_factory=dict)
    differences: list[Difference] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {"operator": self.kind, "scenarios": self.scenarios, "records": self.records,
                "kafka_streams_outputs": self.outputs,
                "kafka_streams_dropped": self.dropped, "kafka_streams_expired_windows": self.expired,
                "agreeing": self.agreeing,
                "differing": {e: self.scenarios - n for e, n in self.agreeing.items()},
                "differences": [d.to_dict() for d in self.differences[:20]]}


def reason_of(row: dict[str, Any]) -> str:
    """A ledger row's reason as the judge's dropped-record metric sees it: a null key that a re-key kept out of
    its repartition topic is `null_key_before_topic`, which no version counts (measured on 3.4.1 to 4.4.0: the
    record never reaches the join, which would count it)."""
    return NULL_KEY_BEFORE_TOPIC if row.get("detail") == NOT_REPARTITIONED else row["reason"]


class Index:
    """An engine's outputs and drops by (operator, task) and (operator, key): each scenario looks up its own."""

    def __init__(self, summary: dict[str, Any]) -> None:
        self.by_task: dict[tuple[str, int], list[dict[str, Any]]] = {}
        self.by_key: dict[tuple[str, Any], list[dict[str, Any]]] = {}
        for op, rows in summary["outputs"].items():
            for r in rows:
                if "task" in r:
                    self.by_task.setdefault((op, r["task"]), []).append(r)
                else:  # final rows carry no task; a key belongs to one scenario
                    self.by_key.setdefault((op, r["key"]), []).append(r)
        self.drops: dict[tuple[str, int, str], int] = {}
        self.rows: dict[tuple[str, int], list[dict[str, Any]]] = {}  # (operator, task) -> its ledger rows
        for r in summary["ledger_rows"]:
            place = (r.get("operator"), r["partition"], reason_of(r))
            self.drops[place] = self.drops.get(place, 0) + 1
            self.rows.setdefault((r.get("operator"), r["partition"]), []).append(r)


def observe(sc: Scenario, index: Index, version: str | None = None) -> Observed:
    """The scenario's rows (in emission order) and its dropped records, from an engine's indexed summary."""
    rows = list(index.by_task.get((sc.operator, sc.id), []))
    for key in sorted({r["key"] for r in sc.records}, key=repr):
        rows += index.by_key.get((sc.operator, key), [])
    rows.sort(key=lambda r: r.get("emit_seq") or 0)
    if sc.kind in topologies.KINDS:
        out = [topologies.observed(sc.kind, sc.config, r) for r in rows]
    elif sc.kind != "join":
        out = [(r["key"], (r["window_start"], r["window_end"]),
                None if r["c"] is None else f"{r['c']}|{r['s'] or 0}|{r['f']}", r["ts"]) for r in rows]
        if sc.config["emit"] == "final":
            out.sort(key=repr)
    else:
        out = [(r["key"], None, r["value"], r["ts"]) for r in rows]
    counted = counted_drops(sc, version)
    dropped = sum(index.drops.get((op, sc.id, reason), 0) for op, reasons in counted.items() for reason in reasons)
    refused: dict[tuple[str, int], int] = {}
    windows: dict[tuple[str, int], list[tuple[int, int, int]]] = {}
    if not topologies.refusals_by_record(sc.kind):
        return Observed(out, dropped, refused)
    for op, reasons in counted.items():
        for r in index.rows.get((op, sc.id), []):
            if reason_of(r) in reasons:
                place = (side_of(r["source"]), r["offset"])
                refused[place] = refused.get(place, 0) + 1
                if r["reason"] == "late" and r.get("window_start") is not None:
                    windows.setdefault(place, []).append((r["window_start"], r["window_end"], r["stream_time"]))
    return Observed(out, dropped, refused, {place: sorted(w) for place, w in windows.items()})


def agree(sc: Scenario, ours: Observed, theirs: Judged) -> bool:
    """Same rows (in order where order is part of the contract), the same number of dropped records, the same
    records dropped as often, and each late record refused for the same windows at the same stream time."""
    rows = sorted(theirs.rows, key=repr) if sc.kind != "join" and sc.config.get("emit") == "final" else theirs.rows
    by_record = topologies.refusals_by_record(sc.kind)
    refused = refused_by_kafka_streams(sc, theirs) if by_record else {}
    expired = expired_by_kafka_streams(sc, theirs) if by_record else {}
    return theirs.error is None and [tuple(r) for r in ours.rows] == [tuple(r) for r in rows] \
        and ours.dropped == theirs.dropped and ours.refused == refused and ours.windows == expired


def attach_order(scenarios: list[Scenario], order: dict[int, list[dict[str, Any]]],
                 ref: dict[str, Any] | None = None) -> None:
    """Each scenario's records in the processing order the reference engine derived (its task's order). A
    scenario of one partition whose timestamps may be invalid is fed whole, in offset order: the judge's own
    extractor decides what becomes of an invalid one (the reference's order lacks the records it skipped).

    A scenario whose operator re-keys is fed in the order of the operator's own task (`downstream`: the
    repartition topic merged with the input read as it is), which the harness's driver keeps, as it runs each
    record through the repartition topic at once; the records the re-key kept out of the topic (a null key)
    come last: they reach no state. An enrichment chain's (`rtjoin`): see _enrichment_feed. `ref`: the reference
    engine's summary (reference_summary)."""
    downstream = ref["downstream_order"] if ref is not None else None
    for sc in scenarios:
        if sc.kind == "invalid":
            sc.order = sorted(sc.records, key=lambda r: r["offset"])
            continue
        by_place = {(r["side"], r["offset"]): r for r in sc.records}
        if sc.kind == "chain" and sc.config["up"] == "rtjoin" and ref is not None:
            sc.order = [by_place[p] for p in _enrichment_feed(sc, order.get(sc.id, []), ref)]
            continue
        if topologies.rekeyed(sc.config) and downstream is not None:
            places = [(side_of(o["source"]), o["offset"]) for o in downstream.get(sc.operator, {}).get(sc.id, [])]
            fed = set(places)
            rest = [p for o in order.get(sc.id, []) if (p := (side_of(o["source"]), o["offset"])) not in fed]
            sc.order = [by_place[p] for p in places + rest]
            continue
        sc.order = [by_place[(side_of(o["source"]), o["offset"])] for o in order.get(sc.id, [])]


def _enrichment_feed(sc: Scenario, stage: list[dict[str, Any]], ref: dict[str, Any]) -> list[tuple[str, int]]:
    """An enrichment chain's records as one sequence for the judge's driver, which runs each stream record through
    both joins and the repartition topic between them at once: the first join's task order (stream and first
    table), with each record of the second table placed before the stream record whose row follows it in the
    second join's task order (the repartition partition merged with that table by head timestamp). The rows keep
    their order in the repartition partition (one upstream task), and a stream-table join forwards at most one
    row per record, at once, so such a sequence always exists."""
    up = f"{sc.operator}_up"
    places = {o["seq"]: (side_of(o["source"]), o["offset"]) for o in stage}
    rows = sorted((r for r in ref["outputs"][up] if r["task"] == sc.id), key=lambda r: r["emit_seq"])
    before: dict[tuple[str, int], list[tuple[str, int]]] = {}
    pending: list[tuple[str, int]] = []
    for o in ref["downstream_order"].get(sc.operator, {}).get(sc.id, []):
        if o["source"] == up:  # a row of the first join: the stream record that made it (emit_seq: seq, place)
            trigger = places[rows[o["offset"]]["emit_seq"] // TABLE_JOIN_STRIDE]
            before.setdefault(trigger, []).extend(pending)
            pending = []
        else:
            pending.append((side_of(o["source"]), o["offset"]))
    fed: list[tuple[str, int]] = []
    for place in (p for p in places.values() if p[0] != "third"):
        fed += before.pop(place, [])
        fed.append(place)
    return fed + pending


def reference_summary(job: Path) -> tuple[dict[str, Any], dict[int, list[dict[str, Any]]]]:
    """The reference engine's summary (outputs, ledger) and processing order per task."""
    from backfill.jobspec.load import load_job
    from backfill.reference.engine import run_reference

    result = run_reference(load_job(job))
    return {**result.to_dict(), "downstream_order": result.downstream_order}, result.order


def spark_summary(job: Path, execute: Execute) -> dict[str, Any]:
    """The Spark engine's published outputs and ledger, read back from the job's JSONL sinks."""
    execute(job, "spark")
    out = job.parent / "out"

    def rows(path: Path) -> list[dict[str, Any]]:
        files = [path] if path.is_file() else sorted(path.glob("*.json*")) if path.is_dir() else []
        return [json.loads(line) for f in files for line in f.read_text().splitlines() if line.strip()]

    outputs = {p.name.removesuffix(".jsonl"): rows(p) for p in out.iterdir() if not p.name.startswith(("ledger", "."))}
    return {"outputs": outputs, "ledger_rows": rows(out / "ledger.jsonl")}


def run_kind(kind: str, count: int, seed: int, versions: list[str], engines: tuple[str, ...],
             execute: Execute | None, work: Path, repro_dir: Path | None,
             progress: Callable[[str], None] = lambda _: None,
             where: dict[str, set[str]] | None = None) -> list[tuple[str, KindResult]]:
    """Draw `count` scenarios of one kind, run our engines once, judge with every Kafka Streams version.

    `where`: only the drawn scenarios whose configuration has, for each field, one of the values (as text).
    The first differences of each engine are shrunk and written as job folders under `repro_dir`.
    """
    scenarios = generate(kind, count, seed) if not where else drawn(
        kind, count, seed, lambda c: all(str(c.get(k)) in values for k, values in where.items()))
    if not scenarios:
        said = " and ".join(f"{k} in {','.join(sorted(v))}" for k, v in (where or {}).items())
        fields = sorted({k for sc in generate(kind, count, seed) for k in sc.config})
        raise SpecError(f"--where: none of the {count} drawn {kind} scenarios has {said}; its configurations' "
                        f"fields: {', '.join(fields)}")
    records = sum(len(sc.records) for sc in scenarios)
    if "spark" in engines and execute is None:
        raise ValueError("the Spark engine needs an executor")
    by_rules: dict[tuple[bool, ...], dict[str, Index]] = {}

    def engines_under(version: str) -> dict[str, Index]:
        """Our engines' results under the version's profile: run once per set of rules that matter to `kind`."""
        rules = ks_versions.profile(version)
        key = () if kind != "join" else (rules.join_null_keys_reach_join, rules.join_time_before_null_check,
                                              rules.outer_scan_per_side)
        key = key or topologies.rules_key(kind, rules)
        line = rules.version
        if key not in by_rules:
            job = write_job(work / kind / line, existing(version), name=f"conformance-{kind}", kafka_streams=line)
            started = time.monotonic()
            ref, order = reference_summary(job)
            attach_order(scenarios, order, ref)
            progress(f"  reference engine ({line} rules): {records:,} records in {time.monotonic() - started:.1f} s")
            by_rules[key] = {"reference": Index(ref)}
            if "spark" in engines:
                assert execute is not None
                started = time.monotonic()
                by_rules[key]["spark"] = Index(spark_summary(job, execute))
                progress(f"  Spark engine ({line} rules): {records:,} records in {time.monotonic() - started:.1f} s")
        return by_rules[key]

    def existing(version: str) -> list[Scenario]:
        """The scenarios whose configuration the release has (versioned tables 3.5+, a join grace 3.6+)."""
        return [sc for sc in scenarios if topologies.supported(sc.kind, sc.config, version)]

    out = []
    for version in versions:
        summaries = engines_under(version)
        present = existing(version)
        started = time.monotonic()
        progress(f"  Kafka Streams {version}: replaying {len(present):,} scenarios (TopologyTestDriver, one per task)")
        reported, judged = judge(present, version)
        progress(f"  Kafka Streams {version}: done in {time.monotonic() - started:.1f} s")
        result = KindResult(kind, len(present), sum(len(sc.records) for sc in present),
                            sum(len(j.rows) for j in judged.values()), sum(j.dropped for j in judged.values()),
                            sum(len(w) for j in judged.values() for w in j.expired.values()))
        for engine in engines:
            agreeing = 0
            for sc in present:
                ours = observe(sc, summaries[engine], version)
                if agree(sc, ours, judged[sc.id]):
                    agreeing += 1
                else:
                    result.differences.append(Difference(sc, engine, ours, judged[sc.id]))
            result.agreeing[engine] = agreeing
        if repro_dir is not None:
            for engine in engines:
                for diff in [d for d in result.differences if d.engine == engine][:2]:
                    progress(f"  shrinking the {engine} difference on scenario {diff.scenario.id} "
                             f"({len(diff.scenario.records)} records)")
                    diff.repro = str(write_repro(diff, shrink(diff, version, work), reported, repro_dir))
        out.append((reported, result))
    return out


def shrink(diff: Difference, version: str, work: Path) -> Difference:
    """Remove records while the reference engine still disagrees with Kafka Streams, until no single removal does.

    Chunks first, as delta debugging does: each round judges, at once (one reference run, one JVM start), every
    candidate that lacks one chunk of the records; the chunk halves when none of them still differs, down to
    single records. A large scenario (hundreds of records) so shrinks in tens of rounds, not hundreds. Only a
    reference difference is shrunk; a Spark-only difference is kept whole.
    """
    if diff.engine != "reference":
        return diff
    sc = diff.scenario
    records = sc.records
    chunk = max(1, len(records) // 2)
    while len(records) > 1:
        cuts = [(i, i + chunk) for i in range(0, len(records), chunk) if chunk < len(records)]
        # each candidate its own keys too: final results carry no task, rows are told apart by key
        candidates = [Scenario(n, sc.kind, sc.config, [{**r, "key": None if r["key"] is None else f"{r['key']}.{n}"}
                                                      for r in records[:a] + records[b:]])
                      for n, (a, b) in enumerate(cuts)]
        smaller = _differences(candidates, version, work) if candidates else []
        if smaller:
            a, b = cuts[smaller[0].scenario.id]
            records = records[:a] + records[b:]
            chunk = min(chunk, max(1, len(records) // 2))
        elif chunk > 1:
            chunk //= 2
        else:
            break
    if records is sc.records:
        return diff
    return next(iter(_differences([Scenario(sc.id, sc.kind, sc.config, records)], version, work)), diff)


def judge_batch(scenarios: list[Scenario], version: str, folder: Path) -> tuple[list[Difference], dict[int, Judged]]:
    """The reference engine on a batch of scenarios (its job written to `folder`) and Kafka Streams on the same,
    fed in the reference's order: the scenarios on which they disagree, and what Kafka Streams did with each."""
    ref, order = reference_summary(write_job(folder, scenarios, kafka_streams=version))
    attach_order(scenarios, order, ref)
    judged = judge(scenarios, version)[1]
    index = Index(ref)
    found = [Difference(sc, "reference", observe(sc, index, version), judged[sc.id]) for sc in scenarios]
    return [d for d in found if not agree(d.scenario, d.ours, d.theirs)], judged


def _differences(scenarios: list[Scenario], version: str, work: Path) -> list[Difference]:
    """The scenarios on which the reference engine and Kafka Streams disagree (a throwaway job for the batch)."""
    folder = Path(tempfile.mkdtemp(dir=work))
    try:
        return judge_batch(scenarios, version, folder)[0]
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def write_repro(found: Difference, small: Difference, version: str, root: Path) -> Path:
    """A job folder that reproduces a difference (shrunk when it could be): job.yaml, inputs, both outputs."""
    folder = root / f"ks-{version}-{found.scenario.kind}-{found.engine}-scenario-{found.scenario.id}"
    shutil.rmtree(folder, ignore_errors=True)
    sc = Scenario(0, small.scenario.kind, small.scenario.config, small.scenario.records, small.scenario.order)
    write_job(folder, [sc], name=f"conformance-{sc.kind}", kafka_streams=version)
    (folder / "difference.json").write_text(json.dumps({**small.to_dict(), "scenario": 0, "kafka_streams_version": version,
                                                        "found_as_scenario": found.scenario.id},
                                                       indent=2, default=str) + "\n")
    return folder

