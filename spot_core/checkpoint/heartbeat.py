"""The driver's heartbeat: how a lease learns that nobody watches it any more.

Whatever drives a job (``spot-pipelines run``, an Airflow worker or triggerer, a Prefect
worker) renews the heartbeat object in the job's store while it watches a lease. The
watcher on the node reads it; when it has not changed for longer than the job's heartbeat
timeout, the driver is gone (SIGKILL, a lost worker), and the watcher stops the step
after an emergency save and ends the lease, so a dead driver never leaves billed,
unwatched capacity behind.

The node judges staleness by its own clock (how long since it last saw the object
change), not by the driver's timestamp, so clock skew between the two cannot end a lease
early or keep one alive.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

HEARTBEAT_KEY = "heartbeat/driver.json"


@dataclass(frozen=True)
class Beat:
    """One renewal: which attempt the driver watches, when (driver's clock), and a counter."""

    attempt: int
    renewed_at: float
    sequence: int

    def to_bytes(self) -> bytes:
        return json.dumps({"attempt": self.attempt, "renewed_at": self.renewed_at,
                           "sequence": self.sequence}).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> "Beat | None":
        """None for anything a driver did not write (garbage, NaN, deep nesting): an
        unreadable beat is no beat, never an exception in the node's watcher."""
        try:
            doc = json.loads(data, parse_constant=_refuse_constant)
            beat = cls(int(doc["attempt"]), float(doc["renewed_at"]), int(doc["sequence"]))
        except (ValueError, KeyError, TypeError, IndexError, RecursionError, OverflowError):
            return None
        return beat if math.isfinite(beat.renewed_at) else None


class Heartbeat:
    """Renew (driver side) and read (node side) one job's heartbeat in its store."""

    def __init__(self, store) -> None:
        self.store = store
        self._sequence = 0

    def renew(self, attempt: int, now: float) -> Beat:
        """Write a new beat for ``attempt``; the sequence makes every renewal a change.

        The store is read only before this object's first renewal (to continue above an
        earlier driver's sequence); after that its own counter does, so a renewal is one
        write (a triggerer watching 1,000 jobs renews 1,000 heartbeats a minute)."""
        if self._sequence == 0:
            last = self.read()
            self._sequence = 0 if last is None else last.sequence
        self._sequence += 1
        beat = Beat(attempt=attempt, renewed_at=now, sequence=self._sequence)
        self.store.put_object(HEARTBEAT_KEY, beat.to_bytes())
        return beat

    def read(self) -> Beat | None:
        """The newest beat, or None when there is none (or it is unreadable)."""
        data = self.store.get_object(HEARTBEAT_KEY)
        return None if data is None else Beat.from_bytes(data)


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")
