"""Part: verify. The report folder: report.json and one self-contained index.html (inline CSS, inline SVG plots).

No font, stylesheet or script from a CDN (docs/architecture.md): the page reads fully offline; its one
inline script filters the samples. The great-expectations results are rendered here, expectation by
expectation; GX's own Data Docs are not linked (they load their assets from CDNs).
"""
from __future__ import annotations

import datetime as dt
import html
import io
import json
from pathlib import Path
from typing import Any

from backfill.verify.catalogue import BY_NAME, SEVERITY
from backfill.verify.runner import Outcome, Section

VERDICT_TEXT = {
    "match": "every window matches",
    "explained": "every difference has a cause backed by evidence",
    "differences": "some differences have no explanation, or expectations failed",
}
CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;margin:24px auto;
max-width:1180px;color:#1d2430;padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #d8dde6;padding-bottom:4px}
h3{font-size:15px;margin:18px 0 6px}.muted{color:#5b6576}.mono{font-family:ui-monospace,Menlo,Consolas,monospace}
.verdict{display:inline-block;padding:8px 14px;border-radius:6px;font-weight:600;font-size:18px;margin:10px 0}
.v-match{background:#e3f5e8;color:#14632f;border:1px solid #9fd8ae}
.v-explained{background:#e6effb;color:#1b4a8a;border:1px solid #a9c4ea}
.v-differences{background:#fbe6e6;color:#8a1b1b;border:1px solid #eaa9a9}
table{border-collapse:collapse;margin:6px 0 12px}th,td{border:1px solid #d8dde6;padding:3px 8px;text-align:left;
vertical-align:top}th{background:#f3f5f9;font-weight:600}td.n{text-align:right;font-variant-numeric:tabular-nums}
.ok{color:#14632f;font-weight:600}.bad{color:#8a1b1b;font-weight:600}.grid{display:flex;flex-wrap:wrap;gap:18px}
figure{margin:0}figure svg{max-width:100%;height:auto}figcaption{color:#5b6576;font-size:12px}
details{margin:6px 0}summary{cursor:pointer}.sample{border-left:3px solid #d8dde6;padding-left:10px;margin:10px 0}
.diff{background:#fff3c4}.filter{margin:6px 0 10px;padding:6px 8px;background:#f3f5f9;border-radius:4px}
.chip{font:inherit;font-size:12px;margin:0 6px 6px 0;padding:2px 8px;border:2px solid;border-radius:12px;
background:#fff;cursor:pointer;color:inherit;text-decoration:none;display:inline-block}
.chip.on{background:#1f2733;color:#fff}.chip.on .muted{color:#d8dde6}#first-look{margin:0 0 8px}
.alert td.mono,.window td.mono{word-break:break-all;max-width:36em}
"""


# The samples' filter: by cause and by key, per section, also from the address (index.html#cause=X&key=Y).
# Inline, no library, nothing loaded.
FILTER_JS = """
(function () {
  function apply(bar) {
    var cause = bar.querySelector('.f-cause').value, key = bar.querySelector('.f-key').value.toLowerCase();
    var shown = 0, all = 0, el = bar.nextElementSibling;
    for (; el && el.classList.contains('sample'); el = el.nextElementSibling) {
      var ok = (!cause || el.dataset.cause === cause) && el.dataset.key.toLowerCase().indexOf(key) >= 0;
      el.hidden = !ok; all++; if (ok) shown++;
    }
    bar.querySelector('.f-count').textContent = shown + ' of ' + all + ' samples shown';
    bar.querySelectorAll('.chip').forEach(function (chip) {
      chip.classList.toggle('on', chip.dataset.cause === cause);
    });
  }
  function fromAddress(scroll) {  // #cause=X&key=Y&section=Z: a link in the page or a link to it
    var wanted = new URLSearchParams(location.hash.slice(1)), first = null;
    document.querySelectorAll('.filter').forEach(function (bar) {
      if (wanted.get('section') && bar.dataset.section !== wanted.get('section')) return;
      bar.querySelector('.f-cause').value = wanted.get('cause') || '';
      bar.querySelector('.f-key').value = wanted.get('key') || '';
      apply(bar);
      first = first || bar;
    });
    if (scroll && first) first.scrollIntoView();
  }
  window.addEventListener('hashchange', function () { fromAddress(true); });
  document.querySelectorAll('.filter').forEach(function (bar) {
    bar.querySelector('.f-cause').addEventListener('change', function () { apply(bar); });
    bar.querySelector('.f-key').addEventListener('input', function () { apply(bar); });
    bar.querySelectorAll('.chip').forEach(function (chip) {  // a click shows that cause; again: every cause
      chip.addEventListener('click', function () {
        var select = bar.querySelector('.f-cause');
        select.value = select.value === chip.dataset.cause ? '' : chip.dataset.cause;
        apply(bar);
      });
    });
    apply(bar);
  });
  if (location.hash.length > 1) fromAddress(false);
})();
"""


def write_report(outcome: Outcome) -> Path:
    """Write report.json and index.html into the outcome's folder; return index.html."""
    folder = outcome.report_dir
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "report.json").write_text(json.dumps(outcome.to_json(), indent=2, default=str))
    page = folder / "index.html"
    page.write_text(render(outcome))
    return page


def write_junit(outcome: Outcome, path: Path) -> Path:
    """The verdict per operator as JUnit XML: one test case per section, failed when the section has
    differences no cause explains (or, in diff, any difference) or a failed expectation suite."""
    import xml.etree.ElementTree as ET

    name = f"backfill {outcome.mode}" + (f" {outcome.job}" if outcome.job else "")
    suite = ET.Element("testsuite", name=name, tests=str(len(outcome.sections)), time=f"{outcome.duration_s:.3f}",
                       timestamp=outcome.started_at)
    failures = 0
    for s in outcome.sections:
        case = ET.SubElement(suite, "testcase", classname=name, name=s.name, time=f"{s.seconds:.3f}")
        unexplained = s.differences if s.causes is None else s.causes.get("unexplained", 0)
        failed = [e["name"] for e in s.expectations if not e["success"]]
        counts = ", ".join(f"{c} {n:,}" for c, n in s.counts.items() if n)
        causes = ", ".join(f"{c} {n:,}" for c, n in (s.causes or {}).items() if n)
        if unexplained or failed:
            failures += 1
            why = []
            if unexplained:
                why.append(f"{unexplained:,} {_unit(s)} differ with no explanation")
            if failed:
                why.append(f"expectations failed: {', '.join(failed)}")
            failure = ET.SubElement(case, "failure", message="; ".join(why), type="reconciliation")
            failure.text = f"counts: {counts}\ncauses: {causes or 'none'}\nreport: {outcome.report_dir / 'index.html'}"
        out = ET.SubElement(case, "system-out")
        out.text = f"counts: {counts}\ncauses: {causes or 'none needed'}"
    suite.set("failures", str(failures))
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)
    return path


def render(outcome: Outcome) -> str:
    """The whole page."""
    title = f"backfill {outcome.mode}" + (f": {outcome.job}" if outcome.job else "")
    parts = [f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{_e(title)}</title>",
             f"<style>{CSS}</style></head><body>", f"<h1>{_e(title)}</h1>",
             f"<div class=muted>{_e(outcome.started_at)} &middot; {outcome.duration_s:.1f} s &middot; exit code "
             f"{outcome.exit_code}</div>",
             f"<div id=verdict class='verdict v-{outcome.verdict}'>verdict: {_e(outcome.verdict)} &mdash; "
             f"{_e(VERDICT_TEXT[outcome.verdict])}</div>",
             _first_look(outcome), _totals(outcome), _run(outcome)]
    parts += [_section(outcome, s) for s in outcome.sections]
    parts.append("<p class=muted>report.json holds these numbers and samples. Generated by backfill; this page "
                 f"loads nothing from the network.</p><script>{FILTER_JS}</script></body></html>")
    return "\n".join(p for p in parts if p)


def _by_severity(causes: dict[str, int]) -> list[tuple[str, int]]:
    """The causes that occurred, the one that needs a person first."""
    rank = {c: i for i, c in enumerate(SEVERITY)}
    return sorted(((c, n) for c, n in causes.items() if n), key=lambda cn: (rank.get(cn[0], len(rank)), cn[0]))


def _first_look(outcome: Outcome) -> str:
    """Under the verdict: per section, the causes found, most severe first, each a link to its samples."""
    lines = []
    for s in outcome.sections:
        found = _by_severity(s.causes or {})
        if not found:
            continue
        links = " ".join(f"<a class=chip style='border-color:{_colour(c)}' "
                         f"href='#cause={_e(c)}&amp;section={_e(s.name)}'>{_e(c)} <span class=muted>{n:,}</span></a>"
                         for c, n in found)
        lead = ""
        if found[0][0] == "unexplained":
            n = found[0][1]
            lead = (f"<b class=bad>Start here: {n:,} {_unit(s)[:-1] if n == 1 else _unit(s)} of {_e(s.name)} "
                    f"{'differs' if n == 1 else 'differ'} and nothing explains {'it' if n == 1 else 'them'}.</b> ")
        lines.append(f"<div>{lead}<span class=muted>{_e(s.name)}:</span> {links}</div>")
    return f"<div id=first-look>{''.join(lines)}</div>" if lines else ""


def _totals(outcome: Outcome) -> str:
    counts = outcome.counts
    rows = "".join(f"<tr><td>{_e(c)}</td><td class=n>{n:,}</td></tr>" for c, n in counts.items())
    units = {_unit(s) for s in outcome.sections}
    unit = " / ".join(sorted(units, reverse=True)) if units else "windows"
    out = f"<h2>Counts</h2><table id=counts><tr><th>category</th><th>{unit}</th></tr>{rows}</table>"
    causes = outcome.causes
    if causes is not None:
        rows = "".join(f"<tr><td class=mono>{_e(c)}</td><td class=n>{n:,}</td><td>{_e(BY_NAME[c].meaning)}</td></tr>"
                       for c, n in _by_severity(causes))
        out += (f"<table id=causes><tr><th>cause</th><th>{unit}</th><th>meaning</th></tr>{rows}</table>" if rows
                else "<div class=muted>no difference needed a cause</div>")
    ok = outcome.expectations_ok
    out += (f"<div>expectations: <span class={'ok' if ok else 'bad'}>{'all passed' if ok else 'some failed'}"
            "</span> (details per operator below)</div>")
    return out


def _run(outcome: Outcome) -> str:
    if not outcome.run:
        return ""
    run = outcome.run
    suites = run.get("expectations", {})
    rows = "".join(_suite_row(s, None) for s in suites.values())
    return (f"<h2>The run verified (--run)</h2><div>run {_e(run.get('run_id'))}: {run.get('records_in', 0):,} records "
            f"in {run.get('duration_s', 0):.1f} s. Expectations checked before publish:</div>"
            f"<table><tr><th>suite</th><th>expectation</th><th>result</th><th>unexpected</th></tr>{rows}</table>")


def _section(outcome: Outcome, s: Section) -> str:
    left, right = s.sides
    head = (f"<h2 id='op-{_e(s.name)}'>{_e(s.name)}</h2><div>{_e(left)}: <span class=mono>{_e(s.left)}</span><br>"
            f"{_e(right)}: <span class=mono>{_e(s.right)}</span><br>keyed by {_e(', '.join(s.keys))}; compared "
            f"{_e(', '.join(s.columns))}; {s.seconds:.1f} s</div>")
    notes = "".join(f"<li>{_e(n)}</li>" for n in s.notes)
    counts = "".join(f"<tr><td>{_e(c)}</td><td class=n>{n:,}</td></tr>" for c, n in s.counts.items())
    causes = "".join(f"<tr><td class=mono>{_e(c)}</td><td class=n>{n:,}</td></tr>"
                     for c, n in _by_severity(s.causes or {})) or "<tr><td colspan=2 class=muted>none</td></tr>"
    unit = _unit(s)
    tables = (f"<div class=grid><table><tr><th>category</th><th>{unit}</th></tr>{counts}</table>"
              + (f"<table><tr><th>cause</th><th>{unit}</th></tr>{causes}</table>" if s.causes is not None else "")
              + "</div>")
    plots = "<div class=grid>" + _timeline_plot(s) + _lateness_plot(s) + "</div>"
    return "\n".join([head, f"<ul class=muted>{notes}</ul>" if notes else "", tables, _incidents(s), plots,
                      _expectations(s), _samples(s)])


def _unit(s: Section) -> str:
    """What a section counts: windows (an aggregate), alerts (a rules operator, keyed by rule and transaction),
    rows (a join, keyed by key and ts; diff)."""
    if "window_start" in s.keys:
        return "windows"
    return "alerts" if tuple(s.keys) == ("rule_id", "transaction_id") else "rows"


def _incidents(s: Section) -> str:
    """Per restarted task: where it restarted, what the restart did to how many windows, first examples."""
    if not s.restarts:
        return ""
    rows = []
    for t in s.restarts:
        w = t["windows"]
        where = "?" if t["restart_offset"] is None else f"{t['restart_offset']:,}"
        source = "committed offset (--commits)" if t["restart_offset_from"] == "--commits" else \
            "inferred: earliest record applied twice"
        through = "" if t.get("reprocessed_through") is None else f"{t['reprocessed_through']:,}"
        when = _fmt(t["event_time_at_restart"], "ts") if t.get("event_time_at_restart") is not None else ""
        examples = "<br>".join(f"{_e(x['cause'])}: {_e(x['key'])} @ {_e(_fmt(x['window_start'], 'window_start'))}"
                               for x in t["examples"])
        rows.append(f"<tr><td class=n>{t['task']}</td><td class=n>{where}</td><td>{_e(source)}</td>"
                    f"<td class=n>{through}</td><td>{_e(when)}</td><td class=n>{w['reprocessed_after_restart']:,}"
                    f"</td><td class=n>{w['reemitted']:,}</td><td class=n>{w['state_lost_on_restore']:,}</td>"
                    f"<td class=n>{w.get('stale_after_restart', 0):,}</td>"
                    f"<td class=mono>{examples}</td></tr>")
    return ("<h3 id='incidents-" + _e(s.name) + "'>Incident: the application restarted</h3>"
            "<div>Where each task restarted, and what the restart did to its windows (each proved by "
            "recomputation; the records are shown with the samples below).</div><table class=incidents><tr>"
            "<th>task (input partition)</th><th>restart offset</th><th>from</th><th>reprocessed through offset</th>"
            "<th>event time at restart</th><th>inflated (applied twice)</th><th>re-emitted</th>"
            f"<th>lost on restore</th><th>stale session</th><th>first examples</th></tr>{''.join(rows)}</table>")


def _expectations(s: Section) -> str:
    if not s.expectations:
        return ""
    rows = "".join(_suite_row(suite, suite.get("docs")) for suite in s.expectations)
    return ("<h3>Expectations (great-expectations)</h3><table class=expectations><tr><th>suite</th><th>expectation"
            f"</th><th>result</th><th>unexpected</th></tr>{rows}</table>")


def _suite_row(suite: dict[str, Any], docs: str | None) -> str:
    link = f" (<a href='{_e(docs)}'>Data Docs</a>)" if docs else ""
    rows = []
    for e in suite["expectations"]:
        ok = e["success"]
        unexpected = f"{e['unexpected_count']:,}" if e.get("unexpected_count") is not None else (
            f"{e['observed_value']:,} duplicated groups" if e.get("observed_value") is not None else "")
        examples = f" e.g. {_e(', '.join(e['examples']))}" if e.get("examples") else ""
        rows.append(f"<tr><td class=mono>{_e(suite['name'])}{link}</td><td>{_e(e['says'])}</td>"
                    f"<td class={'ok' if ok else 'bad'}>{'passed' if ok else 'failed'}</td>"
                    f"<td class=n>{unexpected}{examples}</td></tr>")
        link = ""
    return "".join(rows)


def _samples(s: Section) -> str:
    if not s.samples:
        return ""
    left, right = s.sides
    causes = list(dict.fromkeys(row.get("cause") or "match" for row in s.samples))  # the samples' order: severity
    options = "".join(f"<option value='{_e(c)}'>{_e(c)}</option>" for c in causes)
    shown = {c: sum((row.get("cause") or "match") == c for row in s.samples) for c in causes}
    chips = "".join(f"<button type=button class=chip data-cause='{_e(c)}' style='border-color:"
                    f"{_colour(c)}'>{_e(c)} <span class=muted>{shown[c]}</span></button>"
                    for c in causes)
    out = ["<h3>Samples</h3>",
           f"<div class=filter data-section='{_e(s.name)}'>{chips}<br>show <select class=f-cause "
           f"aria-label='cause'><option value=''>every cause</option>{options}</select> key contains <input "
           "class=f-key aria-label='key' size=16> <span class='f-count muted'></span></div>"]
    for row in s.samples:
        key = ", ".join(f"{k}={_fmt(row.get(k), k)}" for k in s.keys)
        cause = f" &middot; cause <b class=mono>{_e(row['cause'])}</b>" if row.get("cause") else ""
        detail = f"<div>{_e(row['detail'])}</div>" if row.get("detail") else ""
        diff = set(row.get("diff_columns") or [])
        cells = "".join(f"<tr{' class=diff' if c in diff else ''}><td>{_e(c)}</td><td>{_e(_fmt(row.get('l_' + c), c))}"
                        f"</td><td>{_e(_fmt(row.get('r_' + c), c))}</td></tr>" for c in s.columns)
        extra = f"<div class=muted>{row.get('_rows', 0)} {right} rows, {row.get('_copies', 0)} exact copies</div>" \
            if row.get("_rows", 0) > 1 else ""
        tags = f"data-cause='{_e(row.get('cause') or 'match')}' data-key='{_e(row.get(s.keys[0]))}'"
        out.append(f"<div class=sample {tags}><div><b>{_e(row['category'])}</b>{cause} &middot; {_e(key)}</div>{detail}"
                   f"{extra}<table><tr><th>column</th><th>{_e(left)}</th><th>{_e(right)}</th></tr>{cells}</table>"
                   f"{_alert(row, left, right)}{_evidence(row)}{_inputs(row, _unit(s))}</div>")
    return "\n".join(out)


def _alert(row: dict[str, Any], left: str, right: str) -> str:
    """A rules alert's context: its transaction and the rule version in force on each side, and the
    transactions the backfill's window held when the rule fired (docs/semantics.md §12.13), and the stream's as
    the rerun (§12.12) or the held replay (§12.14) that gives its alert has it."""
    if "l_transaction" not in row:
        return ""
    out = ["<table class=alert><tr><th></th><th>" + _e(left) + "</th><th>" + _e(right) + "</th></tr>",
           f"<tr><td>transaction</td><td class=mono>{_e(row.get('l_transaction') or '')}</td>"
           f"<td class=mono>{_e(row.get('r_transaction') or '')}</td></tr>",
           f"<tr><td>rule version in force</td><td class=mono>{_e(row.get('l_rule') or '')}</td>"
           f"<td class=mono>{_e(row.get('r_rule') or '')}</td></tr>"
           "</table>"]
    for side, title in (("l_window", f"the {left}'s window when the rule fired"),
                        ("r_window", f"the {right}'s window, as the rerun or the held replay that gives its alert "
                                     "has it")):
        window = row.get(side)
        if window is None:
            continue
        body = "".join(f"<tr><td class=n>{w['partition']}</td><td class=n>{w['offset']}</td>"
                       f"<td>{_e(_fmt(w['ts'], 'ts'))}</td><td class=mono>{_e(w.get('value') or '')}</td></tr>"
                       for w in window)
        out.append(f"<details class=window open><summary>{_e(title)} ({len(window)} transaction"
                   f"{'' if len(window) == 1 else 's'})</summary><table><tr><th>partition</th><th>offset</th>"
                   f"<th>event time</th><th>transaction</th></tr>{body}</table></details>")
    return "".join(out)


def _evidence(row: dict[str, Any]) -> str:
    recs = row.get("records") or []
    if not recs:
        return ""
    body = "".join(f"<tr><td class=n>{r['partition']}</td><td class=n>{r['offset']}</td><td>{_e(_fmt(r['ts'], 'ts'))}"
                   f"</td><td>{_e(_fmt(r['st'], 'ts'))}</td><td>{_e(r['status'])}</td></tr>" for r in recs)
    return ("<div>the records that make the difference:</div><table><tr><th>partition</th><th>offset</th><th>ts</th>"
            f"<th>stream time at arrival</th><th>backfill</th></tr>{body}</table>")


def _inputs(row: dict[str, Any], unit: str = "windows") -> str:
    recs = row.get("inputs")
    if recs is None:
        return ""
    total = row.get("inputs_total", len(recs))
    shown = f"{total}" if total <= len(recs) else f"{total:,}; the first {len(recs)} shown"
    body = "".join(f"<tr><td class=n>{r['partition']}</td><td class=n>{r['offset']}</td><td>{_e(_fmt(r['ts'], 'ts'))}"
                   f"</td><td>{_e(r['status'])}</td><td class=mono>{_e(r['value'])}</td></tr>" for r in recs)
    what, role = ("this window", "backfill") if unit == "windows" else ("this row", "role")
    return (f"<details><summary>input records behind {what} ({shown})</summary><table><tr><th>partition"
            f"</th><th>offset</th><th>ts</th><th>{role}</th><th>value</th></tr>{body}</table></details>")


# ----------------------------------------------------------------------------- plots (matplotlib -> inline SVG)


MATCH_COLOUR = "#9fd8ae"


def _colour(cause: str) -> str:
    """A cause's colour in the catalogue; a matching row's green."""
    return BY_NAME[cause].colour if cause in BY_NAME else MATCH_COLOUR


def _timeline_plot(s: Section) -> str:
    if not s.timeline:
        return ""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(11.5, 3.0))
    xs = [_when(t["start"]) for t in s.timeline]
    width = s.timeline[0]["width"] / 86_400_000 * 0.9  # matplotlib dates are days
    causes = [c for c in SEVERITY if any(t.get("causes", {}).get(c) for t in s.timeline)]
    bottom = [0.0] * len(s.timeline)
    if causes:  # stacked by cause, the most severe at the bottom
        for cause in causes:
            share = [100.0 * t["causes"].get(cause, 0) / t["rows"] if t["rows"] else 0.0 for t in s.timeline]
            ax.bar(xs, share, width=width, bottom=bottom, color=_colour(cause), align="edge", label=cause)
            bottom = [b + h for b, h in zip(bottom, share)]
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    else:
        bottom = [100.0 * t["differ"] / t["rows"] if t["rows"] else 0.0 for t in s.timeline]
        ax.bar(xs, bottom, width=width, color="#c0392b", align="edge")
    ax.set_ylabel(f"{_unit(s)} not matching (%)")
    ax.set_xlabel("window start (UTC)" if _unit(s) == "windows" else f"{s.keys[-1]} (UTC)")
    ax.set_ylim(0, max(bottom + [1.0]) * 1.15)
    ax.set_title("differences over event time, by cause", fontsize=10)
    fig.autofmt_xdate()
    return _figure(fig, f"plot-timeline-{s.name}",
                   f"share of {_unit(s)} per bucket that are not a match ({len(s.timeline)} buckets); explained causes "
                   "in muted colours, unexplained in red")


def _lateness_plot(s: Section) -> str:
    if not s.lateness:
        return ""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.2, 2.8))
    ax.bar([b["from_ms"] / 1000 for b in s.lateness], [b["count"] for b in s.lateness],
           width=[(b["to_ms"] - b["from_ms"]) / 1000 * 0.9 for b in s.lateness], align="edge", color="#2c6fbb")
    ax.set_xlabel("behind stream time when dropped (s)")
    ax.set_ylabel("late drops")
    ax.set_title("lateness of the ledger's late drops", fontsize=10)
    return _figure(fig, f"plot-lateness-{s.name}", "how far behind stream time each late drop was")


def _figure(fig: Any, ident: str, caption: str) -> str:
    buf = io.StringIO()
    fig.tight_layout()
    fig.savefig(buf, format="svg")
    _pyplot().close(fig)
    svg = buf.getvalue()
    svg = svg[svg.index("<svg"):]  # drop the XML prolog and doctype: inline SVG in HTML
    return f"<figure class=plot id='{_e(ident)}'>{svg}<figcaption>{_e(caption)}</figcaption></figure>"


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # no display; deterministic SVG ids
    matplotlib.rcParams["svg.hashsalt"] = "backfill"
    matplotlib.rcParams["svg.fonttype"] = "path"  # text as paths: no font needed to view it
    import matplotlib.pyplot as plt

    return plt


# ----------------------------------------------------------------------------- formatting


def _when(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc)


def _fmt(value: Any, column: str) -> str:
    """Times as UTC instants (with the ms), everything else as is."""
    if value is None:
        return "null"
    if column in ("window_start", "window_end", "ts") and isinstance(value, int) and value > 10**11:
        return f"{_when(value).strftime('%Y-%m-%d %H:%M:%S.%f')[:-3]} ({value})"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)
