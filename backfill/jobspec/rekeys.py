"""Part: job spec. Re-keying (`group_by`) as the job declares it: which inputs of an operator are re-keyed,
the repartition topics they write, what a re-keyed join reads, and the topics' partition count
(docs/semantics.md §13). Pure: the Spark engine (ops/repartition.py) and the reference engine share it.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from backfill.errors import SpecError
from backfill.jobspec.models import GroupBySpec, OperatorSpec

SUFFIX = "-repartition"
# the detail of the `null_key` ledger row of a record whose re-key gave a null key and that never reached the
# repartition topic (docs/semantics.md §13)
NOT_REPARTITIONED = "group_by gave a null key: not repartitioned"


@dataclass(frozen=True)
class Rekey:
    """One re-keyed input of an operator: the source it re-keys and the repartition topic it writes."""

    op: str  # the operator
    input: str  # the source whose records are re-keyed
    spec: GroupBySpec
    topic: str  # the repartition topic: a derived source of that name
    where: str  # the job field, for messages
    keep_null: bool = False  # a null new key passes (before a left/outer join, Kafka Streams 3.7+)


def regrouped(op: OperatorSpec) -> GroupBySpec | None:
    """The aggregate's re-key, if it has one."""
    return op.aggregate.group_by if op.aggregate is not None else None


def rekeys(op: OperatorSpec, null_keys_reach_join: bool = True) -> list[Rekey]:
    """Every re-keyed input of the operator (an aggregate's one, a join's one or two)."""
    if op.aggregate is not None and op.aggregate.group_by is not None:
        return [Rekey(op.name, op.aggregate.input, op.aggregate.group_by, f"{op.name}{SUFFIX}",
                      f"operators.{op.name}.aggregate.group_by")]
    if op.join is None or op.join.group_by is None:
        return []
    # a repartition before a left or outer join lets null keys through (both sides: the join drops those of
    # its inner side itself, after its stream time has seen them)
    relaxed = null_keys_reach_join and op.join.how != "inner"
    sides = {"left": (op.join.left, op.join.group_by.left), "right": (op.join.other, op.join.group_by.right)}
    return [Rekey(op.name, source, spec, f"{op.name}-{side}{SUFFIX}", f"operators.{op.name}.join.group_by.{side}",
                  keep_null=relaxed)
            for side, (source, spec) in sides.items() if spec is not None]


def join_streams(op: OperatorSpec) -> tuple[str, str]:
    """The sources a join reads (a stream-table join: its stream, then its table): its inputs, or, when it
    re-keys, its repartition topics and copies of the inputs it keeps (read by the join's own tasks, merged with
    the repartition partitions)."""
    assert op.join is not None
    spec = op.join
    if spec.group_by is None:
        return spec.left, spec.other
    return (f"{op.name}-left{SUFFIX if spec.group_by.left else ''}",
            f"{op.name}-right{SUFFIX if spec.group_by.right else ''}")


def copied(op: OperatorSpec) -> list[tuple[str, str]]:
    """(source, stream) for each input of a re-keyed join that is not re-keyed itself."""
    if op.join is None or op.join.group_by is None:
        return []
    left, right = join_streams(op)
    return [(src, name) for src, name, spec in ((op.join.left, left, op.join.group_by.left),
                                               (op.join.other, right, op.join.group_by.right)) if spec is None]


def stream_name(op: OperatorSpec) -> str:
    """The source an aggregate reads: its input, or its repartition topic when it re-keys."""
    assert op.aggregate is not None
    return f"{op.name}{SUFFIX}" if op.aggregate.group_by else op.aggregate.input


def rekey_why(op: OperatorSpec) -> list[str]:
    """What `plan` says about a re-keyed operator's repartition topics."""
    out = []
    for r in rekeys(op):
        kept = [src for src, _ in copied(op)]
        count = (f"{r.spec.partitions} partition{'s' if r.spec.partitions > 1 else ''}" if r.spec.partitions
                 else f"as many partitions as {r.input}" if op.join is None
                 else f"as many partitions as {kept[0]}" if kept
                 else f"as many partitions as the larger of {op.join.left} and {op.join.right}")
        outer = op.join is not None and (op.join.how == "outer" or r.topic.endswith(f"-left{SUFFIX}"))
        nulls = (f"a null key passes (to the upstream partition's number, modulo the count: the real producer "
                 f"picks one) and {'is emitted unjoined' if outer else 'is dropped by the join (ledger: null_key)'}"
                 if r.keep_null else "a null key is dropped there (ledger: null_key)")
        serde = (f"; the key serialized as Avro in the registry's wire format, assuming schema id {r.spec.schema_id} "
                 "(the 5-byte header is hashed too)" if r.spec.format == "avro" else "")
        out.append(f"re-key: each record of {r.input} gets the key {r.spec.key} and is written to {r.topic} ({count}, "
                   f"partition = murmur2 of the serialized key{serde}); {nulls}. Each partition interleaves the upstream "
                   "tasks by the partition time at which they processed the record (a model: the real interleaving "
                   "depends on timing)")
    for src, name in copied(op):
        out.append(f"{src} is read by the join's tasks as it is ({name}: its partitions merged with the "
                   "repartition topic's by head timestamp)")
    return out


def repartition_count(op: OperatorSpec, count: Callable[[str], int]) -> int:
    """The partition count of an operator's repartition topics, `count(source)` giving an input's.

    Declared on the group_by, else the input topic's (Kafka Streams sizes a repartition topic like the
    source topics of the sub-topology that writes it). A join's inputs are co-partitioned: every repartition
    topic takes the count of an input read as it is, else the largest; counts that cannot agree are an error
    (Kafka Streams refuses to start).
    """
    if op.aggregate is not None:
        spec = regrouped(op)
        assert spec is not None
        return spec.partitions or count(op.aggregate.input)
    fixed = {r.where + ".partitions": r.spec.partitions for r in rekeys(op) if r.spec.partitions}
    fixed.update({f"sources.{src}": count(src) for src, _ in copied(op)})
    if len(set(fixed.values())) > 1:
        shown = ", ".join(f"{k}: {v}" for k, v in fixed.items())
        raise SpecError(f"operators.{op.name}.join.group_by: co-partitioned join inputs need one partition count, "
                        f"got {shown}; drop group_by's partitions or make them equal")
    if fixed:
        return next(iter(fixed.values()))
    return max(count(r.input) for r in rekeys(op))


def subtopologies(operators: list[OperatorSpec], sources: list[str]) -> dict[str, int]:
    """Each source's sub-topology, numbered from 0 in the order of the first source of each (docs/semantics.md
    §2.5): the sources one operator reads as they are belong together; a re-keyed input is read by a
    sub-topology of its own that writes the repartition topic, and the input a re-keyed join keeps as it is
    is read by the join's downstream tasks. Kafka Streams gives every sub-topology its own tasks, so each
    has its own PartitionGroup: a queue of one never takes part in another's choice."""
    parent = {s: s for s in sources}

    def root(s: str) -> str:
        while parent[s] != s:
            parent[s] = parent[parent[s]]
            s = parent[s]
        return s

    named = {op.name: op for op in operators}
    for op in operators:
        if rekeys(op) or op.rules is not None:
            continue
        read = [s for s in op.inputs if s in parent]
        # an operator read without a re-key runs in its upstream's tasks: a table aggregate's source belongs
        # with the stream that joins its table (§18.7)
        read += [s for name in op.inputs if name in named and not rekeys(named[name])
                 for s in named[name].inputs if s in parent]
        for other in read[1:]:
            parent[root(other)] = root(read[0])
    numbers: dict[str, int] = {}
    return {s: numbers.setdefault(root(s), len(numbers)) for s in sources}
