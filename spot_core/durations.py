"""Durations and instants as users write them: ``90s``, ``5m``, ``1h30m``, ``2026-12-01T08:00Z``.

One parser for every surface: the settings model (``spot_core.settings``) checks every
duration knob with it, and ``spot-pipelines watch`` its own flags, without importing the
settings model (which pulls in the retry policy, and numpy with it, for its defaults: a
watcher starts on every lease, so it stays light).
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta
from typing import Any

from spot_core.errors import ConfigError

UNIT_SECONDS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = r"(\d+(?:\.\d+)?)([smhd])"
_DURATION = re.compile(rf"^(?:{_PART})+$")


def parse_duration(value: Any, *, name: str = "duration") -> float:
    """Seconds from a number, a ``timedelta`` or a string like ``90s``, ``5m``, ``1h30m``.

    A bare number (or numeric string) is seconds. One-line ConfigError naming the fix.
    """
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if math.isfinite(value):
            return float(value)
    elif isinstance(value, str):
        text = value.strip().lower().replace(" ", "")
        if _DURATION.match(text):
            seconds = sum(float(n) * UNIT_SECONDS[u] for n, u in re.findall(_PART, text))
            if math.isfinite(seconds):  # 400 digits of hours overflow to inf
                return seconds
        try:
            return parse_duration(float(text), name=name)
        except ValueError:
            pass
    raise ConfigError(
        f"{name}={value!r} is not a duration; give seconds (90), a timedelta, "
        "or a string like '90s', '5m', '2h', '1d'"
    )


def parse_time(value: Any, *, name: str = "deadline") -> datetime:
    """An absolute time from a ``datetime`` or an ISO string; no zone means UTC."""
    when = value
    if isinstance(value, str):
        try:
            when = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            when = None
    if not isinstance(when, datetime):
        raise ConfigError(
            f"{name}={value!r} is neither a duration (90m, 12h, 2d) nor an ISO "
            "time (2026-12-01T08:00Z)"
        )
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def format_duration(seconds: float) -> str:
    """The shortest exact form among d, h, m, s (for help texts and messages)."""
    for unit in ("d", "h", "m"):
        count = seconds / UNIT_SECONDS[unit]
        if count >= 1 and count == int(count):
            return f"{int(count)}{unit}"
    return f"{seconds:g}s"
