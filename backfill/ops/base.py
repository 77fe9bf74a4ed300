"""Part: operators. What every operator is to the rest of the house: the `Operator` type and its result.

The plan builder makes one Operator per job operator (`backfill.ops.registry`); the plan prints it and the
evaluator runs it, through these methods only, in this order:

1. `stream_time_columns()`: the stream-time columns the task order computes for it (name -> which records
   advance it), before any operator runs;
2. `count_columns()` and `counts()`: its share of the one counting pass over the ordered records
   (records in, contributing, dropped by reason), which also fails fast on what cannot be published;
3. `run()`: its output and ledger rows, lazily;
4. `settle()`: the counts that only its ledger knows; the conservation check then holds for every operator
   alike (records in == contributing + dropped, late ledger rows == late pairs);
5. `OperatorResult.publishable()` and `output_suite()`: the rows in the range, with the checks that run
   right before the commit (backfill/checks runs them).

Beside them, what the rest of the house asks of every operator, answered by the base class where a kind has
nothing to say: `reads()` and `expressions()` (which record columns and JSON fields the run must keep; by
default all of them), `one_pass()` (whether plan/fused.py can run it: only a window aggregate says yes),
`profile` (the Kafka Streams release whose rules apply, set by the registry), `verified_as` and `noun` (how
`verify` reconciles it, or the one line that says it does not).

Adding an operator is one module with a subclass plus one line in `registry.py`, then the reference engine's
counterpart and its tests; `verify` reconciles it once its `verified_as` names a way.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from backfill.errors import PublishError
from backfill.jobspec import versions
from backfill.jobspec.rekeys import rekeys
from backfill.jobspec.topology import wheres

if TYPE_CHECKING:
    from backfill.jobspec.load import Job
    from backfill.jobspec.models import OperatorSpec

InRange = Callable[[str], Column]  # column name -> "its value is inside the run's range"


@dataclass
class OperatorCounts:
    """Conservation of one operator: in = contributing + dropped (by reason) + filtered (its `where`)."""

    records_in: int = 0
    contributing: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    late_pairs: int = 0
    outputs: int = 0
    incomplete_windows: int = 0
    final_stream_time: dict[int, int] = field(default_factory=dict)
    kind: str = "aggregate"
    filtered: int = 0  # dropped by its `where` before it (no ledger row: docs/semantics.md §15)

    @property
    def balanced(self) -> bool:
        """records_in == contributing + every dropped record + every filtered one."""
        return self.records_in == self.contributing + sum(self.dropped.values()) + self.filtered


@dataclass(frozen=True)
class Check:
    """One expectation on rows: its great-expectations class name, arguments and what it means in our words."""

    kind: str
    args: dict[str, Any]
    says: str


@dataclass(frozen=True)
class OutputSuite:
    """What an operator's output must meet before it is published (and what `verify` checks a stream against):
    row checks on `frame` (the output plus the derived columns they read), and `unique` columns."""

    frame: DataFrame
    checks: list[Check]
    unique: tuple[str, ...] = ()
    stride: int = 1  # how far apart the last unique column's values are (a window start's: the advance)


@dataclass(frozen=True)
class Publishable:
    """What a sink writes for one operator, and what is checked right before its commit."""

    output: DataFrame
    incomplete: Callable[[], int] | None = None  # counted after the write (open windows, waiting rows)
    before_commit: Callable[[DataFrame], None] | None = None  # raises PublishError: nothing is committed


@dataclass(frozen=True)
class OperatorResult:
    """What one operator produced: output rows and ledger rows (lazy), and the frames to release afterwards."""

    output: DataFrame
    ledger: DataFrame
    range_column: str
    incomplete: DataFrame | None = None
    cached: tuple[DataFrame, ...] = ()

    def forwarded_rows(self) -> DataFrame:
        """The rows an operator reading this one reads (docs/semantics.md §18.2), each with the `task` that
        forwarded it and its place in that task's emission order (`emit_seq`)."""
        return self.output

    def publishable(self, in_range: InRange) -> Publishable:
        """The output rows inside the range, and how many rows are incomplete there."""
        inside = in_range(self.range_column)
        incomplete = self.incomplete.where(inside).count if self.incomplete is not None else None
        return Publishable(self.output.where(inside), incomplete)


@dataclass(frozen=True)
class Operator(ABC):
    """One operator of a plan, as `backfill plan` prints it and as `backfill run` executes it.

    The printed fields say what it does and why it reads what it reads; `spec` is the job's operator
    and `index` its position, which names its internal columns (see `backfill.columns`).
    """

    name: str
    kind: str
    inputs: tuple[str, ...]
    window: str
    emit: str
    sink: str | None
    warmup_ms: int = 0
    cooldown_ms: int = 0
    last_window_start: int | None = None
    close_time: int | None = None
    why: tuple[str, ...] = ()
    implemented: bool = True
    not_implemented_reason: str | None = None
    spec: OperatorSpec | None = field(default=None, repr=False, compare=False)
    index: int = field(default=0, repr=False, compare=False)
    # the Kafka Streams release whose rules apply (jobspec/versions.py; the registry sets the job's)
    profile: versions.Profile = field(default_factory=lambda: versions.profile(None), repr=False, compare=False)

    # the output column that --start/--end select on
    range_column: ClassVar[str] = "window_start"
    # reads every record of its sources, whatever the range (no warm-up or cool-down cut)
    reads_all: ClassVar[bool] = False
    # its inputs are one task's queues (Kafka Streams co-partitioning); False: they are not partitioned together
    copartitioned: ClassVar[bool] = True
    noun: ClassVar[str] = "operator"  # what a message calls it
    # how `verify` reconciles its output with a stream's (verify/runner.py: "windows", "join"); None: it does not
    verified_as: ClassVar[str | None] = None
    # printed by `plan --json` (everything but the job's own spec and the position)
    HIDDEN: ClassVar[tuple[str, ...]] = ("spec", "index", "profile")

    @classmethod
    @abstractmethod
    def from_job(cls, job: Job, spec: OperatorSpec, index: int, sink: str | None, start: int | None,
                 end: int | None) -> Operator:
        """Validate the job's operator and decide its warm-up and cool-down for the range [start, end)."""

    def describe(self) -> dict[str, Any]:
        """The printed fields, JSON-ready."""
        return {f.name: (list(v) if isinstance(v := getattr(self, f.name), tuple) else v)
                for f in fields(self) if f.name not in self.HIDDEN}

    def grace_ms(self) -> int:
        """Its grace: how long after a window's end (a join's bound) a late record still counts."""
        spec = self.spec
        if spec is not None and spec.aggregate is not None and spec.aggregate.window is not None:
            return spec.aggregate.window.grace_ms
        return 0

    def settled_by(self, end: int) -> int:
        """The stream time at which its outputs with a range value below `end` are final (scheduled runs wait
        for every source's data to reach it): the close time of the last window before `end`."""
        return self.close_time if self.close_time is not None else end + self.cooldown_ms

    @property
    def stream_time(self) -> str:
        """The name of this operator's stream-time column in the ordered records."""
        return f"_stream_time_{self.index}"

    def stat(self, what: str) -> str:
        """The name of one of this operator's columns in the counting pass."""
        return f"{what}_{self.index}"

    # ------------------------------------------------------------------ before the order
    @abstractmethod
    def stream_time_columns(self) -> dict[str, Column]:
        """Stream-time columns to compute in task order: name -> the records that advance it."""

    def reads(self) -> frozenset[str] | None:
        """Of `seq`, `timestamp` and `headers`, the columns it reads (None: whole records)."""
        return None

    def ledger_candidates(self) -> Column | None:
        """Records beyond null keys and source drops that may give it ledger rows (found in one scan)."""
        return None

    def expressions(self) -> list[str] | None:
        """The SQL texts it evaluates over its records (aggregations, a joiner, re-keys, filters): a run reads only
        the fields of a JSON value that they name (plan/evaluator.py `value_fields`). None, the default: the whole
        value, so a kind that does not say what it reads is never narrowed."""
        return None

    def one_pass(self) -> bool:
        """Whether the one pass (plan/fused.py) can run it, counting included; only a window aggregate can."""
        return False

    # ------------------------------------------------------------------ counting pass
    @abstractmethod
    def count_columns(self, live: Column, late: dict[str, Column] | None = None) -> list[Column]:
        """Aggregations over the ordered records (grouped by source, drop, task); `live`: processed records;
        `late`: the one pass's late columns, given only to an operator whose `one_pass()` holds."""

    @abstractmethod
    def counts(self, rows: list[Any]) -> OperatorCounts:
        """Its counts from the counting pass's rows."""

    # ------------------------------------------------------------------ run and settle
    @abstractmethod
    def run(self, processed: DataFrame, dropped: DataFrame, counts: OperatorCounts) -> OperatorResult:
        """Outputs and ledger rows over the task-ordered records (`dropped`: the ledger candidates)."""

    def settle(self, counts: OperatorCounts, ledger: Mapping[str, int]) -> None:
        """Complete `counts` from its ledger rows per reason; raise PublishError on a contradiction."""

    def output_suite(self, output: DataFrame) -> OutputSuite | None:
        """The expectations its staged output must meet before the commit (None: none yet)."""
        return None


def join_reads(spec: OperatorSpec) -> frozenset[str]:
    """What a join reads of a record: `seq` (the task order) and `timestamp` (a joiner field) always; `headers`
    only when a re-key names them (a joiner cannot)."""
    keys = [r.spec.key for r in rekeys(spec)]
    return frozenset({"seq", "timestamp", *(["headers"] if any("headers" in k for k in keys) else [])})


def around(spec: OperatorSpec) -> list[str]:
    """The texts every operator evaluates around itself: its re-keys and its filters."""
    return [r.spec.key for r in rekeys(spec)] + list(wheres(spec).values())


def aggregate_expressions(spec: OperatorSpec) -> list[str]:
    """An aggregate's `expressions()`: its aggregations (a fold's init, step and merge), re-keys and filters."""
    assert spec.aggregate is not None
    texts: list[str] = []
    for agg in spec.aggregate.aggregations.values():
        texts += [agg] if isinstance(agg, str) else [agg.fold.init, agg.fold.step, agg.fold.merge or ""]
    return texts + around(spec)


def in_source(name: str) -> Column:
    """Records of source `name` that their source did not drop."""
    return (F.col("source") == name) & F.col("_drop").isNull()


def check_null_drops(name: str, counts: OperatorCounts, ledger: Mapping[str, int], reasons: tuple[str, ...]) -> None:
    """Records counted as null drops in the counting pass must all be in the ledger, else nothing is published."""
    for reason in reasons:
        if ledger.get(reason, 0) != counts.dropped[reason]:
            raise PublishError(f"operators.{name}: conservation check failed ({ledger.get(reason, 0)} {reason} "
                               f"ledger rows, {counts.dropped[reason]} such records); nothing was published")


def task_stream_time(final_st: Mapping[int, int]) -> Column:
    """Column: the stream time of the row's `task` at the end of the data (null when unknown)."""
    if not final_st:
        return F.lit(None).cast("long")
    return F.element_at(F.create_map(*[F.lit(x) for kv in final_st.items() for x in kv]), F.col("task"))
