"""One record per offset (docs/semantics.md §7.2): identical copies are read once and counted, copies that
differ fail the run or go to the ledger, gaps are reported; for JSONL, parquet and Delta sources, both engines,
and every way the Spark engine orders records."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from unittest import mock

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from backfill.cli import app
from tests.conftest import read_jsonl, write_jsonl

pytestmark = pytest.mark.spark

JOB = """
name: offsets
sources:
  s: {{format: {fmt}, path: {path}, on_error: {on_error}}}
operators:
  - name: agg
    aggregate: {{input: s, window: {{type: tumbling, size: 10s, grace: 0ms}}, aggregations: {{n: count()}}, emit: {emit}}}
sinks:
  agg: {{format: jsonl, path: out/agg.jsonl}}
  _ledger: {{format: jsonl, path: out/ledger.jsonl}}
  _runs: {{format: jsonl, path: out/runs.jsonl}}
"""
FORMATS = ("jsonl", "parquet", "delta")


def sampled(spark_format: str) -> list[tuple[str, str]]:
    """Every format through the reference engine, one through Spark: the formats' readers are each run by
    Spark in full by the identical-copies test, and from there the check is one code path (CI samples)."""
    return [(fmt, "reference") for fmt in FORMATS] + [(spark_format, "spark")]


def records() -> list[dict[str, Any]]:
    """Two partitions of 30 offsets, a key living in one partition; offset 20 of partition 0 comes late."""
    rows = [{"topic": "t", "partition": p, "offset": i, "key": f"k{p}{i % 3}", "value": f"v{i}",
             "timestamp": 1000 * i} for p in (0, 1) for i in range(30)]
    rows[20]["timestamp"] = 2000  # its window [0, 10s) closed at stream time 19s: a `late` ledger row
    return rows


def _write(tmp: Path, fmt: str, rows: list[dict[str, Any]], spark: Any = None) -> str:
    if fmt == "jsonl":
        write_jsonl(tmp / "inputs" / "s.jsonl", rows)
        return "inputs/s.jsonl"
    table = pa.Table.from_pylist(rows, schema=pa.schema([
        ("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()), ("key", pa.string()),
        ("value", pa.string()), ("timestamp", pa.int64())]))
    if fmt == "parquet":
        (tmp / "inputs" / "s").mkdir(parents=True)
        pq.write_table(table, tmp / "inputs" / "s" / "part-0.parquet")
    else:  # a real Delta table, written by delta-spark
        spark.createDataFrame(table.to_pandas()).write.format("delta").save(str(tmp / "inputs" / "s"))
    return "inputs/s"


def run(tmp: Path, fmt: str, rows: list[dict[str, Any]], spark: Any, *, engine: str = "spark",
        on_error: str = "skip", emit: str = "final", path: str | None = None) -> dict[str, Any]:
    """Write the input in `fmt` (unless `path` names one written already), run the job, read what it wrote."""
    tmp.mkdir(parents=True, exist_ok=True)
    path = path or _write(tmp, fmt, rows, spark)
    (tmp / "job.yaml").write_text(JOB.format(fmt=fmt, path=path, on_error=on_error, emit=emit))
    result = CliRunner().invoke(app, ["run", str(tmp / "job.yaml"), "--json", "--engine", engine])
    out: dict[str, Any] = {"code": result.exit_code, "stderr": result.stderr}
    if result.exit_code != 0:
        out["published"] = (tmp / "out" / "agg.jsonl").exists()
        return out
    summary = json.loads(result.stdout)
    out["summary"] = summary
    if engine == "reference":
        out["outputs"], out["ledger"] = summary["outputs"]["agg"], summary["ledger_rows"]
    else:
        out["outputs"], out["ledger"] = read_jsonl(tmp / "out" / "agg.jsonl"), read_jsonl(tmp / "out" / "ledger.jsonl")
        out["manifest"] = json.loads(read_jsonl(tmp / "out" / "runs.jsonl")[-1]["counts"])
    return out


def _sorted(rows: list[dict[str, Any]], drop: tuple[str, ...] = ()) -> list[str]:
    return sorted(json.dumps({k: v for k, v in r.items() if k not in drop}, sort_keys=True) for r in rows)


@pytest.mark.parametrize("engine", ["spark", "reference"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_identical_copies_give_the_clean_runs_outputs_and_ledger_with_their_count(tmp_path, spark, fmt, engine):
    clean = run(tmp_path / "clean", fmt, records(), spark, engine=engine)
    copies = [dict(r) for r in records() if r["partition"] == 0 and 5 <= r["offset"] < 10]
    doubled = run(tmp_path / "doubled", fmt, records() + copies, spark, engine=engine)
    assert clean["code"] == doubled["code"] == 0, clean["stderr"] + doubled["stderr"]
    assert _sorted(doubled["outputs"]) == _sorted(clean["outputs"]) and len(clean["outputs"]) > 0
    assert _sorted(doubled["ledger"]) == _sorted(clean["ledger"]) and [r["reason"] for r in clean["ledger"]] == ["late"]
    assert doubled["summary"]["duplicates"] == {"s": {"0": 5}} and clean["summary"]["duplicates"] == {}
    # the accounting: the rows read are the records (each offset once) plus the copies left out
    assert doubled["summary"]["records_read"] == clean["summary"]["records_read"] == {"s": 60}
    assert 60 + 5 == len(records() + copies)
    if engine == "spark":
        assert doubled["manifest"]["duplicates"] == {"s": {"0": 5}}
        assert doubled["summary"]["operators"]["agg"] == clean["summary"]["operators"]["agg"]


def _conflicting() -> list[dict[str, Any]]:
    copy = dict(records()[30 + 7])  # partition 1, offset 7, 97 s later
    copy["timestamp"] += 97_000
    return records() + [copy]


@pytest.mark.parametrize("engine", ["spark", "reference"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_conflicting_copy_fails_the_run_with_one_line_naming_its_offset(tmp_path, spark, fmt, engine):
    got = run(tmp_path, fmt, _conflicting(), spark, engine=engine, on_error="fail")
    assert got["code"] == 2 and not got["published"]
    line = got["stderr"].strip()
    assert len(line.splitlines()) == 1, line
    assert "sources.s: offset 7 of t/1 is in the input more than once" in line
    assert "differ in timestamp (7000, 104000)" in line and "on_error: skip" in line


@pytest.mark.parametrize("fmt,engine", sampled("delta"))
def test_conflicting_copies_are_ledgered_and_the_rest_runs_as_without_that_offset(tmp_path, spark, fmt, engine):
    got = run(tmp_path / "conflict", fmt, _conflicting(), spark, engine=engine)
    without = run(tmp_path / "without", fmt, [r for r in records() if (r["partition"], r["offset"]) != (1, 7)],
                  spark, engine=engine)
    assert got["code"] == without["code"] == 0, got["stderr"] + without["stderr"]
    assert _sorted(got["outputs"]) == _sorted(without["outputs"])
    conflicting = [r for r in got["ledger"] if r["reason"] == "conflicting_offset"]
    assert sorted((r["partition"], r["offset"], r["timestamp"]) for r in conflicting) == [(1, 7, 7000), (1, 7, 104000)]
    assert {r["detail"] for r in conflicting} == {"its copies differ in timestamp (7000, 104000)"}
    others = [r for r in got["ledger"] if r["reason"] != "conflicting_offset"]
    assert _sorted(others) == _sorted(without["ledger"])
    assert got["summary"]["ledger"].get("conflicting_offset") == 2
    if engine == "spark":
        assert got["summary"]["source_drops"] == {"s": {"conflicting_offset": 2}}
        assert got["summary"]["records_read"] == {"s": 61}  # both copies are records: each is a ledger row
        # the same run without the check: the copy's timestamp moves stream time, records come out late
        assert got["summary"]["operators"]["agg"]["dropped"] == without["summary"]["operators"]["agg"]["dropped"]


@pytest.mark.parametrize("fmt,engine", sampled("parquet"))
def test_a_gap_is_reported_with_its_size_and_range(tmp_path, spark, fmt, engine):
    rows = [r for r in records() if not (r["partition"] == 1 and 12 <= r["offset"] <= 21)]
    got = run(tmp_path, fmt, rows, spark, engine=engine)
    assert got["code"] == 0, got["stderr"]
    gap = got["summary"]["gaps"]["s"]["1"]
    assert (gap["gaps"], gap["offsets"]) == (1, 10) and set(got["summary"]["gaps"]["s"]) == {"1"}
    assert [(r["from"], r["to"]) for r in gap["ranges"]] == [(12, 21)]
    if engine == "spark":
        assert gap["ranges"][0]["ts_before"] == 11_000 and gap["ranges"][0]["ts_after"] == 22_000
        assert got["manifest"]["gaps"] == got["summary"]["gaps"]
        assert got["summary"]["gaps_not_checked"] == {}


def test_the_summary_says_what_was_found(tmp_path, spark):
    rows = [r for r in records() if not (r["partition"] == 1 and 12 <= r["offset"] <= 14)]
    rows += [dict(r) for r in rows[:2]]
    write_jsonl(tmp_path / "inputs" / "s.jsonl", rows)
    (tmp_path / "job.yaml").write_text(JOB.format(fmt="jsonl", path="inputs/s.jsonl", on_error="skip", emit="final"))
    result = CliRunner().invoke(app, ["run", str(tmp_path / "job.yaml")])
    assert result.exit_code == 0, result.stderr
    assert "s: 2 identical copies of an offset read once (partition 0: 2)" in result.stdout
    assert "s: partition 1 skips 3 offsets in 1 gap (12-14)" in result.stdout


def test_a_ranged_run_says_it_does_not_check_gaps(tmp_path, spark):
    rows = [r for r in records() if not (r["partition"] == 1 and 12 <= r["offset"] <= 14)]
    write_jsonl(tmp_path / "inputs" / "s.jsonl", rows)
    (tmp_path / "job.yaml").write_text(JOB.format(fmt="jsonl", path="inputs/s.jsonl", on_error="skip", emit="final"))
    result = CliRunner().invoke(app, ["run", str(tmp_path / "job.yaml"), "--start", "10000", "--json"])
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["gaps"] == {} and "warm-up bound (10000)" in summary["gaps_not_checked"]["s"]


def _delta_rows(spark: Any, rows: list[dict[str, Any]]) -> Any:
    return spark.createDataFrame(rows, "topic string, partition int, offset long, key string, value string, "
                                       "timestamp long")


@pytest.mark.parametrize("engine", ["spark", "reference"])
def test_a_delta_archive_written_twice_by_an_at_least_once_writer_is_read_once(tmp_path, spark, engine):
    """A Kafka Connect-style sink that restarted wrote offsets 10-29 of partition 0 again in a commit of its own,
    and an archiver re-run appended the whole of partition 1 again: every offset is read once."""
    from backfill.io.delta import append_delta

    clean = run(tmp_path / "clean", "delta", records(), spark, engine=engine)
    table = str(tmp_path / "twice" / "inputs" / "s")
    append_delta(spark, _delta_rows(spark, records()), table)
    append_delta(spark, _delta_rows(spark, [r for r in records() if r["partition"] == 0 and r["offset"] >= 10]), table)
    append_delta(spark, _delta_rows(spark, [r for r in records() if r["partition"] == 1]), table)
    twice = run(tmp_path / "twice", "delta", [], spark, engine=engine, path="inputs/s")
    assert clean["code"] == twice["code"] == 0, clean["stderr"] + twice["stderr"]
    assert _sorted(twice["outputs"]) == _sorted(clean["outputs"])
    assert _sorted(twice["ledger"]) == _sorted(clean["ledger"])
    assert twice["summary"]["duplicates"] == {"s": {"0": 20, "1": 30}}


@pytest.mark.parametrize("engine", ["spark", "reference"])
def test_offsets_backfill_archive_read_as_committed_are_no_gaps(tmp_path, spark, engine):
    """An archive `backfill archive` wrote says which offsets each commit read from the broker (a read_committed
    consumer): offsets missing inside them are transaction markers or aborted records, not a gap. The same rows
    written by another writer do not say it: there they are a gap."""
    from backfill.io.archive import COVERED
    from backfill.io.delta import append_delta

    rows = [r for r in records() if not (r["partition"] == 1 and r["offset"] in (12, 13, 29))]
    archive = str(tmp_path / "archive" / "inputs" / "s")
    append_delta(spark, _delta_rows(spark, [r for r in rows if r["offset"] < 20]), archive,
                 metadata={"backfill.archive": "t", COVERED: json.dumps({"0": [0, 20], "1": [0, 20]})})
    append_delta(spark, _delta_rows(spark, [r for r in rows if r["offset"] >= 20]), archive,
                 metadata={"backfill.archive": "t", COVERED: json.dumps({"0": [20, 30], "1": [20, 30]})})
    archived = run(tmp_path / "archive", "delta", [], spark, engine=engine, path="inputs/s")
    assert archived["code"] == 0, archived["stderr"]
    assert archived["summary"]["gaps"] == {}  # 12-13: markers; 29 is the end of partition 1, not inside it
    other = str(tmp_path / "other" / "inputs" / "s")
    append_delta(spark, _delta_rows(spark, rows), other)
    elsewhere = run(tmp_path / "other", "delta", [], spark, engine=engine, path="inputs/s")
    assert elsewhere["summary"]["gaps"]["s"]["1"]["ranges"][0]["from"] == 12
    assert elsewhere["summary"]["gaps"]["s"]["1"]["offsets"] == 2


def _messy() -> list[dict[str, Any]]:
    """Copies, conflicts and gaps in several partitions, a gap across a chunk border (offsets 14-17)."""
    missing = {(2, 10), (2, 11), (2, 12), (2, 13), (0, 25), (1, 14), (1, 15), (1, 16), (1, 17)}
    rows = [{"topic": "t", "partition": p, "offset": i, "key": None if i % 11 == 5 else f"k{p}{i % 4}",
             "value": f"v{i % 5}", "timestamp": 700 * i + (3000 if i % 7 == 3 else 0)}
            for p in range(3) for i in range(40) if (p, i) not in missing]
    copies = [dict(r) for r in rows if r["offset"] % 6 == 1]
    conflicts = [dict(r, value="other") for r in rows if r["offset"] in (8, 33) and r["partition"] != 1]
    conflicts += [dict(r, timestamp=r["timestamp"] + 9000) for r in rows if (r["partition"], r["offset"]) == (1, 39)]
    return rows + copies + conflicts


PATHS = {"streamed": {}, "check by windows": {"offsets": {"USE_OPERATOR": False}},
         "windows": {"tasks": {"USE_OPERATOR": False}},
         "chunks": {"tasks": {"USE_OPERATOR": False, "CHUNK_OFFSETS": 8, "CHUNKED_PARTITIONS": 3}}}


@pytest.mark.parametrize("emit", ["final", "updates"])
def test_every_ordering_path_checks_offsets_as_the_reference_engine_does(tmp_path, spark, emit):
    """The operator's pass, Spark's windows, a large input's chunks of 8 offsets (a gap across a chunk border),
    with the one pass (final) and without (updates): the same outputs, ledger, copies and gaps."""
    import contextlib

    from backfill.order import offsets, tasks

    oracle = run(tmp_path / "reference", "jsonl", _messy(), spark, engine="reference", emit=emit)
    assert oracle["code"] == 0, oracle["stderr"]
    assert oracle["summary"]["duplicates"] and set(oracle["summary"]["gaps"]["s"]) == {"0", "1", "2"}
    assert oracle["summary"]["ledger"]["conflicting_offset"] == 10
    for label, patches in PATHS.items():
        with contextlib.ExitStack() as stack:
            for module, values in ((offsets, patches.get("offsets")), (tasks, patches.get("tasks"))):
                if values:
                    stack.enter_context(mock.patch.multiple(module, **values))
            got = run(tmp_path / label.replace(" ", "-"), "jsonl", _messy(), spark, emit=emit)
        assert got["code"] == 0, label + got["stderr"]
        assert _sorted(got["outputs"], ("task",)) == _sorted(oracle["outputs"], ("task",)), label
        assert _sorted(got["ledger"]) == _sorted(oracle["ledger"]), label
        assert got["summary"]["duplicates"] == oracle["summary"]["duplicates"], label
        ranges = {s: {p: {**g, "ranges": [{"from": r["from"], "to": r["to"]} for r in g["ranges"]]}
                      for p, g in parts.items()} for s, parts in got["summary"]["gaps"].items()}
        assert ranges == oracle["summary"]["gaps"], label


WINDOWS = {"session": "{type: session, gap: 5s, grace: 0ms}",
           "sliding": "{type: sliding, time_difference: 3s, grace: 0ms}",
           "hopping": "{type: hopping, size: 4s, advance: 2s, grace: 0ms}"}
def verify_job(path: object) -> str:
    """One source, an aggregate per kind of window (emit final), each to its own sink."""
    operators = "".join(f"  - name: {kind}\n    aggregate: {{input: s, window: {window}, aggregations: {{n: count()}}, "
                        "emit: final}\n" for kind, window in WINDOWS.items())
    sinks = "".join(f"  {kind}: {{format: jsonl, path: out/{kind}.jsonl}}\n" for kind in WINDOWS)
    return (f"name: gaps\nsources:\n  s: {{format: jsonl, path: {path}}}\noperators:\n{operators}sinks:\n{sinks}"
            "  _ledger: {format: jsonl, path: out/ledger.jsonl}\n  _runs: {format: jsonl, path: out/runs.jsonl}\n")


def test_verify_names_missing_input_from_the_runs_gap_record(tmp_path, spark):
    """The archive lost offsets 8-13 of key a; the stream saw them. verify explains each window they changed as
    missing_input, with the gap the run recorded as its evidence, for every kind of window (an operator each,
    one job: one run of the stream, one of the archive, one verify)."""
    rows = [{"topic": "t", "partition": 0, "offset": i, "key": "a", "value": "v", "timestamp": 1000 * i}
            for i in range(30)]
    write_jsonl(tmp_path / "full" / "s.jsonl", rows)
    write_jsonl(tmp_path / "archive" / "s.jsonl", [r for r in rows if not 8 <= r["offset"] <= 13])
    stream = tmp_path / "stream"
    stream.mkdir()
    (stream / "job.yaml").write_text(verify_job(tmp_path / "full" / "s.jsonl"))
    assert CliRunner().invoke(app, ["run", str(stream / "job.yaml")]).exit_code == 0
    (tmp_path / "job.yaml").write_text(verify_job("archive/s.jsonl"))
    result = CliRunner().invoke(app, ["run", str(tmp_path / "job.yaml"), "--json"])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["gaps"]["s"]["0"]["ranges"][0]["from"] == 8
    against = [arg for kind in WINDOWS for arg in ("--against", f"{kind}={stream / 'out' / kind}.jsonl")]
    result = CliRunner().invoke(app, ["verify", str(tmp_path / "job.yaml"), *against, "--report",
                                      str(tmp_path / "r"), "--json"])
    assert result.exit_code in (0, 1), result.stderr
    report = json.loads(result.stdout)
    sections = {s["name"]: s for s in report["sections"]}
    assert set(sections) == set(WINDOWS)
    for kind, section in sections.items():
        causes = {c: n for c, n in section["causes"].items() if n}
        assert causes.get("missing_input", 0) > 0 and "unexplained" not in causes, (kind, causes)
        assert "the input's offset gaps: recorded by run" in " ".join(section["notes"]), kind


def test_a_record_without_a_topic_is_in_its_partitions_queue_in_both_engines(tmp_path, spark):
    """A source is one topic: a JSONL record whose topic is null gets the source's, and is processed in its
    partition's offset order. Offset 25 of partition 0 has no topic and timestamp 3 s: by then stream time is
    24 s, so it is late for [0, 10s). Offset 12 of partition 1 is there twice, once without a topic and with
    another value: copies that differ, both ledgered."""
    rows = records()
    rows[25] = {**rows[25], "topic": None, "timestamp": 3000}
    rows.append({**rows[30 + 12], "topic": None, "value": "other"})
    got = {e: run(tmp_path / e, "jsonl", rows, spark, engine=e) for e in ("spark", "reference")}
    assert all(g["code"] == 0 for g in got.values()), [g["stderr"] for g in got.values()]
    fates = {e: sorted((r["reason"], r["partition"], r["offset"]) for r in g["ledger"]) for e, g in got.items()}
    assert fates["spark"] == fates["reference"] == [
        ("conflicting_offset", 1, 12), ("conflicting_offset", 1, 12), ("late", 0, 20), ("late", 0, 25)]
    assert _sorted(got["spark"]["outputs"]) == _sorted(got["reference"]["outputs"])
