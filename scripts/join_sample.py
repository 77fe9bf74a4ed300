"""Write the clicks x impressions sample read by jobs/clicks_impressions.yaml (deterministic: rerun to regenerate).

    .venv/bin/python scripts/join_sample.py [--seed 11] [--minutes 20]

It also writes samples/click_attribution_stream.jsonl, a simulated streaming output of the click_attribution
join with the differences a live application shows (backfill/demo/join_stream.py), which the job's `verify`
section reconciles.

An ad server writes impressions (an ad shown to a user) and clicks (a user clicking an ad) to two topics
of 2 partitions, both keyed by user id, so they are co-partitioned as a stream-stream join requires.
About a third of the impressions get a click 2-90 s later; some clicks have no impression near them (seen
on another device); a few percent of the records reach the broker late (a phone back online); a few clicks
have no user (key null) and a few impressions were written with a null value.
"""
from __future__ import annotations

import argparse
import json
import random
import zlib
from pathlib import Path

START = 1_767_225_600_000  # 2026-01-01T00:00:00Z
USERS = [f"user-{i:03d}" for i in range(300)]
ADS = [f"ad-{i}" for i in range(12)]
PLACEMENTS = ["feed", "search", "sidebar"]
PAGES = ["/home", "/search", "/product", "/cart"]
OUT = Path(__file__).resolve().parent.parent / "jobs" / "samples"


def _events(rng: random.Random, minutes: int) -> list[tuple[int, str, str | None, dict | None, int]]:
    """(arrival time, topic, key, value, event time), in no particular order."""
    users = rng.choices(USERS, [1 / (i + 1) ** 0.4 for i in range(len(USERS))], k=10_000)
    events, t, i = [], START, 0
    while t < START + minutes * 60_000:
        t += rng.randint(400, 3_000)
        user, ad = users[i % len(users)], rng.choice(ADS)
        i += 1
        value = None if rng.random() < 0.005 else {"ad": ad, "placement": rng.choice(PLACEMENTS)}
        events.append(_arrive(rng, "impressions", user, value, t))
        if rng.random() < 0.35:
            events.append(_arrive(rng, "clicks", user, {"ad": ad, "page": rng.choice(PAGES)},
                                  t + rng.randint(2_000, 90_000)))
        if rng.random() < 0.06:  # a click with no impression of that user nearby
            key = None if rng.random() < 0.3 else rng.choice(USERS)
            events.append(_arrive(rng, "clicks", key, {"ad": rng.choice(ADS), "page": rng.choice(PAGES)}, t))
    return events


def _arrive(rng: random.Random, topic: str, key: str | None, value: dict | None, ts: int
            ) -> tuple[int, str, str | None, dict | None, int]:
    late = rng.randint(20_000, 240_000) if rng.random() < 0.04 else rng.randint(0, 300)
    return ts + late, topic, key, value, ts


def write(seed: int, minutes: int) -> dict[str, int]:
    """Write samples/<topic>.jsonl as Kafka archives (offset order = arrival order); return counts."""
    rng = random.Random(seed)
    return write_archives(_events(rng, minutes), ("impressions", "clicks"), rng)


def write_archives(events: list[tuple[int, str, str | None, dict | None, int]], topics: tuple[str, ...],
                   rng: random.Random) -> dict[str, int]:
    """Events (arrival, topic, key, value, event time) as samples/<topic>.jsonl Kafka archives of 2 partitions
    keyed by the key's CRC-32 (a null key: a random partition), offsets in arrival order; the counts."""
    offsets: dict[tuple[str, int], int] = {}
    lines: dict[str, list[str]] = {topic: [] for topic in topics}
    for _, topic, key, value, ts in sorted(events, key=lambda e: (e[0], e[1])):
        part = zlib.crc32(key.encode()) % 2 if key is not None else rng.randrange(2)
        offset = offsets.get((topic, part), 0)
        offsets[(topic, part)] = offset + 1
        lines[topic].append(json.dumps({"topic": topic, "partition": part, "offset": offset, "key": key,
                                        "value": None if value is None else json.dumps(value), "timestamp": ts}))
    OUT.mkdir(parents=True, exist_ok=True)
    for topic, rows in lines.items():
        (OUT / f"{topic}.jsonl").write_text("\n".join(rows) + "\n")
    return {topic: len(rows) for topic, rows in lines.items()}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--minutes", type=int, default=20)
    args = parser.parse_args()
    print(write(args.seed, args.minutes))
    from backfill.demo.join_stream import write_join_stream_sample

    job = OUT.parent / "clicks_impressions.yaml"
    print(write_join_stream_sample(job, "click_attribution", OUT / "click_attribution_stream.jsonl"))
