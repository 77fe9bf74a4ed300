"""Golden timelines for tumbling/hopping aggregation (docs/semantics.md §4) via `backfill run`.

Each case comes from kafka-streams-examples.json; both engines must produce exactly the expected records.
"""
from __future__ import annotations

import pytest

from tests.conftest import examples
from tests.golden.harness import aggregate_job, run_job, timeline

pytestmark = pytest.mark.spark
ENGINES = ["spark", "reference"]
CASES = examples()
CONCAT = "{v: {fold: {init: \"'0'\", step: \"concat(acc, '+', value)\"}}}"


def _inputs(case_id: str) -> list[dict]:
    return timeline([(r["key"], r["value"], r["ts"]) for r in CASES[case_id]["inputs"] if "key" in r])


def _windows(rows: list[dict], value: str = "v") -> list[tuple]:
    return [(r["key"], r["window_start"], r["window_end"], r[value], r["ts"]) for r in rows]


@pytest.mark.parametrize("engine", ENGINES)
def test_tumbling_window_end_equal_to_close_time_is_dropped(tmp_path, spark, engine):
    case = CASES["wagg-expired-by-grace-update"]
    job = aggregate_job("{type: tumbling, size: 10ms, grace: 90ms}",
                        "{v: {fold: {init: \"''\", step: \"concat(acc, '+', value)\"}}}", "updates")
    got = run_job(tmp_path, job, {"s": _inputs(case["id"])}, engine=engine)
    assert got.code == 0, got.stderr
    assert _windows(got.outputs["agg"]) == [("k", 200, 210, "+100", 200)]
    dropped = sorted((d["offset"], d["timestamp"], d["window_start"], d["window_end"], d["stream_time"])
                     for d in got.ledger)
    expected = [(d["offset"], d["ts"], int(d["window"][1:-1].split(",")[0]), int(d["window"][1:-1].split(",")[1]),
                 d["streamTime"]) for d in case["expected_dropped"]]
    assert dropped == sorted(expected)
    assert {d["reason"] for d in got.ledger} == {"late"}


@pytest.mark.parametrize("engine", ENGINES)
def test_final_emits_nothing_while_grace_keeps_every_window_open(tmp_path, spark, engine):
    job = aggregate_job("{type: hopping, size: 10ms, advance: 5ms, grace: 100ms}", CONCAT, "final")
    got = run_job(tmp_path, job, {"s": _inputs("wagg-basic-close")}, engine=engine)
    assert got.code == 0, got.stderr
    assert got.outputs.get("agg", []) == [] and got.ledger == []


@pytest.mark.parametrize("engine", ENGINES)
def test_final_emits_only_windows_closed_by_stream_time(tmp_path, spark, engine):
    case = CASES["wagg-not-progress-enough-close"]
    job = aggregate_job("{type: hopping, size: 10ms, advance: 5ms, grace: 5ms}", CONCAT, "final")
    got = run_job(tmp_path, job, {"s": _inputs(case["id"])}, engine=engine)
    assert got.code == 0, got.stderr
    expected = [(o["key"], o["window_start"], o["window_end"], o["value"], o["ts"]) for o in case["expected_outputs"]]
    assert sorted(_windows(got.outputs["agg"])) == sorted(expected)


@pytest.mark.parametrize("engine", ENGINES)
def test_not_progress_enough_update_variant_emits_every_update_in_order(tmp_path, spark, engine):
    job = aggregate_job("{type: hopping, size: 10ms, advance: 5ms, grace: 5ms}", CONCAT, "updates")
    got = run_job(tmp_path, job, {"s": _inputs("wagg-not-progress-enough-close")}, engine=engine)
    assert got.code == 0, got.stderr
    rows = sorted(got.outputs["agg"], key=lambda r: r["emit_seq"])
    # the ON_WINDOW_UPDATE variant named in the vector's notes
    assert _windows(rows) == [
        ("A", 0, 10, "0+1", 0), ("B", 0, 10, "0+2", 5), ("B", 5, 15, "0+2", 5), ("C", 10, 20, "0+3", 15),
        ("C", 15, 25, "0+3", 15), ("D", 10, 20, "0+4", 15), ("D", 15, 25, "0+4", 15), ("E", 10, 20, "0+5", 19),
        ("E", 15, 25, "0+5", 19)]


@pytest.mark.parametrize("engine", ENGINES)
def test_final_results_match_emit_on_close_without_restart(tmp_path, spark, engine):
    """wagg-emit-from-last-emit-time-close: the restart only re-derives what was already emitted."""
    case = CASES["wagg-emit-from-last-emit-time-close"]
    job = aggregate_job("{type: hopping, size: 10ms, advance: 5ms, grace: 5ms}", CONCAT, "final")
    got = run_job(tmp_path, job, {"s": _inputs(case["id"])}, engine=engine)
    assert got.code == 0, got.stderr
    expected = [(o["key"], o["window_start"], o["window_end"], o["value"], o["ts"]) for o in case["expected_outputs"]]
    assert sorted(_windows(got.outputs["agg"])) == sorted(expected)


@pytest.mark.parametrize("engine", ENGINES)
def test_wall_clock_throttle_is_not_reproduced_final_is_a_superset(tmp_path, spark, engine):
    """wagg-emit-large-interval-close: the 1 s throttle withheld closed windows; the data alone closes more."""
    case = CASES["wagg-emit-large-interval-close"]
    job = aggregate_job("{type: hopping, size: 10ms, advance: 5ms, grace: 5ms}", CONCAT, "final")
    got = run_job(tmp_path, job, {"s": _inputs(case["id"])}, engine=engine)
    assert got.code == 0, got.stderr
    emitted = set(_windows(got.outputs["agg"]))
    expected = {(o["key"], o["window_start"], o["window_end"], o["value"], o["ts"]) for o in case["expected_outputs"]}
    assert expected < emitted
    # stream time 40, grace 5: every window ending at or before 35 is final
    assert {w[1] for w in emitted} == {0, 5, 10, 15, 20}


@pytest.mark.parametrize("engine", ENGINES)
def test_suppress_final_time_windows_raw_and_suppressed(tmp_path, spark, engine):
    case = CASES["suppress-final-time-windows"]
    inputs = _inputs(case["id"])
    raw = [o for o in case["expected_outputs"] if o["topic"] == "output-raw"]
    final = [o for o in case["expected_outputs"] if o["topic"] == "output-suppressed"]

    def key(o: dict) -> tuple:
        k, span = o["key"][1:-1].split("@")
        return (k, int(span.split("/")[0]), int(span.split("/")[1]), o["value"], o["ts"])

    updates = run_job(tmp_path / "u", aggregate_job("{type: tumbling, size: 2ms, grace: 1ms}", "{v: count()}",
                                                    "updates"), {"s": inputs}, engine=engine)
    assert updates.code == 0, updates.stderr
    assert _windows(sorted(updates.outputs["agg"], key=lambda r: r["emit_seq"])) == [key(o) for o in raw]
    closed = run_job(tmp_path / "f", aggregate_job("{type: tumbling, size: 2ms, grace: 1ms}", "{v: count()}",
                                                   "final"), {"s": inputs}, engine=engine)
    assert sorted(_windows(closed.outputs["agg"])) == sorted(key(o) for o in final)
    late = [(d["offset"], d["timestamp"], d["window_start"]) for d in closed.ledger]
    assert late == [(6, 0, 0)]


@pytest.mark.parametrize("engine", ENGINES)
def test_suppress_releases_at_end_plus_grace_not_before(tmp_path, spark, engine):
    case = CASES["suppress-release-boundary"]
    inputs = timeline([(r["key"], "x", r["ts"]) for r in case["inputs"]])
    job = aggregate_job("{type: tumbling, size: 1ms, grace: 1ms}", "{n: count()}", "final")
    got = run_job(tmp_path, job, {"s": inputs}, engine=engine)
    assert got.code == 0, got.stderr
    assert [(r["key"], r["window_start"], r["window_end"], r["ts"]) for r in got.outputs["agg"]] == [
        ("hey", 99, 100, 99)]
    incomplete = got.summary["operators"]["agg"]["incomplete_windows"] if engine == "spark" else \
        len(got.summary["incomplete"]["agg"])
    assert incomplete == 2


@pytest.mark.parametrize("case_id", ["tw-barely-overlapping", "tw-hopping-windowsFor", "tw-tumbling"])
@pytest.mark.parametrize("engine", ENGINES)
def test_windows_for_a_timestamp(tmp_path, spark, engine, case_id):
    case = CASES[case_id]
    cfg = case["config"]
    window = (f"{{type: hopping, size: {cfg['size_ms']}ms, advance: {cfg['advance_ms']}ms, grace: 0ms}}"
              if cfg["advance_ms"] != cfg["size_ms"] else f"{{type: tumbling, size: {cfg['size_ms']}ms, grace: 0ms}}")
    job = aggregate_job(window, "{n: count()}", "updates")
    got = run_job(tmp_path, job, {"s": timeline([("k", "v", case["inputs"][0]["ts"])])}, engine=engine)
    assert got.code == 0, got.stderr
    assert [(r["window_start"], r["window_end"]) for r in got.outputs["agg"]] == [
        (o["window_start"], o["window_end"]) for o in case["expected_outputs"]]


def test_window_validation_errors_name_the_field(tmp_path, spark):
    case = CASES["tw-validation"]
    windows = ["{type: tumbling, size: 0ms, grace: 0ms}", "{type: tumbling, size: -1ms, grace: 0ms}",
               "{type: hopping, size: 123ms, advance: 0ms, grace: 0ms}",
               "{type: hopping, size: 123ms, advance: -1ms, grace: 0ms}",
               "{type: hopping, size: 123ms, advance: 124ms, grace: 0ms}",
               "{type: tumbling, size: 3ms, grace: 0ms}", "{type: tumbling, size: 3ms, grace: -1ms}"]
    for window, expected in zip(windows, case["expected_outputs"], strict=True):
        got = run_job(tmp_path, aggregate_job(window, "{n: count()}", "updates"), {"s": timeline([("k", "v", 1)])})
        if expected["result"] == "ok":
            assert got.code == 0, got.stderr
        else:
            assert got.code == 2
            assert "operators[0].aggregate.window." in got.stderr and "Traceback" not in got.stderr


@pytest.mark.parametrize("size,grace", [(3, 86_399_997), (86_400_000, 0), (86_400_001, 0)])
def test_legacy_grace_is_a_day_minus_the_size(tmp_path, size, grace):
    from backfill.jobspec.load import load_job

    (tmp_path / "job.yaml").write_text(aggregate_job(f"{{type: tumbling, size: {size}ms, grace: legacy}}",
                                                     "{n: count()}", "updates"))
    assert load_job(tmp_path / "job.yaml").spec.operators[0].aggregate.window.grace_ms == grace


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("emit", ["updates", "final"])
def test_fold_step_keeps_a_doubled_quote(tmp_path, spark, engine, emit):
    """'it''s' is one quote in Spark SQL: the fold step reaches Spark with it (not re-rendered as 'its')."""
    job = aggregate_job("{type: tumbling, size: 10ms, grace: 100ms}",
                        "{v: {fold: {init: \"''\", step: \"concat(acc, 'it''s', value)\"}}}", emit)
    got = run_job(tmp_path, job, {"s": timeline([("k", "a", 1), ("k", "b", 2), ("k", "c", 200)])}, engine=engine)
    assert got.code == 0, got.stderr
    assert [r["v"] for r in got.outputs["agg"] if r["window_start"] == 0][-1] == "it'sait'sb"
