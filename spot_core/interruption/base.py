"""What a detector reports (``Notice``) and the small protocol every detector follows.

A notice is a plain frozen record so that the watcher can dedupe it, the CLI can print
it and a step can read it back from the notice file without knowing which cloud (or
signal) produced it.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import json
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

INTERRUPTION = "interruption"
REBALANCE = "rebalance"
# Not from a cloud: the node's watcher lost the driver's heartbeat and stops the step as an
# interruption would (see ``spot_core.interruption.driver``).
DRIVER_LOST = "driver_lost"
KINDS = (INTERRUPTION, REBALANCE, DRIVER_LOST)


@dataclass(frozen=True)
class Notice:
    """One notice that capacity is going away (or, for ``rebalance``, is at risk).

    ``deadline`` is when the capacity goes away (POSIX seconds) or None when the
    source does not say. ``identity`` is what the source uses to tell notices apart
    (Azure's EventId, GCE's one-shot flag); when empty, the deadline does that job.
    ``raw`` is what the endpoint said, kept for diagnostics and excluded from equality.
    """

    kind: str
    cloud: str
    action: str
    deadline: float | None
    detected_at: float
    raw: Any = field(default=None, compare=False, hash=False, repr=False)
    identity: str = ""

    @property
    def is_interruption(self) -> bool:
        return self.kind == INTERRUPTION

    @property
    def stops_step(self) -> bool:
        """The step must save and stop: capacity is going away, or nobody watches it."""
        return self.kind in (INTERRUPTION, DRIVER_LOST)

    @property
    def key(self) -> Hashable:
        """Dedupe key: the same notice served on every poll must fire handlers once."""
        marker = self.identity or self.deadline
        return (self.cloud, self.kind, self.action, marker)

    def to_event(self) -> dict[str, Any]:
        """The JSON object ``spot-pipelines watch`` prints and writes to the notice file."""
        return {
            "event": self.kind,
            "action": self.action,
            "deadline": None if self.deadline is None else format_rfc3339(self.deadline),
            "detected_at": format_rfc3339(self.detected_at),
            "cloud": self.cloud,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_event(), sort_keys=False, allow_nan=False)


@runtime_checkable
class Detector(Protocol):
    """Asks one source whether a notice is pending.

    ``poll`` never raises because an endpoint is down, slow or talking nonsense: it
    logs (once per failure streak) and returns no notices, so the watcher keeps going.
    """

    name: str

    def poll(self, now: float) -> list[Notice]: ...


def format_rfc3339(ts: float) -> str:
    """UTC RFC 3339 with a ``Z``; milliseconds only when the time has a fraction."""
    when = dt.datetime.fromtimestamp(ts, tz=dt.UTC)
    if when.microsecond:
        return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(text: Any) -> float:
    """Parse an RFC 3339 timestamp; naive ones are UTC. ValueError on anything else."""
    if not isinstance(text, str) or "T" not in text.upper():
        raise ValueError(f"not an RFC 3339 timestamp: {text!r}")
    when = dt.datetime.fromisoformat(text.strip())
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


def parse_rfc1123(text: Any) -> float:
    """Parse an HTTP date such as Azure's ``Mon, 19 Sep 2016 18:29:47 GMT``."""
    if not isinstance(text, str):
        raise ValueError(f"not an HTTP date: {text!r}")
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError) as exc:
        raise ValueError(f"not an HTTP date: {text!r}") from exc
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


def format_rfc1123(ts: float) -> str:
    return email.utils.formatdate(ts, usegmt=True)


@dataclass(frozen=True)
class DetectorPlugin:
    """What a notice detector declares, in its own module, for the registry
    (``spot_core.interruption.registry``: entry point group ``spot_pipelines.detectors``).

    ``make(endpoint, timeout, environ)`` builds the detector (``endpoint``: its metadata
    service, None for its default). ``probe(endpoint, timeout)``: whether its metadata
    service answers here, for ``--cloud auto`` (None: it is never probed). ``endpoint``:
    its service's default address. ``aliases``: other names users give it. ``rank``: its
    place in lists and ``auto``'s preference when several services answer (lower first).
    """

    make: Callable[[str | None, float, Mapping[str, str]], Detector]
    summary: str = ""
    probe: Callable[[str, float], bool] | None = None
    endpoint: str | None = None
    aliases: tuple[str, ...] = ()
    rank: int = 100
