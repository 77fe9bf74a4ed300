"""Property tests: session and sliding windows, the Spark engine (per-task kernel + Spark values) equals the
reference engine.

The same adversarial timelines as the other operators (regressions, ties, edge timestamps, null keys and
values, invalid timestamps), with gaps small enough that records bridge sessions, time differences small
enough that records fall before D (early records), and grace small enough that updates are refused and the
store hides windows and sessions a record would otherwise have found.
"""
from __future__ import annotations

import random

import pytest
from hypothesis import given

from tests.golden.harness import run_job
from tests.seeds import DEEP, SEEDS
from tests.test_properties import EMITS, POLICIES, SETTINGS, _job, _ledger, _rows, n_schema, scenarios

pytestmark = [pytest.mark.spark, pytest.mark.slow]
WINDOWS = {
    "session": ["{type: session, gap: 3ms, grace: 0ms}", "{type: session, gap: 5ms, grace: 2ms}",
                "{type: session, gap: 10ms, grace: 7ms}", "{type: session, gap: 1ms, grace: 20ms}"],
    "sliding": [f"{{type: sliding, time_difference: {d}ms, grace: {g}ms}}"
                for d, g in ((3, 0), (5, 2), (10, 7), (1, 20), (30, 0))],
}
MERGE = {"session": ", merge: \"concat(a, '|', b, '>')\"", "sliding": ""}


def _aggregations(kind: str) -> str:
    """The aggregate property test's aggregations; the fold starts from '<' (and merges on sessions), last() in
    place of first()."""
    trail = "trail: {fold: {init: \"'<'\", step: \"concat(acc, coalesce(cast(value.n as string), '_'), ',')\""
    return "\n        ".join(["n: count()", "total: sum(value.n)", "low: min(value.n)", trail + MERGE[kind] + "}}",
                               "last_n: last(value.n)"])


@pytest.mark.parametrize("kind", sorted(WINDOWS))
def test_spark_equals_reference(tmp_path_factory, spark, kind):
    """Every config of the kind, every emit mode (updates, final by on_window_close and by suppress), 30-40
    scenarios each, ranged (and whole with PROPERTY_EXAMPLES)."""
    schema = n_schema(tmp_path_factory)

    @SETTINGS
    @given(seed=SEEDS)
    def check(seed: int) -> None:
        rng = random.Random(seed)
        inputs, policies = {}, []
        for i in range(len(WINDOWS[kind])):
            policies.append(rng.choice(POLICIES))
            rows = scenarios(rng, count=(30, 40), policy=policies[-1])["s"]
            for r in rows:
                r["topic"], r["partition"] = f"s{i}", r["partition"] + 1000 * i
            inputs[f"s{i}"] = rows
        bounds = rng.randint(0, 20), rng.randint(25, 61)
        tmp = tmp_path_factory.mktemp("prop")
        job = _job(policies, schema, WINDOWS[kind], _aggregations(kind), name=kind)
        merged = 0
        ranged = ("--start", str(bounds[0]), "--end", str(bounds[1]))
        # by default the ranged pass alone (its range reads nearly every record, and the whole-input path of
        # these kinds is the goldens' and the aggregate property test's): a run of 15 operators on both engines
        # is the suite's longest test; PROPERTY_EXAMPLES=N runs both passes on N scenarios
        for args in (((), ranged) if DEEP else (ranged,)):
            label = "ranged " if args else ""
            fast = run_job(tmp / f"spark{len(args)}", job, inputs, *args)
            oracle = run_job(tmp / f"ref{len(args)}", job, inputs, *args, engine="reference")
            assert fast.code == 0 and oracle.code == 0, fast.stderr + oracle.stderr
            for i in range(len(WINDOWS[kind])):
                for emit in EMITS:
                    name = f"agg{i}_{emit}"
                    assert _rows(fast.outputs.get(name, [])) == _rows(oracle.outputs[name]), label + name
                    if emit != "updates":
                        assert fast.summary["operators"][name]["incomplete_windows"] == \
                            len(oracle.summary["incomplete"][name]), label + name
                merged += sum(1 for r in oracle.outputs[f"agg{i}_updates"] if r["n"] is None)
            assert _ledger(fast.ledger) == _ledger(oracle.ledger), label + "ledger"
            assert fast.summary["operators"] and all(c["balanced"] if "balanced" in c else True
                                                     for c in fast.summary["operators"].values())
        # the timelines do reach the rules under test: late records, and for sessions merges (tombstones)
        assert (merged > 0 or kind != "session") and any(r["reason"] == "late" for r in oracle.ledger)

    check()
