"""Passing a notice on to a child process: notice file, SIGTERM, and SIGKILL at the end.

The child runs in its own process group so that signals reach the whole step (a
training script and its data-loader workers) and so that a terminal's Ctrl-C reaches
the step only through us. Signals are sent only to a child not yet reaped, to avoid
signalling a recycled pid.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable

from spot_core.interruption.base import Notice
from spot_core.interruption.notice_file import write_notice

logger = logging.getLogger(__name__)

DEFAULT_GRACE_SECONDS = 30.0


class ChildForwarder:
    """Forwards notices and signals to ``child``; enforces the kill deadline.

    ``on_notice`` runs on the watcher thread, ``poll``/``enforce`` on the main thread;
    a lock keeps ``poll`` (which reaps) and signalling apart.
    """

    def __init__(
        self,
        child: subprocess.Popen[bytes],
        notice_file: str,
        grace_seconds: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.child = child
        self.notice_file = notice_file
        self.grace_seconds = grace_seconds
        self.kill_at: float | None = None
        self._clock = clock
        self._lock = threading.Lock()
        self._interrupted = False
        self._killed = False

    def on_notice(self, notice: Notice) -> None:
        """Interruption (or driver lost): write the file, SIGTERM once, arm SIGKILL.
        Rebalance: file only."""
        if not notice.stops_step:
            if not self._interrupted:
                write_notice(self.notice_file, notice)
            return
        first = not self._interrupted
        self._interrupted = True
        kill_at = self._kill_time(notice)
        self.kill_at = kill_at if self.kill_at is None else min(self.kill_at, kill_at)
        if first:
            try:
                write_notice(self.notice_file, notice)
            finally:  # an unwritable notice file must not cost the child its SIGTERM
                self.signal(signal.SIGTERM)

    def _kill_time(self, notice: Notice) -> float:
        """The earlier of the notice deadline and detection + grace (default grace if neither)."""
        grace = None if self.grace_seconds is None else notice.detected_at + self.grace_seconds
        known = [t for t in (notice.deadline, grace) if t is not None]
        return min(known) if known else notice.detected_at + DEFAULT_GRACE_SECONDS

    def signal(self, signum: int) -> bool:
        """Send ``signum`` to the child's process group; False if it is already gone."""
        with self._lock:
            if self.child.returncode is not None:
                return False
            try:
                os.killpg(self.child.pid, signum)
            except ProcessLookupError:
                return False
        logger.info("sent %s to child %d", signal.Signals(signum).name, self.child.pid)
        return True

    def poll(self) -> int | None:
        with self._lock:
            return self.child.poll()

    def enforce(self) -> None:
        """SIGKILL the child once it has outlived the notice deadline or the grace."""
        if self.kill_at is not None and not self._killed and self._clock() >= self.kill_at:
            self._killed = True
            if self.signal(signal.SIGKILL):
                logger.warning("child %d outlived its notice deadline: SIGKILL", self.child.pid)


def exit_code(returncode: int) -> int:
    """A shell's convention: a child killed by signal N exits 128 + N."""
    return 128 - returncode if returncode < 0 else returncode
