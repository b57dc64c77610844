"""Driver liveness: one live driver per job, and the heartbeat that tells a node's watcher
a driver still watches it.

``claim`` refuses a launch while another driver holds the job; ``renew_at_start`` writes
the job's heartbeat (or points it at this process's one beat, with ``heartbeat_uri``) as an
attempt starts, so the node's watcher sees one at once; ``renew`` keeps it fresh on every
check (throttled); ``release`` and ``forget`` end it when the attempt closes. Never fatal
past ``claim``: a missed renewal is tried again at the next check.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from spot_core.checkpoint import CheckpointStore
from spot_core.checkpoint.backend import UnknownAge
from spot_core.checkpoint.heartbeat import DriverBeat, Heartbeat, driver_beat, live_holder
from spot_core.errors import ConfigError, DriverConflict
from spot_core.lifecycle.types import JobSpec
from spot_core.model import JobRecord, Lease

log = logging.getLogger(__name__)


class DriverLiveness:
    """The heartbeats of the jobs one controller drives, with their per-job caches.

    ``heartbeat_timeout_seconds``: how long a lease outlives a driver that stopped renewing
    (None: never, and nothing here writes); ``heartbeat_uri``: this process's one beat for
    every job it watches (None: one heartbeat per job, in its own store); ``take_over``:
    ``claim`` never refuses."""

    def __init__(
        self,
        stores: Callable[[str], CheckpointStore],
        *,
        heartbeat_timeout_seconds: float | None,
        heartbeat_uri: str | None,
        poll_interval_seconds: float,
        take_over: bool,
    ) -> None:
        self.stores = stores
        self.heartbeat_timeout_seconds = heartbeat_timeout_seconds
        self.heartbeat_uri = heartbeat_uri
        self.poll_interval_seconds = poll_interval_seconds
        self.take_over = take_over
        self._beats: dict[str, float] = {}  # job id -> when this process last renewed
        self._heartbeats: dict[tuple[str, str], Heartbeat] = {}  # (job id, store) -> writer
        self._pointed: dict[str, int] = {}  # job id -> attempt its pointer names (heartbeat_uri)

    def claim(
        self, spec: JobSpec, record: JobRecord, store: CheckpointStore, fence_level: int, now: float
    ) -> None:
        """One live driver per job: refuse to launch (``DriverConflict``, one line) while
        another driver process holds the job. Launching would fence that driver's attempt
        out, and the two would take the job from each other in turns, two steps running
        at once. Held: another process renewed the job's heartbeat within its timeout for
        an attempt neither closed in this record nor fenced out; or another driver raised
        the fence above this record's last attempt within the timeout (this driver was
        the one fenced out, as a paused driver finds when it is resumed)."""
        if self.take_over or self.heartbeat_timeout_seconds is None:
            return
        drivers = None if self.heartbeat_uri is None else self.stores(self.heartbeat_uri)
        holder = live_holder(store, now, timeout=self.heartbeat_timeout_seconds, drivers=drivers)
        closed = {a.number for a in record.attempts if a.ended_at is not None}
        if holder is not None and holder.attempt not in closed and holder.attempt >= fence_level:
            raise DriverConflict(
                f"job {spec.job_id} is driven by another driver: {holder.describe()}; stop "
                f"that driver, or wait until its heartbeat is {holder.timeout_seconds:g}s "
                "old, or start with --take-over (take_over=True) once it is gone"
            )
        last = record.attempts[-1].number if record.attempts else None
        if last is None or fence_level <= last:
            return
        try:  # on the store's clock, as the heartbeat's: never this clock against the fencer's
            age = store.fence_age()
        except UnknownAge:  # the safe side: refuse, the line names the way out
            age, when = 0.0, "at a time the store's clock cannot tell"
        else:
            when = "" if age is None else f"{age:.0f}s ago"
        if age is not None and age < self.heartbeat_timeout_seconds:
            raise DriverConflict(
                f"job {spec.job_id} was taken over: another driver started attempt "
                f"{fence_level} {when}, after this driver's attempt {last}; "
                "this driver stops (start again with --take-over (take_over=True) only "
                "once that driver is gone)"
            )

    def renew_at_start(
        self, spec: JobSpec, number: int, now: float, store: CheckpointStore | None = None
    ) -> None:
        """Attempt ``number`` starts (launched or adopted): its heartbeat is written now, so
        the node's watcher sees one at once (raises: the attempt must not run unwatched)."""
        if self.heartbeat_timeout_seconds is not None:
            if self.heartbeat_uri is None:
                self._heartbeat(spec, store).renew(number, now)  # the watcher sees one at once
                self._beats[spec.job_id] = now
            else:
                self._point(spec, number, now, store)

    def renew(self, spec: JobSpec, lease: Lease, now: float) -> None:
        """Tell the node's watcher a driver still watches (throttled; never fatal)."""
        if self.heartbeat_timeout_seconds is None:
            return
        # A quarter of the timeout: three renewals in a row may fail before the node's
        # watcher gives up. Each renewal is a store write per job (1,000 watched jobs at the
        # 5m default: 1,000 S3 PUTs every 75 s); renewing more often would not stop a
        # node sooner after its driver died (it stops a timeout after the last renewal).
        every = self.heartbeat_timeout_seconds / 4
        if self.heartbeat_uri is not None:
            return self._renew_driver_beat(spec, lease, now, every)
        if now - self._beats.get(spec.job_id, float("-inf")) < every:
            return
        try:
            self._heartbeat(spec).renew(lease.attempt, now)
            self._beats[spec.job_id] = now
        except Exception as exc:  # noqa: BLE001 - the next check tries again
            log.warning("job %s: could not renew the heartbeat: %s", spec.job_id, exc)

    def _renew_driver_beat(self, spec: JobSpec, lease: Lease, now: float, every: float) -> None:
        """With ``heartbeat_uri``: vouch for the job in this process's one beat, point the
        job's heartbeat at it once per attempt, and renew the process's object when due
        (one write per round for every job the process watches). A job stays listed
        while its checks come at least once per round and poll."""
        try:
            if self._pointed.get(spec.job_id) != lease.attempt:
                self._point(spec, lease.attempt, now)
            beat = self._driver_beat()
            beat.vouch(spec.job_id, lease.attempt, now)
            beat.renew(now, every=every, window=every + self.poll_interval_seconds)
        except Exception as exc:  # noqa: BLE001 - the next check tries again
            log.warning("job %s: could not renew the driver heartbeat: %s", spec.job_id, exc)

    def _point(
        self, spec: JobSpec, attempt: int, now: float, store: CheckpointStore | None = None
    ) -> None:
        """The job's heartbeat names this process's beat, which lists the job first."""
        beat = self._driver_beat()
        beat.vouch(spec.job_id, attempt, now)
        self._heartbeat(spec, store).point(attempt, beat, spec.job_id, now)
        self._pointed[spec.job_id] = attempt

    def _heartbeat(self, spec: JobSpec, store: CheckpointStore | None = None) -> Heartbeat:
        """The job's heartbeat writer, made once per job and store: its store (for S3, its
        client) is opened once, not at every renewal."""
        key = (spec.job_id, spec.checkpoint_uri)
        heartbeat = self._heartbeats.get(key)
        if heartbeat is None:
            heartbeat = self._heartbeats[key] = Heartbeat(
                store or self.stores(spec.checkpoint_uri), timeout=self.heartbeat_timeout_seconds
            )
        return heartbeat

    def forget(self, spec: JobSpec) -> None:
        """No driver beat is due between attempts: a process that watches jobs for days (a
        triggerer, a Prefect worker) keeps a writer only for the attempts it watches now;
        the next launch makes a new one."""
        self._heartbeats.pop((spec.job_id, spec.checkpoint_uri), None)
        self._beats.pop(spec.job_id, None)
        if self._pointed.pop(spec.job_id, None) is not None:
            self._driver_beat().drop(spec.job_id)

    def _driver_beat(self) -> DriverBeat:
        """This process's beat at ``heartbeat_uri`` (jobs are pointed at it only with one)."""
        if self.heartbeat_uri is None:
            raise ConfigError("no heartbeat_uri: each job keeps its own heartbeat")
        return driver_beat(self.heartbeat_uri, self.stores)

    def release(self, spec: JobSpec, attempt: int, now: float) -> None:
        """Tell a later driver that nobody holds the job now (never fatal: an unreleased
        beat only makes a re-run wait for its timeout, or pass ``take_over``)."""
        if self.heartbeat_timeout_seconds is None:
            return
        try:
            self._heartbeat(spec).release(attempt, now)
        except Exception as exc:  # noqa: BLE001
            log.warning("job %s: could not release the heartbeat: %s", spec.job_id, exc)
