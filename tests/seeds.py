"""The property tests' seeds: every run draws fresh ones, beside the regression seeds each test keeps.

A property example is one Spark job over hundreds of scenarios drawn from one seed, so a run affords a few
examples. With a fixed draw every CI run would search the same corner again; instead hypothesis draws each
run's seeds afresh (not derandomized) and prints the failing one (`Falsifying example: check(seed=N)`): keep
it as an `@example(seed=N)` regression seed of that test. `PROPERTY_EXAMPLES=N` searches N fresh seeds per test
(`CHAIN_EXAMPLES` for the chain properties, `FUZZ_EXAMPLES` for the fuzz test).
"""
from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

DEEP = int(os.environ.get("PROPERTY_EXAMPLES", "0"))
SEEDS = st.integers(0, 2**32 - 1)


def property_settings(examples: int = 1, env: str = "PROPERTY_EXAMPLES") -> settings:
    """`examples` fresh seeds a run (the variable `env` when set), after the test's `@example` seeds; no
    shrinking (one Spark job per example) and no deadline."""
    return settings(max_examples=int(os.environ.get(env, "0")) or examples, deadline=None, derandomize=False, print_blob=True,
                    phases=[Phase.explicit, Phase.generate],
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
