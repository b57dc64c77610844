"""A signal stops `spot-pipelines run` at the driver's next wait, never inside a client call.

The hazard these guard against: a handler that raises can land between a library's lock
acquire and its ``try`` (urllib3's pool, the kubernetes client); the lock stays held and the
clean-up's own API calls wait on it for ever.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from spot_core import stopping
from spot_core.stopping import Stopped, stop_on_signals


def library_call(lock: threading.Lock, signum: int) -> None:
    """A client call whose critical section is not exception-safe, as urllib3's pool's
    ``queue.get`` is not: a signal arrives between the acquire and the release."""
    lock.acquire()
    signal.raise_signal(signum)
    for _ in range(1000):  # the handler runs between these bytecodes
        pass
    lock.release()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_during_a_client_call_stops_at_the_next_wait_with_no_lock_left_held(signum, capfd):
    lock = threading.Lock()
    with stop_on_signals():
        library_call(lock, signum)  # no exception inside the call
        said = capfd.readouterr().err
        assert "stopping once the cloud call under way returns" in said, said
        assert lock.acquire(timeout=1), "the client's lock was left held"
        lock.release()
        started = time.monotonic()
        with pytest.raises(Stopped, match=signal.Signals(signum).name):
            stopping.sleep(30)
    assert time.monotonic() - started < 5, "the pending stop did not raise at once"


def test_a_signal_during_a_wait_stops_at_once():
    with stop_on_signals():
        timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM))
        timer.start()
        started = time.monotonic()
        with pytest.raises(Stopped):
            stopping.sleep(30)
        timer.join()
    assert time.monotonic() - started < 5


def test_a_second_signal_stops_at_once_wherever_it_lands():
    """The way out of a clean-up that hangs: the first signal waits for a safe point, the
    second does not."""
    with stop_on_signals():
        signal.raise_signal(signal.SIGTERM)
        with pytest.raises(Stopped):
            signal.raise_signal(signal.SIGTERM)
            for _ in range(1000):
                pass


def test_after_a_stop_any_further_signal_raises_at_once():
    with stop_on_signals():
        signal.raise_signal(signal.SIGTERM)
        with pytest.raises(Stopped):
            stopping.sleep(30)
        with pytest.raises(Stopped):  # during the clean-up
            signal.raise_signal(signal.SIGINT)
            for _ in range(1000):
                pass


def test_the_previous_handlers_come_back_and_nothing_is_left_pending():
    before = {sig: signal.getsignal(sig) for sig in stopping.STOP_SIGNALS}
    with stop_on_signals():
        signal.raise_signal(signal.SIGHUP)  # pending, never waited on
    assert {sig: signal.getsignal(sig) for sig in stopping.STOP_SIGNALS} == before
    stopping.sleep(0.01)  # no block in force: a plain sleep, nothing raised
    with stop_on_signals():
        stopping.sleep(0.01)  # the old request is gone with its block


def test_other_threads_wait_as_before():
    """Signals reach the main thread only: a worker thread's waits never raise a stop (a
    Prefect task runner drives its jobs from threads)."""
    with stop_on_signals():
        signal.raise_signal(signal.SIGTERM)
        errors: list[BaseException] = []

        def worker():
            try:
                stopping.sleep(0.01)
                with stopping.waiting():
                    pass
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        thread = threading.Thread(target=worker)
        thread.start()
        thread.join(10)
        assert errors == []
        with pytest.raises(Stopped):  # still pending for the main thread
            stopping.sleep(30)


def test_it_refuses_to_start_outside_the_main_thread():
    errors: list[BaseException] = []

    def worker():
        try:
            with stop_on_signals():
                pass
        except RuntimeError as exc:
            errors.append(exc)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join(10)
    assert len(errors) == 1 and "main thread" in str(errors[0])
