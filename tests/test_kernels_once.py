"""Each Python kernel (session and sliding windows, a join's outer store, a stream-table join's grace buffer) runs
once per group and run, however many later steps read its output (session.computed_once).

Spark's cache is found by plan: a persisted kernel whose output a later plan read twice (a self-join) ran again
for every such read, 5 to 7 times per session group. Each kernel function is wrapped here to write one line per
call from the Python worker; a group called twice is a kernel computed twice.
"""
from __future__ import annotations

import collections
import itertools
from pathlib import Path
from typing import Any, Callable

import pytest
from pyspark.sql.group import GroupedData

from backfill.conformance.check import write_job
from backfill.conformance.scenarios import generate
from backfill.jobspec.load import load_job
from backfill.plan.builder import build_plan
from backfill.plan.evaluator import run_plan

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _counted(log: str, tag: str, kernel: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def run(pdf: Any) -> Any:
        out = kernel(pdf)
        group = "|".join(str(pdf[c].iloc[0]) for c in ("task", "key") if c in pdf.columns and len(pdf))
        with open(log, "a") as f:  # noqa: PTH123 - in the Python worker
            f.write(f"{tag}\t{group}\n")
        return out
    return run


WITH_KERNEL: dict[str, Callable[[dict[str, Any]], bool]] = {
    "session": lambda c: (c["gap"], c["grace"]) == (10, 7),  # final by both mechanisms, and updates
    "sliding": lambda c: c["diff"] == 3,
    "join": lambda c: c["how"] == "left" and (c["before"], c["after"], c["grace"]) == (-2, 5, 1),  # outer store
    "table_join": lambda c: c["grace"] > 0 and c["history"] == 10,  # the grace buffer
}


@pytest.mark.parametrize("kind", ["session", "sliding", "join", "table_join"])
def test_every_kernel_group_runs_once_per_run(spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              kind: str) -> None:
    log = str(tmp_path / "calls.tsv")
    serial = itertools.count()
    apply = GroupedData.applyInPandas

    def wrapped(self: GroupedData, func: Callable[[Any], Any], schema: Any) -> Any:
        return apply(self, _counted(log, f"{kind}-{next(serial)}", func), schema)

    monkeypatch.setattr(GroupedData, "applyInPandas", wrapped)
    # the scenarios of the configurations that have a kernel (a job's cost is per operator, one per configuration)
    picked = [sc for sc in generate(kind, 40, 3) if WITH_KERNEL[kind](sc.config)]
    job = write_job(tmp_path / kind, picked, name=f"once-{kind}", kafka_streams="4.4")
    run_plan(build_plan(load_job(job), None, None), spark)
    calls = collections.Counter(Path(log).read_text().splitlines())
    assert len(calls) >= 4, calls  # not vacuous: kernels ran, over several groups
    assert {line: n for line, n in calls.items() if n > 1} == {}
