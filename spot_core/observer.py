"""One shared lease observer per process and provider: many watched leases, one describe.

Why: every driver that watches a lease (each deferred ``SpotJobTrigger`` in a triggerer,
each flow run of a Prefect spot worker) used to describe its own lease every poll, so
1,000 deferred jobs made 1,000 describe calls per poll, although each provider answers
many leases in one call (the local cloud's ``describe(ids)``, EC2 DescribeInstances with
up to ``DESCRIBE_BATCH`` ids, one Kubernetes pod list by label). A ``SharedObserver``
holds every lease registered with it, whatever job it belongs to, and describes them
all with one ``provider.observe`` per poll (in chunks of ``chunk`` leases; the provider
splits further as its API requires), in its own thread, so the blocking SDK or HTTP call
never runs on an event loop. Each waiter is handed its own lease's ``Observation``: the
status, or the error the describe raised (every waiter of a failed describe gets it, and
the controller's ``observe_failure_timeout`` decides what that means).

It only observes: classifying, billing and closing an attempt stay in the controller
(``Controller.check(..., observed=...)``). Waits are bounded (a waiter that gets nothing
in ``timeout`` seconds is handed a retryable error); a lease is described only while at
least one driver watches it (``watch`` / ``unwatch`` count), and the polling thread ends
once nothing has been watched for ``IDLE_SECONDS``.

Observers are shared by key (``observer_key``: the provider's name, its reopen options
and the identity of the credentials that reach it), via ``shared_observer``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from spot_core import stopping
from spot_core.errors import SpotError
from spot_core.model import Lease
from spot_core.providers.base import Observation

log = logging.getLogger(__name__)

CHUNK = 1000  # leases per provider.observe call (the provider splits further)
MIN_INTERVAL = 0.05  # seconds: the fastest poll cadence accepted
IDLE_SECONDS = 30.0  # the polling thread ends after this long with nothing to watch


class ObserverTimeout(SpotError):
    """No observation of the lease arrived in time (a stalled describe); retryable."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=True)


@dataclass(eq=False)
class _Waiter:
    """One driver waiting for an observation made at or after ``after``."""

    after: float
    deliver: Callable[[Observation], None]
    loop: asyncio.AbstractEventLoop | None = None
    # the asyncio future, for grouped delivery on its loop
    future: asyncio.Future[Observation] | None = None


@dataclass
class _Watched:
    lease: Lease
    poll_interval: float
    count: int = 1
    waiters: list[_Waiter] = field(default_factory=list)


class SharedObserver:
    """Describes every watched lease of one provider once per poll, in a thread.

    ``provider``: anything with the Provider protocol's ``observe(leases)``. ``chunk``:
    at most this many leases per ``observe`` call; a chunk whose call raises hands the
    error to its leases' waiters only. ``clock``: POSIX time (``Observation.at``).
    """

    def __init__(
        self,
        provider: Any,
        *,
        name: str = "",
        chunk: int = CHUNK,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if chunk < 1:
            raise ValueError(f"chunk={chunk!r} must be at least 1 lease")
        self.provider = provider
        self.name = name or provider.name
        self.chunk = chunk
        self._clock = clock
        self._cond = threading.Condition()
        self._watched: dict[str, _Watched] = {}
        self._latest: dict[str, Observation] = {}
        self._thread: threading.Thread | None = None
        self._closed = False
        self.polls = 0  # describe rounds made (each one call per chunk)
        self.calls = 0  # provider.observe calls made

    # -- registering -----------------------------------------------------------------------
    def watch(self, lease: Lease, poll_interval: float) -> None:
        """Describe ``lease`` every poll (at most every ``poll_interval`` s) until as many
        ``unwatch`` calls as ``watch`` calls have been made for it."""
        if not poll_interval > 0:
            raise ValueError(f"poll_interval={poll_interval!r} must be > 0 seconds")
        with self._cond:
            if self._closed:
                raise RuntimeError(f"the shared observer of {self.name} is closed")
            watched = self._watched.get(lease.lease_id)
            if watched is None:
                self._watched[lease.lease_id] = _Watched(lease, poll_interval)
            else:
                watched.count += 1
                watched.poll_interval = min(watched.poll_interval, poll_interval)
            self._ensure_thread()
            self._cond.notify_all()  # a shorter interval takes effect now

    def unwatch(self, lease_id: str) -> None:
        """One watcher of ``lease_id`` is gone; at the last, the lease is no longer
        described and any waiter left is told so (never left to its timeout)."""
        with self._cond:
            watched = self._watched.get(lease_id)
            if watched is None:
                return
            watched.count -= 1
            if watched.count > 0:
                return
            del self._watched[lease_id]
            self._latest.pop(lease_id, None)
            waiters = watched.waiters
        gone = Observation(
            lease_id,
            error=SpotError(
                f"lease {lease_id} is no longer watched by the shared observer", retryable=True
            ),
            at=self._clock(),
        )
        self._deliver([(w, gone) for w in waiters])

    @contextmanager
    def watching(self, lease: Lease, poll_interval: float) -> Iterator[SharedObserver]:
        """``watch`` for the body of a ``with`` block, ``unwatch`` however it ends."""
        self.watch(lease, poll_interval)
        try:
            yield self
        finally:
            self.unwatch(lease.lease_id)

    def watched(self) -> tuple[str, ...]:
        with self._cond:
            return tuple(self._watched)

    # -- waiting -----------------------------------------------------------------------------
    def wait(self, lease_id: str, after: float, timeout: float) -> Observation:
        """From a thread: the first observation of ``lease_id`` made at or after ``after``
        (POSIX seconds), waiting at most ``timeout`` s (then a retryable error)."""
        done = threading.Event()
        box: list[Observation] = []

        def deliver(observation: Observation) -> None:
            box.append(observation)
            done.set()

        waiter = self._add_waiter(lease_id, _Waiter(after, deliver))
        if waiter is not None:
            try:
                with stopping.waiting():  # where a signal may stop `spot-pipelines run`
                    delivered = done.wait(timeout)
            except BaseException:
                self._remove_waiter(lease_id, waiter)
                raise
            if not delivered:
                self._remove_waiter(lease_id, waiter)
                return self._timed_out(lease_id, timeout)
        return box[0] if box else self._timed_out(lease_id, timeout)

    async def wait_async(self, lease_id: str, after: float, timeout: float) -> Observation:
        """``wait`` for an event loop: awaits without blocking the loop (the Airflow
        triggerer runs every trigger in one)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Observation] = loop.create_future()
        waiter = self._add_waiter(lease_id, _Waiter(after, future.set_result, loop, future))
        if waiter is None:
            return future.result()
        try:
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            return self._timed_out(lease_id, timeout)
        finally:
            self._remove_waiter(lease_id, waiter)

    def _timed_out(self, lease_id: str, timeout: float) -> Observation:
        return Observation(
            lease_id,
            error=ObserverTimeout(
                f"the shared observer of {self.name} gave no status for lease {lease_id} in "
                f"{timeout:g} s (its describe is stalled)"
            ),
            at=self._clock(),
        )

    def _add_waiter(self, lease_id: str, waiter: _Waiter) -> _Waiter | None:
        """Register ``waiter``, or deliver at once (and return None) if the latest
        observation is recent enough or the lease is not watched."""
        with self._cond:
            watched = self._watched.get(lease_id)
            latest = self._latest.get(lease_id)
            if watched is not None and (latest is None or latest.at < waiter.after):
                watched.waiters.append(waiter)
                return waiter
        if watched is None or latest is None:  # (a watched lease with none waits above)
            latest = Observation(
                lease_id,
                error=SpotError(
                    f"lease {lease_id} is not watched: call watch() first", retryable=False
                ),
                at=self._clock(),
            )
        waiter.deliver(latest)
        return None

    def _remove_waiter(self, lease_id: str, waiter: _Waiter) -> None:
        with self._cond:
            watched = self._watched.get(lease_id)
            if watched is not None and waiter in watched.waiters:
                watched.waiters.remove(waiter)

    # -- polling -----------------------------------------------------------------------------
    def _ensure_thread(self) -> None:
        """Start the polling thread if none runs (caller holds the lock)."""
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(
                target=self._run, daemon=True, name=f"spot-observer-{self.name}"
            )
            self._thread.start()

    def _run(self) -> None:
        try:
            while True:
                batch = self._next_batch()
                if batch is None:
                    return
                started = self._clock()
                self._publish(self.describe(batch, started))
                self._sleep_until_next(started)
        except Exception:  # noqa: BLE001 - waiters time out into errors; a watch restarts it
            log.exception("the shared observer of %s stopped", self.name)
        finally:
            with self._cond:
                if self._thread is threading.current_thread():
                    self._thread = None

    def _next_batch(self) -> list[Lease] | None:
        """Every watched lease, after waiting (bounded) for one; None: stop the thread."""
        with self._cond:
            if not self._watched and not self._closed:
                self._cond.wait(IDLE_SECONDS)
            if self._closed or not self._watched:
                if self._thread is threading.current_thread():
                    self._thread = None  # under the lock: the next watch starts a new one
                return None
            return [w.lease for w in self._watched.values()]

    def _interval(self) -> float:
        return max(
            MIN_INTERVAL,
            min((w.poll_interval for w in self._watched.values()), default=IDLE_SECONDS),
        )

    def _sleep_until_next(self, started: float) -> None:
        """Until one interval after the last poll began (shortened if a watch asks for a
        faster cadence meanwhile)."""
        with self._cond:
            while not self._closed and self._watched:
                left = started + self._interval() - self._clock()
                if left <= 0:
                    return
                self._cond.wait(left)

    def describe(self, leases: Sequence[Lease], at: float) -> list[Observation]:
        """One ``provider.observe`` per chunk of ``leases``; a failed chunk's error goes
        to each of its leases. Made in the polling thread."""
        observations: list[Observation] = []
        for start in range(0, len(leases), self.chunk):
            chunk = leases[start : start + self.chunk]
            self.calls += 1
            try:
                statuses = self.provider.observe(chunk)
            except Exception as exc:  # noqa: BLE001 - handed to every waiter of the chunk
                log.warning("describing %d lease(s) on %s failed: %s", len(chunk), self.name, exc)
                observations += [Observation(each.lease_id, error=exc, at=at) for each in chunk]
                continue
            observations += [
                Observation(each.lease_id, status=statuses.get(each.lease_id), at=at)
                for each in chunk
            ]
        self.polls += 1
        return observations

    def _publish(self, observations: list[Observation]) -> None:
        ready: list[tuple[_Waiter, Observation]] = []
        with self._cond:
            for observation in observations:
                watched = self._watched.get(observation.lease_id)
                if watched is None:
                    continue  # unwatched while it was being described
                self._latest[observation.lease_id] = observation
                keep = []
                for waiter in watched.waiters:
                    (
                        ready.append((waiter, observation))
                        if waiter.after <= observation.at
                        else keep.append(waiter)
                    )
                watched.waiters = keep
        self._deliver(ready)

    @staticmethod
    def _deliver(ready: list[tuple[_Waiter, Observation]]) -> None:
        """Thread waiters directly; asyncio waiters with one wake-up per event loop."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Waiter, Observation]]] = {}
        for waiter, observation in ready:
            if waiter.loop is None:
                waiter.deliver(observation)
            else:
                by_loop.setdefault(waiter.loop, []).append((waiter, observation))
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_resolve, items)
            except RuntimeError:  # the loop closed: nobody waits there any more
                pass

    def close(self) -> None:
        """Stop polling; waiters left are handed an error."""
        with self._cond:
            self._closed = True
            waiters = [(w, lid) for lid, watched in self._watched.items() for w in watched.waiters]
            self._watched.clear()
            self._cond.notify_all()
        self._deliver(
            [
                (
                    w,
                    Observation(
                        lid,
                        error=SpotError(
                            f"the shared observer of {self.name} was closed", retryable=True
                        ),
                        at=self._clock(),
                    ),
                )
                for w, lid in waiters
            ]
        )


def _resolve(items: list[tuple[_Waiter, Observation]]) -> None:
    for waiter, observation in items:
        if waiter.future is not None and not waiter.future.done():
            waiter.future.set_result(observation)


# -- one per process and provider -----------------------------------------------------------------
_OBSERVERS: dict[str, SharedObserver] = {}
_LOCK = threading.Lock()


def observer_key(provider_name: str, options: Any, *identity: Any) -> str:
    """The provider's reopen identity: its name, its JSON-able options, and whatever
    identifies the credentials that reach it (a connection id, a credentials block's
    fingerprint; never a secret)."""
    return json.dumps([provider_name, options, *identity], sort_keys=True, default=str)


def shared_observer(key: str, provider: Any) -> SharedObserver:
    """This process's observer for ``key``, made on first use with ``provider`` (a new
    one if the provider for the key was reopened)."""
    with _LOCK:
        observer = _OBSERVERS.get(key)
        if observer is None or observer.provider is not provider:
            observer = _OBSERVERS[key] = SharedObserver(provider)
        return observer


def observer_of(provider: Any) -> SharedObserver:
    """This process's observer of this provider object (it describes with the provider's
    own credentials): every synchronous driver handed the same provider (``spot-pipelines
    run``, the Prefect task runner's spot tasks) shares its one describe per poll."""
    # Keyed without the object's identity: a reopened provider replaces the entry (no
    # leak of one observer per provider a long-lived process opened), and the entry is
    # only ever handed to the provider object it describes with.
    key = observer_key(provider.name, provider.options, "synchronous drivers")
    return shared_observer(key, provider)


def wait_timeout(poll_interval: float) -> float:
    """How long a driver waits for one observation: two polls and a slow describe."""
    return 2 * poll_interval + 60.0
