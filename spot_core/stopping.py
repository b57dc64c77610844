"""Stopping a driver on a signal at a safe point, not wherever the signal lands.

Why: Python runs a signal handler in the main thread between any two bytecodes. A handler
that raises (as the default SIGINT handler does, and as `spot-pipelines run` did for
SIGTERM and SIGHUP) can land inside a client library's critical section: between a lock's
acquire and its ``try`` in urllib3's connection pool, the kubernetes client or botocore.
The lock then stays held, and the clean-up that must follow a stop (terminating the lease,
closing the attempt) waits on it for ever, leaving a billed lease behind.

``stop_on_signals`` turns the first signal into a request; the main thread raises ``Stopped``
at its next wait (``sleep``, ``waiting``): the controller's sleeps and observer waits and a
provider's launch polls, where no library call is under way. A signal that arrives during
such a wait raises at once, as before, so a stop is as prompt as ever whenever the driver
is idle, and at most one API call later otherwise (every call is bounded by its client's
timeouts). A second signal raises at once wherever it lands: the way out of a clean-up that
hangs. A request still pending when the block ends (the job finished with no wait after
the signal) is dropped with it: the process exits with the job's own status.

Outside the main thread (a Prefect task runner's threads, an Airflow worker) and when no
``stop_on_signals`` block is in force, ``sleep`` is ``time.sleep`` and ``waiting`` does nothing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from types import FrameType

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Stopped(KeyboardInterrupt):
    """A signal stopped the driver; like Ctrl-C, the controller terminates the running lease."""


class _State:
    """What the handler and the main thread's waits share (written in the main thread only)."""

    def __init__(self) -> None:
        self.active = 0  # stop_on_signals blocks in force
        self.pending: int | None = None  # the first signal, not yet raised
        self.raised = False  # a Stopped was raised: the next signal raises at once
        self.waits = 0  # how deep the main thread is in safe waits


_state = _State()


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _stopped(signum: int) -> Stopped:
    _state.raised = True
    return Stopped(f"stopped by {signal.Signals(signum).name}")


def _on_signal(signum: int, frame: FrameType | None) -> None:
    if _state.waits > 0 or _state.raised or _state.pending is not None:
        raise _stopped(signum)
    _state.pending = signum  # raised by the main thread's next wait
    _say(
        f"{signal.Signals(signum).name}: stopping once the cloud call under way returns "
        "(send it again to stop at once)"
    )


def _say(line: str) -> None:
    """One line to stderr from a signal handler: ``os.write``, not ``print``, since the
    main thread may be inside a write to the same buffered stream."""
    try:
        os.write(2, f"spot-pipelines: {line}\n".encode())
    except OSError:
        pass


@contextlib.contextmanager
def waiting() -> Iterator[None]:
    """Mark a blocking wait of the main thread as a safe place for a stop to land; raise
    ``Stopped`` at once if a signal came while the thread was busy elsewhere."""
    if not _in_main_thread() or _state.active == 0:
        yield
        return
    if _state.pending is not None:
        signum, _state.pending = _state.pending, None
        raise _stopped(signum)
    _state.waits += 1
    try:
        yield
    finally:
        _state.waits -= 1


def sleep(seconds: float) -> None:
    """``time.sleep`` at a safe point (the default sleep of the controller and providers)."""
    with waiting():
        time.sleep(seconds)


@contextlib.contextmanager
def stop_on_signals(signals: tuple[int, ...] = STOP_SIGNALS) -> Iterator[None]:
    """While in force (main thread only), ``signals`` stop the driver at its next safe wait;
    the previous handlers come back after."""
    if not _in_main_thread():
        raise RuntimeError(
            "stop_on_signals must be entered in the main thread: Python only "
            "delivers signals to handlers set there"
        )
    previous = {sig: signal.signal(sig, _on_signal) for sig in signals}
    _state.active += 1
    try:
        yield
    finally:
        _state.active -= 1
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if _state.active == 0:
            _state.pending, _state.raised = None, False
