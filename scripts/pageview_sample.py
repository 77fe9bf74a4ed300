"""Write the page views x users sample read by jobs/pageviews_per_region.yaml (deterministic: rerun to regenerate).

    .venv/bin/python scripts/pageview_sample.py [--seed 5] [--minutes 20]

Kafka Streams' PageViewRegion shape: a website writes page views (keyed by user id) to one topic and the
users' profiles to a compacted one (keyed by user id too: co-partitioned, 2 partitions each). Most users
registered before the views begin; some register while they browse (their first views find no profile),
some move to another region midway, one account is deleted (a tombstone), and a few views have no page (a
beacon) or reach the broker late (a phone back online).
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from join_sample import OUT, START, _arrive  # noqa: E402 - the join sample's clock and arrival rule

USERS = [f"user-{i:03d}" for i in range(60)]
REGIONS = ["eu", "us", "apac"]
PAGES = ["/home", "/search", "/product", "/cart", "/checkout"]


def _events(rng: random.Random, minutes: int) -> list[tuple[int, str, str | None, dict | None, int]]:
    """(arrival time, topic, key, value, event time), in no particular order."""
    events = []
    late = set(rng.sample(USERS, 8))  # they register while they browse
    for user in USERS:
        at = START + rng.randint(60_000, minutes * 30_000) if user in late else START - rng.randint(1, 3_600_000)
        events.append((at, "users", user, {"region": rng.choice(REGIONS)}, at))
    for user in rng.sample(USERS, 6):  # moved to another region
        at = START + rng.randint(0, minutes * 60_000)
        events.append((at, "users", user, {"region": rng.choice(REGIONS)}, at))
    gone = START + minutes * 30_000
    events.append((gone, "users", USERS[0], None, gone))  # an account deleted: a tombstone
    weights = [1 / (i + 1) ** 0.6 for i in range(len(USERS))]
    t = START
    while t < START + minutes * 60_000:
        t += rng.randint(200, 1_500)
        user = rng.choices(USERS, weights)[0]
        page = None if rng.random() < 0.03 else rng.choice(PAGES)
        events.append(_arrive(rng, "pageviews", user, {"page": page}, t))
    return events


def write(seed: int, minutes: int) -> dict[str, int]:
    """Write samples/<topic>.jsonl as Kafka archives (offset order = arrival order); return counts."""
    rng = random.Random(seed)
    offsets: dict[tuple[str, int], int] = {}
    lines: dict[str, list[str]] = {"pageviews": [], "users": []}
    for _, topic, key, value, ts in sorted(_events(rng, minutes), key=lambda e: (e[0], e[1])):
        assert key is not None
        part = zlib.crc32(key.encode()) % 2
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
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--minutes", type=int, default=20)
    args = parser.parse_args()
    print(write(args.seed, args.minutes))
