"""Part: foundation. Topologies as the job declares them: the filters (`where`) before each operator, which
operators are table aggregations and stream-table joins, which operator reads another (docs/semantics.md
§15-§18). Pure: the Spark engine and the reference engine share it, as they share rekeys.py.
"""
from __future__ import annotations

from collections.abc import Callable

from backfill.jobspec.models import FoldAggregation, OperatorSpec
from backfill.jobspec.rekeys import rekeys, repartition_count


def wheres(op: OperatorSpec) -> dict[str, str]:
    """The filters before the operator: input source -> a Spark SQL boolean over its records (KStream#filter).

    An aggregate's or a rules operator's `where` filters its input (before a re-key); a join's `where.left`
    and `where.right` filter each side (the right side of a stream-table join is its table)."""
    if op.aggregate is not None:
        return {op.aggregate.input: op.aggregate.where} if op.aggregate.where else {}
    if op.rules is not None:
        return {op.rules.input: op.rules.where} if op.rules.where else {}
    assert op.join is not None
    where = op.join.where
    if where is None:
        return {}
    sides = ((op.join.left, where.left), (op.join.other, where.right))
    return {source: text for source, text in sides if text}


def where_field(op: OperatorSpec, source: str) -> str:
    """The job field of the filter on `source`, for messages."""
    if op.join is not None:
        side = "left" if source == op.join.left else "right"
        return f"operators.{op.name}.join.where.{side}"
    return f"operators.{op.name}.{op.kind}.where"


def is_table_aggregate(op: OperatorSpec) -> bool:
    """An aggregate without a window: KGroupedStream#aggregate, a table (docs/semantics.md §16)."""
    return op.aggregate is not None and op.aggregate.window is None


def is_table_join(op: OperatorSpec) -> bool:
    """A KStream-KTable join (docs/semantics.md §17)."""
    return op.join is not None and op.join.table is not None


def is_stream_join(op: OperatorSpec) -> bool:
    """A KStream-KStream join (docs/semantics.md §5)."""
    return op.join is not None and op.join.table is None


# ---------------------------------------------------------------------------------------------- chains
def upstream(op: OperatorSpec, operators: list[OperatorSpec]) -> OperatorSpec | None:
    """The operator whose forwarded stream `op` reads (docs/semantics.md §18), or None: it reads sources."""
    names = {o.name: o for o in operators}
    found = [names[i] for i in op.inputs if i in names and not op.reads_source(i)]
    return found[0] if found else None


def feeders(operators: list[OperatorSpec]) -> set[str]:
    """The operators another operator reads: each reads every record of its inputs (docs/semantics.md §18.4)."""
    return {up.name for op in operators if (up := upstream(op, operators)) is not None}


def chain_order(operators: list[OperatorSpec]) -> list[OperatorSpec]:
    """The chained operators (those reading another operator), each after the operator it reads."""
    chained = [op for op in operators if upstream(op, operators) is not None]
    return sorted(chained, key=lambda op: depth(op, operators))


def depth(op: OperatorSpec, operators: list[OperatorSpec]) -> int:
    """How many operators lie between `op` and the sources (0: it reads sources); the job has no cycle."""
    up = upstream(op, operators)
    return 0 if up is None else 1 + depth(up, operators)


def chain_problem(op: OperatorSpec, operators: list[OperatorSpec]) -> str | None:
    """Why `op` cannot read the operator it names, as `field: what; fix` (None: it can), docs/semantics.md §18.5."""
    up = upstream(op, operators)
    if up is None:
        return None
    field = f"operators.{op.name}.{op.kind}"
    if up.rules is not None:
        return f"{field}.input: {up.name!r} is a rules operator, whose alerts are no stream here; read a source"
    if op.rules is not None:
        return (f"{field}: reads operator {up.name!r}; a rules operator over a chained stream is not supported: "
                "read a source")
    if op.join is None:
        return None
    read = [side for side, name in (("left", op.join.left), ("right", op.join.other)) if not op.reads_source(name)]
    if len(read) > 1:
        return f"{field}: both inputs are operators; a join may read one operator, the other input a source"
    side = read[0]
    other = "right" if side == "left" else "left"
    if op.join.table is not None and side == "right":  # the stream beside it is a source in its tasks (§18.7)
        return table_problem(op, up, field)
    if op.join.table is not None and op.join.group_by is None:  # in the upstream join's tasks (§18.8)
        return stream_problem(op, up, field)
    if op.join.where is not None and getattr(op.join.where, other):
        return (f"{field}.where.{other}: a filter on the source beside an operator is not supported yet; filter "
                f"the source's topic before the job, or the operator's rows (where.{side})")
    if op.join.group_by is None:  # a stream-stream join in the upstream's tasks (§18.9)
        return stream_join_problem(op, up, field, side)
    if op.join.group_by is None or getattr(op.join.group_by, side) is None:
        return (f"{field}.group_by.{other}: re-keys the source while {up.name!r} is read as it is; re-key the "
                f"operator's side too (group_by: {{{side}: <new key>}}), or neither")
    return None


def in_task(op: OperatorSpec, operators: list[OperatorSpec]) -> bool:
    """Whether `op` runs in the tasks of the operator it reads, record by record beside its source: a
    stream-table join whose table a table aggregate computes (docs/semantics.md §18.7), or whose stream is
    a join's or a table aggregate's rows (§18.8), or a stream-stream join one of whose sides is a stream-table
    join's or a table aggregate's rows (§18.9); none re-keys."""
    up = upstream(op, operators)
    return up is not None and op.join is not None and not rekeys(op)


def beside(op: OperatorSpec, operators: list[OperatorSpec]) -> str:
    """The source a join in its upstream's tasks reads beside the operator's rows (`in_task`): its stream when
    the operator is its table (§18.7), its table when the operator is its stream (§18.8), a stream-stream
    join's other side (§18.9)."""
    assert op.join is not None
    up = upstream(op, operators)
    name = up.name if up is not None else None
    if op.join.table is not None:
        return op.join.left if op.join.table == name else op.join.table
    return op.join.other if op.join.left == name else op.join.left


def table_problem(op: OperatorSpec, up: OperatorSpec, field: str) -> str | None:
    """Why operator `up` cannot be `op`'s table (None: it can, docs/semantics.md §18.7): only a table aggregate
    over a source, not re-keyed, read by a stream that is not re-keyed either, into a plain store."""
    assert op.join is not None
    if not is_table_aggregate(up):
        return (f"{field}.table: {up.name!r} is no table (a windowed aggregate's keys are windows, a join's rows a "
                "stream); a table is a source or an aggregate without a window")
    assert up.aggregate is not None
    if not up.reads_source(up.aggregate.input):
        return (f"{field}.table: {up.name!r} reads operator {up.aggregate.input!r}; an aggregate's table is joined "
                "when the aggregate reads a source (a table two operators down is not modelled yet)")
    if up.aggregate.group_by is not None:
        return (f"{field}.table: {up.name!r} re-keys its input (its table lives in the tasks of its repartition "
                "topic), which is not modelled yet; give it no group_by, or read a source keyed as it needs")
    if op.join.group_by is not None:
        return (f"{field}.group_by: a re-keyed stream joined with an operator's table is not modelled yet; re-key "
                "the stream before the job, or join a source")
    if op.join.versioned is not None:
        return (f"{field}.versioned: an aggregate's table is a plain key-value store here; remove versioned")
    return None


def stream_problem(op: OperatorSpec, up: OperatorSpec, field: str) -> str | None:
    """Why stream-table join `op` cannot read operator `up`'s rows as its stream without a re-key (None: it can,
    docs/semantics.md §18.8): `up` is a join or a table aggregate over sources, not re-keyed, whose rows keep
    their key (a stream-table join without grace; a stream-stream join; an aggregate's every update), and `op`'s
    table is another topic."""
    assert op.join is not None
    fix = "re-key it (group_by: {left: <new key>}) to read it through a repartition topic"
    if not (up.join is not None or is_table_aggregate(up)):
        return (f"{field}.left: reads operator {up.name!r} without a re-key; in the upstream's tasks a join reads "
                "a join's or a table aggregate's rows only (a windowed aggregate's keys are windows, not the "
                f"table's keys): {fix}")
    problem = _as_is_problem(up, f"{field}.left", fix)
    if problem is not None:
        return problem
    if op.join.versioned is not None:
        return f"{field}.versioned: a join over an operator's rows reads a plain table here; remove versioned"
    if op.join.table in up.inputs:
        return (f"{field}.table: {op.join.table!r} is read by {up.name!r} too; one topic feeding both is not "
                "modelled: declare the topic twice")
    return None


def stream_join_problem(op: OperatorSpec, up: OperatorSpec, field: str, side: str) -> str | None:
    """Why stream-stream join `op` cannot read operator `up`'s rows as its `side` without a re-key (None: it can,
    docs/semantics.md §18.9): `up` is a stream-table join or a table aggregate over sources, not re-keyed, which
    forwards at most one row per record, at once, keeping the record's key; the other side is another topic."""
    assert op.join is not None
    fix = f"re-key it (group_by: {{{side}: <new key>}}) to read it through a repartition topic"
    if not ((up.join is not None and up.join.table is not None) or is_table_aggregate(up)):
        what = ("a stream-stream join forwards several rows at one record, and later ones" if up.join is not None
                else "a windowed aggregate's keys are windows, not the other side's keys")
        return (f"{field}.{side}: reads operator {up.name!r} without a re-key; in the upstream's tasks a "
                f"stream-stream join reads a stream-table join's or a table aggregate's rows only ({what}): {fix}")
    problem = _as_is_problem(up, f"{field}.{side}", fix)
    if problem is not None:
        return problem
    other = op.join.other if side == "left" else op.join.left
    if other in up.inputs:
        return (f"{field}.{'right' if side == 'left' else 'left'}: {other!r} is read by {up.name!r} too; one "
                "topic feeding both is not modelled: declare the topic twice")
    return None


def _as_is_problem(up: OperatorSpec, at: str, fix: str) -> str | None:
    """Why operator `up`'s rows cannot be read as they are, in its tasks (§18.8, §18.9), as a line about field `at`:
    it re-keys or reads an operator, or it is a stream-table join with a grace period."""
    if rekeys(up) or not all(up.reads_source(i) for i in up.inputs):
        return (f"{at}: {up.name!r} re-keys or reads an operator; its rows are read without a re-key only when it "
                f"reads sources as they are: {fix}")
    if up.join is not None and up.join.versioned is not None and up.join.versioned.grace:
        return (f"{at}: {up.name!r} has a grace period (its rows leave its buffer in another order than their "
                f"records'), which is not modelled here: {fix}")
    return None


def topology_problem(operators: list[OperatorSpec]) -> str | None:
    """What is wrong with who reads whom, as one line `field: what; fix` (None: nothing): a cycle, or a chain
    that is not supported (docs/semantics.md §18.5)."""
    loop = cycle(operators)
    if loop is not None:
        return (f"operators.{loop[0]}: the operators read each other in a cycle ({' -> '.join(loop)}); an input "
                "must be a source or an operator closer to the sources")
    return next((p for op in operators if (p := chain_problem(op, operators)) is not None), None)


def cycle(operators: list[OperatorSpec]) -> list[str] | None:
    """The names of a cycle of operators reading each other (input -> ... -> input), or None."""
    for op in operators:
        path = [op.name]
        current = op
        while (up := upstream(current, operators)) is not None:
            if up.name in path:
                return path[path.index(up.name):] + [up.name]
            path.append(up.name)
            current = up
    return None


def task_count(op: OperatorSpec, operators: list[OperatorSpec], count: Callable[[str], int]) -> int:
    """How many tasks `op` has, `count(source)` giving a source's partition count: its repartition topics'
    count when it re-keys (docs/semantics.md §13), else its first input's (a source, or the operator it reads:
    a chained stream stays in the task that forwarded it, §18.1)."""
    if rekeys(op):
        return repartition_count(op, lambda name: _input_count(op, name, operators, count))
    return _input_count(op, op.inputs[0], operators, count)


def _input_count(op: OperatorSpec, name: str, operators: list[OperatorSpec], count: Callable[[str], int]) -> int:
    up = None if op.reads_source(name) else next((o for o in operators if o.name == name), None)
    return count(name) if up is None else task_count(up, operators, count)


def tombstones(up: OperatorSpec) -> bool:
    """Whether an aggregate's row with every aggregation null is a tombstone, read downstream as a null value
    (docs/semantics.md §18.2): a session merged away, or a table whose only aggregation is a fold (§11, §16.3)."""
    spec = up.aggregate
    if spec is None:
        return False
    if spec.window is not None:
        return spec.window.type == "session"
    return len(spec.aggregations) == 1 and isinstance(next(iter(spec.aggregations.values())), FoldAggregation)
