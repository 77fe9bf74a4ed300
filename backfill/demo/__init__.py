"""Part: commands. `backfill demo`: generate a Kafka-archive click sample, run jobs/demo.yaml on it, explain what was
dropped."""
from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import random
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
from rich.console import Console
from rich.table import Table

from backfill.errors import SpecError
from backfill.jobspec.durations import format_duration
from backfill.jobspec.models import WindowSpec
from backfill.demo.fraud import PAYMENTS, backtest_summary, explain_backtest, generate_payments
from backfill.demo.stream import partition_for
from backfill.resources import bundled

TOPIC = "clicks"
START_MS = 1_704_067_200_000  # 2024-01-01T00:00:00Z
USERS = [f"user-{i:03d}" for i in range(1, 51)]
PAGES = ("/home", "/search", "/product", "/cart", "/login")  # distinct second letters for the `pages` fold
PAGE_WEIGHTS = (40, 25, 20, 10, 5)
LATE_SHARE = 0.03  # share of records produced with an older timestamp (stragglers)
AMOUNT_SHARE = 0.3  # clicks that carry a purchase amount; the rest have amount null
NULL_KEYS = 3  # a producer bug: a few records without a key (Kafka Streams drops them: null_key)

WORK_DIR = "demo-output"
SOURCE = "data/bronze/clicks"
LEDGER = "data/ledger/clicks"
GOLD = "data/gold"
STREAM = "data/stream/clicks_per_user_1m"  # the simulated streaming output (backfill/demo/stream.py)
# the join example and its simulated streaming output (backfill/demo/join_stream.py), copied as they are
JOIN_EXAMPLE = ("jobs/clicks_impressions.yaml", "jobs/samples/clicks.jsonl", "jobs/samples/impressions.jsonl",
                "jobs/samples/click_attribution_stream.jsonl", "schemas/impression.json", "schemas/ad_click.json")
STREAM_OPERATOR = "clicks_per_user_1m"
# Kafka Streams' PageViewRegion shape (a filter, a stream-table join, a re-key, a hopping count), bundled as it is
PAGEVIEWS = ("jobs/pageviews_per_region.yaml", "jobs/samples/pageviews.jsonl", "jobs/samples/users.jsonl")
EXAMPLES = 5

ARCHIVE_SCHEMA = pa.schema([
    ("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()), ("key", pa.string()),
    ("value", pa.string()), ("timestamp", pa.int64()),
    ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
])


# ----------------------------------------------------------------------------- the sample


def _user_weights() -> list[float]:
    """Zipf-like popularity: a few heavy users, a long tail."""
    return [1 / (rank + 1) ** 0.9 for rank in range(len(USERS))]


def _delay_ms(rng: random.Random) -> int:
    """How far behind its partition a straggler is: mostly seconds, sometimes minutes (a phone back online)."""
    r = rng.random()
    if r < 0.7:
        return rng.randint(5_000, 30_000)
    if r < 0.95:
        return rng.randint(30_000, 90_000)
    return rng.randint(90_000, 240_000)


def _value(rng: random.Random, user: str, ts: int) -> str:
    """The click as JSON (schemas/click.json)."""
    page = rng.choices(PAGES, PAGE_WEIGHTS)[0]
    amount = round(rng.uniform(1, 200), 2) if rng.random() < AMOUNT_SHARE else None
    return json.dumps({"user": user, "page": page, "amount": amount, "ts": ts})


def _clicks(n: int, partitions: int, seed: int) -> tuple[dict[str, list[Any]], list[int]]:
    """The records column-wise, in production order, and the delays injected (ms)."""
    rng = random.Random(seed)
    weights = _user_weights()
    no_key = set(rng.sample(range(n), min(NULL_KEYS, n)))
    cols: dict[str, list[Any]] = {name: [] for name in ARCHIVE_SCHEMA.names}
    offsets, partition_time = [0] * partitions, [START_MS] * partitions
    clock, delays = START_MS, []
    for i in range(n):
        clock += rng.randint(100, 300)  # one producer: a click every 100-300 ms
        user = rng.choices(USERS, weights)[0]
        key = None if i in no_key else user
        # keyless records go to any partition (a producer's sticky partitioner)
        part = rng.randrange(partitions) if key is None else partition_for(key, partitions)
        ts = clock
        if rng.random() < LATE_SHARE:
            delay = _delay_ms(rng)
            if partition_time[part] - delay >= START_MS:  # no straggler from before the sample starts
                ts = partition_time[part] - delay
                delays.append(delay)
        partition_time[part] = max(partition_time[part], ts)
        for name, value in (("topic", TOPIC), ("partition", part), ("offset", offsets[part]), ("key", key),
                            ("value", _value(rng, user, ts)), ("timestamp", ts), ("headers", None)):
            cols[name].append(value)
        offsets[part] += 1
    return cols, delays


def generate_clicks(path: str, n: int = 20_000, partitions: int = 2, seed: int = 7) -> dict[str, Any]:
    """Write a deterministic click sample as a Kafka-archive Delta table at `path`; return what it holds."""
    from deltalake import write_deltalake

    cols, delays = _clicks(n, partitions, seed)
    write_deltalake(path, pa.table(cols, schema=ARCHIVE_SCHEMA), mode="overwrite")
    per_partition = Counter(cols["partition"])
    stamps = cols["timestamp"]
    return {
        "path": path, "records": n, "seed": seed, "users": len(set(k for k in cols["key"] if k)),
        "partitions": {p: per_partition[p] for p in range(partitions)},
        "null_keys": sum(k is None for k in cols["key"]), "late_injected": len(delays),
        "late_delay_ms": {"min": min(delays, default=0), "max": max(delays, default=0)},
        "start_ms": min(stamps), "end_ms": max(stamps), "span_s": round((max(stamps) - min(stamps)) / 1000, 1),
    }


# ----------------------------------------------------------------------------- the run


def run_demo(out: Console, err: Console, profile: str | None, as_json: bool) -> None:
    """Generate the sample under ./demo-output if missing, run the demo job, print the summary and the drops."""
    from backfill.execute import execute
    from backfill.summary import print_summary

    work = Path.cwd() / WORK_DIR
    sample = None
    if not (work / SOURCE / "_delta_log").is_dir():
        sample = generate_clicks(str(work / SOURCE))
        if not as_json:
            err.print(f"[dim]generated {sample['records']:,} clicks ({sample['late_injected']} late, "
                      f"{sample['null_keys']} without key) in {WORK_DIR}/{SOURCE}[/]", highlight=False)
    job = install_job(work)
    summary = execute(job, None, None, profile, "spark", err, quiet=as_json)
    ledger = _read_delta(work / LEDGER).to_pylist()
    windows = _windows(job)
    stream = stream_sample(work, job)
    # the rules example: a Flink fraud-detection job's alerts re-derived, and a back-test of a changed rule
    if not (work / PAYMENTS / "transactions.jsonl").is_file():
        generate_payments(work / PAYMENTS)
    live = execute(work / "jobs" / "fraud_rules.yaml", None, None, profile, "spark", err, quiet=True)
    execute(work / "jobs" / "fraud_backtest.yaml", None, None, profile, "spark", err, quiet=True)
    backtest = backtest_summary(work)
    pageviews = execute(work / PAGEVIEWS[0], None, None, profile, "spark", err, quiet=True)
    if as_json:
        print(json.dumps({"sample": sample, "summary": summary, "ledger": _reason_counts(ledger),
                          "late_examples": _examples(ledger, windows), "outputs": _outputs(summary),
                          "stream_sample": stream, "rules": {"summary": live, "backtest": backtest},
                          "pageviews": pageviews}, indent=2, default=str))
        return
    print_summary(out, summary)
    explain_drops(out, summary, ledger, windows)
    out.print(f"A simulated streaming output of {STREAM_OPERATOR} (with a few restarts, duplicates and windows "
              f"still open at the archive's end) is in {WORK_DIR}/{STREAM}; check the backfill against it with "
              f"[bold]backfill verify {WORK_DIR}/jobs/demo.yaml --against {STREAM_OPERATOR}={WORK_DIR}/{STREAM}[/]",
              highlight=False)
    join = f"{WORK_DIR}/{JOIN_EXAMPLE[0]}"
    out.print(f"The join example (which impression led to each click) has a simulated streaming output too: "
              f"[bold]backfill verify {join} --run[/] re-derives the join and explains every difference of it.",
              highlight=False)
    explain_backtest(out, backtest, live)
    explain_pageviews(out, pageviews)


def explain_pageviews(out: Console, summary: dict[str, Any]) -> None:
    """The topology example in a few lines: what each step kept, and where its outputs are."""
    enriched, regions = summary["operators"]["enriched"], summary["operators"]["views_per_region"]
    out.print(f"\n[bold]A topology[/] (Kafka Streams' PageViewRegion: filter, stream-table join with the users "
              f"table, re-key by region, hopping count): {summary['records_read']['pageviews']:,} page views, "
              f"{enriched['filtered']:,} without a page filtered before the join, {enriched['outputs']:,} enriched; "
              f"{regions['filtered']:,} of a user with no region filtered before the re-key; "
              f"{regions['outputs']:,} window updates per region ({regions['late_pairs']:,} late (view, window) "
              f"pairs in the ledger) in {WORK_DIR}/out/pageviews_per_region/. "
              f"[bold]backfill plan {WORK_DIR}/{PAGEVIEWS[0]}[/] shows the topology and how a run executes it.",
              highlight=False)


def stream_sample(work: Path, job: Path) -> dict[str, Any] | None:
    """The bundled "streaming output" of the 1m operator, simulated from the same input (demo/stream.py)."""
    from backfill.demo.stream import write_stream_sample

    if (work / STREAM / "_delta_log").is_dir():
        return None
    return write_stream_sample(job, STREAM_OPERATOR, work / STREAM)


def install_job(work: Path) -> Path:
    """Copy the demo's jobs and schemas/click.json into `work` (same layout, so relative paths hold)."""
    for rel in ("jobs/demo.yaml", "jobs/fraud_rules.yaml", "jobs/fraud_backtest.yaml", "jobs/scheduled_clicks.yaml",
                "schemas/click.json", *JOIN_EXAMPLE, *PAGEVIEWS):
        shipped = bundled(rel)  # the checkout's, or the installed wheel's copy
        if not shipped.is_file():
            raise SpecError(f"{shipped}: a file of the demo is missing from this installation; reinstall backfill "
                            "(a wheel built from the repository, or `pip install -e` from a clone)")
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shipped, work / rel)  # always the bundled version: the demo is reproducible
    return work / "jobs" / "demo.yaml"


def _read_delta(path: Path) -> pa.Table:
    """A small Delta table, whole (the ledger)."""
    from backfill.io.delta import arrow_table

    return arrow_table(str(path))


def _windows(job: Path) -> dict[str, WindowSpec]:
    """The window of each aggregate operator of the job, to say when its windows closed."""
    from backfill.jobspec.load import load_job

    spec = load_job(job).spec
    return {op.name: op.aggregate.window for op in spec.operators if op.aggregate is not None}


# ----------------------------------------------------------------------------- explaining the drops

REASONS = {
    "late": "its window had closed: stream time >= window end + grace (a session: > its end + gap + grace)",
    "null_key": "no key, nothing to group by (Kafka Streams skips it)",
    "invalid_timestamp": "no valid timestamp (on_invalid: skip)",
}


def _reason_counts(ledger: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Ledger rows per operator and reason."""
    counts: dict[str, dict[str, int]] = {}
    for row in ledger:
        per_op = counts.setdefault(row["operator"] or "(source)", {})
        per_op[row["reason"]] = per_op.get(row["reason"], 0) + 1
    return counts


def _examples(ledger: list[dict[str, Any]], windows: dict[str, WindowSpec]) -> list[dict[str, Any]]:
    """A few late drops to look at, from every operator, from the furthest behind to the nearest."""
    late = [r for r in ledger if r["reason"] == "late"]
    refused = Counter((r["operator"], r["partition"], r["offset"]) for r in late)
    picked = []
    for i, op in enumerate(sorted(windows)):
        mine = sorted((r for r in late if r["operator"] == op),
                      key=lambda r: (r["timestamp"] - r["stream_time"], r["partition"], r["offset"], r["window_start"]))
        k = min(len(mine), EXAMPLES // len(windows) + (i < EXAMPLES % len(windows)))
        w = windows[op]
        for j in range(k):  # spread over the range of lateness: stragglers and near misses
            r = mine[j * (len(mine) - 1) // max(k - 1, 1)]
            closes = r["window_end"] + w.grace_ms + (int(w.gap or 0) if w.type == "session" else 0)
            picked.append({**r, "grace_ms": w.grace_ms, "closes_ms": closes,
                           "behind_ms": r["stream_time"] - r["timestamp"],
                           "windows_refused": refused[(op, r["partition"], r["offset"])],
                           "windows_of_record": _windows_per_record(w)})
    return picked


def _clock(ms: int, seconds: bool = True) -> str:
    """Time of day (UTC) of epoch ms; the sample lives on 2024-01-01."""
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).strftime("%H:%M:%S" if seconds else "%H:%M")


def _windows_per_record(w: WindowSpec) -> int:
    """How many windows a record falls into: ceil(size / advance); one session."""
    return 1 if w.type == "session" else -(-w.size_ms // w.advance_ms)


def _describe(w: WindowSpec) -> str:
    """`tumbling 1m, grace 10s` / `hopping 5m every 1m, grace 30s` / `session gap 2m, grace 30s`."""
    if w.type == "session":
        return f"session gap {format_duration(int(w.gap or 0))}, grace {format_duration(w.grace_ms)}"
    every = f" every {format_duration(w.advance_ms)}" if w.type == "hopping" else ""
    return f"{w.type} {format_duration(w.size_ms)}{every}, grace {format_duration(w.grace_ms)}"


def _outputs(summary: dict[str, Any]) -> dict[str, str]:
    """Sink name -> path relative to the current directory."""
    return {name: _rel(sink["path"]) for name, sink in summary["sinks"].items()}


def _rel(path: str) -> str:
    """`path` relative to the current directory when it is under it (shorter to read and to paste)."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return path


def explain_drops(out: Console, summary: dict[str, Any], ledger: list[dict[str, Any]],
                  windows: dict[str, WindowSpec]) -> None:
    """Say in a few lines what was dropped and why, with example late records and where the outputs are."""
    counts = _reason_counts(ledger)
    out.print()
    out.print("[bold]What was dropped, and why[/] (times are UTC, 2024-01-01)", highlight=False)
    out.print("Stream time is the highest timestamp a task (one partition here) has seen so far. Kafka Streams "
              "closes a window once stream time reaches window end + grace; a record arriving after that is "
              "dropped for that window. A hopping record can miss an old window and still count in newer ones. "
              "A session closes once stream time passes its end + gap + grace; a click that would only start "
              "or extend a closed session is dropped, one inside a session still open is counted.",
              highlight=False)
    out.print(_reason_table(summary, counts))
    for reason in sorted({r for per_op in counts.values() for r in per_op}):
        out.print(f"  {reason}: {REASONS.get(reason, 'see the ledger rows')}", highlight=False)
    examples = _examples(ledger, windows)
    for op, w in windows.items():
        out.print(_late_table(op, w, [e for e in examples if e["operator"] == op]))
    ledger_path = _outputs(summary).get("_ledger", f"{WORK_DIR}/{LEDGER}")
    out.print(f"Outputs: one Delta table per operator in {WORK_DIR}/{GOLD}/, every drop in {ledger_path}. "
              f"Read one with [bold]python -c \"from deltalake import DeltaTable as T; "
              f"print(T('{ledger_path}').to_pandas())\"[/]; edit {WORK_DIR}/jobs/demo.yaml and rerun it with "
              f"[bold]backfill run {WORK_DIR}/jobs/demo.yaml[/].", highlight=False)
    out.print(f"On a schedule: [bold]backfill run {WORK_DIR}/jobs/scheduled_clicks.yaml --due[/] publishes the "
              "sample's complete 10-minute intervals, each once; [bold]backfill runs[/] on the same file lists them.",
              highlight=False)


def _reason_table(summary: dict[str, Any], counts: dict[str, dict[str, int]]) -> Table:
    """Ledger rows and whole records lost, per operator and reason."""
    table = Table("operator", "reason", "ledger rows", "records lost entirely", box=None, pad_edge=False)
    for op, reasons in sorted(counts.items()):
        dropped = summary["operators"].get(op, {}).get("dropped", {})
        for reason, n in sorted(reasons.items()):
            table.add_row(op, reason, f"{n:,}", f"{dropped.get(reason, n):,}")
    return table


def _late_table(op: str, w: WindowSpec, examples: list[dict[str, Any]]) -> Table:
    """Example late drops of one operator: when the window closed and how far behind the record was."""
    table = Table("key", "timestamp", "window", "closes", "stream time", "behind", "late for", box=None,
                  pad_edge=False, title=f"late examples, {op} ({_describe(w)})", title_justify="left")
    seconds = w.type == "session"  # a session's bounds are click times
    for e in examples:
        table.add_row(e["key"], _clock(e["timestamp"]),
                      f"{_clock(e['window_start'], seconds)}-{_clock(e['window_end'], seconds)}",
                      _clock(e["closes_ms"]), _clock(e["stream_time"]),
                      f"{e['behind_ms'] / 1000:.1f} s", f"{e['windows_refused']} of {e['windows_of_record']}")
    return table


# ----------------------------------------------------------------------------- the demo through Kafka

KAFKA_DIR = "kafka"


DEMO_PASSWORD_ENV = "BACKFILL_DEMO_KAFKA_PASSWORD"
# the demo's clicks as Avro: the second version adds a field with a default halfway through the history
CLICK_AVRO = {"type": "record", "name": "Click", "namespace": "demo", "fields": [
    {"name": "user", "type": "string"}, {"name": "page", "type": "string"},
    {"name": "amount", "type": ["null", "double"], "default": None}, {"name": "ts", "type": "long"}]}
CLICK_AVRO_V2 = {**CLICK_AVRO, "fields": [*CLICK_AVRO["fields"], {"name": "device", "type": "string",
                                                                  "default": "web"}]}


def run_kafka_demo(out: Console, err: Console, profile: str | None, as_json: bool, avro: bool = False) -> bool:
    """The demo through a real broker: produce the clicks to a topic, archive it, run the job from both.

    Starts a local broker (127.0.0.1, temporary log) and stops it at the end; returns True when the run
    from the topic and the run from its archive published identical outputs and ledgers. `avro`: the broker
    is read over SASL_SSL (SCRAM-SHA-512, its password in an environment variable the job names), and the
    clicks are Avro in the registry's wire format, two schema versions, through a local schema registry.
    """
    from backfill.execute import execute
    from backfill.io.archive import archive_topic
    from backfill.io.broker import start_broker
    from backfill.io.kafka import create_topic, produce
    from backfill.session import get_spark

    def say(line: str) -> None:
        if not as_json:
            err.print(f"[dim]{line}[/]", highlight=False)

    work = Path.cwd() / WORK_DIR / KAFKA_DIR
    shutil.rmtree(work, ignore_errors=True)
    install_job(work)
    cols, _ = _clicks(20_000, 2, 7)
    say("starting a local Kafka broker (KRaft, 127.0.0.1)" + (" with SASL and TLS listeners" if avro else ""))
    with start_broker(secure=avro) as broker, _registry(avro, say) as registry:
        create_topic(broker.bootstrap, TOPIC, 2)
        values: list[Any] = cols["value"]
        security, bootstrap, value = None, broker.bootstrap, None
        if avro:
            user, password = broker.users["SCRAM-SHA-512"]
            os.environ[DEMO_PASSWORD_ENV] = password  # this process's clients read it; the job names the variable
            security = {"protocol": "SASL_SSL", "mechanism": "SCRAM-SHA-512", "username": user,
                        "password": "${env:" + DEMO_PASSWORD_ENV + "}", "ca_file": str(broker.ca_file)}
            bootstrap, value = broker.listeners["SASL_SSL"], {"format": "avro", "registry": {"url": registry.url}}
            values = _avro_values(registry.url, values)
            say(f"clicks as Avro through the schema registry at {registry.url}: schema ids "
                f"{sorted({int.from_bytes(v[1:5], 'big') for v in values})}; the cluster read over SASL_SSL")
        from backfill.jobspec.models import SecuritySpec

        spec = SecuritySpec(**security) if security else None
        records = [{"partition": p, "key": k, "value": v, "timestamp": t}
                   for p, k, v, t in zip(cols["partition"], cols["key"], values, cols["timestamp"])]
        say(f"produced {produce(bootstrap, TOPIC, records, spec):,} clicks to topic {TOPIC} at {bootstrap}")
        archived = archive_topic(get_spark(profile), bootstrap, TOPIC, str(work / SOURCE), say, spec)
        say(f"archived {archived['records']:,} records into {WORK_DIR}/{KAFKA_DIR}/{SOURCE}")
        runs = {}
        kafka = {"bootstrap": bootstrap, "topic": TOPIC, **({"security": security} if security else {})}
        extra = {"value": value} if value else {}
        for name, source in (("topic", {"format": "kafka", "kafka": kafka, **extra}),
                             ("archive", {"format": "delta", "path": f"../{SOURCE}", **extra})):
            say(f"running the demo job from the {name}")
            runs[name] = execute(_variant(work, name, source), None, None, profile, "spark", err, quiet=True)
    same = {sink: _table_rows(work / "gold-topic" / sink) == _table_rows(work / "gold-archive" / sink)
            for sink in (*_windows(work / "jobs" / "demo.yaml"), "ledger")}
    if as_json:
        print(json.dumps({"archive": archived, "identical": same, "runs": runs}, indent=2, default=str))
    else:
        for sink, equal in same.items():
            rows = len(_table_rows(work / "gold-topic" / sink))
            out.print(f"{sink}: {rows:,} rows from the topic, "
                      + ("identical to the run from the archive" if equal else "[red]DIFFERENT[/] from the archive"),
                      highlight=False)
        out.print("[bold green]the topic and its archive gave identical outputs[/]" if all(same.values()) else
                  "[bold red]the topic and its archive gave different outputs[/]", highlight=False)
    return all(same.values())


@contextlib.contextmanager
def _registry(wanted: bool, say: Any) -> Iterator[Any]:
    """A local schema registry for the Avro variant (none otherwise)."""
    if not wanted:
        yield None
        return
    from backfill.io.registry_server import start_registry

    say("starting a local schema registry (Apicurio Registry, 127.0.0.1)")
    with start_registry() as registry:
        yield registry


def _avro_values(url: str, values: list[str]) -> list[bytes]:
    """The JSON clicks as Avro through confluent-kafka's serializer: the first half v1, the rest v2 (`device`)."""
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from backfill.io.registry import serializer_client

    client, conf = serializer_client(url)
    ctx = SerializationContext(TOPIC, MessageField.VALUE)
    v1 = AvroSerializer(client, json.dumps(CLICK_AVRO), conf=conf)
    v2 = AvroSerializer(client, json.dumps(CLICK_AVRO_V2), conf=conf)
    half = len(values) // 2
    return [v1(json.loads(v), ctx) if i < half else v2({**json.loads(v), "device": "app"}, ctx)
            for i, v in enumerate(values)]


def _variant(work: Path, name: str, source: dict[str, Any]) -> Path:
    """The demo job reading `source`, writing under gold-<name>/ (outputs) of `work`."""
    import yaml

    spec = yaml.safe_load((work / "jobs" / "demo.yaml").read_text())
    spec["name"] = f"clicks-demo-{name}"
    spec["sources"]["clicks"] = {**{k: v for k, v in spec["sources"]["clicks"].items()
                                    if k not in ("format", "path")}, **source}
    spec["sinks"] = {sink: {"format": "delta", "path": f"../gold-{name}/{'ledger' if sink == '_ledger' else sink}"}
                     for sink in spec["sinks"]}
    spec.pop("verify", None)
    job = work / "jobs" / f"demo-{name}.yaml"
    job.write_text(yaml.safe_dump(spec, sort_keys=False))
    return job


def _table_rows(path: Path) -> list[tuple[Any, ...]]:
    """Every row of a Delta table, sorted (for an order-free comparison)."""
    return sorted((tuple(r.values()) for r in _read_delta(path).to_pylist()), key=repr)
