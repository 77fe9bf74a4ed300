"""A run parses a JSON value once and keeps only the fields its operators read; every value is still checked
against the whole schema, so what is unreadable does not depend on what the job reads."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from backfill.jobspec.load import load_job
from backfill.plan.builder import build_plan
from backfill.plan.evaluator import value_fields
from tests.golden.harness import run_job

pytestmark = pytest.mark.spark
SCHEMA = {"type": "object", "properties": {"user": {"type": "string"}, "page": {"type": "string"},
                                           "amount": {"type": ["number", "null"]}, "ts": {"type": "integer"}}}
VALUES = [
    {"user": "u1", "page": "/a", "amount": 1.5, "ts": 1},
    {"user": "u1", "page": 7, "amount": 2, "ts": 2},  # a number in a text field: Spark reads its JSON text
    {"user": {"id": 3}, "page": "/b", "amount": None, "ts": 3},  # an object in a text field: the same
    {"user": "u1", "page": "/c", "amount": 4, "ts": "three"},  # a text in an integer field: unreadable
    {"user": "u1", "page": "/d", "amount": "four", "ts": 5},  # a text in a number field: unreadable
    "not json",
]


def _job(tmp: Path, aggregations: str, schema: dict | None = None) -> str:
    (tmp / "click.json").write_text(json.dumps(schema or SCHEMA))
    (tmp / "inputs").mkdir(parents=True, exist_ok=True)
    texts = [v if isinstance(v, str) else json.dumps(v) for v in VALUES]
    pq.write_table(pa.table({"partition": [0] * len(texts), "offset": list(range(len(texts))),
                             "key": ["k"] * len(texts), "value": texts, "timestamp": list(range(10, 10 + len(texts)))}),
                   tmp / "inputs" / "clicks.parquet")
    return f"""
name: fields
sources:
  clicks: {{format: parquet, path: inputs/clicks.parquet, on_error: skip,
           value: {{format: json, schema: {tmp / 'click.json'}}}}}
operators:
  - name: agg
    aggregate:
      input: clicks
      window: {{type: tumbling, size: 1m, grace: 0ms}}
      aggregations: {aggregations}
      emit: updates
sinks:
  agg: {{format: jsonl, path: out/agg.jsonl}}
  _ledger: {{format: jsonl, path: out/ledger.jsonl}}
  _runs: {{format: jsonl, path: out/runs.jsonl}}
"""


def test_what_is_unreadable_does_not_depend_on_the_fields_read(tmp_path, spark):
    narrow = tmp_path / "narrow"
    narrow.mkdir()
    job = _job(narrow, "{n: count(), total: sum(VALUE.Amount)}")  # Spark SQL names ignore case
    (narrow / "job.yaml").write_text(job)
    assert value_fields(build_plan(load_job(narrow / "job.yaml"))) == {"amount"}
    got = run_job(narrow, job, {})
    whole = tmp_path / "whole"
    whole.mkdir()
    everything = run_job(whole, _job(whole, "{n: count(), total: sum(VALUE.Amount), all: 'max(to_json(value))'}"),
                         {})
    assert got.code == 0 and everything.code == 0, got.stderr + everything.stderr
    def last(outcome):
        return max(outcome.outputs["agg"], key=lambda r: r["emit_seq"])
    assert (last(got)["n"], last(got)["total"]) == (last(everything)["n"], last(everything)["total"]) == (3, 3.5)
    # to_json leaves out nulls
    assert json.loads(last(everything)["all"]) == {"user": '{"id":3}', "page": "/b", "ts": 3}

    def unreadable(outcome):
        return sorted((r["offset"], r["reason"], r["detail"]) for r in outcome.ledger)
    assert unreadable(got) == unreadable(everything) == [
        (3, "unreadable", "unreadable value: not a JSON object matching the value schema"),
        (4, "unreadable", "unreadable value: not a JSON object matching the value schema"),
        (5, "unreadable", "unreadable value: not a JSON object matching the value schema")]


@pytest.mark.parametrize(("aggregations", "fields"), [
    ("{n: count()}", set()),
    ("{t: sum(value.amount), u: 'max(value.`user`)'}", {"amount", "user"}),
    ("{f: {fold: {init: \"''\", step: \"concat(acc, value)\"}}}", None),
])
def test_the_fields_a_job_reads(tmp_path, aggregations, fields):
    (tmp_path / "job.yaml").write_text(_job(tmp_path, aggregations))
    assert value_fields(build_plan(load_job(tmp_path / "job.yaml"))) == fields


def test_a_job_that_reads_no_field_of_a_text_only_value(tmp_path, spark):
    """Only text fields, none read: the value is still parsed (a non-object is unreadable) and kept as present."""
    text_only = {"type": "object", "properties": {"user": {"type": "string"}, "page": {"type": "string"}}}
    got = run_job(tmp_path, _job(tmp_path, "{n: count()}", text_only), {})
    assert got.code == 0, got.stderr
    assert max(got.outputs["agg"], key=lambda r: r["emit_seq"])["n"] == 5
    assert [(r["offset"], r["reason"]) for r in got.ledger] == [(5, "unreadable")]


def test_values_that_are_all_empty_objects(tmp_path, spark):
    """No schema, every value `{}`: the value has no field to keep; the run counts every record."""
    job = _job(tmp_path, "{n: count()}").replace(f", schema: {tmp_path / 'click.json'}", "")
    pq.write_table(pa.table({"partition": [0] * 3, "offset": [0, 1, 2], "key": ["k"] * 3, "value": ["{}"] * 3,
                             "timestamp": [10, 11, 12]}), tmp_path / "inputs" / "clicks.parquet")  # in place of _job's
    assert "schema" not in job
    got = run_job(tmp_path, job, {})
    assert got.code == 0, got.stderr
    assert max(got.outputs["agg"], key=lambda r: r["emit_seq"])["n"] == 3 and got.ledger == []


def test_an_operator_kind_that_does_not_say_what_it_reads_is_never_narrowed(tmp_path):
    import dataclasses

    from backfill.ops.base import Operator
    from backfill.ops.registry import OPERATORS

    (tmp_path / "job.yaml").write_text(_job(tmp_path, "{total: sum(value.amount)}"))
    plan = build_plan(load_job(tmp_path / "job.yaml"), None, None)
    assert value_fields(plan) == {"amount"}
    op = plan.operators[0]
    # the same operator as a kind that inherits Operator.expressions (says nothing): the whole value is read
    silent = type("Silent", (type(op),), {"expressions": Operator.expressions})
    mute = silent(**{f.name: getattr(op, f.name) for f in dataclasses.fields(op)})
    assert value_fields(dataclasses.replace(plan, operators=(mute,))) is None
    # every registered kind but the rules operator (it reads its values as text) says what it reads
    saying = {kind for kind, cls in OPERATORS.items() if cls.expressions is not Operator.expressions}
    assert saying == set(OPERATORS) - {"rules"}
