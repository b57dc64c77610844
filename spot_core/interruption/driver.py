"""The node's side of the driver heartbeat: notice when nobody watches the lease any more.

Whatever drives a job renews a heartbeat object in the job's store while it watches a
lease (``spot_core.checkpoint.heartbeat``). ``DriverMonitor`` reads it on a daemon thread
and remembers, by the NODE's monotonic clock, when the beat last changed (its sequence).
The clock starts when the monitor starts, because the driver writes a first beat before
it launches. A failed or slow read counts as "no change": a store outage longer than the
timeout ends the lease too, which is the safe side (a re-run resumes from the newest
checkpoint; an unwatched lease would bill on).

Staleness is judged by ``expired`` from the caller's loop, not on the reader thread, so
a read that hangs (an S3 request stuck in retries) cannot postpone the verdict.

Only beats for this lease's attempt count when the attempt is known: a driver that has
moved on to attempt N+1 does not keep attempt N's lease alive.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from spot_core.interruption.base import DRIVER_LOST, Notice

logger = logging.getLogger(__name__)

MAX_READ_INTERVAL = 10.0  # seconds: a long timeout still reads the heartbeat this often
STOP_ACTION = "stop"
SOURCE = "heartbeat"


def read_interval(timeout: float) -> float:
    """How often to read: four reads per timeout, at most every ``MAX_READ_INTERVAL``."""
    return min(timeout / 4.0, MAX_READ_INTERVAL)


@dataclass
class Freshness:
    """Pure bookkeeping: when (monotonic seconds) the beat was last seen to change."""

    started_at: float
    attempt: int | None = None
    changed_at: float | None = None
    sequence: int | None = None
    # A replacement launched on its predecessor's notice: the driver still renews that
    # attempt's beat until it adopts the replacement, and those renewals count too.
    handover_from: int | None = None

    def observe(self, beat: Any, now: float) -> None:
        """Record one read (``None`` for a failed or empty read: no change)."""
        if beat is None or (
            self.attempt is not None and beat.attempt not in (self.attempt, self.handover_from)
        ):
            return
        if self.sequence is not None and beat.sequence != self.sequence:
            self.changed_at = now
        self.sequence = beat.sequence  # the first beat seen proves nothing about freshness

    def age(self, now: float) -> float:
        """Seconds since the last change (or since the start, if none was seen)."""
        return now - (self.started_at if self.changed_at is None else self.changed_at)


class DriverMonitor:
    """Reads the heartbeat every ``interval`` s on a daemon thread; ``expired`` judges."""

    def __init__(
        self,
        read: Callable[[], Any],
        timeout: float,
        *,
        attempt: int | None = None,
        handover_from: int | None = None,
        interval: float | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.timeout = float(timeout)
        self.interval = read_interval(self.timeout) if interval is None else float(interval)
        self._read = read
        self._monotonic = monotonic
        self._clock = clock
        self._lock = threading.Lock()
        self._freshness = Freshness(
            started_at=monotonic(), attempt=attempt, handover_from=handover_from
        )
        self._failing = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost: Notice | None = None

    def start(self) -> DriverMonitor:
        self._thread = threading.Thread(target=self._run, name="spot-driver-heartbeat", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop reading; a read in flight is left to finish on its daemon thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)

    def __enter__(self) -> DriverMonitor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.read_once()
            self._stop.wait(self.interval)

    def read_once(self) -> None:
        """One read; any failure is logged once per streak and counts as no change."""
        try:
            beat = self._read()
        except Exception as exc:  # noqa: BLE001 - an outage must not kill the monitor
            if not self._failing:
                logger.warning(
                    "cannot read the driver heartbeat (%s); counting it as no "
                    "renewal, will log again only after it recovers",
                    exc,
                )
            self._failing, beat = True, None
        else:
            if self._failing:
                logger.info("driver heartbeat readable again")
            self._failing = False
        with self._lock:
            self._freshness.observe(beat, self._monotonic())

    def age(self) -> float:
        with self._lock:
            return self._freshness.age(self._monotonic())

    def expired(self) -> Notice | None:
        """The driver-lost notice (once, then the same one) when the beat is too old."""
        if self.lost is None and self.age() >= self.timeout:
            self.lost = Notice(
                DRIVER_LOST,
                SOURCE,
                STOP_ACTION,
                deadline=None,
                detected_at=self._clock(),
                identity="driver-lost",
            )
            logger.warning(
                "no new driver heartbeat for %.1fs (timeout %.1fs): the driver is "
                "gone; stopping the step and ending the lease",
                self.age(),
                self.timeout,
            )
        return self.lost
