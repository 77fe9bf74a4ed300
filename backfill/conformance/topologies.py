"""Part: conformance. Scenarios for the topologies beyond one windowed operator: table aggregations (`table`),
stream-table joins with plain and versioned tables (`table_join`), window aggregates behind a filter
(`filter`) and chains (`chain`: a stream-table or stream-stream join whose results are filtered and counted in
windows, a window count whose update stream or final windows are filtered and counted per key, two stream-table
joins through a repartition topic or in one task, a stream joined with a table aggregation of another stream or
of itself),
judged by the same Kafka Streams harness (jvm/harness `Topologies`).

A stream-table scenario has several keys, table updates racing the stream records (out of order, on equal
timestamps), tombstones, null keys and values on both sides; its two topics are queues of one task, fed to
the harness in the task's merge order (the reference engine's). What each configuration is in a job and on
the harness's S line is written here; scenarios.py, harness.py and check.py dispatch to it.
"""
from __future__ import annotations

import random
from typing import Any

from backfill.jobspec import versions as ks_versions

KINDS = ("table", "table_join", "filter", "chain", "invalid")
POLICIES = {"skip": 1, "pt": 2}  # an `invalid` configuration's on_invalid, and its number on the harness's P line
INVALID_SHARE = 0.1  # of an `invalid` scenario's records (never its first: partition_time needs one before)
FILTERED = "x"  # the filter kinds drop a value whose p is x (Java: the "n,p" text contains it)
WINDOW_UPS = ("agg", "sess", "slide")  # a chain whose upstream counts one stream in windows
# a chain whose downstream is a stream-table join (the others' is a window or table aggregate)
TABLE_JOIN_DOWN = ("rtjoin", "atjoin", "atself", "ttjoin", "ajoin", "sjt")
# a chain whose downstream is a stream-stream join, in the upstream's tasks (a stream-table join's rows, an
# aggregation's updates)
STREAM_JOIN_DOWN = ("tsj", "asj")
TOMB = "if(value.p = 'z', null, concat(acc, value.p))"  # a lone fold giving null: the key is deleted


def configs(kind: str) -> list[dict[str, Any]]:
    """Every configuration of a kind."""
    if kind == "table":
        return [{"agg": a, "filter": f} for a in ("ours", "tomb") for f in ("-", FILTERED)]
    if kind == "chain":
        joins = [{"up": "tjoin", "how": h, "size": s, "advance": a, "grace": g, "before": 0, "after": 0, "jgrace": 0}
                 for h in ("inner", "left") for s, a, g in ((10, 5, 0), (10, 10, 3))]
        joins += [{"up": "sjoin", "how": h, "size": 10, "advance": 10, "grace": 2, "before": b, "after": a, "jgrace": g}
                  for h in ("inner", "left", "outer") for b, a, g in ((2, 3, 1), (0, 5, 0))]
        # an upstream window count's every update (-), or its final windows: suppress, or emit on window close
        return joins + [{"up": "agg", "how": e, "size": s, "advance": a, "grace": g, "before": 0, "after": 0,
                         "jgrace": 0} for e in ("-", "suppress", "close") for s, a, g in ((10, 10, 0), (10, 5, 3),
                                                                                         (12, 5, 2))] + [
            # session (gap: size) and sliding (time difference: size) windows' final rows, by either mechanism
            {"up": up, "how": e, "size": s, "advance": s, "grace": g, "before": 0, "after": 0, "jgrace": 0}
            for up in ("sess", "slide") for e in ("suppress", "close") for s, g in ((3, 0), (6, 2))] + [
            # the enrichment chain: a stream-table join's rows re-keyed by their region and joined with a table
            {"up": "rtjoin", "how": h, "size": 0, "advance": 0, "grace": 0, "before": 0, "after": 0, "jgrace": 0}
            for h in ("inner", "left")] + [
            # a stream joined with the table an aggregation of another stream (atjoin), or of itself (atself),
            # computes in the same task
            {"up": up, "how": h, "size": 0, "advance": 0, "grace": 0, "before": 0, "after": 0, "jgrace": 0}
            for up in ("atjoin", "atself") for h in ("inner", "left")] + [
            # a stream-table join's rows joined, as they are, with a second table of the same keys
            {"up": "ttjoin", "how": h, "size": 0, "advance": 0, "grace": 0, "before": 0, "after": 0, "jgrace": 0}
            for h in ("inner", "left")] + [
            # an aggregation's every update joined, as it is, with a table of the same keys
            {"up": "ajoin", "how": h, "size": 0, "advance": 0, "grace": 0, "before": 0, "after": 0, "jgrace": 0}
            for h in ("inner", "left")] + [
            # a stream-stream join's rows (several per record, an outer join's later) joined as they are with a
            # table of the same keys
            {"up": "sjt", "how": h, "size": 0, "advance": 0, "grace": 0, "before": 2, "after": 3, "jgrace": 1}
            for h in ("inner", "left", "outer")] + [
            # a stream-table join's rows (tsj), or an aggregation's every update (asj), joined as they are with a
            # stream of the same keys in join windows
            {"up": up, "how": h, "size": 0, "advance": 0, "grace": 0, "before": b, "after": a, "jgrace": g}
            for up, b, a, g in (("tsj", 2, 3, 1), ("asj", 0, 5, 0)) for h in ("inner", "left", "outer")]
    if kind == "invalid":
        return [{"size": s, "advance": a, "grace": g, "emit": "updates", "policy": p}
                for s, a, g in ((10, 10, 0), (10, 5, 3), (12, 5, 2)) for p in POLICIES]
    if kind == "filter":
        return [{"size": s, "advance": a, "grace": g, "emit": "updates", "filter": FILTERED}
                for s, a, g in ((10, 10, 0), (10, 5, 0), (10, 5, 7), (12, 5, 3))]
    out = [{"how": h, "history": -1, "grace": 0, "filter": f} for h in ("inner", "left") for f in ("-", "l3")]
    out += [{"how": h, "history": hist, "grace": g, "filter": "-"} for h in ("inner", "left")
            for hist, g in ((10, 0), (30, 0), (10, 4), (20, 6))]
    # the stream re-keyed before the join (selectKey; a repartition topic): to a letter of its value's number
    return out + [{"how": h, "history": hist, "grace": 0, "filter": "-", "rekey": "val"} for h in ("inner", "left")
                  for hist in (-1, 10)]


# a re-keyed scenario's letters a, b, c as keys of its own partition (murmur2 of the key modulo the job's
# partition count is the scenario's id): its table's keys are those, and every stream record's key the three of
# them, WIDTH characters each, of which the re-key takes the one its value's number picks
WIDTH = 7  # a letter, a dot, five digits (_keyed)
REKEY = f"substr(key, (cast(substr(value, 2) as int) % 3) * {WIDTH} + 1, {WIDTH})"


REGION_END = "~"  # a drawn region key ends so (then comes the scenario's number)


def rekeyed(config: dict[str, Any]) -> bool:
    """Whether a configuration re-keys a stream before a join (a chain rtjoin: the join's rows)."""
    return config.get("rekey", "-") != "-" or config.get("up") == "rtjoin"


def as_written(kind: str, config: dict[str, Any], scenario: int, partitions: int, side: str, key: Any,
               value: Any = None) -> tuple[Any, Any]:
    """A re-keyed scenario's record's key and value in the job and for the judge, made keys of the scenario's
    own partition (murmur2 of the key modulo the job's partition count is its id; a key as drawn is a letter or
    region and the scenario's number). A table join's: the table's key, its letter's key; every stream record's
    key the three letters' keys. A chain rtjoin's: a region value of the first table, and a key of the second,
    the region's key."""
    assert rekeyed(config)
    if kind == "chain":
        if side == "right" and value is not None:
            return key, _keyed(value, scenario, partitions)
        if side == "third" and key is not None:
            return _keyed(key.split(REGION_END)[0], scenario, partitions), value
        return key, value
    letters = _letters(scenario, partitions)
    if side == "left":
        return "".join(letters.values()), value
    return (None if key is None else letters[key[0]]), value


def _keyed(text: str, scenario: int, partitions: int) -> str:
    """The first `<text>.<five digits>` the partitioner puts in `scenario`."""
    from backfill.reference.repartition import partition_for

    n = next(i for i in range(10 ** 6) if partition_for(f"{text}.{i:05d}".encode(), partitions) == scenario)
    return f"{text}.{n:05d}"


def _letters(scenario: int, partitions: int) -> dict[str, str]:
    """Each letter's key (WIDTH characters) in `scenario`."""
    return {letter: _keyed(letter, scenario, partitions) for letter in "abc"}


def records(rng: random.Random, kind: str, config: dict[str, Any]) -> list[dict[str, Any]]:
    """One task's records: the aggregate kinds draw from scenarios.py, a join's both topics here (a chain's
    stream carries `n,p` texts, its table regions, one of them `x`, which the chain filters out)."""
    if kind not in ("table_join", "chain"):
        raise ValueError(kind)
    keys = ["a", "b", "c", "a", None]
    out: list[dict[str, Any]] = []
    recent: list[int] = []
    sides = (("left", "l"),) if config.get("up") in (*WINDOW_UPS, "atself") else (("right", "t"), ("left", "l"))
    if config.get("up") in ("rtjoin", "ttjoin", "sjt", "tsj"):  # a second table (rtjoin: keyed by region, see
        # as_written), or (tsj) the stream joined in windows
        sides += (("third", "c"),)
    for side, prefix in sides:
        for offset in range(rng.choice([0, *range(1, 12 if kind == "table_join" else 16)])):
            roll = rng.random()
            if roll < 0.3 and recent:  # racing: a timestamp of the other side, or one step off it
                ts = max(0, rng.choice(recent) + rng.choice([-1, 0, 0, 1]))
            else:
                ts = rng.choice([rng.randint(0, 40), rng.choice([0, 1, 5, 10, 11, 20, 30])])
            recent.append(ts)
            value: Any = None if rng.random() < 0.15 else f"{prefix}{offset}"
            if kind == "chain" and value is not None:
                if side == "left":
                    value = f"{rng.randint(-3, 9)},{rng.choice('xyz')}"
                elif config["up"] in ("tjoin", "rtjoin", "ttjoin", "ajoin", "tsj") and side == "right":
                    value = rng.choice(["r1", "r2", "r2", "x"])
            key = rng.choice(keys)
            if side == "third" and config["up"] == "rtjoin":
                key = rng.choice(["r1", "r2", "x", "r1", None])
                key = None if key is None else key + REGION_END
            out.append({"side": side, "offset": offset, "key": key, "value": value, "timestamp": ts})
    return out


def supported(kind: str, config: dict[str, Any], version: str) -> bool:
    """Whether a configuration exists in a Kafka Streams release (versioned tables 3.5+, a join grace 3.6+)."""
    rules = ks_versions.profile(version)
    if kind != "table_join" or config["history"] < 0:
        return True
    return rules.versioned_tables and (not config["grace"] or rules.table_join_grace)


def rules_key(kind: str, rules: ks_versions.Profile) -> tuple[bool, ...]:
    """The rules of a release that change what our engines do for a kind (one run per distinct key)."""
    if kind == "table_join":
        return (rules.join_null_keys_reach_join, rules.versioned_tables, rules.table_join_grace)
    if kind == "chain":
        return (rules.join_null_keys_reach_join, rules.join_time_before_null_check, rules.outer_scan_per_side)
    return ()


def dropped_reasons(kind: str) -> tuple[str, ...]:
    """The ledger reasons Kafka Streams' dropped-records metric counts."""
    return {"table": ("null_key", "null_value"), "table_join": ("null_key", "null_value", "expired"),
            "filter": ("late", "null_key"), "chain": (),  # a chain's: per operator (check.counted_drops)
            "invalid": ("late", "null_key", "invalid_timestamp")}[kind]


def refusals_by_record(kind: str) -> bool:
    """Whether the ledger rows can be matched to the judge's input records one by one. A chain's downstream rows
    name the forwarded row, not the input record that produced it: its drops are compared as a total."""
    return kind != "chain"


def operator_yaml(kind: str, name: str, c: dict[str, Any], sources: dict[str, str]) -> str:
    """The job's operator for one configuration (a chain: its upstream `<name>_up`, then the operator itself)."""
    if kind == "chain":
        return _chain_yaml(name, c, sources)
    if kind == "table_join":
        versioned = (f"\n      versioned: {{history_retention: {c['history']}ms, grace: {c['grace']}ms}}"
                     if c["history"] >= 0 else "")
        where = f"\n      where: {{left: \"value != '{c['filter']}'\"}}" if c["filter"] != "-" else ""
        if c["how"] == "left" and c["grace"]:  # Kafka Streams 3.7+ fails on a null key there: filtered, as an
            where = "\n      where: {left: \"key is not null\"}"  # application must (the harness does too)
        rekey = ""
        if rekeyed(c):  # only the re-keyed scenarios' stream records (others would reach its tasks too)
            where = f"\n      where: {{left: \"length(key) = {3 * WIDTH}\"}}"
            rekey = f"\n      group_by: {{left: \"{REKEY}\"}}"
        return (f"  - name: {name}\n    join:\n      left: {sources['left']}\n      table: {sources['right']}\n"
                f"      how: {c['how']}{versioned}{where}{rekey}\n"
                "      value: \"concat(coalesce(left.value, '-'), '|', coalesce(right.value, '-'))\"")
    where = f"\n      where: \"value.p != '{c['filter']}'\"" if c.get("filter", "-") != "-" else ""
    if kind == "table":
        aggs = (f"{{f: {{fold: {{init: \"''\", step: \"{TOMB}\"}}}}}}" if c["agg"] == "tomb" else
                "{c: count(), s: sum(value.n), f: {fold: {init: \"''\", step: \"concat(acc, value.p)\"}}}")
        return (f"  - name: {name}\n    aggregate:\n      input: {sources['input']}{where}\n"
                f"      aggregations: {aggs}\n      emit: updates")
    window = (f"{{type: tumbling, size: {c['size']}ms, grace: {c['grace']}ms}}" if c["size"] == c["advance"] else
              f"{{type: hopping, size: {c['size']}ms, advance: {c['advance']}ms, grace: {c['grace']}ms}}")
    return (f"  - name: {name}\n    aggregate:\n      input: {sources['input']}{where}\n      window: {window}\n"
            "      aggregations: {c: count(), s: sum(value.n), f: {fold: {init: \"''\", step: "
            "\"concat(acc, coalesce(value.p, '~'))\"}}}\n      emit: updates")


def _chain_yaml(name: str, c: dict[str, Any], sources: dict[str, str]) -> str:
    """A chain's two operators: what jvm/harness `Topologies#chain` builds with the DSL."""
    window = (f"{{type: tumbling, size: {c['size']}ms, grace: {c['grace']}ms}}" if c["size"] == c["advance"] else
              f"{{type: hopping, size: {c['size']}ms, advance: {c['advance']}ms, grace: {c['grace']}ms}}")
    if c["up"] == "rtjoin":  # what Topologies#tableJoins builds (rekey)
        up = (f"    join:\n      left: {sources['left']}\n      table: {sources['right']}\n      how: {c['how']}\n"
              "      value: \"concat(substr(left.value, -1), '|', coalesce(right.value, 'null'))\"")
        down = (f"    join:\n      left: {name}_up\n      table: {sources['third']}\n      how: inner\n"
                "      where: {left: \"length(value) > 6\"}\n      group_by: {left: \"substr(value, 3)\"}\n"
                "      value: \"concat(left.value, '>', right.value)\"")
        return f"  - name: {name}_up\n{up}\n  - name: {name}\n{down}"
    if c["up"] == "ttjoin":  # what Topologies#tableJoins builds
        up = (f"    join:\n      left: {sources['left']}\n      table: {sources['right']}\n      how: {c['how']}\n"
              "      value: \"concat(substr(left.value, -1), '|', coalesce(right.value, 'null'))\"")
        down = (f"    join:\n      left: {name}_up\n      table: {sources['third']}\n      how: inner\n"
                "      value: \"concat(left.value, '>', right.value)\"")
        return f"  - name: {name}_up\n{up}\n  - name: {name}\n{down}"
    if c["up"] == "sjt":  # what Topologies#chain builds for it
        up = (f"    join:\n      left: {sources['left']}\n      right: {sources['right']}\n      how: {c['how']}\n"
              f"      window: {{before: {c['before']}ms, after: {c['after']}ms, grace: {c['jgrace']}ms}}\n"
              "      value: \"concat(coalesce(substr(left.value, -1), '-'), '|', coalesce(right.value, '-'))\"")
        down = (f"    join:\n      left: {name}_up\n      table: {sources['third']}\n      how: inner\n"
                "      value: \"concat(left.value, '>', right.value)\"")
        return f"  - name: {name}_up\n{up}\n  - name: {name}\n{down}"
    if c["up"] in STREAM_JOIN_DOWN:  # what Topologies#streamJoinInTask builds
        window = f"{{before: {c['before']}ms, after: {c['after']}ms, grace: {c['jgrace']}ms}}"
        if c["up"] == "tsj":
            up = (f"    join:\n      left: {sources['left']}\n      table: {sources['right']}\n      how: inner\n"
                  "      value: \"concat(substr(left.value, -1), '|', coalesce(right.value, 'null'))\"")
            other, mine = sources["third"], "left.value"
        else:
            up = (f"    aggregate:\n      input: {sources['left']}\n"
                  "      aggregations: {c: count(), f: {fold: {init: \"''\", step: \"concat(acc, value)\"}}}\n"
                  "      emit: updates")
            other, mine = sources["right"], "concat(cast(left.value.c as string), '|', left.value.f)"
        down = (f"    join:\n      left: {name}_up\n      right: {other}\n      how: {c['how']}\n"
                f"      window: {window}\n"
                f"      value: \"concat(coalesce({mine}, '-'), '|', coalesce(right.value, '-'))\"")
        return f"  - name: {name}_up\n{up}\n  - name: {name}\n{down}"
    if c["up"] == "ajoin":  # what Topologies#aggregateStreamJoin builds
        up = (f"    aggregate:\n      input: {sources['left']}\n"
              "      aggregations: {c: count(), f: {fold: {init: \"''\", step: \"concat(acc, value)\"}}}\n"
              "      emit: updates")
        down = (f"    join:\n      left: {name}_up\n      table: {sources['right']}\n      how: {c['how']}\n"
                "      value: \"concat(cast(left.value.c as string), '|', left.value.f, '>', "
                "coalesce(right.value, 'null'))\"")
        return f"  - name: {name}_up\n{up}\n  - name: {name}\n{down}"
    if c["up"] in ("atjoin", "atself"):  # what Topologies#aggregateTableJoin builds
        counted = sources["left" if c["up"] == "atself" else "right"]
        up = (f"    aggregate:\n      input: {counted}\n"
              "      aggregations: {c: count(), f: {fold: {init: \"''\", step: \"concat(acc, value)\"}}}\n"
              "      emit: updates")
        down = (f"    join:\n      left: {sources['left']}\n      table: {name}_up\n      how: {c['how']}\n"
                "      value: \"concat(substr(left.value, -1), '|', coalesce(concat(cast(right.value.c as string), "
                "'|', right.value.f), 'null'))\"")
        return f"  - name: {name}_up\n{up}\n  - name: {name}\n{down}"
    if c["up"] in WINDOW_UPS:
        if c["up"] == "sess":
            window = f"{{type: session, gap: {c['size']}ms, grace: {c['grace']}ms}}"
        elif c["up"] == "slide":
            window = f"{{type: sliding, time_difference: {c['size']}ms, grace: {c['grace']}ms}}"
        emit = {"-": "updates", "suppress": "final\n      close: suppress",
                "close": "final\n      close: on_window_close"}[c["how"]]
        up = (f"    aggregate:\n      input: {sources['left']}\n      window: {window}\n"
              f"      aggregations: {{c: count()}}\n      emit: {emit}")
        down = (f"    aggregate:\n      input: {name}_up\n      where: \"value.c >= 2\"\n"
                "      aggregations: {c: count(), f: {fold: {init: \"''\", step: \"concat(acc, cast(value.window_start as string), ':', "
                "cast(value.c as string), ';')\"}}}\n      emit: updates")
    else:
        if c["up"] == "tjoin":
            up = (f"    join:\n      left: {sources['left']}\n      table: {sources['right']}\n      how: {c['how']}\n"
                  "      value: \"named_struct('p', substr(left.value, -1), 'region', right.value)\"")
            where, step = "value.region != 'x'", "concat(acc, value.p)"
        else:
            join_window = f"{{before: {c['before']}ms, after: {c['after']}ms, grace: {c['jgrace']}ms}}"
            up = (f"    join:\n      left: {sources['left']}\n      right: {sources['right']}\n      how: {c['how']}\n"
                  f"      window: {join_window}\n"
                  "      value: \"concat(coalesce(substr(left.value, -1), '-'), '|', coalesce(right.value, '-'))\"")
            where, step = "substr(value, 1, 1) != 'x'", "concat(acc, value, ';')"
        down = (f"    aggregate:\n      input: {name}_up\n      where: \"{where}\"\n      window: {window}\n"
                f"      aggregations: {{c: count(), f: {{fold: {{init: \"''\", step: \"{step}\"}}}}}}\n"
                "      emit: updates")
    return f"  - name: {name}_up\n{up}\n  - name: {name}\n{down}"


def with_event_times(rng: random.Random, records: list[dict[str, Any]]) -> None:
    """An `invalid` scenario's timestamps in the value (`t`, read by `extractor: field`): the record's own, or for
    some records after the first an invalid one (negative, or missing); a null value has none either, so the
    first record has a value (under partition_time an invalid first record stops Kafka Streams and backfill)."""
    if records and records[0]["value"] is None:
        records[0]["value"] = {"n": 1, "p": "x"}
    for i, r in enumerate(records):
        if isinstance(r["value"], dict):
            roll = rng.random()
            t: Any = r["timestamp"] if i == 0 or roll >= INVALID_SHARE else rng.choice([-1, -5, None])
            r["value"] = {**r["value"], "t": t} if t is not None else dict(r["value"])


def source_of(kind: str, config: dict[str, Any], default: str) -> str:
    """The source a configuration's operator reads: an `invalid` one the source of its policy's extractor."""
    return f"scenarios_{config['policy']}_in" if kind == "invalid" else default


def harness_line(kind: str, sid: int, c: dict[str, Any]) -> str:
    """The S line of Replay.java for one scenario (an `invalid` one after the P line of its timestamps)."""
    if kind == "invalid":
        return (f"P\tinvalid\t{POLICIES[c['policy']]}\n"
                f"S\t{sid}\tagg\t{c['size']}\t{c['advance']}\t{c['grace']}\tupdates\tours\t-1\t-")
    if kind == "chain":
        return (f"S\t{sid}\tchain\t{c['up']}\t{c['how']}\t{c['size']}\t{c['advance']}\t{c['grace']}\t"
                f"{c['before']}\t{c['after']}\t{c['jgrace']}")
    if kind == "table_join":
        return f"S\t{sid}\ttjoin\t{c['how']}\t{c['history']}\t{c['grace']}\t{c['filter']}\t{c.get('rekey', '-')}"
    if kind == "table":
        return f"S\t{sid}\ttagg\t{c['agg']}\t{c['filter']}"
    return f"S\t{sid}\tagg\t{c['size']}\t{c['advance']}\t{c['grace']}\tupdates\tours\t-1\t{c['filter']}"


def observed(kind: str, config: dict[str, Any], r: dict[str, Any]) -> tuple:
    """One output row in the comparable form of the harness's rows."""
    if kind == "table_join":
        return (r["key"], None, r["value"], r["ts"])
    if kind == "chain":
        if config.get("up") in (*TABLE_JOIN_DOWN, *STREAM_JOIN_DOWN):
            return (r["key"], None, r["value"], r["ts"])
        window = (r["window_start"], r["window_end"]) if "window_start" in r else None
        return (r["key"], window, f"{r['c']}|{r['f']}", r["ts"])
    if kind == "table":
        if config["agg"] == "tomb":
            return (r["key"], None, r["f"], r["ts"])
        return (r["key"], None, f"{r['c']}|{r['s'] or 0}|{r['f']}", r["ts"])
    return (r["key"], (r["window_start"], r["window_end"]), f"{r['c']}|{r['s'] or 0}|{r['f']}", r["ts"])
