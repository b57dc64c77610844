"""SIGTERM as an interruption notice.

On Kubernetes (pod eviction, node drain), on an ACPI shutdown of a spot VM and under
``spot-pipelines run``, the first thing a step hears is SIGTERM. This detector turns
that signal into the same ``Notice`` the metadata detectors produce, so one code path
(checkpoint, then exit) handles every source.
"""

from __future__ import annotations

import collections
import logging
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from spot_core.errors import ConfigError
from spot_core.interruption.base import INTERRUPTION, DetectorPlugin, Notice

logger = logging.getLogger(__name__)

DEFAULT_NOTICE_SECONDS = 30.0  # Kubernetes' default terminationGracePeriodSeconds


class SignalDetector:
    """Installs a handler for ``signals`` in the main thread; restores the old one on close.

    The handler only appends to a deque (safe in a signal handler: no locks); ``poll``
    drains it. ``notice_seconds`` sets the deadline, since a signal carries none.
    """

    name = "signal"

    def __init__(
        self,
        signals: tuple[int, ...] = (signal.SIGTERM,),
        notice_seconds: float | None = DEFAULT_NOTICE_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if threading.current_thread() is not threading.main_thread():
            raise ConfigError(
                "SignalDetector must be created in the main thread: "
                "Python only delivers signals to handlers set there"
            )
        self.notice_seconds = notice_seconds
        self._clock = clock
        self._received: collections.deque[tuple[int, float]] = collections.deque()
        self._previous: dict[int, Any] = {}
        for signum in signals:
            self._previous[signum] = signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._received.append((signum, self._clock()))

    def poll(self, now: float) -> list[Notice]:
        notices = []
        while self._received:
            signum, at = self._received.popleft()
            notices.append(self._notice(signum, at))
        return notices

    def _notice(self, signum: int, at: float) -> Notice:
        name = signal.Signals(signum).name
        deadline = None if self.notice_seconds is None else at + self.notice_seconds
        return Notice(INTERRUPTION, "signal", "terminate", deadline, at, raw=name, identity=name)

    def close(self) -> None:
        """Give the signals back to whoever handled them before; safe to call twice."""
        if threading.current_thread() is not threading.main_thread():
            if self._previous:
                logger.warning(
                    "SignalDetector.close() outside the main thread: signal handlers left installed"
                )
            return
        while self._previous:
            signum, previous = self._previous.popitem()
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)

    def __enter__(self) -> SignalDetector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


PLUGIN = DetectorPlugin(
    make=lambda endpoint, timeout, environ: SignalDetector(),
    summary="SIGTERM only: the notice a node's shutdown gives every process",
    rank=4,
)
