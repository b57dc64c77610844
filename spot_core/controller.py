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
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from spot_core import stopping
from spot_core.attempt_env import (
    CHECKPOINT_INTERVAL,
    HANDOVER_DEADLINE,
    HANDOVER_FROM,
    HEARTBEAT_URI,
    INFRASTRUCTURE_EXIT_CODE,
)
from spot_core.checkpoint import CheckpointStore, open_store
from spot_core.checkpoint.backend import UnknownAge
from spot_core.checkpoint.handover import (
    DEFAULT_NOTICE_SECONDS,
    forget_launched,
    mark_ended,
    mark_launched,
    read_launched,
)
from spot_core.checkpoint.heartbeat import DriverBeat, Heartbeat, driver_beat, live_holder
from spot_core.checkpoint.resumed import read_resumed
from spot_core.errors import ConfigError, DriverConflict, SpotError
from spot_core.market.base import Market as PriceMarket
from spot_core.model import (
    INTERRUPTED,
    Attempt,
    CheckpointRef,
    JobRecord,
    JobStatus,
    Lease,
    Market,
    Outcome,
    Pool,
)
from spot_core.observer import SharedObserver, wait_timeout
from spot_core.policy.checkpoint_interval import (
    CheckpointBounds,
    mean_save_seconds,
    pool_checkpoint_interval,
)
from spot_core.policy.deadline.live import DeadlineWork
from spot_core.policy.deadline.planner import DeadlinePlan, check_deadline_policy, plan_job
from spot_core.policy.retry import Decision, RetryPolicy, decide_next
from spot_core.providers.base import (
    Bill,
    Capability,
    LaunchSpec,
    LeaseState,
    LeaseStatus,
    Observation,
    Provider,
)
from spot_core.settings import HANDOVER_MODES, SpotSettings

log = logging.getLogger(__name__)

Persist = Callable[[JobRecord], None]
Listener = Callable[[str, JobRecord, str], None]


@dataclass(frozen=True)
class JobSpec:
    """One job: what to run, where it may run, where it checkpoints, and by when."""

    job_id: str
    command: tuple[str, ...]
    checkpoint_uri: str
    pools: tuple[Pool, ...]
    # The job's deadline, a wall-clock POSIX time (``SpotSettings.deadline_spec``).
    deadline_at: float | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    # What a deadline-bound job needs, in capacity seconds, so the policy can tell when
    # spot no longer fits before the deadline; progress comes from checkpoint steps.
    work_capacity_seconds: float | None = None
    total_steps: int | None = None
    restart_overhead_capacity_seconds: float = SpotSettings.restart_overhead_capacity_seconds
    # Run ``command`` in this container image (see ``spot_core.container``).
    image: str | None = None
    # A deadline policy by name (``spot_core.policy.deadline.policies``: greedy,
    # uniform-progress, default, ...) that decides spot / on-demand / wait between attempts
    # on a trace market (see ``spot_core.policy.deadline.planner``); None: only the safety
    # net (go on-demand once the work and two restarts no longer fit), as on EC2.
    deadline_policy: str | None = None

    def __post_init__(self) -> None:
        if self.deadline_policy is None:
            return
        check_deadline_policy(self.deadline_policy)
        if self.deadline_at is None or self.work_capacity_seconds is None:
            raise ConfigError(
                f"deadline policy {self.deadline_policy!r} needs the job's "
                "deadline and work (--deadline and --work)"
            )

    def candidate_pools(self) -> tuple[Pool, ...]:
        """The spot pools and their on-demand counterparts, without duplicates."""
        on_demand = tuple(p.on(Market.ON_DEMAND) for p in self.pools if p.is_spot)
        return tuple(dict.fromkeys(self.pools + on_demand))

    def to_dict(self) -> dict[str, Any]:
        """JSON-able, so a driver that did not build the job can launch its next attempt
        (a trigger handing over on the notice carries it in its kwargs)."""
        return {
            "job_id": self.job_id,
            "command": list(self.command),
            "checkpoint_uri": self.checkpoint_uri,
            "pools": [pool.to_dict() for pool in self.pools],
            "deadline_at": self.deadline_at,
            "env": dict(self.env),
            "work_capacity_seconds": self.work_capacity_seconds,
            "total_steps": self.total_steps,
            "restart_overhead_capacity_seconds": self.restart_overhead_capacity_seconds,
            "image": self.image,
            "deadline_policy": self.deadline_policy,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobSpec:
        """``to_dict()``'s output back; anything else is one ConfigError (a trigger's kwargs
        can be truncated or forged)."""
        try:
            command = data["command"]
            env = data.get("env") or {}
            if not isinstance(command, (list, tuple)) or not all(
                isinstance(part, str) for part in command
            ):
                raise ValueError(f"command={command!r} is not a list of strings")
            if not isinstance(env, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in env.items()
            ):
                raise ValueError("env is not a mapping of strings to strings")
            numbers = {
                name: data.get(name)
                for name in (
                    "deadline_at",
                    "work_capacity_seconds",
                    "total_steps",
                    "restart_overhead_capacity_seconds",
                )
            }
            for name, value in numbers.items():
                if value is not None and (
                    isinstance(value, bool)
                    or not isinstance(value, (int, float))
                    or not math.isfinite(value)
                ):
                    raise ValueError(f"{name}={value!r} is not a finite number")
            overhead = numbers["restart_overhead_capacity_seconds"]
            return cls(
                job_id=str(data["job_id"]),
                command=tuple(command),
                checkpoint_uri=str(data["checkpoint_uri"]),
                pools=tuple(Pool.from_dict(pool) for pool in data["pools"]),
                deadline_at=numbers["deadline_at"],
                env=dict(env),
                work_capacity_seconds=numbers["work_capacity_seconds"],
                total_steps=None if numbers["total_steps"] is None else int(numbers["total_steps"]),
                restart_overhead_capacity_seconds=(
                    SpotSettings.restart_overhead_capacity_seconds
                    if overhead is None
                    else float(overhead)
                ),
                image=data.get("image"),
                deadline_policy=data.get("deadline_policy"),
            )
        except ConfigError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ConfigError(
                f"the job's spec is malformed ({type(exc).__name__}: "
                f"{exc}); it was not written by spot-pipelines"
            ) from None


FINAL_STATUSES = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.DEADLINE_MISSED)
NextAction = Literal["finished", "sleep", "watch", "ended"]
NEXT_ACTIONS = ("finished", "sleep", "watch", "ended")


@dataclass(frozen=True)
class Next:
    """What a driver does now, with the record it must keep.

    ``finished``: the job settled (``record.status`` says how). ``sleep``: call
    ``advance`` again at ``until``. ``watch``: the attempt runs on ``lease``; call
    ``check`` every ``poll_interval_seconds`` (its bound is ``until``, the attempt's time limit).
    ``ended``: the watched attempt just closed (``record.attempts[-1]`` says how); call
    ``advance`` for what comes next.
    """

    action: NextAction
    record: JobRecord
    until: float = 0.0
    lease: Lease | None = None
    reason: str = ""
    failing_since: float | None = None  # watch: start of a run of failed observations
    notice_at: float | None = None  # watch: first interruption notice seen

    @property
    def last_attempt(self) -> Attempt | None:
        return self.record.attempts[-1] if self.record.attempts else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-able, so a driver can carry it across processes (a trigger's kwargs)."""
        return {
            "action": self.action,
            "record": self.record.to_dict(),
            "until": self.until,
            "lease": None if self.lease is None else self.lease.to_dict(),
            "reason": self.reason,
            "failing_since": self.failing_since,
            "notice_at": self.notice_at,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Next:
        """``to_dict()``'s output back; anything else is one ConfigError (a trigger's kwargs
        or event read back can be truncated or forged)."""
        try:
            if data.get("action") not in NEXT_ACTIONS:
                raise ValueError(
                    f"action={data.get('action')!r} is not one of {', '.join(NEXT_ACTIONS)}"
                )
            times = {name: data.get(name) for name in ("until", "failing_since", "notice_at")}
            for name, value in times.items():
                if value is not None and (
                    isinstance(value, bool)
                    or not isinstance(value, (int, float))
                    or not math.isfinite(value)
                ):
                    raise ValueError(f"{name}={value!r} is not a finite time")
            lease = data.get("lease")
            record = JobRecord.from_dict(data["record"])
            return cls(
                action=data["action"],
                record=record,
                until=float(times["until"] or 0.0),
                lease=None if lease is None else Lease.from_dict(lease),
                reason=str(data.get("reason") or ""),
                failing_since=times["failing_since"],
                notice_at=times["notice_at"],
            )
        except ConfigError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ConfigError(
                f"the controller's Next is malformed ({type(exc).__name__}: "
                f"{exc}); it was not written by spot-pipelines"
            ) from None


@runtime_checkable
class _OpensStores(Protocol):
    """The optional method of a provider that declares ``Capability.OWN_STORES``."""

    def open_store(self, uri: str) -> CheckpointStore: ...


def provider_stores(provider: Provider) -> Callable[[str], CheckpointStore]:
    """How a job's store is opened: the provider's own opener (its credentials and
    clients) when it declares ``OWN_STORES``, else ``open_store``."""
    if Capability.OWN_STORES not in provider.capabilities:
        return open_store
    if not isinstance(provider, _OpensStores):
        raise AttributeError(
            f"the {provider.name} provider declares OWN_STORES but has no open_store method"
        )
    return provider.open_store


def classify(status: LeaseStatus) -> Outcome:
    """How an ended lease's attempt ended. A notice or a reclaim is never a failure; a
    provider's own verdict (``LeaseStatus.outcome``) stands as given."""
    if status.outcome is not None:
        return Outcome(status.outcome)
    if status.exit_code == 0:
        return Outcome.SUCCEEDED
    if status.state is LeaseState.RECLAIMED or status.notice_at is not None:
        return Outcome.PREEMPTED
    if status.exit_code == INFRASTRUCTURE_EXIT_CODE:  # the step's store stayed unreachable
        return Outcome.INFRASTRUCTURE_FAILED
    if status.state is LeaseState.TERMINATED or status.exit_code is None or status.exit_code < 0:
        return Outcome.INFRASTRUCTURE_FAILED
    return Outcome.USER_FAILED


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
        # (job id, created at, deadline at, policy) -> the job's plan
        self._plans: dict[tuple[str, float, float, str], DeadlinePlan | None] = {}
        self._beats: dict[str, float] = {}  # job id -> when this process last renewed
        self._heartbeats: dict[tuple[str, str], Heartbeat] = {}  # (job id, store) -> writer
        self._pointed: dict[str, int] = {}  # job id -> attempt its pointer names (heartbeat_uri)
        self._drain_looks: dict[str, float] = {}  # job id -> when a drain was last considered
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
        nxt = None
        try:
            nxt = self.advance(spec, record or self.persist(self.new_record(spec)))
            while nxt.action != "finished":
                nxt = self._drive(spec, nxt, observer)
        except BaseException:
            latest = self._last_saved.get(spec.job_id) or (record if nxt is None else nxt.record)
            if latest is not None and latest.current_attempt is not None:
                self.stop(spec, latest, "stopped: the driver was interrupted")
            raise
        finally:
            self._last_saved.pop(spec.job_id, None)
        return nxt.record

    def _drive(self, spec: JobSpec, nxt: Next, observer: SharedObserver | None = None) -> Next:
        if nxt.action == "sleep":
            self._sleep(max(0.0, nxt.until - self._clock()))
            return self.advance(spec, nxt.record)
        if nxt.action == "watch":
            if observer is not None:
                return self._watch_shared(spec, nxt, observer)
            self._sleep(self.poll_interval_seconds)
            return self.check(spec, nxt)
        return self.advance(spec, nxt.record)  # ended

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
            return self._adopt_replacement(spec, record, now)
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
        self._renew_heartbeat(spec, lease, now)
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
            return self._ended(
                spec, record, lease, _stopped(now, "stopped: the job's deadline passed"), now
            )
        notice_at = watch.notice_at if watch.notice_at is not None else status.notice_at
        if notice_at is not None and watch.notice_at is None:
            self._listener("notice", record, f"interruption notice on {lease.pool.key}")
        watch = dataclasses.replace(watch, failing_since=None, notice_at=notice_at)
        signal_at = (
            notice_at if self.handover != "on_rebalance" else notice_at or status.rebalance_at
        )
        if signal_at is not None and self.handover != "off":
            watch = self._hand_over(spec, watch, status, signal_at, now)
        if notice_at is None:
            return self._maybe_drain(spec, watch, lease, now)
        return watch

    # -- handover: the replacement launched on the notice ----------------------------------------
    def _hand_over(
        self, spec: JobSpec, watch: Next, status: LeaseStatus, signal_at: float, now: float
    ) -> Next:
        """Launch the running attempt's replacement now, while it saves (``handover``).

        The policy decides where, as it would once the attempt ended preempted (it is asked
        with that record); its budgets are the same. The replacement is told which attempt
        it replaces and by when that one's capacity is gone: it prefetches, waits for the
        emergency checkpoint, then fences (``spot_core.checkpoint.handover``). The old
        attempt is left to finish its save; the record names both leases before anything
        else happens, and ``advance`` adopts the replacement once the old one is closed."""
        record = watch.record
        running = record.current_attempt
        if (
            running is None
            or running.replacement is not None
            or running.drain_requested_at is not None
            or self.market is None
            or not spec.command  # a watch-only spec (a trigger without the job's launch
            # spec, ``jobs.Relaunch``): the driver that launched the job hands over
            # A deadline policy's plan decides on the progress the emergency checkpoint is
            # about to prove: asked before that save, it could choose another market than
            # it will once the attempt closed, so such a job relaunches after the end.
            or self._deadline_plan(spec, record) is not None
        ):
            return watch
        store = self.stores(spec.checkpoint_uri)
        launched = read_launched(store, running.number)
        if launched is not None:  # launched by a driver that restarted before recording it
            return self._record_replacement(watch, launched, running.number)
        try:
            ended = dataclasses.replace(
                running, ended_at=now, outcome=Outcome.PREEMPTED, notice_at=signal_at
            )
            decision = self.decide(spec, record.finish_attempt(ended), now)
        except Exception as exc:  # noqa: BLE001 - the usual path launches after the end
            log.warning("job %s: no handover (%s); relaunching after the end", spec.job_id, exc)
            return watch
        if decision.action != "launch":
            return watch  # the policy waits or settles: asked again once the attempt ends
        number = max(record.next_attempt_number, store.fence_level() + 1)
        deadline = status.reclaim_at or signal_at + DEFAULT_NOTICE_SECONDS
        if watch.notice_at is None:  # a rebalance: no reclaim is announced yet, so the
            # replacement waits for the old attempt's notice and save or its end, at most
            # the attempt's time limit (the second lease is the insurance's price)
            deadline = now + self.attempt_timeout_seconds
        launch = self._launch_spec(spec, number)
        handover_env = {HANDOVER_FROM: str(running.number), HANDOVER_DEADLINE: f"{deadline:.3f}"}
        launch = dataclasses.replace(launch, env={**launch.env, **handover_env})
        start_ref = record.latest_checkpoint
        intervals = {
            pool.key: self._checkpoint_interval(pool, start_ref, now) for pool in decision.pools
        }
        lease, problems, _ = self._launch_first(decision.pools, launch, intervals)
        if lease is None:
            log.info("job %s: no capacity for a handover (%s)", spec.job_id, "; ".join(problems))
            return watch
        replacement = {
            "attempt": number,
            "lease": lease.to_dict(),
            "launched_at": now,
            "state": "launched",
            "checkpoint_interval_seconds": intervals.get(lease.pool.key),
            "reason": decision.reason,
        }
        try:
            mark_launched(store, running.number, replacement)
            return self._record_replacement(watch, replacement, running.number)
        except BaseException:
            self._terminate(lease)  # unrecorded: nobody else could end it
            forget_launched(store, running.number)
            raise

    def _record_replacement(self, watch: Next, replacement: Mapping[str, Any], old: int) -> Next:
        """The record names ``old``'s replacement before anything else happens."""
        lease = Lease.from_dict(replacement["lease"])
        record = self._save(
            watch.record.with_running(replacement=dict(replacement)),
            "handover",
            f"attempt {replacement['attempt']} launched on {lease.pool.key} on the "
            f"notice to attempt {old}",
        )
        return dataclasses.replace(watch, record=record)

    def _adopt_replacement(self, spec: JobSpec, record: JobRecord, now: float) -> Next:
        """The closed attempt's replacement becomes the running attempt: the store is
        fenced at its number (the old attempt, closed, can no longer save: a zombie of it is
        refused) and it is watched like any launched attempt."""
        old = record.attempts[-1]
        replacement = dict(old.replacement or {})
        lease = Lease.from_dict(replacement["lease"])
        number = int(replacement["attempt"])
        store = self.stores(spec.checkpoint_uri)
        store.fence(number)
        if self.heartbeat_timeout_seconds is not None:
            if self.heartbeat_uri is None:
                self._heartbeat(spec, store).renew(number, now)
                self._beats[spec.job_id] = now
            else:
                self._point(spec, number, now, store)
        replacement["state"] = "adopted"
        record = dataclasses.replace(
            record,
            attempts=record.attempts[:-1] + (dataclasses.replace(old, replacement=replacement),),
        )
        attempt = Attempt(
            number=number,
            pool=lease.pool,
            started_at=lease.started_at,
            lease_id=lease.lease_id,
            checkpoint_step_start=old.checkpoint_step_end,
            lease=lease.to_dict(),
            checkpoint_interval_seconds=replacement.get("checkpoint_interval_seconds"),
        )
        reason = f"handover from attempt {old.number}: {replacement.get('reason', '')}"
        record = self._save(record.start_attempt(attempt), "launched", reason)
        return Next("watch", record, until=self._end_by(lease), lease=lease, reason=reason)

    def _end_replacement(self, spec: JobSpec, attempt: Attempt, now: float) -> Attempt:
        """An attempt that did not end in an interruption (it finished, or the driver was
        stopped) needs no replacement: end its lease and bill it to the attempt."""
        replacement = dict(attempt.replacement or {})
        lease = Lease.from_dict(replacement["lease"])
        self._terminate(lease)
        bill = self.provider.bill(lease, now)
        replacement["state"] = "terminated"
        return dataclasses.replace(
            attempt,
            replacement=replacement,
            cost=attempt.cost + bill.cost,
            on_demand_cost=attempt.on_demand_cost + bill.on_demand_cost,
            message=(attempt.message + "; " if attempt.message else "")
            + f"its replacement (attempt {replacement['attempt']}) was ended unused",
        )

    # -- voluntary drain: a move mid-run -------------------------------------------------------
    def _maybe_drain(self, spec: JobSpec, watch: Next, lease: Lease, now: float) -> Next:
        """Move a running attempt when the policy says the move pays.

        At most once per market tick (or ``capacity_wait``), the job's policy is asked what
        it would do now, with the progress its store proves: an on-demand attempt under
        any policy (``decide_next``'s return-to-spot rule), a spot attempt only under a
        deadline policy's plan (which may leave a dearer zone for a cheaper one, or on-demand
        to wait, as in the simulator). When the answer is a move (``Decision.move``), the
        attempt is marked ``drain_requested_at`` and persisted first, then its lease is
        terminated gracefully: the step's watcher forwards SIGTERM, the step saves an
        emergency checkpoint and stops, and the attempt closes as ``drained`` (no budget
        spent)."""
        running = watch.record.current_attempt
        if self.market is None:  # an in-place step's: nowhere else to move it
            return watch
        if (
            running is None
            or running.drain_requested_at is not None
            or now - self._drain_looks.get(spec.job_id, -math.inf) < self._drain_every()
        ):
            return watch
        self._drain_looks[spec.job_id] = now
        try:
            if running.pool.is_spot and self._deadline_plan(spec, watch.record) is None:
                return watch  # only a plan moves spot attempts: no store read for the rest
            record = watch.record
            latest = self.stores(spec.checkpoint_uri).latest()
            if latest is not None:
                record = record.with_checkpoint(latest)
            decision = self.decide(spec, record, now)
        except Exception as exc:  # noqa: BLE001 - a missed look costs savings, not the job
            log.warning("job %s: could not look for a better place to run (%s)", spec.job_id, exc)
            return watch
        if not decision.move:
            return watch
        record = self._save(
            record.with_running(drain_requested_at=now), "draining", decision.reason
        )
        self._terminate(lease)
        return dataclasses.replace(watch, record=record)

    def _drain_every(self) -> float:
        """Seconds between looks: one market tick in wall time, at most ``capacity_wait``."""
        market = self._priced()
        tick = market.tick_seconds
        every = self.policy.capacity_wait_seconds
        return min(every, tick / market.time_scale) if tick else every

    def _priced(self) -> PriceMarket:
        """The market that prices the job's pools; an in-place step's controller has none
        (it only opens and closes attempts on capacity the engine runs)."""
        if self.market is None:
            raise ConfigError(
                "this controller has no market (an in-place step's): it cannot decide "
                "where the job runs; pass the provider's market"
            )
        return self.market

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
            ended = self._end_replacement(spec, record.attempts[-1], now)
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
            record, offers, self.policy, now=now, work=self._deadline_work(spec, record)
        )
        plan = self._deadline_plan(spec, record)
        if plan is None:
            return decision
        return plan.decide(record, offers, self.policy, decision, now=now)

    def _deadline_plan(self, spec: JobSpec, record: JobRecord) -> DeadlinePlan | None:
        """The job's window planned once by its deadline policy (trace markets only)."""
        if (
            spec.deadline_policy is None
            or record.deadline_at is None
            or spec.work_capacity_seconds is None
        ):
            return None
        key = (spec.job_id, record.created_at, record.deadline_at, spec.deadline_policy)
        if key not in self._plans:
            plan = plan_job(
                self.market,
                policy=spec.deadline_policy,
                pools=spec.pools,
                created_at=record.created_at,
                deadline_at=record.deadline_at,
                work_capacity_seconds=spec.work_capacity_seconds,
                restart_overhead_capacity_seconds=(spec.restart_overhead_capacity_seconds),
                total_steps=spec.total_steps,
            )
            if plan is None:
                log.info(
                    "job %s: deadline policy %s does not apply here (no trace market or "
                    "no room); the safety net alone decides",
                    spec.job_id,
                    spec.deadline_policy,
                )
            self._plans[key] = plan
        return self._plans[key]

    def _deadline_work(self, spec: JobSpec, record: JobRecord) -> DeadlineWork | None:
        """Work left and restart overhead in wall seconds, for a job with a deadline."""
        if record.deadline_at is None or spec.work_capacity_seconds is None:
            return None
        done = 0.0
        if spec.total_steps and record.latest_checkpoint is not None:
            done = min(1.0, record.latest_checkpoint.step / spec.total_steps)
        scale = self.provider.capacity_seconds(1.0)  # capacity seconds per wall second
        tick = self._priced().tick_seconds or 60.0
        return DeadlineWork(
            work_left_seconds=spec.work_capacity_seconds * (1.0 - done) / scale,
            restart_overhead_seconds=spec.restart_overhead_capacity_seconds / scale,
            tick_seconds=tick / scale,
        )

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
        self._claim(spec, record, store, level, now)
        number = max(record.next_attempt_number, level + 1)
        store.fence(number)
        start_ref = store.latest()
        start_step = None if start_ref is None else start_ref.step
        if self.heartbeat_timeout_seconds is not None:
            if self.heartbeat_uri is None:
                self._heartbeat(spec, store).renew(number, now)  # the watcher sees one at once
                self._beats[spec.job_id] = now
            else:
                self._point(spec, number, now, store)
        launch = self._launch_spec(spec, number)
        intervals = {
            pool.key: self._checkpoint_interval(pool, start_ref, now) for pool in decision.pools
        }
        try:
            lease, problems, failure = self._launch_first(decision.pools, launch, intervals)
        except BaseException:
            self._release(spec, number, now)  # nothing runs: a re-run need not wait
            raise
        if lease is None:
            self._release(spec, number, now)
            outcome = Outcome.INFRASTRUCTURE_FAILED if failure else Outcome.CAPACITY_UNAVAILABLE
            return self._record_no_lease(
                record, number, decision, start_step, problems, outcome, now
            ), None
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

    def _claim(
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

    def _checkpoint_interval(
        self, pool: Pool, start_ref: CheckpointRef | None, now: float
    ) -> float:
        """The attempt's time-based checkpoint interval on ``pool``, in capacity seconds:
        Young/Daly from the pool's interruption rate (0 on on-demand) and the job's mean
        measured save, else the configured cost. A market that cannot say counts as no
        interruptions seen (the notice remains the first line of defence)."""
        rate = 0.0
        if pool.is_spot:
            try:  # a market that keeps no history has no stat for the pool
                stat = self._priced().stats([pool], now).get(pool.key)
                rate = 0.0 if stat is None else float(stat.interruptions_per_hour)
            except Exception as exc:  # noqa: BLE001 - an interval is advice, not a launch
                log.warning(
                    "no interruption rate for %s (%s); checkpoint interval at its maximum",
                    pool.key,
                    exc,
                )
        measured = mean_save_seconds(start_ref)
        cost = self.provider.capacity_seconds(measured) if measured else self.checkpoint_bounds.cost
        return pool_checkpoint_interval(rate, cost, self.checkpoint_bounds)

    def _launch_first(
        self,
        pools: Sequence[Pool],
        launch: LaunchSpec,
        intervals: Mapping[str, float] | None = None,
    ) -> tuple[Lease | None, list[str], bool]:
        """Try the ranked pools in order; the first with capacity wins.

        Errors are read as data: a capacity miss moves to the next pool, another retryable
        error (a cloud API failure) too, but marks the round an infrastructure failure; a
        non-retryable one (bad configuration) is raised: no pool can fix it.
        """
        problems: list[str] = []
        failure = False
        for pool in pools:
            try:
                return (
                    self.provider.launch(self._with_interval(launch, pool, intervals), pool),
                    problems,
                    failure,
                )
            except SpotError as exc:
                if not exc.retryable:
                    raise
                failure = failure or exc.outcome != str(Outcome.CAPACITY_UNAVAILABLE)
                problems.append(f"{pool.key}: {exc}")
        return None, problems, failure

    def _with_interval(
        self, launch: LaunchSpec, pool: Pool, intervals: Mapping[str, float] | None
    ) -> LaunchSpec:
        """``launch`` telling the step its checkpoint interval on ``pool`` in wall seconds
        (the step's clock), unless the job's own environment already sets one."""
        interval = (intervals or {}).get(pool.key)
        if interval is None or CHECKPOINT_INTERVAL in launch.env:
            return launch
        wall = interval / max(self.provider.capacity_seconds(1.0), 1e-12)
        return dataclasses.replace(launch, env={**launch.env, CHECKPOINT_INTERVAL: f"{wall:.6g}"})

    def _record_no_lease(
        self,
        record: JobRecord,
        number: int,
        decision: Decision,
        start_step: int | None,
        problems: list[str],
        outcome: Outcome,
        now: float,
    ) -> JobRecord:
        pool = decision.pools[0]  # a launch decision names at least one pool
        running = Attempt(
            number=number, pool=pool, started_at=now, checkpoint_step_start=start_step
        )
        finished = dataclasses.replace(
            running,
            ended_at=now,
            outcome=outcome,
            checkpoint_step_end=start_step,
            message="; ".join(problems)[:500],
        )
        record = record.start_attempt(running).finish_attempt(finished)
        return self._save(record, str(outcome), finished.message)

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

    def _renew_heartbeat(self, spec: JobSpec, lease: Lease, now: float) -> None:
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

    def _forget_heartbeat(self, spec: JobSpec) -> None:
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
            lost_work_seconds=self._lost_work(outcome, running, end_ref, ended_at),
            checkpoint_overhead_seconds=self.provider.capacity_seconds(
                _checkpoint_seconds(end_ref, running.number)
            ),
            message=_message(outcome, status),
            notice_at=status.notice_at,
        )
        finished = _with_resume_report(store, finished)
        if finished.replacement is not None:
            finished = self._close_handover(spec, store, finished, now)
        record = record.finish_attempt(finished)
        if end_ref is not None:
            record = record.with_checkpoint(end_ref)
        self._release(spec, running.number, now)
        self._forget_heartbeat(spec)
        return self._save(record, str(outcome), status.message)

    def _close_handover(
        self, spec: JobSpec, store: CheckpointStore, finished: Attempt, now: float
    ) -> Attempt:
        """The old attempt of a handover closed: tell its waiting replacement to go on
        (``advance`` adopts it) or, when the attempt was not interrupted, end it."""
        if finished.outcome not in INTERRUPTED:
            return self._end_replacement(spec, finished, now)
        try:
            mark_ended(store, finished.number, finished.ended_at or now)
        except Exception as exc:  # noqa: BLE001 - it still goes on at the notice's deadline
            log.warning("job %s: could not tell the replacement to go on: %s", spec.job_id, exc)
        return finished

    def _release(self, spec: JobSpec, attempt: int, now: float) -> None:
        """Tell a later driver that nobody holds the job now (never fatal: an unreleased
        beat only makes a re-run wait for its timeout, or pass ``take_over``)."""
        if self.heartbeat_timeout_seconds is None:
            return
        try:
            self._heartbeat(spec).release(attempt, now)
        except Exception as exc:  # noqa: BLE001
            log.warning("job %s: could not release the heartbeat: %s", spec.job_id, exc)

    def _lost_work(
        self, outcome: Outcome, running: Attempt, end_ref: CheckpointRef | None, ended_at: float
    ) -> float:
        """Work done after the last durable checkpoint, which the next attempt must redo.

        None after the attempt's own emergency checkpoint: the step stops at that save, so
        the time until its lease ended (the process exiting, the node being reclaimed at
        the notice's end) was teardown, not work to redo."""
        if outcome is Outcome.SUCCEEDED:
            return 0.0
        saved_at = running.started_at
        if end_ref is not None and end_ref.attempt == running.number:
            if end_ref.metadata.get("emergency"):
                return 0.0
            saved_at = max(saved_at, end_ref.created_at)
        return self.provider.capacity_seconds(max(0.0, ended_at - saved_at))

    def _save(self, record: JobRecord, kind: str, detail: str) -> JobRecord:
        self._remember(record)
        self._persist(record)
        self._listener(kind, record, detail)
        return record


def _message(outcome: Outcome, status: LeaseStatus) -> str:
    """The provider's message; for the step's own failure, led by its exit code."""
    if outcome is Outcome.DRAINED:
        return "drained: stopped with a checkpoint to move the job where the policy said"
    if outcome is Outcome.USER_FAILED and status.exit_code is not None:
        return f"exit code {status.exit_code}" + (f": {status.message}" if status.message else "")
    return status.message


def _fenced_above(store: CheckpointStore, attempt: int) -> int | None:
    """The newer attempt that fenced ``attempt`` out of the store, or None."""
    try:
        level = store.fence_level()
    except Exception as exc:  # noqa: BLE001 - unknown: classify by the exit alone
        log.warning("could not read the fence of %s: %s", store.uri, exc)
        return None
    return level if level > attempt else None


def handover_mode(provider: Provider, handover: str | None) -> str:
    """The ``handover`` setting for ``provider``: its default (``on_notice`` where it can
    launch in parallel, else ``off``), or the one asked for if the provider can do it."""
    # A provider object that declares nothing (a test double, an old plugin) can do nothing
    # optional: no handover, rather than no controller.
    declared = getattr(provider, "capabilities", Capability.NONE)
    parallel = Capability.PARALLEL_LAUNCH in declared
    if handover is None:
        return "on_notice" if parallel else "off"
    if handover not in HANDOVER_MODES:
        raise ConfigError(f"handover={handover!r} is not one of {', '.join(HANDOVER_MODES)}")
    if handover != "off" and not parallel:
        raise ConfigError(
            f"handover={handover} needs a provider that can hold two leases of a job at "
            f"once; {provider.name} cannot (set handover=off)"
        )
    return handover


def pending_replacement(record: JobRecord) -> Mapping[str, Any] | None:
    """The replacement the last (closed) attempt launched and nobody adopted yet."""
    if not record.attempts or record.current_attempt is not None:
        return None
    replacement = record.attempts[-1].replacement
    if replacement is None or replacement.get("state") != "launched":
        return None
    return replacement


def _end_ref(store: CheckpointStore, running: Attempt) -> CheckpointRef | None:
    """The newest checkpoint the attempt could have reached: with a handover, the
    replacement may already have saved newer ones, which are not this attempt's."""
    ref = store.latest()
    if ref is None or ref.attempt <= running.number:
        return ref
    older = [r for r in store.list() if r.attempt <= running.number]
    return older[-1] if older else None


def _with_resume_report(store: CheckpointStore, attempt: Attempt) -> Attempt:
    """The attempt with what its step reported at its first step (``checkpoint.resumed``):
    when it resumed, and the step it actually restored (a replacement adopted after a
    handover restores the old attempt's emergency checkpoint, which may be pruned from the
    store by the time the old attempt closes). Never fatal: an unread report costs a
    measurement, not the close."""
    try:
        report = read_resumed(store, attempt.number)
    except Exception as exc:  # noqa: BLE001 - a measurement, never the lifecycle
        log.warning("could not read the resume report of attempt %d: %s", attempt.number, exc)
        return attempt
    if report is None:
        return attempt
    return dataclasses.replace(
        attempt,
        resumed_at=attempt.resumed_at or report.resumed_at,
        checkpoint_step_start=attempt.checkpoint_step_start if report.step is None else report.step,
    )


def _stopped(now: float, message: str) -> LeaseStatus:
    return LeaseStatus(LeaseState.TERMINATED, ended_at=now, message=message)


def _checkpoint_seconds(ref: CheckpointRef | None, attempt: int) -> float:
    """Save time the attempt's Checkpointer reported in its newest checkpoint's metadata."""
    if ref is None or ref.attempt != attempt:
        return 0.0
    return float(ref.metadata.get("checkpoint_seconds_total", 0.0))
