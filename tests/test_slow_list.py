"""tests/slow.txt, the measured slow tests: its entries name files that exist, and its patterns match as the
file says (a pattern that matched nothing, or everything, would move tests in or out of the fast subset)."""
from __future__ import annotations

from tests.conftest import REPO, SLOW, _listed_slow


def test_every_entry_names_a_test_file_of_the_suite() -> None:
    assert SLOW and all((REPO / entry.split("::")[0]).is_file() for entry in SLOW)


def test_ids_match_exactly_and_patterns_by_file_and_parameters() -> None:
    exact = next(e for e in SLOW if "::*" not in e)
    assert _listed_slow(exact) and not _listed_slow(exact + "x")
    assert _listed_slow("tests/golden/test_join.py::test_anything[spark]")
    assert not _listed_slow("tests/golden/test_join.py::test_anything[reference]")
    assert _listed_slow("tests/verify/test_join_verify.py::test_anything")
    assert not _listed_slow("tests/verify/test_join_verify.py::test_anything[p]")
    assert not _listed_slow("tests/verify/test_join_verify_other.py::test_anything")
