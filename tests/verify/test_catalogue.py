"""The one catalogue of causes (backfill/verify/catalogue.py): what the attribution, the report and the docs read.

A cause the docs name is in the catalogue, the job spec lists every cause in the catalogue's order, each cause
has a meaning and a colour, and `first_match` gives a row's cause and detail from the same table row.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from backfill.verify import catalogue
from backfill.verify.catalogue import CATALOGUE, CAUSES, SEVERITY, first_match

ROOT = Path(__file__).resolve().parents[2]


def test_every_cause_has_one_entry_a_meaning_a_colour_and_a_rank() -> None:
    assert len(set(CAUSES)) == len(CAUSES) == len(CATALOGUE)
    assert sorted(c.severity for c in CATALOGUE) == list(range(len(CATALOGUE)))  # one rank each, no gaps
    assert SEVERITY[0] == "unexplained"  # what nothing explains comes first
    for cause in CATALOGUE:
        assert cause.meaning and re.fullmatch(r"#[0-9a-f]{6}", cause.colour), cause.name
        assert cause.family in ("window", "restart", "join", "alerts", "mechanism", "none"), cause.name
    assert catalogue.RESTART_CAUSES == ("reprocessed_after_restart", "reemitted", "state_lost_on_restore",
                                        "stale_after_restart")


def test_the_job_spec_lists_every_cause_in_the_catalogues_order() -> None:
    text = (ROOT / "docs" / "job-spec.md").read_text()
    listed = re.search(r"Causes \(`report\.json` `causes`[^:]*:(.*?)\.\n", text, re.S)
    assert listed is not None
    assert tuple(re.findall(r"`(\w+)`", listed.group(1))) == CAUSES


def test_every_cause_the_readme_explains_is_in_the_catalogue() -> None:
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("| cause | evidence |"):].split("\n\n")[0]
    causes = re.findall(r"^\| `(\w+)` \|", table, re.M)
    assert len(causes) >= 5 and set(causes) <= set(CAUSES), set(causes) - set(CAUSES)


def test_a_cause_outside_the_catalogue_is_refused() -> None:
    with pytest.raises(AssertionError, match="not in the catalogue"):
        first_match([(None, "a_cause_nobody_documented", "detail")])


@pytest.mark.spark
def test_first_match_takes_cause_and_detail_from_the_first_row_that_holds(spark) -> None:
    from pyspark.sql import functions as F

    df = spark.createDataFrame([(1, True, True), (2, False, True), (3, False, False), (4, None, False)],
                               "id int, a boolean, b boolean")
    cause, detail = first_match([(F.col("a"), "late_drop_differs", F.format_string("a of %d", F.col("id"))),
                                 (F.col("b"), "tie_order", "b"),
                                 (None, "unexplained", "neither")])
    got = {r["id"]: (r["cause"], r["detail"]) for r in df.select("id", cause.alias("cause"),
                                                                 detail.alias("detail")).collect()}
    assert got == {1: ("late_drop_differs", "a of 1"), 2: ("tie_order", "b"), 3: ("unexplained", "neither"),
                   4: ("unexplained", "neither")}  # a null condition does not hold
    none, why = first_match([(F.col("a"), "tie_order", "a"), (None, None, None)])
    assert [tuple(r) for r in df.orderBy("id").select(none, why).collect()] == [
        ("tie_order", "a"), (None, None), (None, None), (None, None)]
