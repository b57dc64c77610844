"""The driver's heartbeat: how a lease learns that nobody watches it any more.

Whatever drives a job (``spot-pipelines run``, an Airflow worker or triggerer, a Prefect
worker) renews the heartbeat object in the job's store while it watches a lease. The
watcher on the node reads it; when it has not changed for longer than the job's heartbeat
timeout, the driver is gone (SIGKILL, a lost worker), and the watcher stops the step
after an emergency save and ends the lease, so a dead driver never leaves billed,
unwatched capacity behind.

The node judges staleness by its own monotonic clock (how long since it last saw the
object change), not by the driver's timestamp, so clock skew between the two cannot end a
lease early or keep one alive. A second driver judges a beat's age on the store's clock
(``live_holder``), for the same reason.

With a ``heartbeat_uri`` (a store every node can read), a driver process renews one
object there for all the leases it watches instead of one per job: a triggerer watching
1,000 jobs writes one object every renewal instead of 1,000 (S3 PUTs are billed, and were
about half of such a process's CPU). The job's own heartbeat then holds a *pointer*
(``driver``: which process drives it), written once per attempt and driver; the process's
``DriverBeat`` object lists the jobs it still watches and the attempt of each. The node
follows the pointer and counts a renewal only while its job is listed at its attempt, so
a driver that stops watching one job (a cancelled trigger) while it lives on for others
stops vouching for that job at its next renewal, and the node's timeout runs as before.

One live driver per job: every beat names the driver process that wrote it (``owner``, a
random id per process, with its host and pid) and the heartbeat timeout it runs under; a
driver that closes an attempt *releases* the beat. ``live_holder`` reads the beat before
a driver launches an attempt: a beat that another process renewed within its timeout and
has not released is a live driver, and the controller refuses to start a second one
(``spot_core.controller``; ``take_over`` overrides it once the other one is gone).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import socket
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spot_core.checkpoint.backend import UnknownAge
from spot_core.errors import FencedOut

if TYPE_CHECKING:
    from spot_core.checkpoint.store import CheckpointStore

HEARTBEAT_KEY = "heartbeat/driver.json"
DRIVER_KEY = "drivers/{}.json"  # a driver process's beat, in the heartbeat_uri store
_DRIVER_ID = re.compile(r"[0-9a-f]{32}")  # what a pointer may name (no path tricks)


@dataclass(frozen=True)
class DriverIdentity:
    """Which driver process wrote a beat: a random ``owner`` id (pids repeat across hosts
    and reboots), and its host and pid for the message that names it."""

    owner: str
    host: str
    pid: int


def _new_identity() -> DriverIdentity:
    return DriverIdentity(uuid.uuid4().hex, socket.gethostname()[:255], os.getpid())


_identity = _new_identity()


def _renew_identity() -> None:  # a forked child is another driver process
    global _identity
    _identity = _new_identity()


os.register_at_fork(after_in_child=_renew_identity)


def this_driver() -> DriverIdentity:
    """This process's identity as a driver (a new one after a fork)."""
    return _identity


@dataclass(frozen=True)
class Beat:
    """One renewal: which attempt the driver watches, when (driver's clock), and a counter.

    ``driver``/``job``: set in a pointer (the job's beat of a driver that keeps one
    ``DriverBeat`` for all its jobs): the renewals are then that driver's object's, for
    the entry ``job`` in it."""

    attempt: int
    renewed_at: float
    sequence: int
    driver: str | None = None
    job: str | None = None
    # Who wrote it and under which heartbeat timeout (seconds); ``released``: its driver
    # closed the attempt (no driver holds the job). None/False in beats of older versions.
    owner: str | None = None
    host: str | None = None
    pid: int | None = None
    timeout: float | None = None
    released: bool = False

    def to_bytes(self) -> bytes:
        doc: dict[str, Any] = {
            "attempt": self.attempt,
            "renewed_at": self.renewed_at,
            "sequence": self.sequence,
        }
        if self.driver is not None:
            doc.update(driver=self.driver, job=self.job)
        if self.owner is not None:
            doc.update(owner=self.owner, host=self.host, pid=self.pid)
        if self.timeout is not None:
            doc["timeout"] = self.timeout
        if self.released:
            doc["released"] = True
        return json.dumps(doc, allow_nan=False).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Beat | None:
        """None for anything a driver did not write (garbage, NaN, deep nesting, a pointer
        naming no valid driver id): an unreadable beat is no beat, never an exception in
        the node's watcher."""
        try:
            doc = json.loads(data, parse_constant=_refuse_constant)
            beat = cls(int(doc["attempt"]), float(doc["renewed_at"]), int(doc["sequence"]))
            if "driver" in doc:
                driver, job = doc["driver"], doc["job"]
                if not (
                    isinstance(driver, str)
                    and _DRIVER_ID.fullmatch(driver)
                    and isinstance(job, str)
                    and job
                ):
                    return None
                beat = cls(beat.attempt, beat.renewed_at, beat.sequence, driver, job)
            beat = dataclasses.replace(beat, **_writer(doc))
        except (ValueError, KeyError, TypeError, IndexError, RecursionError, OverflowError):
            return None
        return beat if math.isfinite(beat.renewed_at) else None


def _writer(doc: dict[str, Any]) -> dict[str, Any]:
    """The writer fields of a beat document; a malformed one is dropped field by field
    (the beat itself still counts for the node, which never reads them)."""
    owner, host, pid, timeout = (doc.get(k) for k in ("owner", "host", "pid", "timeout"))
    fields: dict[str, Any] = {"released": doc.get("released") is True}
    if isinstance(owner, str) and 0 < len(owner) <= 64:
        fields["owner"] = owner
        fields["host"] = host[:255] if isinstance(host, str) else None
        fields["pid"] = pid if isinstance(pid, int) and not isinstance(pid, bool) else None
    if (
        isinstance(timeout, (int, float))
        and not isinstance(timeout, bool)
        and math.isfinite(timeout)
        and timeout > 0
    ):
        fields["timeout"] = float(timeout)
    return fields


class Heartbeat:
    """Renew (driver side) and read (node side) one job's heartbeat in its store.

    ``drivers``: the ``heartbeat_uri`` store, where a pointer's driver keeps its beat; a
    reader without it cannot follow a pointer (and so sees no renewal)."""

    def __init__(
        self,
        store: CheckpointStore,
        drivers: CheckpointStore | None = None,
        *,
        timeout: float | None = None,
        identity: DriverIdentity | None = None,
    ) -> None:
        self.store = store
        self.drivers = drivers
        self.timeout = timeout  # the writer's heartbeat timeout, written into its beats
        self.identity = identity  # the writer (default: this process, at each write)
        self._sequence = 0
        self._written_at = -math.inf
        self._pointer: Beat | None = None  # reader side: the pointer last followed

    def renew(self, attempt: int, now: float) -> Beat:
        """Write a new beat for ``attempt``; the sequence makes every renewal a change.

        The store is read only before this object's first renewal (to continue above an
        earlier driver's sequence); after that its own counter does, so a renewal is one
        write (a triggerer watching 1,000 jobs renews 1,000 heartbeats a minute)."""
        return self._write(attempt, now)

    def point(self, attempt: int, driver: DriverBeat, job: str, now: float) -> Beat:
        """Write a pointer: ``driver``'s object renews ``job``'s ``attempt`` from now on.
        One write per attempt and driver process (the driver lists the job first)."""
        return self._write(attempt, now, driver=driver.driver_id, job=job)

    def release(self, attempt: int, now: float) -> Beat | None:
        """Say that ``attempt`` is closed: no driver holds the job until the next launch
        (a re-run may start at once, without waiting for the timeout). Read first, once
        per attempt: a newer attempt's beat (another driver's) is left alone (None)."""
        last = self.read_own()
        if last is not None and last.attempt > attempt:
            return None
        self._sequence = max(self._sequence, 0 if last is None else last.sequence)
        return self._write(attempt, now, released=True)

    def _write(self, attempt: int, now: float, **extra: Any) -> Beat:
        """One write. The beat is read first before this object's first write (to go on
        above an earlier driver's sequence) and after a silence of half the timeout (a
        paused driver, resumed): a beat of a newer attempt is then never overwritten,
        since its driver took the job over (``FencedOut``)."""
        silent = self.timeout is not None and now - self._written_at >= self.timeout / 2
        if self._sequence == 0 or silent:
            last = self.read_own()
            if last is not None and last.attempt > attempt:
                raise FencedOut(
                    f"the job's heartbeat names attempt {last.attempt}, newer "
                    f"than {attempt}: another driver took the job over"
                )
            self._sequence = max(self._sequence, 0 if last is None else last.sequence)
        self._sequence += 1
        self._written_at = now
        me = self.identity or this_driver()
        beat = Beat(
            attempt=attempt,
            renewed_at=now,
            sequence=self._sequence,
            owner=me.owner,
            host=me.host,
            pid=me.pid,
            timeout=self.timeout,
            **extra,
        )
        self.store.put_object(HEARTBEAT_KEY, beat.to_bytes())
        return beat

    def read_own(self) -> Beat | None:
        """The job's own beat object as written (a beat or a pointer), unfollowed."""
        data = self.store.get_object(HEARTBEAT_KEY)
        return None if data is None else Beat.from_bytes(data)

    def read(self) -> Beat | None:
        """The newest beat, or None when there is none (or it is unreadable).

        A pointer is followed to its driver's object: the beat is then that object's
        renewal for this job (its attempt there), or None when the driver no longer
        lists the job or its object cannot be read. The pointer is re-read only when
        following it finds nothing, so a steady watch costs one read, as without one."""
        if self._pointer is not None:
            beat = self._follow(self._pointer)
            if beat is not None:
                return beat
        own = self.read_own()
        if own is None or own.driver is None:
            self._pointer = None
            return own
        self._pointer = own
        return self._follow(own)

    def _follow(self, pointer: Beat) -> Beat | None:
        if self.drivers is None:
            return None
        data = self.drivers.get_object(DRIVER_KEY.format(pointer.driver))
        listed = None if data is None else DriverBeat.entry(data, pointer.job)
        if listed is None:
            return None
        attempt, renewed_at, sequence = listed
        return Beat(attempt, renewed_at, sequence, pointer.driver, pointer.job)


class DriverBeat:
    """One driver process's heartbeat for every job it watches (``heartbeat_uri``).

    A job's driver *vouches* for it at every check of its lease (in memory); a renewal
    writes one object listing each job vouched for within ``window`` seconds, with its
    attempt. A job whose checks stop (its trigger cancelled, its flow run gone) drops
    out at the next renewal, so its node's timeout runs from then, as if its own beat had
    stopped. Thread-safe: a triggerer's checks run on many threads."""

    def __init__(self, store: CheckpointStore, driver_id: str | None = None) -> None:
        self.store = store
        self.driver_id = driver_id or uuid.uuid4().hex
        self._lock = threading.Lock()
        self._jobs: dict[str, tuple[int, float]] = {}  # job -> (attempt, last vouched)
        self._sequence = 0
        self._renewed_at = -math.inf

    def vouch(self, job: str, attempt: int, now: float) -> None:
        with self._lock:
            self._jobs[job] = (attempt, now)

    def drop(self, job: str) -> None:
        with self._lock:
            self._jobs.pop(job, None)

    def renew(self, now: float, *, every: float = 0.0, window: float = math.inf) -> bool:
        """Write the object if the last renewal is ``every`` seconds old (one writer per
        round: others return False at once); listed: jobs vouched for within ``window``.
        A failed write raises and leaves the round due again."""
        with self._lock:
            if now - self._renewed_at < every:
                return False
            previous, self._renewed_at = self._renewed_at, now
            self._jobs = {j: v for j, v in self._jobs.items() if now - v[1] <= window}
            self._sequence += 1
            doc = {
                "driver": self.driver_id,
                "renewed_at": now,
                "sequence": self._sequence,
                "jobs": {j: attempt for j, (attempt, _) in self._jobs.items()},
            }
        try:
            self.store.put_object(
                DRIVER_KEY.format(self.driver_id), json.dumps(doc, allow_nan=False).encode()
            )
        except BaseException:
            with self._lock:
                self._renewed_at = min(self._renewed_at, previous)
            raise
        return True

    @staticmethod
    def entry(data: bytes, job: str | None) -> tuple[int, float, int] | None:
        """``job``'s (attempt, renewed_at, sequence) in a driver object, or None (not
        listed, or not an object a driver wrote)."""
        try:
            doc = json.loads(data, parse_constant=_refuse_constant)
            attempt = doc["jobs"][job]
            listed = (int(attempt), float(doc["renewed_at"]), int(doc["sequence"]))
        except (ValueError, KeyError, TypeError, IndexError, RecursionError, OverflowError):
            return None
        if isinstance(attempt, bool) or not math.isfinite(listed[1]):
            return None
        return listed


@dataclass(frozen=True)
class Holder:
    """Another driver process that holds a job: it renewed the job's heartbeat
    ``age_seconds`` ago by the store's clock (None: the store's clock cannot tell), within
    its ``timeout_seconds``, while watching ``attempt``."""

    host: str
    pid: int | None
    attempt: int
    age_seconds: float | None
    timeout_seconds: float

    def describe(self) -> str:
        pid = "" if self.pid is None else f" pid {self.pid}"
        when = (
            "at a time the store's clock cannot tell (written in its future)"
            if self.age_seconds is None
            else f"{self.age_seconds:.0f}s ago"
        )
        return (
            f"{self.host}{pid} renewed its heartbeat {when} "
            f"(attempt {self.attempt}, timeout {self.timeout_seconds:g}s)"
        )


def live_holder(
    store: CheckpointStore,
    now: float,
    *,
    timeout: float,
    drivers: CheckpointStore | None = None,
    me: DriverIdentity | None = None,
) -> Holder | None:
    """The driver process other than ``me`` that holds the job whose store is ``store``,
    or None: its beat is renewed within its timeout (``timeout`` for a beat that names
    none), not released, and not written by ``me``. A pointer's renewals are read from
    ``drivers`` (the ``heartbeat_uri`` store) when given, else its own write counts.

    The age is the beat object's on the store's own clock (``CheckpointStore.object_age``),
    never ``now`` against the time its writer wrote: a second driver whose clock was an
    hour ahead took every live job's beat for a dead one and ran the job twice. An age the
    store's clock cannot tell counts as held (the safe side: a second driver is refused,
    and the line names ``--take-over``). ``now`` is not used (kept for callers)."""
    del now
    me = me or this_driver()
    beat = Heartbeat(store).read_own()
    if beat is None or beat.released or (beat.owner is not None and beat.owner == me.owner):
        return None
    where, key = store, HEARTBEAT_KEY
    if beat.driver is not None and drivers is not None:
        if Heartbeat(store, drivers)._follow(beat) is None:  # its driver let the job go
            return None
        where, key = drivers, DRIVER_KEY.format(beat.driver)
    limit = beat.timeout or timeout
    try:
        age = where.object_age(key)
    except UnknownAge:
        age = None
    else:
        if age is None or age >= limit:  # gone meanwhile, or stale
            return None
    return Holder(beat.host or "an unknown host", beat.pid, beat.attempt, age, limit)


_driver_beats: dict[str, DriverBeat] = {}
_driver_beats_lock = threading.Lock()


def driver_beat(uri: str, open_store: Callable[[str], CheckpointStore]) -> DriverBeat:
    """This process's ``DriverBeat`` at ``uri`` (made once, with ``open_store(uri)``):
    every controller in the process (each trigger of a triggerer) shares it."""
    with _driver_beats_lock:
        beat = _driver_beats.get(uri)
        if beat is None:
            beat = _driver_beats[uri] = DriverBeat(open_store(uri))
        return beat


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")
