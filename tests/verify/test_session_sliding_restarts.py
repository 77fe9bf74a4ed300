"""Restart causes for session and sliding windows (docs/semantics.md §9, §10, §11): after a crash of an
at-least-once application, the records from the committed offset on are applied twice onto the restored store,
and a final window that suppress had released after the commit is released again. Each effect is proved by
recomputation over the records inside the window's bounds, with those records as evidence; the same wrong
values without evidence of a restart are not put down to one.

One task (partition 0). The application committed offset 2, crashed after offset 4 and restarted from offset 2:
a2, z1 and a3 were applied twice. c's session [11 s, 11 s] closed at z1 (offset 3), a's sliding window
[7 s, 12 s] at a2 (offset 2), both after the commit: each was released before the crash and again after it. (c's
sliding window closed at a1, before the commit: emitted twice, it would be a duplicate delivery.)
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from typer.testing import CliRunner

from backfill.cli import app
from tests.conftest import write_jsonl
from tests.verify.browser import Browser
from tests.verify.conftest import ran_job

pytestmark = [pytest.mark.spark, pytest.mark.slow]

JOB = """
name: restarted-windows
sources:
  s: {format: jsonl, path: inputs/s.jsonl, value: {format: string}, timestamp: {extractor: record}}
operators:
  - name: sessions
    aggregate:
      input: s
      window: {type: session, gap: 5s, grace: 1s}
      aggregations: {n: count(), trail: {fold: {init: "''", step: "concat(acc, value)", merge: "concat(a, b)"}}}
      emit: final
      close: suppress
  - name: sliding
    aggregate:
      input: s
      window: {type: sliding, time_difference: 5s, grace: 1s}
      aggregations: {n: count(), trail: {fold: {init: "''", step: "concat(acc, value)"}}}
      emit: final
      close: suppress
sinks:
  sessions: {format: delta, path: out/sessions}
  sliding: {format: delta, path: out/sliding}
  _ledger: {format: delta, path: out/ledger}
  _runs: {format: jsonl, path: out/runs.jsonl}
"""
# (key, value, ts); offsets in this order. a3 comes behind stream time (18 s) and still joins a's session.
INPUT = [("c", "c1", 11_000), ("a", "a1", 12_000), ("a", "a2", 13_000), ("z", "z1", 18_000), ("a", "a3", 17_500),
         ("w", "w1", 40_000)]
COMMITTED, CRASHED_AFTER = 2, 4
TWICE = {o for o in range(COMMITTED, CRASHED_AFTER + 1)}


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ran_job(tmp_path_factory.mktemp("restarts"), JOB, [(k, v, 0, t) for k, v, t in INPUT])


def _ours(job: Path, operator: str) -> list[dict[str, Any]]:
    rows = DeltaTable(str(job.parent / "out" / operator)).to_pyarrow_table().to_pylist()
    return sorted(rows, key=lambda r: (r["window_end"], r["key"], r["window_start"]))


def _replayed(row: dict[str, Any]) -> dict[str, Any] | None:
    """The window as the restarted application emits it: the records inside its bounds from the committed offset
    on applied again after the others (the fold sees them twice), or None when the restart did not touch it."""
    inside = [(o, v) for o, (k, v, t) in enumerate(INPUT)
              if k == row["key"] and row["window_start"] <= t <= row["window_end"]]
    again = [v for o, v in inside if o in TWICE]
    if not again:
        return None
    return {**row, "n": row["n"] + len(again), "trail": row["trail"] + "".join(again)}


# per operator: the window released after the commit and before the crash, and the offset that closed it
AGAIN = {"sessions": ("c", 11_000, 3), "sliding": ("a", 7_000, 2)}


def _stream(job: Path, operator: str, tmp: Path, replay: bool = True, reemit: bool = True) -> Path:
    """The stream's output: the AGAIN window twice (released before the crash and again after it), the windows
    the replayed records reached with them applied twice."""
    rows = []
    for r in _ours(job, operator):
        rows.append((_replayed(r) if replay else None) or r)
        if reemit and (r["key"], r["window_start"]) == AGAIN[operator][:2]:
            rows.append(r)
    return write_jsonl(tmp / f"{operator}.jsonl", [{**r, "partition": 0, "offset": i} for i, r in enumerate(rows)])


def _verify(job: Path, operator: str, stream: Path, tmp: Path, *args: str) -> tuple[int, dict[str, Any]]:
    result = CliRunner().invoke(app, ["verify", str(job), "--json", "--against", f"{operator}={stream}",
                                      "--report", str(tmp / f"report-{operator}"), *args])
    assert result.exit_code in (0, 1), result.stdout + result.stderr
    [section] = json.loads(result.stdout)["sections"]
    return result.exit_code, section


def _commits(tmp: Path) -> str:
    path = tmp / "commits.json"
    path.write_text(json.dumps([{"topic": "t", "partition": 0, "offset": COMMITTED}]))
    return str(path)


@pytest.mark.parametrize("operator", ["sessions", "sliding"])
def test_each_restart_effect_gets_its_cause_with_its_records(job: Path, tmp_path: Path, operator: str) -> None:
    touched = [r for r in _ours(job, operator) if _replayed(r) is not None]
    assert len(touched) >= 2  # a's and z's windows at least
    code, section = _verify(job, operator, _stream(job, operator, tmp_path), tmp_path, "--commits",
                            _commits(tmp_path), "--corrections", str(tmp_path / "fixes"))
    assert code == 0
    assert {c: n for c, n in section["causes"].items() if n} == {"reprocessed_after_restart": len(touched),
                                                                 "reemitted": 1}
    by_window = {(r["key"], r["window_start"]): r for r in touched}
    shown = [s for s in section["samples"] if s["cause"] == "reprocessed_after_restart"]
    assert shown  # a few per cause
    for sample in shown:
        r = by_window[(sample["key"], sample["window_start"])]
        inside = [o for o, (k, _, t) in enumerate(INPUT) if k == r["key"] and r["window_start"] <= t <= r["window_end"]
                  and o in TWICE]
        assert [(x["offset"], x["status"]) for x in sample["records"]] == [(o, "applied twice") for o in inside]
        assert (sample["restart_from"], sample["restart_to"]) == (min(inside), max(inside))
    [again] = [s for s in section["samples"] if s["cause"] == "reemitted"]
    assert (again["key"], again["window_start"], again["closed_at"]) == AGAIN[operator]
    assert "suppress's buffer" in again["detail"]
    [task] = section["restarts"]
    assert (task["restart_offset"], task["restart_offset_from"]) == (COMMITTED, "--commits")
    assert task["windows"]["reprocessed_after_restart"] == len(touched) and task["windows"]["reemitted"] == 1
    # corrections: the replayed windows with the backfill's values
    ours = {(r["key"], r["window_start"]): (r["n"], r["trail"]) for r in _ours(job, operator)}
    fixed = DeltaTable(str(tmp_path / "fixes" / operator)).to_pyarrow_table().to_pylist()
    assert sorted((r["key"], r["window_start"], r["n"], r["trail"]) for r in fixed if r["correction"] == "replace") \
        == sorted((r["key"], r["window_start"], *ours[(r["key"], r["window_start"])]) for r in touched)
    _read_in_a_browser(tmp_path, operator, section)


def _read_in_a_browser(tmp: Path, operator: str, section: dict[str, Any]) -> None:
    """Headless Chromium: the section of a sliding or session operator as for time windows: its causes under the
    verdict, a click on one shows its samples only, with the records that prove it; the restart's incident
    table; nothing loaded from elsewhere."""
    page = Browser(tmp / "profile")
    try:
        page.open((tmp / f"report-{operator}" / "index.html").resolve().as_uri())
        assert page.js("document.querySelector('#verdict').textContent").startswith("verdict: explained")
        look = page.js("document.querySelector('#first-look').textContent")
        assert look.startswith(f"{operator}:") and "reprocessed_after_restart" in look and "reemitted" in look
        visible = "Array.from(document.querySelectorAll('.sample')).filter(e => !e.hidden).map(e => e.dataset.cause)"
        assert len(page.js(visible)) == len(section["samples"])
        page.click(".chip[data-cause='reemitted']")
        assert page.js(visible) == ["reemitted"]
        page.click(".chip[data-cause='reprocessed_after_restart']")
        shown = page.js(visible)
        assert shown and set(shown) == {"reprocessed_after_restart"}
        proof = ("Array.from(document.querySelectorAll('.sample')).filter(e => !e.hidden).map(e => "
                 "Array.from(e.querySelectorAll('td')).filter(td => td.textContent === 'applied twice').length)")
        assert all(n > 0 for n in page.js(proof))
        incident = f"document.querySelector('#incidents-{operator}').nextElementSibling.nextElementSibling"
        assert page.js(f"{incident}.querySelectorAll('tr').length") == 2  # one restarted task
        assert page.js(f"{incident}.offsetHeight") > 0
        assert page.requests and all(u.startswith(("file:", "data:")) for u in page.requests), page.requests
    finally:
        page.close()


@pytest.mark.parametrize("operator", ["sessions", "sliding"])
def test_the_same_values_without_restart_evidence_are_unexplained(job: Path, tmp_path: Path, operator: str) -> None:
    """No committed offsets, and no window emitted again with another value: nothing shows a restart."""
    touched = [r for r in _ours(job, operator) if _replayed(r) is not None]
    code, section = _verify(job, operator, _stream(job, operator, tmp_path, reemit=False), tmp_path)
    assert code == 1
    assert {c: n for c, n in section["causes"].items() if n} == {"unexplained": len(touched)}
    assert section["restarts"] == []


def test_a_value_no_replay_reproduces_stays_unexplained_beside_a_proven_restart(job: Path, tmp_path: Path) -> None:
    """With the restart proven, a window whose value no run of replayed records gives is not put down to it."""
    rows = _ours(job, "sessions")
    stream = [(_replayed(r) or r) for r in rows]
    [m] = [r for r in stream if r["key"] == "a"]
    m["n"] += 7  # more than any replay of the window's records can add
    path = write_jsonl(tmp_path / "odd.jsonl", [{**r, "partition": 0, "offset": i} for i, r in enumerate(stream)])
    _, section = _verify(job, "sessions", path, tmp_path, "--commits", _commits(tmp_path))
    causes = {(s["key"], s["window_start"]): s["cause"] for s in section["samples"] if s["category"] != "match"}
    assert causes[("a", m["window_start"])] == "unexplained"
    assert [c for k, c in causes.items() if k[0] == "z"] == ["reprocessed_after_restart"]


# sessions only the stream has, each what the restart made of a's records (a1, a2, a3 at offsets 1, 2, 4):
# before the restart point, a's session as it stood at the commit (the restored suppress buffer still held it);
# from it on, the session a2 and a3 formed alone (the restored store had expired the one they belonged to)
PLANTED = {"stale_after_restart": ("a", 12_000, 12_000, 1, "a1"),
           "state_lost_on_restore": ("a", 13_000, 17_500, 2, "a2a3")}


def test_sessions_only_the_stream_has_that_the_restart_made(job: Path, tmp_path: Path) -> None:
    """Both planted in one stream: with the committed offsets each gets its cause, without them neither is put
    down to a restart, and with values the split does not give both stay unexplained."""
    rows = _ours(job, "sessions")
    planted = {(key, start, end): (cause, n, trail) for cause, (key, start, end, n, trail) in PLANTED.items()}
    assert not any((r["key"], r["window_start"], r["window_end"]) in planted for r in rows)

    def stream(extra: int) -> str:
        made = [{**rows[0], "key": k, "window_start": s, "window_end": e, "n": n + extra, "trail": trail, "ts": e}
                for (k, s, e), (_, n, trail) in planted.items()]
        return write_jsonl(tmp_path / f"planted-{extra}.jsonl",
                           [{**r, "partition": 0, "offset": i} for i, r in enumerate([*rows, *made])])

    for evidence in (True, False):
        code, section = _verify(job, "sessions", stream(0), tmp_path,
                                *(["--commits", _commits(tmp_path)] if evidence else []))
        assert section["counts"]["extra_in_stream"] == len(planted) and section["counts"]["match"] == len(rows)
        found = {(s["key"], s["window_start"], s["window_end"]): s for s in section["samples"]
                 if s["category"] != "match"}
        assert set(found) == set(planted)
        if evidence:
            assert code == 0
            for bounds, (cause, _, _) in planted.items():
                assert found[bounds]["cause"] == cause
                assert f"partition 0 offset {COMMITTED}" in found[bounds]["detail"]
        else:  # no committed offsets and nothing emitted twice: no restart is claimed
            assert code == 1 and {s["cause"] for s in found.values()} == {"unexplained"}
    # the same sessions with values the split does not give are not put down to the restart
    _, section = _verify(job, "sessions", stream(1), tmp_path, "--commits", _commits(tmp_path))
    assert sorted(s["cause"] for s in section["samples"] if s["category"] != "match") == ["unexplained"] * 2
