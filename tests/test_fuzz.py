"""Fuzzing the two things users hand us: job files and records.

Specs: 1,000+ mutated job files through `backfill plan`: exit 0 (still a valid job) or exit 2 with one line,
never a traceback or an internal error. Records: 1,000+ malformed JSONL lines through `backfill run` on both
engines: every line is either processed or in the ledger as unreadable, with the same cause in both.
"""
from __future__ import annotations

import copy
import json
import random
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from backfill.cli import app
from tests.golden.harness import run_job
from tests.seeds import SEEDS, property_settings

# a fresh batch of 1,200 records each run (tests/seeds.py); FUZZ_EXAMPLES=5 fuzzes that many
VALID: dict[str, Any] = {
    "name": "fuzz",
    "sources": {
        "a": {"format": "jsonl", "path": "in/a.jsonl", "key": {"format": "string"}, "value": {"format": "json"},
              "timestamp": {"extractor": "record", "on_invalid": "skip"}, "on_error": "skip"},
        "b": {"format": "jsonl", "path": "in/b.jsonl", "timestamp": {"extractor": "field", "field": "ts"},
              "value": {"format": "json"}},
    },
    "operators": [
        {"name": "agg", "aggregate": {"input": "a", "window": {"type": "hopping", "size": "5m", "advance": "1m",
                                                               "grace": "30s"},
                                      "aggregations": {"n": "count()", "t": {"fold": {"init": "''",
                                                                                      "step": "concat(acc, 'x')"}}},
                                      "emit": "final"}},
        {"name": "j", "join": {"left": "a", "right": "b", "how": "left", "window": {"before": "1m", "after": "10s",
                                                                                    "grace": "0ms"},
                               "value": "concat(left.value, coalesce(right.value, 'none'))"}},
    ],
    "sinks": {"agg": {"format": "delta", "path": "out/agg"}, "j": {"format": "jsonl", "path": "out/j.jsonl"},
              "_ledger": {"format": "parquet", "path": "out/ledger"}},
    "verify": {"agg": {"against": "stream/agg", "tolerance": {"n": "abs:0.1"}}},
}
ODD_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True), st.text(max_size=12),
    st.sampled_from(["5 minutes", "-1ms", "99999999999999d", "0ms", "1h", "", "legacy", "final", "updates",
                     "outer", "kafka", "../..", "/", "in/a.jsonl", "out/agg", "count(", "sum(value.x) +", "@#!",
                     "concat(left.seq)", "acc", "tumbling", "session", "sliding", "12.5s"]),
    st.lists(st.integers(), max_size=2), st.dictionaries(st.sampled_from(["format", "path", "x"]), st.text(max_size=4),
                                                         max_size=2))


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into a nested dict/list."""
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, prefix + (i,))
    return out


def _mutate(doc: dict[str, Any], rng: random.Random, value: Any, count: int) -> Any:
    for _ in range(count):
        paths = [p for p in _paths(doc) if p]
        path = rng.choice(paths)
        parent = doc
        for part in path[:-1]:
            parent = parent[part]
        action = rng.random()
        if action < 0.3 and isinstance(parent, dict):
            del parent[path[-1]]
        elif action < 0.4 and isinstance(parent, dict):
            parent[rng.choice(["typo", "windw", "grace ", "Format"])] = value
        else:
            parent[path[-1]] = copy.deepcopy(value)
        if not isinstance(doc, dict) or not doc:
            break
    return doc


@pytest.fixture(scope="module")
def job_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("fuzzspec")
    (folder / "in").mkdir()
    for name in ("a", "b"):
        (folder / "in" / f"{name}.jsonl").write_text("")
    return folder


@settings(max_examples=1000, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32), value=ODD_VALUES, count=st.integers(1, 3), raw=st.booleans())
def test_a_malformed_job_file_gives_one_line_and_exit_2_never_a_traceback(job_folder, seed, value, count, raw):
    rng = random.Random(seed)
    doc = _mutate(copy.deepcopy(VALID), rng, value, count)
    text = yaml.safe_dump(doc, sort_keys=False)
    if raw:  # damage the text itself
        cut = rng.randrange(len(text))
        text = text[:cut] + rng.choice(["", ":", "{", "- ", "\t", "]", "'"]) + text[cut + 1:]
    job = job_folder / "job.yaml"
    job.write_text(text)
    result = CliRunner().invoke(app, ["plan", str(job)])
    assert result.exit_code in (0, 2), result.output
    if result.exit_code == 2:
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
        assert "internal error" not in lines[0] and "Traceback" not in result.stderr


ODD = [None, True, False, 0, -1, 2**40, 2**64, -2**63 - 1, 1.5, -0.0, 1e300, "", "x", "12", "2024-01-01", [1], [],
       {"a": 1}, {"n": "x"}, {}]
GARBAGE = ["not json", "[1, 2]", "42", '"text"', "{", "null", '{"a": }', "{}", '{"offset": 1}']


def lines(rng: random.Random, n: int) -> list[str]:
    """JSONL lines: good records, records with some fields of odd JSON types, and lines that are no object."""
    out = []
    for _ in range(n):
        kind = rng.choice(["good", "good", "odd", "odd", "garbage"])
        if kind == "garbage":
            out.append(rng.choice(GARBAGE))
            continue
        record = {"topic": "t", "partition": rng.randint(0, 1), "offset": rng.randint(0, 10_000),
                  "key": rng.choice(["a", "b", None]), "value": {"x": rng.randint(0, 9)},
                  "timestamp": rng.randint(0, 10**6)}
        if kind == "odd":
            for name in rng.sample(sorted(record) + ["headers"], rng.randint(1, 3)):
                # another string topic is a second topic in one source: refused as a whole (tested elsewhere)
                record[name] = rng.choice([v for v in ODD if name != "topic" or not isinstance(v, str)])
        out.append(json.dumps(record))
    return out


def _causes(ledger: list[dict[str, Any]]) -> list[str]:
    """The unreadable ledger rows' causes, without the file the Spark engine appends."""
    return sorted(r["detail"].split(" in /")[0] for r in ledger if r["reason"] == "unreadable")


@pytest.mark.spark
@property_settings(env="FUZZ_EXAMPLES")
@given(seed=SEEDS)
def test_malformed_records_go_to_the_ledger_with_the_same_cause_in_both_engines(tmp_path_factory, spark, seed):
    batch = lines(random.Random(seed), 1200)
    tmp = tmp_path_factory.mktemp("fuzzrec")
    (tmp / "inputs").mkdir()
    (tmp / "inputs" / "s.jsonl").write_text("\n".join(batch) + "\n")
    job = """
name: fuzzrec
sources:
  s: {format: jsonl, path: inputs/s.jsonl, value: {format: json, schema: schema.json}, on_error: skip,
      timestamp: {extractor: record, on_invalid: skip}}
operators:
  - name: agg
    aggregate: {input: s, window: {type: tumbling, size: 1s, grace: 0ms}, aggregations: {n: count()}, emit: updates}
sinks:
  agg: {format: jsonl, path: out/agg.jsonl}
  _ledger: {format: jsonl, path: out/ledger.jsonl}
"""
    (tmp / "schema.json").write_text(json.dumps({"type": "object", "properties": {"x": {"type": "integer"}}}))
    fast, oracle = run_job(tmp, job, {}, engine="spark"), run_job(tmp, job, {}, engine="reference")
    assert fast.code == 0 and oracle.code == 0, fast.stderr + oracle.stderr
    # random offsets repeat: an identical copy of an offset is read once and counted apart (docs/semantics.md §7.3)
    copies = sum((fast.summary.get("duplicates") or {}).get("s", {}).values())
    assert fast.summary["records_read"]["s"] + copies == len(batch)
    assert copies == sum((oracle.summary.get("duplicates") or {}).get("s", {}).values())
    drops = fast.summary["source_drops"].get("s", {})
    counts = fast.summary["operators"]["agg"]
    assert fast.summary["records_processed"]["s"] + sum(drops.values()) == fast.summary["records_read"]["s"]
    assert counts["records_in"] == counts["contributing"] + sum(counts["dropped"].values())
    assert _causes(fast.ledger) == _causes(oracle.ledger)
    assert drops.get("unreadable", 0) == len(_causes(fast.ledger))
    # and every other fate and output alike: a record without a topic of its own is in its partition's queue
    # in both engines (the reference once queued it apart, so it was on time there and late in Spark)
    assert sorted(map(_fate, fast.ledger)) == sorted(map(_fate, oracle.ledger))
    assert sorted(map(_row, fast.outputs["agg"])) == sorted(map(_row, oracle.outputs["agg"]))


def _fate(row: dict[str, Any]) -> str:
    """A ledger row without its detail (the Spark engine names the file)."""
    return json.dumps({k: v for k, v in row.items() if k != "detail"}, sort_keys=True, default=str)


def _row(row: dict[str, Any]) -> str:
    return json.dumps(row, sort_keys=True, default=str)
