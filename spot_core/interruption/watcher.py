"""A background thread that polls detectors and runs handlers once per notice.

Clouds keep serving a notice on every poll until the capacity is gone; the watcher
remembers each notice's key so a handler (checkpoint, forward SIGTERM, print) runs
once per notice, not once per poll. Handlers and detectors may fail: the failure is
logged and the thread keeps watching, because a dead watcher is a silent one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable, Iterable

from spot_core.bounds import MAX_WAIT_SECONDS
from spot_core.errors import ConfigError
from spot_core.interruption.base import Detector, Notice
from spot_core.interruption.endpoint import FailureStreak

logger = logging.getLogger(__name__)

Handler = Callable[[Notice], None]
DEFAULT_STOP_TIMEOUT = 5.0


class InterruptionWatcher:
    """Polls every detector every ``poll_interval`` seconds on a daemon thread."""

    def __init__(
        self,
        detectors: Iterable[Detector],
        poll_interval: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not 0 < poll_interval <= MAX_WAIT_SECONDS:  # a thread cannot wait 1e300 s
            raise ConfigError(
                f"poll_interval must be > 0 and at most {MAX_WAIT_SECONDS:g} "
                f"seconds (1d), got {poll_interval!r}"
            )
        self.detectors = list(detectors)
        self.poll_interval = float(poll_interval)
        self._clock = clock
        self._handlers: list[Handler] = []
        self._notices: list[Notice] = []
        self._seen: set[Hashable] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._interrupted = threading.Event()
        self._thread: threading.Thread | None = None
        self._streaks = {id(d): FailureStreak(f"detector {d.name}", logger) for d in self.detectors}

    def add_handler(self, handler: Handler) -> None:
        """``handler(notice)`` runs on the watcher thread, once per distinct notice."""
        with self._lock:
            self._handlers.append(handler)

    @property
    def notices(self) -> list[Notice]:
        with self._lock:
            return list(self._notices)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> InterruptionWatcher:
        if self.running:
            return self
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, name="spot-interruption-watcher", daemon=True
        )
        self._thread.start()
        return self

    def stop(self, timeout: float = DEFAULT_STOP_TIMEOUT) -> bool:
        """Stop polling; True when the thread ended within ``timeout`` seconds."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is None or thread is threading.current_thread():
            return True
        thread.join(timeout)
        if thread.is_alive():
            logger.warning(
                "interruption watcher still busy after %.1fs (a detector is "
                "slower than its timeout); leaving the daemon thread",
                timeout,
            )
        return not thread.is_alive()

    def close(self) -> None:
        """Stop, then release detectors that hold resources (signal handlers)."""
        self.stop()
        for detector in self.detectors:
            close = getattr(detector, "close", None)
            if callable(close):
                close()

    def __enter__(self) -> InterruptionWatcher:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait(self, timeout: float | None) -> Notice | None:
        """The first interruption (not rebalance) notice, or None after ``timeout`` s."""
        if not self._interrupted.wait(timeout):
            return None
        return next((n for n in self.notices if n.is_interruption), None)

    def _run(self) -> None:
        next_poll = time.monotonic()
        while not self._stop.is_set():
            self.poll_once()
            next_poll = max(next_poll + self.poll_interval, time.monotonic())
            self._stop.wait(max(0.0, next_poll - time.monotonic()))

    def poll_once(self) -> list[Notice]:
        """Poll every detector once; run handlers for new notices; return those."""
        fresh: list[Notice] = []
        for detector in self.detectors:
            if self._stop.is_set():
                break
            for notice in self._poll(detector):
                if self._remember(notice):
                    fresh.append(notice)
                    self._dispatch(notice)
        return fresh

    def _poll(self, detector: Detector) -> list[Notice]:
        """A detector must not raise; if one does anyway, it is a bug to log, not a crash."""
        streak = self._streaks.setdefault(id(detector), FailureStreak(detector.name, logger))
        try:
            notices = list(detector.poll(self._clock()))
        except Exception as exc:  # noqa: BLE001 - the thread must survive any detector
            streak.failed(exc)
            logger.debug("detector %s raised", detector.name, exc_info=True)
            return []
        streak.succeeded()
        return notices

    def _remember(self, notice: Notice) -> bool:
        with self._lock:
            if notice.key in self._seen:
                return False
            self._seen.add(notice.key)
            self._notices.append(notice)
            return True

    def _dispatch(self, notice: Notice) -> None:
        logger.info("notice: %s", notice.to_json())
        with self._lock:
            handlers = list(self._handlers)
        for handler in handlers:
            try:
                handler(notice)
            except Exception:  # noqa: BLE001 - one bad handler must not stop the others
                logger.exception("interruption handler %r failed on %s", handler, notice)
        if notice.is_interruption:
            self._interrupted.set()
