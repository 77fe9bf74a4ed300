"""`backfill verify` on a stream-stream join: rows as multisets of (key, ts, value), each planted difference
with the cause its evidence shows (verify/joins.py, docs/semantics.md §5).

One left join, before = after = 100 ms, grace 100 ms (store retention 300 ms), one partition per topic (one
task). The backfill processes the records by head timestamp; the timeline below is built so that moving one
record ahead of one record of the other topic changes the outcome of exactly one row, which is what a
live application at the edge of its input does. The stream's output is the backfill's with the planted
differences.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from backfill.cli import app
from tests.conftest import read_jsonl, write_jsonl
from tests.golden.harness import run_job
from tests.verify.browser import Browser

pytestmark = pytest.mark.spark

JOB = """
name: join-verify
sources:
  clicks: {format: jsonl, path: inputs/clicks.jsonl}
  views: {format: jsonl, path: inputs/views.jsonl}
operators:
  - name: lj
    join: {left: clicks, right: views, how: left, window: {before: 100ms, after: 100ms, grace: 100ms},
           value: "concat(left.value, '+', coalesce(right.value, 'null'))"}
sinks:
  lj: {format: jsonl, path: out/lj.jsonl}
  _ledger: {format: jsonl, path: out/ledger.jsonl}
  _runs: {format: jsonl, path: out/runs.jsonl}
"""


def _topic(topic: str, rows: list[tuple[str, str, int]]) -> list[dict[str, Any]]:
    return [{"topic": topic, "partition": 0, "offset": i, "key": k, "value": v, "timestamp": ts}
            for i, (k, v, ts) in enumerate(rows)]


CLICKS = _topic("clicks", [("q", "q0", 1500), ("a", "a1", 1050), ("b", "b2", 2000), ("y", "y3", 2350),
                           ("c", "c4", 3000), ("x", "x5", 3300), ("d", "d6", 4000), ("w", "w7", 4250)])
VIEWS = _topic("views", [("a", "A1", 1000), ("z", "Z2", 1400), ("b", "B3", 2050), ("c", "C4", 3080),
                         ("v", "V5", 4300), ("d", "D6", 4050)])


def _row(key: str, value: str, ts: int) -> dict[str, Any]:
    return {"key": key, "value": value, "ts": ts}


# (row, in the backfill, in the stream, the cause)
PLANTED = [
    # a1 arrives after Z2 moved the views store to 1400: A1 (1000) is past retention, a1 comes out unmatched.
    # The stream still held A1 (Z2 after a1): it joined them and never emitted a1 unmatched.
    (_row("a", "a1+A1", 1050), False, True, "expired_differs"),
    (_row("a", "a1+null", 1050), True, False, "expired_differs"),
    # b2 + B3 joined at B3; y3 (2350 >= 2000 + 300) is the next click after B3: first, it expires b2
    (_row("b", "b2+B3", 2050), True, False, "expired_differs"),
    # C4 joined c4 before its window closed (3200); x5 (3300), the next click after C4, closes it if first
    (_row("c", "c4+null", 3000), False, True, "partner_after_close"),
    # w7 closed d6's window (4200) before D6 came: the backfill emits d6 unmatched (and then d6 + D6);
    # the stream processed D6 first
    (_row("d", "d6+null", 4000), True, False, "partner_after_close"),
    # w7's window closes at 4450; the data read ends at 4300: the stream went on and emitted it
    (_row("w", "w7+null", 4250), False, True, "range_boundary"),
]


def _stream(backfill: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The backfill's rows with the planted differences, a copy of one row, and one changed value."""
    rows = sorted(backfill, key=lambda r: r["emit_seq"])
    out = [_row(r["key"], r["value"], r["ts"]) for r in rows]
    for row, mine, theirs, _ in PLANTED:
        if mine and not theirs:
            out.remove(row)
        elif theirs and not mine:
            out.append(row)
    out.append(dict(out[0]))  # written twice: at-least-once
    changed = next(r for r in out if r["value"] == "d6+D6")
    changed["value"] = "d6+D6!"  # a joiner that differs: no input produces it
    return [{**r, "partition": 0, "offset": i} for i, r in enumerate(out)]


@pytest.fixture(scope="module")
def verified(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[str, Any], list[dict[str, Any]], Path]:
    from backfill.session import get_spark

    get_spark("local")
    tmp = tmp_path_factory.mktemp("join-verify")
    got = run_job(tmp, JOB, {"clicks": CLICKS, "views": VIEWS})
    assert got.code == 0, got.stderr
    write_jsonl(tmp / "stream.jsonl", _stream(got.outputs["lj"]))
    result = CliRunner().invoke(app, ["verify", str(tmp / "job.yaml"), "--against", f"lj={tmp / 'stream.jsonl'}",
                                      "--report", str(tmp / "report"), "--junit", str(tmp / "junit.xml")])
    report = json.loads((tmp / "report" / "report.json").read_text())
    return result.exit_code, report, got.outputs["lj"], tmp / "report"


def test_the_backfill_emits_what_the_timeline_says(verified):
    """The rows the planted differences are built on are the backfill's own (the timeline is what it says)."""
    _, _, backfill, _ = verified
    rows = {(r["key"], r["value"], r["ts"]) for r in backfill}
    for row, mine, _, _ in PLANTED:
        assert ((row["key"], row["value"], row["ts"]) in rows) == mine, row
    assert ("d", "d6+D6", 4050) in rows and ("c", "c4+C4", 3080) in rows


def test_each_planted_difference_has_its_cause(verified):
    code, report, _, _ = verified
    section = report["sections"][0]
    assert section["keys"] == ["key", "ts"]
    assert section["counts"]["missing_in_stream"] == 3  # the changed row pairs with its original: a mismatch
    assert section["counts"]["extra_in_stream"] == 3
    assert section["counts"]["duplicate_in_stream"] == 1
    assert section["counts"]["mismatch"] == 1
    causes = {c: n for c, n in report["causes"].items() if n}
    assert causes == {"expired_differs": 3, "partner_after_close": 2, "range_boundary": 1, "duplicate_delivery": 1,
                      "unexplained": 1}
    by_row = {(s["key"], s["ts"], s["l_value"] or s["r_value"]): s for s in section["samples"]}
    for row, _, _, cause in PLANTED:
        sample = by_row[(row["key"], row["ts"], row["value"])]
        assert sample["cause"] == cause, (row, sample)
        assert sample["detail"]
    mismatch = by_row[("d", 4050, "d6+D6")]
    assert (mismatch["category"], mismatch["cause"], mismatch["r_value"]) == ("mismatch", "unexplained", "d6+D6!")
    assert report["verdict"] == "differences" and code == 1  # the changed joiner value is unexplained


def test_the_records_that_prove_a_cause_are_shown(verified):
    _, report, _, _ = verified
    samples = {(s["key"], s["r_value"] or s["l_value"]): s for s in report["sections"][0]["samples"]}
    moved_on = samples[("b", "b2+B3")]["inputs"]
    assert [(r["status"], r["ts"]) for r in moved_on] == [("earlier", 2000), ("later", 2050),
                                                         ("moves the store on", 2350)]
    closed = samples[("c", "c4+null")]["inputs"]
    assert [(r["status"], r["ts"]) for r in closed] == [("unmatched record", 3000), ("partner", 3080),
                                                       ("closes the window", 3300)]
    gone = samples[("a", "a1+A1")]["inputs"]
    assert [(r["status"], r["offset"]) for r in gone] == [("earlier", 0), ("later", 1)]


def test_the_report_in_a_browser_filters_by_a_clicked_cause_and_loads_nothing(verified, tmp_path):
    """Headless Chromium over its DevTools protocol: the page loads no resource but itself, a mouse click on a
    cause shows that cause's samples only, a second click shows them all again; a screenshot is kept."""
    _, report, _, folder = verified
    page = Browser(tmp_path / "profile")
    try:
        page.open((folder / "index.html").resolve().as_uri())
        samples = len(report["sections"][0]["samples"])
        visible = "Array.from(document.querySelectorAll('.sample')).filter(e => !e.hidden).map(e => e.dataset.cause)"
        assert len(page.js(visible)) == samples
        page.click(".chip[data-cause='expired_differs']")
        assert page.js(visible) == ["expired_differs"] * 3
        assert page.js("document.querySelector('.f-count').textContent") == f"3 of {samples} samples shown"
        assert page.js("document.querySelector('.chip.on').dataset.cause") == "expired_differs"
        shot = Path(__file__).resolve().parents[2] / "test-artifacts" / "verify-join-report.png"
        page.screenshot(shot)
        assert shot.stat().st_size > 20_000
        page.click(".chip[data-cause='expired_differs']")
        assert len(page.js(visible)) == samples
        # the first thing a reader sees: the verdict, then what to look at, the unexplained difference first
        assert page.js("document.querySelector('#verdict').textContent").startswith("verdict: differences")
        assert page.js("document.querySelector('#first-look').textContent").startswith(
            "Start here: 1 row of lj differs and nothing explains it.")
        assert page.js(visible)[0] == "unexplained"
        page.click("#first-look a")  # its link shows those samples only (on the page's hash change)
        assert page.until(visible, ["unexplained"]) == ["unexplained"]
        assert page.requests and all(u.startswith(("file:", "data:")) for u in page.requests), page.requests
    finally:
        page.close()


def test_an_identical_stream_matches(tmp_path, spark):
    got = run_job(tmp_path, JOB, {"clicks": CLICKS, "views": VIEWS})
    rows = sorted(got.outputs["lj"], key=lambda r: r["emit_seq"])
    write_jsonl(tmp_path / "stream.jsonl", [{"key": r["key"], "value": r["value"], "ts": r["ts"], "partition": 0,
                                             "offset": i} for i, r in enumerate(rows)])
    result = CliRunner().invoke(app, ["verify", str(tmp_path / "job.yaml"), "--against",
                                      f"lj={tmp_path / 'stream.jsonl'}", "--report", str(tmp_path / "r")])
    assert result.exit_code == 0, result.stderr
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["verdict"] == "match"
    assert report["counts"]["match"] == len(rows)
    assert read_jsonl(tmp_path / "out" / "ledger.jsonl") == []




def test_rows_near_an_offset_gap_of_the_input_are_missing_input(tmp_path, spark):
    """The archive of the views lost C4 (offset 3 skipped): the stream, which read it, joined c4 with it; the
    backfill emits c4 unmatched. Both rows are near the gap: missing_input, with the gap named."""
    full = run_job(tmp_path / "full", JOB, {"clicks": CLICKS, "views": VIEWS})
    rows = sorted(full.outputs["lj"], key=lambda r: r["emit_seq"])
    gapped = run_job(tmp_path / "gapped", JOB, {"clicks": CLICKS, "views": [v for v in VIEWS if v["offset"] != 3]})
    assert gapped.code == 0, gapped.stderr
    write_jsonl(tmp_path / "stream.jsonl", [{"key": r["key"], "value": r["value"], "ts": r["ts"], "partition": 0,
                                             "offset": i} for i, r in enumerate(rows)])
    result = CliRunner().invoke(app, ["verify", str(tmp_path / "gapped" / "job.yaml"), "--against",
                                      f"lj={tmp_path / 'stream.jsonl'}", "--report", str(tmp_path / "r")])
    assert result.exit_code == 0, result.stderr
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert {c: n for c, n in report["causes"].items() if n} == {"missing_input": 2}
    samples = {(s["category"], s["l_value"] or s["r_value"]): s for s in report["sections"][0]["samples"]}
    assert samples[("extra_in_stream", "c4+C4")]["cause"] == "missing_input"
    assert "views partition 0 skips offsets 3-3" in samples[("missing_in_stream", "c4+null")]["detail"]


# key m: m1, M1, m2, M2 (by head timestamp) give m1+M1, m2+M1, m1+M2, m2+M2 in that order; key n the same;
# key u: U1, u1, u2 (u2 is earlier than u1, behind it in its partition) give u1+U1 at u1, then u2+U1 at u2
MOVES_CLICKS = _topic("clicks", [("m", "m1", 5000), ("m", "m2", 5050), ("n", "n1", 6000), ("n", "n2", 6050),
                                 ("u", "u1", 8100), ("u", "u2", 8050)])
MOVES_VIEWS = _topic("views", [("m", "M1", 5020), ("m", "M2", 5060), ("n", "N1", 6020), ("n", "N2", 6060),
                               ("u", "U1", 8080)])


def test_a_moved_row_is_processing_order_only_where_an_order_of_its_records_writes_it_there(tmp_path, spark):
    """A joined row is emitted when the later of its pair is processed; a partition's records keep their
    offset order (docs/semantics.md §5.7). The stream wrote m1+M2 before m2+M1: the order m1, M1, M2, m2 does
    that (m2 comes after both m1 and M2), processing_order, with the four records. It wrote n2+N1 before n1+N1:
    no order does (n1 precedes n2 and N1 is shared, so n1+N1 is always emitted first), unexplained. It wrote
    u2+U1 before u1+U1: no record of u1+U1 can come last (u1 precedes u2), but U1 processed after both emits
    both, and its store gives u2 (8050) before u1 (8100): processing_order."""
    got = run_job(tmp_path, JOB, {"clicks": MOVES_CLICKS, "views": MOVES_VIEWS})
    assert got.code == 0, got.stderr
    rows = [(r["key"], r["value"], r["ts"]) for r in sorted(got.outputs["lj"], key=lambda r: r["emit_seq"])]
    assert [v for _, v, _ in rows] == ["m1+M1", "m2+M1", "m1+M2", "m2+M2", "n1+N1", "n2+N1", "n1+N2", "n2+N2",
                                       "u1+U1", "u2+U1"]
    stream = [rows[i] for i in (0, 2, 1, 3, 5, 4, 6, 7, 9, 8)]
    write_jsonl(tmp_path / "stream.jsonl", [{"key": k, "value": v, "ts": ts, "partition": 0, "offset": i}
                                            for i, (k, v, ts) in enumerate(stream)])
    result = CliRunner().invoke(app, ["verify", str(tmp_path / "job.yaml"), "--against",
                                      f"lj={tmp_path / 'stream.jsonl'}", "--report", str(tmp_path / "r")])
    assert result.exit_code == 1, result.stderr
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert {c: n for c, n in report["causes"].items() if n} == {"processing_order": 2, "unexplained": 1}
    samples = {s["l_value"] or s["r_value"]: s for s in report["sections"][0]["samples"]}
    reachable, never = samples["m2+M1"], samples["n1+N1"]
    assert (reachable["category"], reachable["cause"]) == ("moved_in_stream", "processing_order")
    assert [(r["status"], r["ts"]) for r in reachable["inputs"]] == [
        ("record of this row", 5050), ("record of this row", 5020),
        ("record of the row written before", 5000), ("record of the row written before", 5060)]
    assert (never["category"], never["cause"]) == ("moved_in_stream", "unexplained")
    assert "value n2+N1" in never["detail"] and "always emitted first" in never["detail"]
    shared = samples["u1+U1"]
    assert (shared["category"], shared["cause"]) == ("moved_in_stream", "processing_order")
    assert "value u2+U1" in shared["detail"] and "emits both at once" in shared["detail"]
