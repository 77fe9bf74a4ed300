"""Write tests/slow.txt, the tests that take 4 s or more, from the durations of a whole-suite run.

    .venv/bin/python -m pytest -q --durations=0 > /tmp/suite.log
    .venv/bin/python scripts/slow_tests.py /tmp/suite.log

tests/conftest.py marks each test the file names `slow` (as `@pytest.mark.slow` does), so `-m "not slow"`, the
fast subset, leaves them out. A test's time is its setup, call and teardown together, as measured on the two
workers CI runs; tests already marked in their file are listed too (the marker is idempotent). A setup of 20 s
or more is a module's fixture, which whichever of its tests runs first would pay: it lists `FILE::*[PARAMS]`, every
test of that file with those parameters (`FILE::*`: every test of the file without parameters).
"""
from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

THRESHOLD_S = 4.0
FIXTURE_S = 20.0  # a setup this long is a module's fixture running jobs (a broker or a first session: shorter)
LINE = re.compile(r"^([\d.]+)s (call|setup|teardown)\s+(\S.*)$")
OUT = Path(__file__).resolve().parents[1] / "tests" / "slow.txt"


def main(log: str) -> None:
    seconds: Counter[str] = Counter()
    fixtures: Counter[str] = Counter()
    for line in Path(log).read_text().splitlines():
        m = LINE.match(line.rstrip())
        if not m:
            continue
        took, phase, test = float(m[1]), m[2], m[3]
        seconds[test] += took
        if phase == "setup" and took >= FIXTURE_S:
            params = test[test.index("["):] if test.endswith("]") else ""
            fixtures[f"{test.split('::')[0]}::*{params}"] += took
    if not seconds:
        sys.exit(f"{log}: no durations in it; run pytest with --durations=0")
    slow = {**{t: s for t, s in seconds.items() if s >= THRESHOLD_S}, **fixtures}
    lines = [f"# tests of {THRESHOLD_S:g} s or more, and modules whose fixture took {FIXTURE_S:g} s or more, in a "
             "whole-suite run on two workers (scripts/slow_tests.py): tests/conftest.py marks them slow",
             *(f"{slow[t]:7.1f}  {t}" for t in sorted(slow, key=lambda t: (-slow[t], t)))]
    OUT.write_text("\n".join(lines) + "\n")
    print(f"{OUT}: {len(slow) - len(fixtures)} tests, {len(fixtures)} modules' fixtures")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: scripts/slow_tests.py PYTEST_LOG (a run with --durations=0)")
    main(sys.argv[1])
