"""The one attempt lifecycle: decide, launch, watch, classify, bill, close, record.

Every driver (``spot-pipelines run``, the Airflow operator and trigger, ``@task.spot``,
the Prefect task runner, worker and ``spot_task``) runs a job through this resumable API
and nothing else::

    nxt = controller.advance(spec, record)          # finished | sleep until T | watch lease L
    while nxt.action == "watch":
        nxt = controller.check(spec, nxt)            # one observation; "ended" once it closed
    record = nxt.record

``advance`` reads the market, asks the pure retry policy (and, for a job with a
``deadline_policy`` on a trace market, the deadline policy's plan) what the JobRecord
does next and applies it: it fences the store, launches in the first ranked pool with
capacity and records the attempt (lease included, so any process can pick it up).
``check`` observes the watched lease once, renews the driver's heartbeat in the job's
store, tolerates failed observations until they have lasted ``observe_failure_timeout``,
and ends the attempt at ``attempt_timeout``. ``on_lease_end`` (a driver that observed
the end itself, such as a trigger) and ``stop`` (a driver told to stop) close the attempt
the same way. The record goes to the persistence callback after every change, before
anything acts on it. State lives only in the record and the job's store, so a driver
can die between any two calls and another resumes from the record.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence

from spot_core import stopping
from spot_core.attempt_env import HEARTBEAT_URI
from spot_core.checkpoint import CheckpointStore
from spot_core.errors import ConfigError, SpotError
from spot_core.lifecycle.closing import (
    _checkpoint_seconds,
    _end_ref,
    _fenced_above,
    _message,
    _stopped,
    _with_resume_report,
    classify,
    lost_work,
)
from spot_core.lifecycle.handover import Handover, handover_mode, pending_replacement
from spot_core.lifecycle.launching import closed_without_lease, launch_first
from spot_core.lifecycle.liveness import DriverLiveness
from spot_core.lifecycle.moves import Moves
from spot_core.lifecycle.transition import Transition
from spot_core.lifecycle.types import (
    FINAL_STATUSES,
    JobSpec,
    Listener,
    Next,
    Persist,
    provider_stores,
)
from spot_core.market.base import Market as PriceMarket
from spot_core.model import Attempt, JobRecord, JobStatus, Lease, Outcome, Pool
from spot_core.observer import SharedObserver, wait_timeout
from spot_core.policy.checkpoint_interval import CheckpointBounds
from spot_core.policy.retry import Decision, RetryPolicy, decide_next
from spot_core.providers.base import (
    Bill,
    LaunchSpec,
    LeaseState,
    LeaseStatus,
    Observation,
    Provider,
)
from spot_core.settings import SpotSettings

log = logging.getLogger(__name__)


class Controller:
    """Runs one job's attempts under a provider, a market and a retry policy.

    Its bounds are the settings model's knobs (``SpotSettings.controller_options()`` gives
    them all; each default here is the model's): ``poll_interval_seconds`` between
    observations in ``run`` (drivers that watch elsewhere choose their own);
    ``attempt_timeout_seconds``, the longest one attempt may run;
    ``heartbeat_timeout_seconds``, how long a lease outlives a driver that stopped renewing
    its heartbeat (passed to the node's watcher; None: never); ``heartbeat_uri``, a store
    every node can read where this process keeps one heartbeat for all the jobs it
    watches (``spot_core.checkpoint.heartbeat.DriverBeat``; None: one per job, in its own
    store); ``take_over``: launch even though another driver process renewed the job's
    heartbeat within its timeout (otherwise ``DriverConflict``: one live driver per job);
    ``observe_failure_timeout_seconds``, how long observing a lease may keep failing
    before the attempt ends as ``infrastructure_failed`` (its lease is still terminated);
    ``checkpoint_*_seconds``, what shapes each attempt's checkpoint interval.
    ``stores``: opens a job's checkpoint store by URI; by default the provider's
    ``open_store`` (it reaches the store with the provider's own credentials) if it
    declares ``Capability.OWN_STORES``, else ``open_store`` with boto3's default chain.

    It keeps the lifecycle and delegates the rest, each part with its own per-job caches:
    ``liveness`` (``DriverLiveness``: the claim and the heartbeats), ``moves`` (``Moves``:
    drains, deadline plans, checkpoint intervals) and ``handovers`` (``Handover``: the
    replacement launched on a notice, then adopted or ended).
    """

    def __init__(
        self,
        provider: Provider,
        market: PriceMarket | None,
        policy: RetryPolicy = RetryPolicy(),
        *,
        persist: Persist | None = None,
        listener: Listener | None = None,
        stores: Callable[[str], CheckpointStore] | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = stopping.sleep,
        poll_interval_seconds: float = SpotSettings.poll_interval_seconds,
        attempt_timeout_seconds: float = SpotSettings.attempt_timeout_seconds,
        heartbeat_timeout_seconds: float | None = SpotSettings.heartbeat_timeout_seconds,
        heartbeat_uri: str | None = SpotSettings.heartbeat_uri,
        observe_failure_timeout_seconds: float = (SpotSettings.observe_failure_timeout_seconds),
        checkpoint_cost_seconds: float = SpotSettings.checkpoint_cost_seconds,
        checkpoint_interval_min_seconds: float = (SpotSettings.checkpoint_interval_min_seconds),
        checkpoint_interval_max_seconds: float = (SpotSettings.checkpoint_interval_max_seconds),
        take_over: bool = SpotSettings.take_over,
        handover: str | None = SpotSettings.handover,
    ) -> None:
        self.checkpoint_bounds = CheckpointBounds(
            checkpoint_cost_seconds,
            checkpoint_interval_min_seconds,
            checkpoint_interval_max_seconds,
        )
        self.provider = provider
        self.market = market
        self.policy = policy
        self.stores = stores or provider_stores(provider)
        self.poll_interval_seconds = poll_interval_seconds
        self.attempt_timeout_seconds = attempt_timeout_seconds
        self.heartbeat_timeout_seconds = heartbeat_timeout_seconds
        self.heartbeat_uri = heartbeat_uri
        self.take_over = bool(take_over)
        self.handover = handover_mode(provider, handover)
        self.observe_failure_timeout_seconds = observe_failure_timeout_seconds
        self._persist = persist or (lambda record: None)
        self._listener = listener or (lambda kind, record, detail: None)
        self._clock = clock
        self._sleep = sleep
        self.liveness = DriverLiveness(
            self.stores,
            heartbeat_timeout_seconds=heartbeat_timeout_seconds,
            heartbeat_uri=heartbeat_uri,
            poll_interval_seconds=poll_interval_seconds,
            take_over=self.take_over,
        )
        self.moves = Moves(self, self.checkpoint_bounds)
        self.handovers = Handover(self)
        # job id -> the record last persisted, while the job is unsettled: what `run` stops
        # when it is interrupted, even between a launch and the Next that names its lease.
        self._last_saved: dict[str, JobRecord] = {}

    def persist(self, record: JobRecord) -> JobRecord:
        """Hand ``record`` to the persistence callback (e.g. a new record before launch)."""
        self._remember(record)
        self._persist(record)
        return record

    def _remember(self, record: JobRecord) -> None:
        if record.status in FINAL_STATUSES:
            self._last_saved.pop(record.job_id, None)
        else:
            self._last_saved[record.job_id] = record

    def new_record(self, spec: JobSpec) -> JobRecord:
        return JobRecord(
            job_id=spec.job_id,
            created_at=self._clock(),
            deadline_at=spec.deadline_at,
            checkpoint_uri=spec.checkpoint_uri,
            time_scale=self.provider.capacity_seconds(1.0),
        )

    # -- the synchronous driver -------------------------------------------------------------
    def run(
        self,
        spec: JobSpec,
        record: JobRecord | None = None,
        *,
        observer: SharedObserver | None = None,
    ) -> JobRecord:
        """Drive the job to a final status in this process (``spot-pipelines run``, the
        Prefect task runner).

        ``observer``: the process's shared observer of this provider
        (``spot_core.observer.observer_of``): the lease is then observed in its one
        describe per poll with every other job the process drives (a task runner's
        mapped tasks), instead of by a describe of its own. Any exception (Ctrl-C,
        SIGTERM turned into one by the caller) stops the running attempt: its lease is
        terminated and the attempt closed before it propagates.

        Raises:
            DriverConflict: another live driver holds the job (``take_over`` is off).
            CheckpointError: the job's store cannot be reached or written (retryable
                when ``.retryable``), including ``FencedOut`` for a superseded driver.
            ConfigError: the provider refused the launch spec as given.
        """
        transition = Transition(self, spec, clock=self._clock)
        step = None
        try:
            step = transition.start(record or self.persist(self.new_record(spec)))
            while step.action != "finished":
                if step.action == "wait":
                    self._sleep(step.wait_seconds)
                    step = transition.woke(step.next)
                else:
                    step = transition.follow(self._watch(spec, step.next, observer))
        except BaseException:
            latest = self._last_saved.get(spec.job_id) or (record if step is None else step.record)
            if latest is not None and latest.current_attempt is not None:
                self.stop(spec, latest, "stopped: the driver was interrupted")
            raise
        finally:
            self._last_saved.pop(spec.job_id, None)
        return step.record

    def _watch(self, spec: JobSpec, nxt: Next, observer: SharedObserver | None) -> Next:
        """Check the watched lease every poll interval until its attempt ends."""
        if observer is not None:
            return self._watch_shared(spec, nxt, observer)
        while nxt.action == "watch":
            self._sleep(self.poll_interval_seconds)
            nxt = self.check(spec, nxt)
        return nxt

    def _watch_shared(self, spec: JobSpec, nxt: Next, observer: SharedObserver) -> Next:
        """Check the watched lease on each of the shared observer's polls until its
        attempt ends (the waits are bounded: a stalled describe is a retryable error)."""
        lease = nxt.lease
        if lease is None:
            raise ValueError(
                f"_watch_shared() needs a Next that watches a lease, got {nxt.action!r}"
            )
        with observer.watching(lease, self.poll_interval_seconds):
            after = time.time()  # the observer's clock: its observations are POSIX time
            while nxt.action == "watch":
                observed = observer.wait(
                    lease.lease_id, after, wait_timeout(self.poll_interval_seconds)
                )
                nxt = self.check(spec, nxt, observed=observed)
                after = observed.at + self.poll_interval_seconds / 2  # the next poll's
        return nxt

    # -- the resumable API --------------------------------------------------------------------
    def advance(self, spec: JobSpec, record: JobRecord, now: float | None = None) -> Next:
        """What the job does next, applied: finished, sleep until T, or watch a lease.

        A record with a running attempt (left by a driver that died or handed over) is
        watched again, not relaunched.

        Raises:
            DriverConflict: another live driver holds the job (``take_over`` is off).
            CheckpointError: the store could not be fenced or read before a launch.
            ConfigError: the provider refused the launch spec as given.
        """
        now = self._clock() if now is None else now
        if record.status in FINAL_STATUSES:
            return Next("finished", record, reason=str(record.status))
        running = record.current_attempt
        if running is not None:
            return self._watch_running(spec, record, running, now)
        if pending_replacement(record) is not None:
            return self.handovers.adopt_replacement(spec, record, now)
        for _ in range(max(2, len(spec.candidate_pools()) + 1)):
            decision = self.decide(spec, record, now)
            settled = self._settle(record, decision, now)
            if settled is not None:
                return Next("finished", settled, reason=decision.reason)
            if decision.action == "wait":
                self._listener("wait", record, decision.reason)
                return Next(
                    "sleep", record, until=now + decision.wait_seconds, reason=decision.reason
                )
            record, lease = self._start_attempt(spec, record, decision, now)
            if lease is not None:
                return Next(
                    "watch", record, until=self._end_by(lease), lease=lease, reason=decision.reason
                )
            now = self._clock()
        return Next(
            "sleep",
            record,
            until=now + self.policy.capacity_wait_seconds,
            reason="no pool had capacity in this round",
        )

    def check(
        self,
        spec: JobSpec,
        watch: Next,
        now: float | None = None,
        *,
        observed: Observation | None = None,
    ) -> Next:
        """Observe the watched lease once; the same ``watch`` (updated) or ``ended``.

        ``observed``: the lease as a shared observer (``spot_core.observer``) already saw
        it in a batched describe; read exactly as this call's own observation would be
        (a describe error counts toward ``observe_failure_timeout``).

        Raises:
            ValueError: ``watch`` watches no lease, or ``observed`` is another lease's.
            Observation errors are not raised: they are data (``failing_since``) until
            ``observe_failure_timeout`` ends the attempt as ``infrastructure_failed``.
        """
        now = self._clock() if now is None else now
        lease, record = watch.lease, watch.record
        if watch.action != "watch" or lease is None:
            raise ValueError(f"check() needs a Next that watches a lease, got {watch.action!r}")
        if observed is not None and observed.lease_id != lease.lease_id:
            raise ValueError(
                f"check(): observation of lease {observed.lease_id} for the "
                f"watch of lease {lease.lease_id}"
            )
        self.liveness.renew(spec, lease, now)
        try:
            status = (
                self.provider.observe([lease]).get(lease.lease_id)
                if observed is None
                else observed.result()
            )
            if status is None:
                raise SpotError(
                    f"the {self.provider.name} provider does not know lease {lease.lease_id}",
                    retryable=True,
                )
        except Exception as exc:  # noqa: BLE001 - read as data: retryable or not
            return self._observe_failed(spec, watch, exc, now)
        if status.ended:
            if status.notice_at is None and watch.notice_at is not None:
                status = dataclasses.replace(status, notice_at=watch.notice_at)
            return self._ended(spec, record, lease, status, now)
        if now >= watch.until:
            return self._ended(
                spec,
                record,
                lease,
                _stopped(
                    now,
                    "stopped: the attempt's time limit "
                    f"({self.attempt_timeout_seconds:g} s) passed",
                ),
                now,
            )
        if record.deadline_at is not None and now >= record.deadline_at:
            stopped = _stopped(now, "stopped: the job's deadline passed before it finished")
            missed = dataclasses.replace(stopped, outcome=Outcome.DEADLINE_MISSED.value)
            return self._ended(spec, record, lease, missed, now)
        notice_at = watch.notice_at if watch.notice_at is not None else status.notice_at
        if notice_at is not None and watch.notice_at is None:
            self._listener("notice", record, f"interruption notice on {lease.pool.key}")
        watch = dataclasses.replace(watch, failing_since=None, notice_at=notice_at)
        signal_at = (
            notice_at if self.handover != "on_rebalance" else notice_at or status.rebalance_at
        )
        if signal_at is not None and self.handover != "off":
            watch = self.handovers.hand_over(spec, watch, status, signal_at, now)
        if notice_at is None:
            return self.moves.maybe_drain(spec, watch, lease, now)
        return watch

    # -- ending, and opening in place ------------------------------------------------------
    def on_lease_end(
        self, spec: JobSpec, record: JobRecord, status: LeaseStatus, now: float | None = None
    ) -> JobRecord:
        """Close the running attempt whose lease ended as ``status`` (observed elsewhere).

        Raises:
            ValueError: ``record`` has no running attempt to close.
        """
        now = self._clock() if now is None else now
        lease = self._running_lease(record)
        return self._ended(spec, record, lease, status, now).record

    def stop(
        self, spec: JobSpec, record: JobRecord, reason: str, now: float | None = None
    ) -> JobRecord:
        """The driver was told to stop (killed, cancelled, marked failed): terminate the
        running attempt's lease and close the attempt. A record with none is returned as is.

        Raises only what the ``persist`` callback raises: a lease that cannot be terminated
        is logged and the attempt closed all the same (the node's watcher ends it when the
        heartbeat lapses).
        """
        now = self._clock() if now is None else now
        if record.current_attempt is None:
            if pending_replacement(record) is None:
                return record
            ended = self.handovers.end_replacement(spec, record.attempts[-1], now)
            record = dataclasses.replace(record, attempts=record.attempts[:-1] + (ended,))
            return self._save(record, "stopped", reason)
        return self.on_lease_end(spec, record, _stopped(now, reason), now)

    def cancel(
        self, spec: JobSpec, record: JobRecord, reason: str, now: float | None = None
    ) -> JobRecord:
        """The user cancelled the job (a cancelled flow run): stop its running attempt and
        settle the record as failed, with ``reason`` on the last attempt."""
        record = self.stop(spec, record, reason, now)
        return self._save(record.with_status(JobStatus.FAILED), "cancelled", reason)

    def adopt(
        self,
        spec: JobSpec,
        record: JobRecord,
        lease_for: Callable[[int, float], Lease],
        now: float | None = None,
        attempt: int | None = None,
    ) -> tuple[JobRecord, Lease]:
        """Open an attempt on capacity the driver already runs on (``@task.spot``,
        ``spot_task``): close one a vanished earlier run left open, fence the store, and
        record the new attempt on the lease ``lease_for(number, now)`` describes. Its end is
        reported with ``on_lease_end`` like any other.

        ``attempt``: the number the capacity already runs as, when whoever launched it
        fenced the store for it (a spot worker's lease, ``SPOT_ATTEMPT``): the attempt
        takes that number (or the record's next, if higher) instead of one above the
        fence, so the launcher's next attempt is not pushed up.

        Raises:
            CheckpointError: the store could not be fenced or read.
        """
        now = self._clock() if now is None else now
        if record.current_attempt is not None:  # the earlier worker vanished mid-call
            record = self.on_lease_end(
                spec,
                record,
                LeaseStatus(
                    LeaseState.RECLAIMED,
                    ended_at=now,
                    notice_at=now,
                    message="the worker vanished without a report (killed or reclaimed)",
                ),
                now,
            )
        store = self.stores(spec.checkpoint_uri)
        floor = store.fence_level() + 1 if attempt is None else attempt
        number = max(record.next_attempt_number, floor)
        store.fence(number)
        start_ref = store.latest()
        lease = lease_for(number, now)
        opened = Attempt(
            number=number,
            pool=lease.pool,
            started_at=lease.started_at,
            lease_id=lease.lease_id,
            lease=lease.to_dict(),
            checkpoint_step_start=None if start_ref is None else start_ref.step,
        )
        if start_ref is not None:
            record = record.with_checkpoint(start_ref)
        return self._save(record.start_attempt(opened), "launched", "in place"), lease

    # -- deciding ----------------------------------------------------------------------------
    def decide(self, spec: JobSpec, record: JobRecord, now: float | None = None) -> Decision:
        """Observe the market and ask the policy what the job does next (no side effect).

        Raises:
            SpotError: the market could not be read (``retryable`` says whether to ask
                again).
        """
        now = self._clock() if now is None else now
        offers = self._priced().offers(spec.candidate_pools(), now)
        decision = decide_next(
            record, offers, self.policy, now=now, work=self.moves.deadline_work(spec, record)
        )
        plan = self.moves.deadline_plan(spec, record)
        if plan is None:
            return decision
        return plan.decide(record, offers, self.policy, decision, now=now)

    def _priced(self) -> PriceMarket:
        """The market that prices the job's pools; an in-place step's controller has none
        (it only opens and closes attempts on capacity the engine runs)."""
        if self.market is None:
            raise ConfigError(
                "this controller has no market (an in-place step's): it cannot decide "
                "where the job runs; pass the provider's market"
            )
        return self.market

    def _settle(self, record: JobRecord, decision: Decision, now: float) -> JobRecord | None:
        """The final record if ``decision`` ends the job, else None."""
        if decision.action == "done":
            return self._save(record.with_status(JobStatus.SUCCEEDED), "done", decision.reason)
        if decision.action == "fail":
            missed = record.deadline_at is not None and now >= record.deadline_at
            status = JobStatus.DEADLINE_MISSED if missed else JobStatus.FAILED
            return self._save(record.with_status(status), "failed", decision.reason)
        return None

    # -- launching ---------------------------------------------------------------------------
    def _start_attempt(
        self, spec: JobSpec, record: JobRecord, decision: Decision, now: float
    ) -> tuple[JobRecord, Lease | None]:
        """Fence the store above every attempt it has seen, launch in the first ranked pool
        with capacity, and record the attempt (or a ``capacity_unavailable`` one)."""
        store = self.stores(spec.checkpoint_uri)
        # A re-run of a job id (its record lost with a killed driver) continues above the
        # dead run's attempts, so the dead run's zombie is the one refused.
        level = store.fence_level()
        self.liveness.claim(spec, record, store, level, now)
        number = max(record.next_attempt_number, level + 1)
        store.fence(number)
        start_ref = store.latest()
        start_step = None if start_ref is None else start_ref.step
        self.liveness.renew_at_start(spec, number, now, store)
        launch = self._launch_spec(spec, number)
        intervals = {
            pool.key: self.moves.checkpoint_interval(pool, start_ref, now)
            for pool in decision.pools
        }
        try:
            lease, problems, failure = self._launch_first(decision.pools, launch, intervals)
        except BaseException:
            self.liveness.release(spec, number, now)  # nothing runs: a re-run need not wait
            raise
        if lease is None:
            self.liveness.release(spec, number, now)
            outcome = Outcome.INFRASTRUCTURE_FAILED if failure else Outcome.CAPACITY_UNAVAILABLE
            record = closed_without_lease(
                record, number, decision, start_step, problems, outcome, now
            )
            return self._save(record, str(outcome), record.attempts[-1].message), None
        try:
            attempt = Attempt(
                number=number,
                pool=lease.pool,
                started_at=lease.started_at,
                lease_id=lease.lease_id,
                checkpoint_step_start=start_step,
                lease=lease.to_dict(),
                checkpoint_interval_seconds=intervals.get(lease.pool.key),
            )
            if start_ref is not None:
                record = record.with_checkpoint(start_ref)
            return self._save(record.start_attempt(attempt), "launched", decision.reason), lease
        except BaseException:
            # Unrecorded, nobody could ever stop it: a lease must not outlive a failed save
            # (or a SIGTERM / Ctrl-C that lands between the launch and the record).
            self._terminate(lease)
            raise

    def _launch_spec(self, spec: JobSpec, number: int) -> LaunchSpec:
        env = (
            spec.env
            if self.heartbeat_uri is None or self.heartbeat_timeout_seconds is None
            else {**spec.env, HEARTBEAT_URI: self.heartbeat_uri}
        )
        return LaunchSpec(
            job_id=spec.job_id,
            attempt=number,
            command=spec.command,
            checkpoint_uri=spec.checkpoint_uri,
            env=env,
            image=spec.image,
            heartbeat_timeout_seconds=self.heartbeat_timeout_seconds,
        )

    def _launch_first(
        self,
        pools: Sequence[Pool],
        launch: LaunchSpec,
        intervals: Mapping[str, float] | None = None,
    ) -> tuple[Lease | None, list[str], bool]:
        """``launching.launch_first``, each pool told its checkpoint interval."""
        return launch_first(self.provider, pools, launch, intervals, self.moves.with_interval)

    # -- watching ----------------------------------------------------------------------------
    def _watch_running(
        self, spec: JobSpec, record: JobRecord, running: Attempt, now: float
    ) -> Next:
        lease = self._running_lease(record)
        if lease is None:  # recorded without a lease (cannot happen for launched attempts)
            return self._ended(spec, record, None, _stopped(now, "the attempt had no lease"), now)
        return Next(
            "watch",
            record,
            until=self._end_by(lease),
            lease=lease,
            reason=f"watching attempt {running.number} on {lease.pool.key}",
        )

    def _running_lease(self, record: JobRecord) -> Lease | None:
        running = record.current_attempt
        if running is None:
            raise ValueError(f"job {record.job_id} has no running attempt to close")
        return running.lease_of(record.job_id)

    def _end_by(self, lease: Lease) -> float:
        return lease.started_at + self.attempt_timeout_seconds

    def _observe_failed(self, spec: JobSpec, watch: Next, exc: Exception, now: float) -> Next:
        """A failed observation is not a lease end; only a sustained failure is."""
        since = watch.failing_since if watch.failing_since is not None else now
        retryable = getattr(exc, "retryable", True) is not False
        message = f"{type(exc).__name__}: {exc}"
        if retryable and now - since < self.observe_failure_timeout_seconds:
            log.warning(
                "job %s: observing lease %s failed (%s); retrying for up to %g s",
                spec.job_id,
                None if watch.lease is None else watch.lease.lease_id,
                message,
                self.observe_failure_timeout_seconds,
            )
            return dataclasses.replace(watch, failing_since=since)
        why = (
            f"could not observe the lease for {now - since:.0f} s"
            if retryable
            else "observing the lease failed for good"
        )
        return self._ended(
            spec, watch.record, watch.lease, _stopped(now, f"stopped: {why}: {message}"[:500]), now
        )

    def _ended(
        self, spec: JobSpec, record: JobRecord, lease: Lease | None, status: LeaseStatus, now: float
    ) -> Next:
        """Terminate (idempotent), classify, bill and close the running attempt."""
        if lease is not None:
            self._terminate(lease)
        record = self._close_attempt(spec, record, lease, status, now)
        return Next("ended", record, reason=status.message)

    def _terminate(self, lease: Lease) -> None:
        try:
            self.provider.terminate(lease)
        except Exception:  # noqa: BLE001 - logged; cleanup_orphans and the heartbeat remain
            log.exception(
                "could not terminate lease %s; the node's heartbeat watch ends it", lease.lease_id
            )

    # -- closing -----------------------------------------------------------------------------
    def _close_attempt(
        self, spec: JobSpec, record: JobRecord, lease: Lease | None, status: LeaseStatus, now: float
    ) -> JobRecord:
        ended_at = status.ended_at or now
        store = self.stores(spec.checkpoint_uri)
        running = record.current_attempt
        if running is None:
            raise ValueError(f"job {record.job_id} has no running attempt to close")
        end_ref = _end_ref(store, running)
        outcome = classify(status)
        if running.drain_requested_at is not None and outcome is not Outcome.SUCCEEDED:
            outcome = Outcome.DRAINED  # the controller stopped it to move the job
        fenced_by = _fenced_above(store, running.number) if outcome is Outcome.USER_FAILED else None
        if fenced_by is not None:  # its saves were refused: not the step's own failure
            outcome = Outcome.INFRASTRUCTURE_FAILED
            status = dataclasses.replace(
                status,
                message=(
                    f"fenced out: attempt {fenced_by} of this job was started by another driver "
                    f"(exit code {status.exit_code})"
                ),
            )
        bill = (
            self.provider.bill(lease, ended_at)
            if lease is not None
            else Bill(cost=0.0, on_demand_cost=0.0, capacity_seconds=0.0)
        )
        finished = dataclasses.replace(
            running,
            ended_at=ended_at,
            outcome=outcome,
            cost=bill.cost,
            on_demand_cost=bill.on_demand_cost,
            data_transfer_cost=bill.data_transfer_cost,
            checkpoint_step_end=None if end_ref is None else end_ref.step,
            lost_work_seconds=lost_work(self.provider, outcome, running, end_ref, ended_at),
            checkpoint_overhead_seconds=self.provider.capacity_seconds(
                _checkpoint_seconds(end_ref, running.number)
            ),
            message=_message(outcome, status),
            notice_at=status.notice_at,
        )
        finished = _with_resume_report(store, finished)
        if finished.replacement is not None:
            finished = self.handovers.close_handover(spec, store, finished, now)
        record = record.finish_attempt(finished)
        if end_ref is not None:
            record = record.with_checkpoint(end_ref)
        self.liveness.release(spec, running.number, now)
        self.liveness.forget(spec)
        return self._save(record, str(outcome), finished.message)

    def _save(self, record: JobRecord, kind: str, detail: str) -> JobRecord:
        self._remember(record)
        self._persist(record)
        self._listener(kind, record, detail)
        return record
