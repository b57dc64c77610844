"""Mid-run moves: what the controller decides about a job while an attempt runs or before
it launches, beyond the retry policy's next step.

A voluntary drain (an attempt moved when the policy says the move pays: an on-demand
attempt back to spot, or a spot attempt under a deadline policy's plan); the job's
deadline plan, made once per job; the work a deadline-bound job has left; and each
attempt's checkpoint interval on its pool.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Mapping
from typing import Protocol

from spot_core.attempt_env import CHECKPOINT_INTERVAL
from spot_core.checkpoint import CheckpointStore
from spot_core.lifecycle.types import JobSpec, Next
from spot_core.market.base import Market as PriceMarket
from spot_core.model import CheckpointRef, JobRecord, Lease, Pool
from spot_core.policy.checkpoint_interval import (
    CheckpointBounds,
    mean_save_seconds,
    pool_checkpoint_interval,
)
from spot_core.policy.deadline.live import DeadlineWork
from spot_core.policy.deadline.planner import DeadlinePlan, plan_job
from spot_core.policy.retry import Decision, RetryPolicy
from spot_core.providers.base import LaunchSpec, Provider

log = logging.getLogger(__name__)


class MoveHost(Protocol):
    """What the moves use of the controller that owns them."""

    provider: Provider
    market: PriceMarket | None
    policy: RetryPolicy
    stores: Callable[[str], CheckpointStore]

    def decide(self, spec: JobSpec, record: JobRecord, now: float | None = None) -> Decision: ...

    def _priced(self) -> PriceMarket: ...

    def _save(self, record: JobRecord, kind: str, detail: str) -> JobRecord: ...

    def _terminate(self, lease: Lease) -> None: ...


class Moves:
    """The mid-run moves of one controller's jobs, with their per-job caches (the deadline
    plans, and when a drain was last considered)."""

    def __init__(self, host: MoveHost, checkpoint_bounds: CheckpointBounds) -> None:
        self.host = host
        self.checkpoint_bounds = checkpoint_bounds
        # (job id, created at, deadline at, policy) -> the job's plan
        self._plans: dict[tuple[str, float, float, str], DeadlinePlan | None] = {}
        self._drain_looks: dict[str, float] = {}  # job id -> when a drain was last considered

    def maybe_drain(self, spec: JobSpec, watch: Next, lease: Lease, now: float) -> Next:
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
        if self.host.market is None:  # an in-place step's: nowhere else to move it
            return watch
        if (
            running is None
            or running.drain_requested_at is not None
            or now - self._drain_looks.get(spec.job_id, -math.inf) < self.drain_every()
        ):
            return watch
        self._drain_looks[spec.job_id] = now
        try:
            if running.pool.is_spot and self.deadline_plan(spec, watch.record) is None:
                return watch  # only a plan moves spot attempts: no store read for the rest
            record = watch.record
            latest = self.host.stores(spec.checkpoint_uri).latest()
            if latest is not None:
                record = record.with_checkpoint(latest)
            decision = self.host.decide(spec, record, now)
        except Exception as exc:  # noqa: BLE001 - a missed look costs savings, not the job
            log.warning("job %s: could not look for a better place to run (%s)", spec.job_id, exc)
            return watch
        if not decision.move:
            return watch
        record = self.host._save(
            record.with_running(drain_requested_at=now), "draining", decision.reason
        )
        self.host._terminate(lease)
        return dataclasses.replace(watch, record=record)

    def drain_every(self) -> float:
        """Seconds between looks: one market tick in wall time, at most ``capacity_wait``."""
        market = self.host._priced()
        tick = market.tick_seconds
        every = self.host.policy.capacity_wait_seconds
        return min(every, tick / market.time_scale) if tick else every

    def deadline_plan(self, spec: JobSpec, record: JobRecord) -> DeadlinePlan | None:
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
                self.host.market,
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

    def deadline_work(self, spec: JobSpec, record: JobRecord) -> DeadlineWork | None:
        """Work left and restart overhead in wall seconds, for a job with a deadline."""
        if record.deadline_at is None or spec.work_capacity_seconds is None:
            return None
        done = 0.0
        if spec.total_steps and record.latest_checkpoint is not None:
            done = min(1.0, record.latest_checkpoint.step / spec.total_steps)
        scale = self.host.provider.capacity_seconds(1.0)  # capacity seconds per wall second
        tick = self.host._priced().tick_seconds or 60.0
        return DeadlineWork(
            work_left_seconds=spec.work_capacity_seconds * (1.0 - done) / scale,
            restart_overhead_seconds=spec.restart_overhead_capacity_seconds / scale,
            tick_seconds=tick / scale,
        )

    def checkpoint_interval(self, pool: Pool, start_ref: CheckpointRef | None, now: float) -> float:
        """The attempt's time-based checkpoint interval on ``pool``, in capacity seconds:
        Young/Daly from the pool's interruption rate (0 on on-demand) and the job's mean
        measured save, else the configured cost. A market that cannot say counts as no
        interruptions seen (the notice remains the first line of defence)."""
        rate = 0.0
        if pool.is_spot:
            try:  # a market that keeps no history has no stat for the pool
                stat = self.host._priced().stats([pool], now).get(pool.key)
                rate = 0.0 if stat is None else float(stat.interruptions_per_hour)
            except Exception as exc:  # noqa: BLE001 - an interval is advice, not a launch
                log.warning(
                    "no interruption rate for %s (%s); checkpoint interval at its maximum",
                    pool.key,
                    exc,
                )
        measured = mean_save_seconds(start_ref)
        cost = (
            self.host.provider.capacity_seconds(measured)
            if measured
            else self.checkpoint_bounds.cost
        )
        return pool_checkpoint_interval(rate, cost, self.checkpoint_bounds)

    def with_interval(
        self, launch: LaunchSpec, pool: Pool, intervals: Mapping[str, float] | None
    ) -> LaunchSpec:
        """``launch`` telling the step its checkpoint interval on ``pool`` in wall seconds
        (the step's clock), unless the job's own environment already sets one."""
        interval = (intervals or {}).get(pool.key)
        if interval is None or CHECKPOINT_INTERVAL in launch.env:
            return launch
        wall = interval / max(self.host.provider.capacity_seconds(1.0), 1e-12)
        return dataclasses.replace(launch, env={**launch.env, CHECKPOINT_INTERVAL: f"{wall:.6g}"})
