"""The end-of-run summary a person reads: records in, out, dropped by reason, duration, records/s."""
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
    ops = Table("operator", "in", "contributing", "dropped", "late pairs", "outputs", "open windows", box=None)
    for name, c in summary["operators"].items():
        dropped = ", ".join(f"{k} {v:,}" for k, v in c["dropped"].items() if v) or "0"
        ops.add_row(name, f"{c['records_in']:,}", f"{c['contributing']:,}", dropped, f"{c['late_pairs']:,}",
                    f"{c['outputs']:,}", f"{c['incomplete_windows']:,}")
    console.print(ops)
    console.print("[dim]late pairs: (record, window) refused by grace; open windows: not final by the end "
                  "of the data, not emitted[/]", highlight=False)
    ledger = ", ".join(f"{k} {v:,}" for k, v in sorted(summary["ledger"].items())) or "empty"
    console.print(f"ledger rows: {summary['ledger_rows']:,} in range ({ledger} in all)", highlight=False)
    for name, sink in summary["sinks"].items():
        version = f" version {sink['version']}" if sink.get("version") is not None else ""
        console.print(f"  {name} -> {sink['path']} ({sink['rows']:,} rows{version})", highlight=False)
    console.print(f"{summary['records_in']:,} records in {summary['duration_s']:.1f} s "
                  f"({summary['records_per_s']:,.0f} records/s); every record accounted for", highlight=False)
