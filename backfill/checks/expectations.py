"""Part: checks. great-expectations suites generated from the job: one per output kind, run before publish and in
verify.

Window outputs (docs/semantics.md §4.1): keys not null, window_end - window_start == size, starts
aligned to the advance, ts inside [window_start, window_end), and (key, window_start) unique for
final results ((task, emit_seq) for updates; (partition, offset) for a stream archive), uniqueness as
its own suite: a row-count expectation of 0 on the groups that occur twice. The ledger
suite checks conservation per operator (docs/semantics.md §7). GX must never call out
(GX_ANALYTICS_ENABLED=false, conf/*.yaml) and shows no progress bars.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from backfill.errors import ExpectationsFailed
from backfill.ops.base import Check, Operator

RESULT_FORMAT_PUBLISH = "BOOLEAN_ONLY"  # fewest Spark jobs; a failure is re-run with SUMMARY for the message
RESULT_FORMAT_REPORT = "SUMMARY"


@dataclass
class SuiteResult:
    """The outcome of one suite on one table."""

    name: str
    target: str
    success: bool
    rows: int | None = None
    expectations: list[dict[str, Any]] = field(default_factory=list)
    docs: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return asdict(self)

    def failures(self) -> str:
        """The failed expectations in one line."""
        bad = [e for e in self.expectations if not e["success"]]
        return "; ".join(f"{e['says']} ({e['unexpected_count']} rows)" if e.get("unexpected_count") is not None
                         else f"{e['says']} ({e['observed_value']} duplicated groups)"
                         if e.get("observed_value") is not None else e["says"] for e in bad)


def conservation_checks() -> list[Check]:
    """The ledger suite: per operator, records in = contributing + dropped, late rows = late pairs."""
    return [Check("ExpectColumnPairValuesToBeEqual", {"column_A": "records_in", "column_B": "accounted"},
                  "records in = contributing + dropped (every record accounted for)"),
            Check("ExpectColumnPairValuesToBeEqual", {"column_A": "late_ledger_rows", "column_B": "late_pairs"},
                  "late ledger rows = late (record, window) pairs counted per record")]


def validate(df: DataFrame | Any, name: str, target: str, checks: list[Check], *, result_format: str,
             docs_dir: Path | None = None) -> SuiteResult:
    """Run one suite on a Spark DataFrame, or a pandas one for small tables computed on the driver
    (no Spark job per expectation); with docs_dir, also build GX Data Docs there."""
    with _VALIDATE_LOCK:  # sinks are staged side by side; GX's context is process-wide, one suite at a time
        return _validate_alone(df, name, target, checks, result_format=result_format, docs_dir=docs_dir)


def _validate_alone(df: DataFrame | Any, name: str, target: str, checks: list[Check], *, result_format: str,
                    docs_dir: Path | None = None) -> SuiteResult:
    gx, gxe = _gx()
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
    source = (context.data_sources.add_spark(name="spark", persist=False) if isinstance(df, DataFrame)
              else context.data_sources.add_pandas(name="pandas"))
    batch = source.add_dataframe_asset(name=name).add_batch_definition_whole_dataframe("whole")
    suite = context.suites.add(gx.ExpectationSuite(name=name))
    for check in checks:
        suite.add_expectation(getattr(gxe, check.kind)(**check.args, description=check.says))
    vd = context.validation_definitions.add(gx.ValidationDefinition(name=f"{name}.validation", data=batch, suite=suite))
    if docs_dir is None:
        res = vd.run(batch_parameters={"dataframe": df}, result_format=result_format)
    else:
        res = _run_with_docs(context, gx, vd, df, result_format, docs_dir)
    return SuiteResult(name=name, target=target, success=bool(res.success),
                       expectations=[_describe(r, c) for r, c in zip(res.results, checks)],
                       docs=str(docs_dir / "index.html") if docs_dir is not None else None)


def _run_with_docs(context: Any, gx: Any, vd: Any, df: DataFrame, result_format: str, docs_dir: Path) -> Any:
    """A checkpoint whose action writes Data Docs into docs_dir (they load CSS/JS from CDNs: secondary page)."""
    docs_dir = docs_dir.resolve()  # GX wants an absolute base directory
    docs_dir.mkdir(parents=True, exist_ok=True)
    context.add_data_docs_site(site_name="backfill_docs", site_config={
        "class_name": "SiteBuilder",
        "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": str(docs_dir)},
        "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"}})
    cp = context.checkpoints.add(gx.Checkpoint(
        name=f"{vd.name}.checkpoint", validation_definitions=[vd], result_format=result_format,
        actions=[gx.checkpoint.UpdateDataDocsAction(name="docs", site_names=["backfill_docs"])]))
    result = cp.run(batch_parameters={"dataframe": df})
    return next(iter(result.run_results.values()))


def _describe(result: Any, check: Check) -> dict[str, Any]:
    """One expectation result, JSON-ready."""
    info = result.result or {}
    sample = info.get("partial_unexpected_list") or []
    return {"expectation": result.expectation_config.type, "args": check.args, "says": check.says,
            "success": bool(result.success), "unexpected_count": info.get("unexpected_count"),
            "unexpected_percent": info.get("unexpected_percent"), "examples": [str(x) for x in sample[:5]],
            **({"observed_value": info["observed_value"]} if "unexpected_count" not in info
               and isinstance(info.get("observed_value"), int) else {})}


_IMPORT_LOCK = threading.Lock()
_VALIDATE_LOCK = threading.RLock()


def _gx() -> tuple[Any, Any]:
    """Import GX with analytics off (no outbound calls, notes/stack.md) and quiet loggers."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    import logging

    with _IMPORT_LOCK:  # the warm-up thread may be importing it right now
        import great_expectations as gx
        import great_expectations.expectations as gxe

    logging.getLogger("great_expectations").setLevel(logging.ERROR)
    return gx, gxe


def warm_up() -> None:
    """Import GX in a background thread (a few seconds of Python) while Spark reads and sorts the input."""
    def work() -> None:
        try:
            _gx()
        except Exception:  # noqa: BLE001 - the real import in validate() reports the problem
            pass

    threading.Thread(target=work, name="gx-import", daemon=True).start()


# ----------------------------------------------------------------------------- before publish


class PublishChecks:
    """The suites a run executes on what it is about to publish; a failure raises ExpectationsFailed (exit 1)."""

    def __init__(self, spark: SparkSession, results: dict[str, Any]) -> None:
        self.spark, self.results = spark, results

    def conservation(self, counts: list[dict[str, Any]]) -> None:
        """The ledger suite on one row per operator, before any commit."""
        if not counts:
            return
        import pandas as pd

        columns = ["operator", "records_in", "accounted", "late_ledger_rows", "late_pairs"]
        df = pd.DataFrame([[c[k] for k in columns] for c in counts], columns=columns)
        self._run(df, "_ledger.conservation", "run counts and ledger", conservation_checks())

    def for_output(self, op: Operator) -> Callable[[DataFrame], None] | None:
        """The audit of one operator's staged output (called by the sink right before its commit).

        Two suites: the row checks on the staged rows, and uniqueness as "no duplicated group": a GX
        row-count expectation on the staged rows grouped by the unique columns (one aggregation;
        GX's compound-uniqueness expectation runs a window over every row in several jobs, which cost
        more than the whole window aggregation at 10M records). A failure of either names both.
        """
        name = op.name
        if type(op).output_suite is Operator.output_suite:  # an operator without expectations of its own
            return None

        def audit(staged: DataFrame) -> None:
            suite = op.output_suite(staged)
            if suite is None:
                return
            unique = suite.unique
            results = [self._validate(suite.frame, f"{name}.output", f"staged output of {name}", suite.checks)]
            if unique and all(c in staged.columns for c in unique):
                groups = duplicated_groups(staged, unique, suite.stride)
                results.append(self._validate(groups, f"{name}.output.unique",
                                              f"groups of ({', '.join(unique)}) in the staged output of {name}",
                                              [unique_check(unique)]))
            failed = [r for r in results if not r.success]
            if failed:
                raise ExpectationsFailed(f"{name}.output: expectations failed before publish: "
                                   f"{'; '.join(r.failures() for r in failed)}; nothing was committed for it")

        return audit

    def _validate(self, df: Any, name: str, target: str, checks: list[Check]) -> SuiteResult:
        result = validate(df, name, target, checks, result_format=RESULT_FORMAT_PUBLISH)
        if not result.success:  # rerun for counts and examples: failures are rare, the message must be precise
            result = validate(df, name, target, checks, result_format=RESULT_FORMAT_REPORT)
        self.results[name] = result.to_dict()
        return result

    def _run(self, df: Any, name: str, target: str, checks: list[Check]) -> None:
        result = self._validate(df, name, target, checks)
        if not result.success:
            raise ExpectationsFailed(f"{name}: expectations failed before publish: {result.failures()}; "
                               "nothing was committed for it")


def unique_check(columns: tuple[str, ...]) -> Check:
    """Uniqueness as an expectation on `duplicated_groups(df, columns)`: none."""
    return Check("ExpectTableRowCountToEqual", {"value": 0}, f"({', '.join(columns)}) unique")


def duplicated_groups(df: DataFrame, columns: tuple[str, ...], stride: int = 1) -> DataFrame:
    """The groups of `columns` that occur more than once.

    Exact, in two aggregations. The first finds suspects cheaply: its groups are (a 64-bit hash of the
    columns but the last; a block of 64 values of the last, `stride` apart), each with its row count and a
    64-bit mask of the values it holds. A group whose count exceeds its mask's bits holds a repeated value,
    or two groups of one hash, or a null. Only the rows of those groups (none, unless the rows are wrong) are
    then grouped by the columns themselves. When the last column is dense (offsets, emit_seq, window starts
    `stride` = the advance apart), the first aggregation keeps a row per block instead of one per row
    (3.4M staged windows: 0.8-1.0 s, against 2.9 s with one group per row)."""
    *others, last = columns
    if isinstance(df.schema[last].dataType, T.IntegralType):
        value, stride = f"CAST(`{last}` AS BIGINT)", int(stride)
        # deterministic: equal values share block and bit; a null value has none (bit_or skips it)
        blocks = {"_hash": F.xxhash64(*others) if others else F.lit(0).cast("long"),
                  "_block": F.expr(f"({value} div {stride}) div 64"), "_rest": F.expr(f"{value} % {stride}")}
        bit = F.expr(f"shiftleft(1L, CAST(pmod({value} div {stride}, 64) AS INT))")
    else:
        blocks = {"_hash": F.xxhash64(*columns)}
        bit = F.lit(1).cast("long")  # one group per hash: a count above one is a suspect
    keyed = df.select(*columns, *[c.alias(n) for n, c in blocks.items()], bit.alias("_bit"))
    suspect = (keyed.groupBy(*blocks).agg(F.count(F.lit(1)).alias("_n"), F.bit_or("_bit").alias("_bits"))
               .where(F.col("_n") != F.coalesce(F.bit_count("_bits"), F.lit(0)))
               .select(*[F.col(n).alias(f"_s{n}") for n in blocks]))
    # null-safe: the rows whose value is null are a block of their own
    on = [F.col(n).eqNullSafe(F.col(f"_s{n}")) for n in blocks]
    suspects = keyed.join(F.broadcast(suspect), on, "left_semi").select(*columns)
    return suspects.groupBy(*columns).count().where(F.col("count") > 1)
