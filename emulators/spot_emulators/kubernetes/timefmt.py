"""Timestamps in the two shapes the API uses: RFC 3339 seconds for object fields and
RFC 3339 nanoseconds for log lines (``?timestamps=true``)."""

from __future__ import annotations

import time


def rfc3339(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def rfc3339_nano(ts: float) -> str:
    whole = int(ts)
    return (
        time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + f".{int((ts - whole) * 1e9):09d}Z"
    )


def micro_time(ts: float) -> str:
    """``MicroTime`` fields (eventTime, lease renewTime)."""
    whole = int(ts)
    return (
        time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + f".{int((ts - whole) * 1e6):06d}Z"
    )
