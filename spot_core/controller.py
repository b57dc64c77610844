"""Observe -> decide -> apply for one job, until it succeeds, fails or misses its deadline.

The controller is the only loop in the system. It reads the market, asks the pure
retry policy what to do with the JobRecord (and, for a job with a ``deadline_policy`` on
a trace market, the deadline policy's plan: ``spot_core.policy.deadline_planner``),
applies the decision through a provider, classifies how the attempt ended, keeps the
cost ledger, and hands the record to a persistence callback after every change (engine
adapters plug their state stores in there). It holds exactly one lease at a time and
terminates it on every exit path, including exceptions, cancellation and Ctrl-C.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

from spot_core.checkpoint import open_store
from spot_core.errors import CapacityUnavailable, ConfigError
from spot_core.model import Attempt, JobRecord, JobStatus, Lease, Market, Outcome, Pool
from spot_core.policy.deadline_live import DeadlineWork
from spot_core.policy.deadline_planner import DeadlinePlan, check_deadline_policy, plan_job
from spot_core.policy.retry import Decision, RetryPolicy, decide_next
from spot_core.providers.base import LaunchSpec, LeaseState, LeaseStatus, Provider

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
    deadline: float | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    # What a deadline-bound job needs, in capacity seconds, so the policy can tell when
    # spot no longer fits before the deadline; progress comes from checkpoint steps.
    work_seconds: float | None = None
    total_steps: int | None = None
    restart_overhead_seconds: float = 300.0
    # Run ``command`` in this container image (see ``spot_core.container``).
    image: str | None = None
    # A deadline policy by name (``spot_core.policy.deadline_policies``: greedy,
    # uniform-progress, default, ...) that decides spot / on-demand / wait between attempts
    # on a trace market (see ``spot_core.policy.deadline_planner``); None: only the safety
    # net (go on-demand once the work and two restarts no longer fit), as on EC2.
    deadline_policy: str | None = None

    def __post_init__(self) -> None:
        if self.deadline_policy is None:
            return
        check_deadline_policy(self.deadline_policy)
        if self.deadline is None or self.work_seconds is None:
            raise ConfigError(f"deadline policy {self.deadline_policy!r} needs the job's "
                              "deadline and work_seconds (--deadline and --work)")

    def candidate_pools(self) -> tuple[Pool, ...]:
        """The spot pools and their on-demand counterparts, without duplicates."""
        on_demand = tuple(p.on(Market.ON_DEMAND) for p in self.pools if p.is_spot)
        return tuple(dict.fromkeys(self.pools + on_demand))


def classify(status: LeaseStatus) -> Outcome:
    """How an ended lease's attempt ended. A notice or a reclaim is never a failure."""
    if status.exit_code == 0:
        return Outcome.SUCCEEDED
    if status.state is LeaseState.RECLAIMED or status.notice_at is not None:
        return Outcome.PREEMPTED
    if status.state is LeaseState.TERMINATED or status.exit_code is None or status.exit_code < 0:
        return Outcome.INFRASTRUCTURE_FAILED
    return Outcome.USER_FAILED


class Controller:
    """Runs one job under a provider, a market and a retry policy."""

    def __init__(self, provider: Provider, market, policy: RetryPolicy = RetryPolicy(), *,
                 persist: Persist | None = None, listener: Listener | None = None,
                 clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep,
                 poll_interval: float = 0.1) -> None:
        self.provider = provider
        self.market = market
        self.policy = policy
        self._persist = persist or (lambda record: None)
        self._listener = listener or (lambda kind, record, detail: None)
        self._clock = clock
        self._sleep = sleep
        self._poll_interval = poll_interval
        self._plans: dict[tuple, DeadlinePlan | None] = {}

    def persist(self, record: JobRecord) -> JobRecord:
        """Hand ``record`` to the persistence callback (e.g. a new record before launch)."""
        self._persist(record)
        return record

    def new_record(self, spec: JobSpec) -> JobRecord:
        return JobRecord(job_id=spec.job_id, created_at=self._clock(), deadline=spec.deadline,
                         checkpoint_uri=spec.checkpoint_uri)

    def run(self, spec: JobSpec, record: JobRecord | None = None) -> JobRecord:
        """Drive the job to a final status and return its record."""
        record = record or self.new_record(spec)
        while record.status not in (JobStatus.SUCCEEDED, JobStatus.FAILED,
                                    JobStatus.DEADLINE_MISSED):
            record = self.step(spec, record)
        return record

    def step(self, spec: JobSpec, record: JobRecord) -> JobRecord:
        """One observe -> decide -> apply round (synchronous: waits for the attempt to end)."""
        decision = self.decide(spec, record)
        settled = self.settle(record, decision)
        if settled is not None:
            return settled
        if decision.action == "wait":
            self._listener("wait", record, decision.reason)
            self._sleep(decision.wait_seconds)
            return record
        record, lease = self.start_attempt(spec, record, decision)
        if lease is None:
            return record
        try:
            status = self.wait_for_end(lease, record.deadline)
        finally:
            self.provider.terminate(lease)
        return self.finish_attempt(spec, record, lease, status)

    # -- the steps, public so that engine adapters can run them across processes ----------
    def decide(self, spec: JobSpec, record: JobRecord) -> Decision:
        """Observe the market and ask the policy what the job does next."""
        now = self._clock()
        offers = self.market.offers(spec.candidate_pools(), now)
        decision = decide_next(record, offers, self.policy, now=now,
                               work=self._deadline_work(spec, record))
        plan = self._deadline_plan(spec, record)
        if plan is None:
            return decision
        return plan.decide(record, offers, self.policy, decision, now=now)

    def _deadline_plan(self, spec: JobSpec, record: JobRecord) -> DeadlinePlan | None:
        """The job's window planned once by its deadline policy (trace markets only)."""
        if spec.deadline_policy is None or record.deadline is None or spec.work_seconds is None:
            return None
        key = (spec.job_id, record.created_at, record.deadline, spec.deadline_policy)
        if key not in self._plans:
            plan = plan_job(self.market, policy=spec.deadline_policy, pools=spec.pools,
                            created_at=record.created_at, deadline=record.deadline,
                            work_seconds=spec.work_seconds,
                            restart_overhead_seconds=spec.restart_overhead_seconds,
                            total_steps=spec.total_steps)
            if plan is None:
                log.info("job %s: deadline policy %s does not apply here (no trace market or "
                         "no room); the safety net alone decides", spec.job_id,
                         spec.deadline_policy)
            self._plans[key] = plan
        return self._plans[key]

    def _deadline_work(self, spec: JobSpec, record: JobRecord) -> DeadlineWork | None:
        """Work left and restart overhead in wall seconds, for a job with a deadline."""
        if record.deadline is None or spec.work_seconds is None:
            return None
        done = 0.0
        if spec.total_steps and record.latest_checkpoint is not None:
            done = min(1.0, record.latest_checkpoint.step / spec.total_steps)
        scale = self.provider.capacity_seconds(1.0)  # capacity seconds per wall second
        tick = getattr(self.market, "tick_seconds", 60.0)
        return DeadlineWork(work_left_seconds=spec.work_seconds * (1.0 - done) / scale,
                            restart_overhead_seconds=spec.restart_overhead_seconds / scale,
                            tick_seconds=tick / scale)

    def settle(self, record: JobRecord, decision: Decision) -> JobRecord | None:
        """The final record if ``decision`` ends the job, else None."""
        if decision.action == "done":
            return self._save(record.with_status(JobStatus.SUCCEEDED), "done", decision.reason)
        if decision.action == "fail":
            missed = record.deadline is not None and self._clock() >= record.deadline
            status = JobStatus.DEADLINE_MISSED if missed else JobStatus.FAILED
            return self._save(record.with_status(status), "failed", decision.reason)
        return None

    def start_attempt(self, spec: JobSpec, record: JobRecord,
                      decision: Decision) -> tuple[JobRecord, Lease | None]:
        """Fence the store, launch in the first ranked pool with capacity, record it.

        Returns the lease, or None (with a ``capacity_unavailable`` attempt recorded)
        when no pool had capacity.
        """
        number = record.next_attempt_number
        store = open_store(spec.checkpoint_uri)
        store.fence(number)  # from now on, a zombie of an older attempt cannot commit
        start_ref = store.latest()
        launch = LaunchSpec(job_id=spec.job_id, attempt=number, command=spec.command,
                            checkpoint_uri=spec.checkpoint_uri, env=spec.env, image=spec.image)
        lease, errors = self._launch_first(decision.pools, launch)
        start_step = None if start_ref is None else start_ref.step
        if lease is None:
            return self._record_no_capacity(record, number, decision, start_step, errors), None
        attempt = Attempt(number=number, pool=lease.pool, started_at=lease.started_at,
                          lease_id=lease.lease_id, checkpoint_step_start=start_step)
        return self._save(record.start_attempt(attempt), "launched", decision.reason), lease

    def wait_for_end(self, lease: Lease, deadline: float | None) -> LeaseStatus:
        """Poll the lease until it ends (bounded by the job's deadline, if it has one)."""
        while True:
            status = self.provider.observe([lease])[lease.lease_id]
            if status.ended:
                return status
            if deadline is not None and self._clock() >= deadline:
                self.provider.terminate(lease)
                return LeaseStatus(LeaseState.TERMINATED, ended_at=self._clock(),
                                   message="stopped: the job's deadline passed")
            self._sleep(self._poll_interval)

    def finish_attempt(self, spec: JobSpec, record: JobRecord, lease: Lease,
                       status: LeaseStatus) -> JobRecord:
        """Classify the ended attempt, bill it, and note its last durable checkpoint."""
        return self._close_attempt(record, lease, status, open_store(spec.checkpoint_uri))

    # -- helpers -------------------------------------------------------------------------
    def _launch_first(self, pools, launch: LaunchSpec) -> tuple[Lease | None, list[str]]:
        """Try the ranked pools in order; the first with capacity wins."""
        errors = []
        for pool in pools:
            try:
                return self.provider.launch(launch, pool), errors
            except CapacityUnavailable as exc:
                errors.append(f"{pool.key}: {exc}")
        return None, errors

    def _record_no_capacity(self, record, number, decision, start_step, errors) -> JobRecord:
        now = self._clock()
        pool = decision.pools[0] if decision.pools else None
        running = Attempt(number=number, pool=pool, started_at=now, checkpoint_step_start=start_step)
        finished = dataclasses.replace(running, ended_at=now, outcome=Outcome.CAPACITY_UNAVAILABLE,
                                       checkpoint_step_end=start_step,
                                       message="; ".join(errors)[:500])
        record = record.start_attempt(running).finish_attempt(finished)
        return self._save(record, "capacity_unavailable", finished.message)

    def _close_attempt(self, record: JobRecord, lease: Lease, status: LeaseStatus,
                       store) -> JobRecord:
        ended_at = status.ended_at or self._clock()
        end_ref = store.latest()
        outcome = classify(status)
        bill = self.provider.bill(lease, ended_at)
        finished = dataclasses.replace(
            record.current_attempt, ended_at=ended_at, outcome=outcome, cost=bill.cost,
            on_demand_cost=bill.on_demand_cost, data_transfer_cost=bill.data_transfer_cost,
            checkpoint_step_end=None if end_ref is None else end_ref.step,
            lost_work_seconds=self._lost_work(outcome, lease, end_ref, ended_at),
            checkpoint_overhead_seconds=self.provider.capacity_seconds(
                _checkpoint_seconds(end_ref, lease.attempt)),
            message=status.message)
        record = record.finish_attempt(finished)
        if end_ref is not None:
            record = record.with_checkpoint(end_ref)
        return self._save(record, str(outcome), status.message)

    def _lost_work(self, outcome: Outcome, lease: Lease, end_ref, ended_at: float) -> float:
        """Work done after the last durable checkpoint, which the next attempt must redo."""
        if outcome is Outcome.SUCCEEDED:
            return 0.0
        saved_at = lease.started_at
        if end_ref is not None and end_ref.attempt == lease.attempt:
            saved_at = max(saved_at, end_ref.created_at)
        return self.provider.capacity_seconds(max(0.0, ended_at - saved_at))

    def _save(self, record: JobRecord, kind: str, detail: str) -> JobRecord:
        self._persist(record)
        self._listener(kind, record, detail)
        return record


def _checkpoint_seconds(ref, attempt: int) -> float:
    """Save time the attempt's Checkpointer reported in its newest checkpoint's metadata."""
    if ref is None or ref.attempt != attempt:
        return 0.0
    return float(ref.metadata.get("checkpoint_seconds_total", 0.0))
