"""Part: foundation. Durations as integer milliseconds: `500ms`, `30s`, `5m`, `24h`, `1d` (job-spec.md "Durations")."""
from __future__ import annotations

import re

UNITS_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION = re.compile(r"^\s*(-?\d+)\s*(ms|s|m|h|d)\s*$")
HINT = "use an integer with a unit, e.g. 5m, 30s, 500ms, 24h, 1d"
# 100 years: every sum the engine forms (a timestamp plus size, advance, grace, before, after) stays far
# below 2^63 ms, so no window or retention bound can overflow a Java/Spark long
MAX_MS = 36_500 * UNITS_MS["d"]


def parse_duration(text: object) -> int:
    """Parse a duration to milliseconds; raise ValueError with a one-line hint."""
    if isinstance(text, bool) or not isinstance(text, str):
        raise ValueError(f"{text!r} is not a duration; {HINT}")
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a duration; {HINT}")
    ms = int(match.group(1)) * UNITS_MS[match.group(2)]
    if abs(ms) > MAX_MS:
        raise ValueError(f"{text!r} is out of range; a duration is at most 36500d (100 years)")
    return ms


def format_duration(ms: int) -> str:
    """Render milliseconds with the largest exact unit (300000 -> '5m')."""
    for unit in ("d", "h", "m", "s"):
        if ms and ms % UNITS_MS[unit] == 0:
            return f"{ms // UNITS_MS[unit]}{unit}"
    return f"{ms}ms"


INSTANT_HINT = "use ISO-8601 (2024-01-01T00:00:00Z) or epoch milliseconds"


def parse_instant(text: str | int) -> int:
    """An ISO-8601 instant (UTC when it names no zone) or epoch milliseconds, as epoch ms; ValueError if neither."""
    import datetime as dt

    if isinstance(text, int) or str(text).lstrip("-").isdigit():
        return int(text)
    value = dt.datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.timezone.utc)
    return int(value.timestamp() * 1000)
