"""Part: commands. The join example's "streaming output": what a live Kafka Streams application wrote for one
left join, with the differences a live application shows, each of which `backfill verify` explains.

Derived from the job's own input, deterministically: the join replayed by the reference engine, then

- throttle: an unmatched row comes out when the outer join's wall-clock throttle allows (1 s by default,
  docs/semantics.md §5.6), so a few are written after the next row of their key (-> emit_throttle);
- lag: the right-hand partition lagged (the application was at the live edge), so for a few left records the
  window closed in join stream time before their partner arrived: the record came out unmatched, then joined
  anyway (the join has no grace check, docs/semantics.md §5.2) (-> partner_after_close);
- duplicates: a producer retry wrote a few rows twice (at-least-once, docs/semantics.md §9; -> duplicate_delivery);
- boundary: the application ran on after the archive ends, so the records still waiting then came out
  unmatched (-> range_boundary).

Rows carry the output topic's partition (the task's: both topics are keyed alike) and offset, in order.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from backfill.errors import SpecError
from backfill.jobspec.load import load_job
from backfill.ops.join import JOINED, PHASE_BASE, STRIDE
from backfill.reference.engine import run_reference
from backfill.reference.expr import compile_scalar
from backfill.reference.join import _struct as joiner_view
from backfill.reference.records import read_records


def simulate_join(job_path: Path, operator: str, throttled: int = 3, lagged: int = 2,
                  duplicates: int = 2) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The simulated streaming output of a left or outer join `operator`, and what was planted."""
    job = load_job(job_path)
    op = job.spec.operator(operator)
    if op.join is None or op.join.how == "inner" or op.join.eager:
        raise SpecError(f"operators.{operator}: the stream sample simulates a left or outer join (spurious-result "
                        "fix on)")
    result = run_reference(job)
    joiner = compile_scalar(op.join.value)
    lefts = [dict(r, ts=r["timestamp"]) for r in read_records(job, op.join.left) if r["_problem"] is None]
    rights = [dict(r, ts=r["timestamp"]) for r in read_records(job, op.join.right) if r["_problem"] is None]

    def alone(rec: dict[str, Any]) -> dict[str, Any]:
        return {"key": rec["key"], "value": joiner({"key": rec["key"], "left": joiner_view(rec), "right": None}),
                "ts": rec["ts"]}

    rows = [{"key": r["key"], "value": r["value"], "ts": r["ts"], "partition": r["task"], "_seq": r["emit_seq"]}
            for r in sorted(result.outputs[operator], key=lambda r: (r["task"], r["emit_seq"]))]
    facts: dict[str, Any] = {"operator": operator, "throttled": [], "lagged": [], "duplicated": [], "ran_on": []}
    for _ in range(throttled):  # an unmatched row from the outer store, written after the next row of its key
        i = next((i for i, r in enumerate(rows) if r["key"] is not None and not r.get("_planted")
                  and _unmatched(r) and _joined_next(rows, i)), None)
        if i is None:
            break
        j = _next_of_key(rows, i)
        assert j is not None
        row = dict(rows.pop(i), _planted=True)
        rows.insert(j, row)  # right after that row (now at j - 1)
        facts["throttled"].append(_describe(row))
    for row in _partnered(rows, lefts, rights, joiner, op.join.window.before, op.join.window.after, lagged):
        at = rows.index(row[0])  # the left record unmatched, written just before its joined row
        rows.insert(at, {**alone(row[1]), "partition": row[0]["partition"], "_planted": True})
        facts["lagged"].append(_describe(rows[at]))
    for n in range(duplicates):
        i = (n + 1) * len(rows) // (duplicates + 1)
        rows.insert(i + 1, dict(rows[i], _planted=True))
        facts["duplicated"].append(_describe(rows[i]))
    for waiting in result.incomplete.get(operator, []):  # the application ran on: the window closed later
        rec = next((r for r in lefts if r["key"] == waiting["key"] and r["ts"] == waiting["ts"]
                    and r["partition"] == waiting["task"]), None)
        if waiting["side"] == "left" and rec is not None:
            rows.append({**alone(rec), "partition": waiting["task"], "_planted": True})
            facts["ran_on"].append(_describe(rows[-1]))
    offsets: dict[int, int] = {}
    out = []
    for r in rows:
        offset = offsets.get(r["partition"], 0)
        offsets[r["partition"]] = offset + 1
        out.append({"key": r["key"], "value": json.dumps(r["value"]), "ts": r["ts"], "partition": r["partition"],
                    "offset": offset})
    facts["rows"] = len(out)
    return out, facts


def _unmatched(row: dict[str, Any]) -> bool:
    """A row the outer store emitted (docs/semantics.md §5.3): the first phase of its record's emissions."""
    return row["_seq"] % STRIDE < PHASE_BASE[JOINED]


def _joined_next(rows: list[dict[str, Any]], i: int) -> bool:
    """The next row of row i's key is a joined row that is not planted."""
    j = _next_of_key(rows, i)
    return j is not None and not rows[j].get("_planted") and "_seq" in rows[j] and not _unmatched(rows[j])


def _next_of_key(rows: list[dict[str, Any]], i: int) -> int | None:
    """Index of the next row after i with the same key and partition."""
    return next((j for j in range(i + 1, len(rows)) if rows[j]["key"] == rows[i]["key"]
                 and rows[j]["partition"] == rows[i]["partition"]), None)


def _partnered(rows: list[dict[str, Any]], lefts: list[dict[str, Any]], rights: list[dict[str, Any]], joiner: Any,
               before: int, after: int, n: int) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Up to n joined rows whose left record joined exactly one partner: (the row, the left record)."""
    out = []
    by_key: dict[Any, list[dict[str, Any]]] = {}
    for r in rights:
        by_key.setdefault(r["key"], []).append(r)
    for left in lefts:
        if left["key"] is None or left["value"] is None:
            continue
        partners = [r for r in by_key.get(left["key"], []) if r["value"] is not None
                    and left["ts"] - before <= r["ts"] <= left["ts"] + after]
        if len(partners) != 1:
            continue
        value = joiner({"key": left["key"], "left": joiner_view(left), "right": joiner_view(partners[0])})
        row = next((r for r in rows if r["key"] == left["key"] and r["value"] == value and not r.get("_planted")
                    and r["ts"] == max(left["ts"], partners[0]["ts"])), None)
        if row is not None:
            out.append((row, left))
        if len(out) == n:
            break
    return out


def _describe(row: dict[str, Any]) -> str:
    return f"{row['key']}@{row['ts']}"


def write_join_stream_sample(job_path: Path, operator: str, path: Path) -> dict[str, Any]:
    """Simulate and write the streaming output as JSONL (key, value as JSON text, ts, partition, offset)."""
    rows, facts = simulate_join(job_path, operator)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return facts
