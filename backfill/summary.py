"""Part: commands. The end-of-run summary a person reads: records in, out, dropped by reason, duration, records/s."""
from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table


def print_summary(console: Console, summary: dict[str, Any]) -> None:
    """Print the run summary as a few small tables."""
    rng = f"[{summary['start'] if summary['start'] is not None else '-inf'}, " \
          f"{summary['end'] if summary['end'] is not None else '+inf'})"
    console.print(f"[bold]run {summary['run_id']}[/] of job [bold]{summary['job']}[/], window starts in {rng}",
                  highlight=False)
    inputs = Table("source", "read", "processed", "past cool-down", "dropped at source", box=None)
    for src, n in summary["records_read"].items():
        drops = summary["source_drops"].get(src, {})
        inputs.add_row(src, f"{n:,}", f"{summary['records_processed'].get(src, 0):,}",
                       f"{summary['beyond_range'].get(src, 0):,}",
                       ", ".join(f"{k} {v:,}" for k, v in drops.items()) or "0")
    console.print(inputs)
    for line in offset_lines(summary):
        console.print(line, highlight=False)
    ops = Table("operator", "in", "contributing", "dropped", "filtered", "late pairs", "outputs", "open windows",
                box=None)
    for name, c in summary["operators"].items():
        dropped = ", ".join(f"{k} {v:,}" for k, v in c["dropped"].items() if v) or "0"
        ops.add_row(name, f"{c['records_in']:,}", f"{c['contributing']:,}", dropped, f"{c.get('filtered', 0):,}",
                    f"{c['late_pairs']:,}", f"{c['outputs']:,}", f"{c['incomplete_windows']:,}")
    console.print(ops)
    console.print("[dim]filtered: dropped by the operator's where (no ledger row); late pairs: (record, window) "
                  "refused by grace; open windows: not final by the end "
                  "of the data, not emitted[/]", highlight=False)
    ledger = ", ".join(f"{k} {v:,}" for k, v in sorted(summary["ledger"].items())) or "empty"
    console.print(f"ledger rows: {summary['ledger_rows']:,} in range ({ledger} in all)", highlight=False)
    suites = summary.get("expectations") or {}
    if suites:
        console.print(f"expectations: {sum(s['success'] for s in suites.values())} of {len(suites)} suites passed "
                      "before publish", highlight=False)
    for name, sink in summary["sinks"].items():
        version = f" version {sink['version']}" if sink.get("version") is not None else ""
        console.print(f"  {name} -> {sink['path']} ({sink['rows']:,} rows{version})", highlight=False)
    for warning in summary.get("warnings", []):
        console.print(f"[yellow]warning:[/] {warning}", highlight=False)
    if summary.get("strategies"):  # as `backfill plan` prints them (plan/strategy.py)
        console.print("[dim]strategies: " + "; ".join(f"{stage} {how}" for stage, how in summary["strategies"].items())
                      + "[/]", highlight=False)
    console.print(f"{summary['records_in']:,} records in {summary['duration_s']:.1f} s "
                  f"({summary['records_per_s']:,.0f} records/s); every record accounted for", highlight=False)


def offset_lines(summary: dict[str, Any], shown: int = 3, partitions: int = 5) -> list[str]:
    """Lines for the sources with identical copies read once, gaps (the first `partitions` partitions, their first
    `shown` ranges each), or gaps not checked (docs/semantics.md §7.2-§7.4); none for a source read exactly once
    per offset without a gap."""
    lines = []
    for src, parts in (summary.get("duplicates") or {}).items():
        each = ", ".join(f"partition {p}: {n:,}" for p, n in sorted(parts.items(), key=lambda kv: int(kv[0])))
        lines.append(f"{src}: {sum(parts.values()):,} identical copies of an offset read once ({each})")
    for src, parts in (summary.get("gaps") or {}).items():
        ordered = sorted(parts.items(), key=lambda kv: int(kv[0]))
        for p, g in ordered[:partitions]:
            ranges = ", ".join(f"{r['from']}" if r["from"] == r["to"] else f"{r['from']}-{r['to']}"
                               for r in g["ranges"][:shown])
            more = ", ..." if g["gaps"] > shown else ""
            lines.append(f"{src}: partition {p} skips {g['offsets']:,} offsets in {g['gaps']:,} gap"
                         f"{'s' if g['gaps'] != 1 else ''} ({ranges}{more})")
        if len(ordered) > partitions:
            lines.append(f"{src}: and {len(ordered) - partitions:,} more partitions with gaps (--json lists them)")
    if summary.get("gaps"):
        lines.append("[dim]a gap is not an error: compaction, retention or an archive with a hole make them "
                     "(docs/semantics.md §7.4)[/]")
    for src, why in (summary.get("gaps_not_checked") or {}).items():
        lines.append(f"[dim]{src}: gaps not checked: {why}[/]")
    return lines


def print_verification(console: Console, outcome: Any, page: Any) -> None:
    """Verdict, counts per category and cause, expectations, and where the report is."""
    style = {"match": "green", "explained": "blue", "differences": "red"}[outcome.verdict]
    console.print(f"[bold {style}]verdict: {outcome.verdict}[/] ({outcome.mode}, {outcome.duration_s:.1f} s)",
                  highlight=False)
    table = Table("operator", *outcome.sections[0].counts.keys(), box=None) if outcome.sections else None
    for s in outcome.sections:
        assert table is not None
        table.add_row(s.name, *[f"{n:,}" for n in s.counts.values()])
    if table is not None:
        console.print(table)
    if outcome.causes is not None:
        causes = ", ".join(f"{c} {n:,}" for c, n in outcome.causes.items() if n) or "none needed"
        console.print(f"causes: {causes}", highlight=False)
    for s in outcome.sections:
        for t in getattr(s, "restarts", []):
            w = t["windows"]
            console.print(f"{s.name}: task {t['task']} restarted at offset {t['restart_offset']} "
                          f"({'committed' if t['restart_offset_from'] == '--commits' else 'inferred'}): "
                          f"{w['reprocessed_after_restart']:,} windows inflated, {w['reemitted']:,} re-emitted, "
                          f"{w['state_lost_on_restore']:,} lost on restore", highlight=False)
        if getattr(s, "corrections", None):
            c = s.corrections
            console.print(f"{s.name}: {c['rows']:,} corrections written to {c['path']} ({c['format']})",
                          highlight=False)
    suites = [e for s in outcome.sections for e in s.expectations]
    suites += list((outcome.run or {}).get("expectations", {}).values())
    failed = [e["name"] for e in suites if not e["success"]]
    console.print(f"expectations: {len(suites) - len(failed)} of {len(suites)} suites passed"
                  + (f" (failed: {', '.join(failed)})" if failed else ""), highlight=False)
    console.print(f"report: {page}", highlight=False)
