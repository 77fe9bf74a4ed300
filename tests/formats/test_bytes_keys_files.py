"""`key.format: bytes` from JSONL: base64 text under `key_b64` reads as the key's bytes, the same key a parquet
source's binary column gives (outputs, re-keying by the raw bytes, ledger), in both engines; a string under
`key` reads as before; a `key_b64` that is not base64 is unreadable (docs/job-spec.md "Real data formats")."""
from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from backfill.cli import app
from backfill.errors import SourceError
from backfill.jobspec.load import load_job
from backfill.reference.engine import run_reference
from backfill.reference.repartition import partition_for
from tests.conftest import read_jsonl

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ODD = b"\xff\x00\x80"  # not UTF-8: a key only base64 (or a binary column) can carry
# key, timestamp: offset 3 has no key (null_key); offset 6 is late for b"z" (its window closed at 2h)
RECORDS: list[tuple[bytes | None, int]] = [(b"abc", 1000), (ODD, 2000), (b"abc", 3000), (None, 4000), (ODD, 5000),
                                           (b"z", 7_200_000), (b"z", 10)]
REKEY = "group_by: {key: key, format: bytes, partitions: 3}, "


def _rows(records: list[tuple[bytes | None, int]]) -> list[dict[str, Any]]:
    return [{"topic": "t", "partition": 0, "offset": i, "timestamp": ts, "value": f"v{i}"}
            for i, (_, ts) in enumerate(records)]


def _jsonl_b64(path: Path, records: list[tuple[bytes | None, int]]) -> None:
    lines = [{**row, **({} if k is None else {"key_b64": base64.b64encode(k).decode()})}
             for row, (k, _) in zip(_rows(records), records)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def _parquet(path: Path, records: list[tuple[bytes | None, int]]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = _rows(records)
    pq.write_table(pa.table({"topic": [r["topic"] for r in rows],
                             "partition": pa.array([r["partition"] for r in rows], pa.int32()),
                             "offset": [r["offset"] for r in rows],
                             "key": pa.array([k for k, _ in records], pa.binary()),
                             "value": [r["value"] for r in rows], "timestamp": [r["timestamp"] for r in rows]}), path)


def _job(folder: Path, source: str, rekey: str = "", on_error: str = "skip") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    job = folder / "job.yaml"
    job.write_text(f"""
name: bytes-keys
sources:
  s: {{{source}, key: {{format: bytes}}, on_error: {on_error}}}
operators:
  - name: c
    aggregate: {{input: s, {rekey}window: {{type: tumbling, size: 1h, grace: 0ms}}, emit: updates,
                 aggregations: {{n: count(), vs: {{fold: {{init: "''", step: "concat(acc, value)"}}}}}}}}
sinks:
  c: {{format: jsonl, path: out/c.jsonl}}
  _ledger: {{format: jsonl, path: out/ledger.jsonl}}
""")
    return job


def _spark(job: Path) -> tuple[list[dict], list[dict]]:
    result = CliRunner().invoke(app, ["run", str(job), "--json"])
    assert result.exit_code == 0, result.stderr
    rows = read_jsonl(job.parent / "out/c.jsonl")  # a binary key as the JSON sink writes it: base64
    return [{**r, "key": base64.b64decode(r["key"])} for r in rows], read_jsonl(job.parent / "out/ledger.jsonl")


def _reference(job: Path) -> tuple[list[dict], list[dict]]:
    ref = run_reference(load_job(job))
    return ref.outputs["c"], ref.ledger


def _sorted(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: json.dumps(r, sort_keys=True, default=repr))


@pytest.mark.parametrize("rekey", ["", REKEY], ids=["own-key", "group_by-bytes"])
def test_key_b64_reads_as_the_binary_key_a_parquet_source_gives(tmp_path, spark, rekey):
    _jsonl_b64(tmp_path / "in.jsonl", RECORDS)
    _parquet(tmp_path / "in.parquet", RECORDS)
    jsonl = _job(tmp_path / "jsonl", f"format: jsonl, path: {tmp_path / 'in.jsonl'}", rekey)
    parquet = _job(tmp_path / "parquet", f"format: parquet, path: {tmp_path / 'in.parquet'}", rekey)
    spark_rows, spark_ledger = _spark(jsonl)
    ref_rows, ref_ledger = _reference(jsonl)
    # the same records, the same outputs and ledger: JSONL and parquet, Spark and the reference engine
    assert (_sorted(spark_rows), _sorted(spark_ledger)) == tuple(map(_sorted, _spark(parquet)))
    assert (ref_rows, ref_ledger) == _reference(parquet)
    assert _sorted(spark_rows) == _sorted(ref_rows) and _sorted(spark_ledger) == _sorted(ref_ledger)

    assert sorted((r["key"], r["n"], r["vs"]) for r in spark_rows) == [
        (b"abc", 1, "v0"), (b"abc", 2, "v0v2"), (b"z", 1, "v5"), (ODD, 1, "v1"), (ODD, 2, "v1v4")]
    ledger = {r["offset"]: r for r in spark_ledger}
    assert sorted(ledger) == [3, 6] and ledger[3]["reason"] == "null_key" and ledger[3]["key"] is None
    assert (ledger[6]["reason"], ledger[6]["key"]) == ("late", "7A")  # the key's bytes in hex
    if rekey:  # re-keyed by Kafka's partitioner: murmur2 over the raw bytes, 3 partitions
        tasks = {r["key"]: r["task"] for r in spark_rows}
        assert tasks == {k: partition_for(k, 3) for k in (b"abc", ODD, b"z")}
        assert len(set(tasks.values())) > 1
        assert ledger[6]["detail"] == f"re-keyed to c-repartition/{partition_for(b'z', 3)}"


def test_a_string_under_key_reads_as_before(tmp_path, spark):
    """A bytes key written as a JSON string under `key` (no key_b64): its UTF-8, as before, in both engines."""
    rows = _rows([(None, 1000), (None, 2000), (None, 3000)])
    lines = [{**row, "key": k} for row, k in zip(rows, ["abc", "é", "abc"])]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    job = _job(tmp_path / "job", f"format: jsonl, path: {tmp_path / 'in.jsonl'}")
    rows, ledger = _spark(job)
    assert sorted((r["key"], r["n"]) for r in rows) == [(b"abc", 1), (b"abc", 2), ("é".encode(), 1)] and ledger == []
    ref_rows, ref_ledger = _reference(job)
    assert sorted((r["key"], r["n"]) for r in ref_rows) == [("abc", 1), ("abc", 2), ("é", 1)] and ref_ledger == []


BAD_LINES = {1: ({"key_b64": "not base64!"}, "unreadable key: key_b64 is not base64"),
             2: ({"key_b64": 12}, "unreadable key: key_b64 is a JSON integer; key.format: bytes reads base64 text"),
             3: ({"key": "abc", "key_b64": "YWJj"},
                 "unreadable key: the line has both key and key_b64; key.format: bytes reads one (base64 text under "
                 "key_b64, or a string under key)")}


def _bad_input(path: Path) -> Path:
    rows = _rows([(None, 1000 * i) for i in range(4)])
    rows[0]["key_b64"] = base64.b64encode(ODD).decode()
    for offset, (fields, _) in BAD_LINES.items():
        rows[offset].update(fields)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_key_b64_that_is_not_base64_is_unreadable_under_skip(tmp_path, spark):
    path = _bad_input(tmp_path / "in.jsonl")
    job = _job(tmp_path / "job", f"format: jsonl, path: {path}")
    rows, ledger = _spark(job)
    ref_rows, ref_ledger = _reference(job)
    assert all(r["detail"].endswith(f" in {path}") for r in ledger)  # the Spark engine names the file, too
    ledger = [{**r, "detail": r["detail"].removesuffix(f" in {path}")} for r in ledger]
    causes = {offset: cause for offset, (_, cause) in BAD_LINES.items()}
    assert {r["offset"]: (r["reason"], r["detail"]) for r in ledger} == {
        o: ("unreadable", c) for o, c in causes.items()}
    assert _sorted(ledger) == _sorted(ref_ledger)
    assert [(r["key"], r["n"]) for r in rows] == [(ODD, 1)] and [(r["key"], r["n"]) for r in ref_rows] == [(ODD, 1)]
    # the line with both keeps its key_b64 bytes in the ledger, in both engines
    assert {r["offset"]: r["key"] for r in ledger} == {1: None, 2: None, 3: "616263"}


def test_a_key_b64_that_is_not_base64_under_fail_stops_naming_file_and_line(tmp_path, spark):
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps({**_rows([(None, 0)])[0], "key_b64": base64.b64encode(ODD).decode()}) + "\n"
                    + json.dumps({**_rows([(None, 0), (None, 1)])[1], "key_b64": "%%%"}) + "\n")
    job = _job(tmp_path / "job", f"format: jsonl, path: {path}", on_error="fail")
    result = CliRunner().invoke(app, ["run", str(job), "--json"])
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert str(path) in result.stderr and "line 2" in result.stderr and "key_b64 is not base64" in result.stderr
    assert not (tmp_path / "job/out/c.jsonl").exists()
    with pytest.raises(SourceError, match="key_b64 is not base64"):
        run_reference(load_job(job))
