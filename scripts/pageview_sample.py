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
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from join_sample import START, _arrive, write_archives  # noqa: E402 - the join sample's clock, arrivals, archives

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
    return write_archives(_events(rng, minutes), ("pageviews", "users"), rng)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--minutes", type=int, default=20)
    args = parser.parse_args()
    print(write(args.seed, args.minutes))
