"""Deadline policies for live jobs: the simulator's policies, run by the controller.

On a market that replays traces (the local spot cloud's ``TraceMarket``), a deadline-bound
job is planned once, exactly as ``spot-pipelines simulate`` plans a window: the window
starts at the trace tick in which the job was created (``record.created_at``), holds the
whole ticks that end by the job's deadline, sees the history before its start, and the
job's work and restart overhead are its capacity seconds (capacity time *is* trace time on
the local cloud). The window is cut by the builder the simulator uses
(:meth:`spot_core.policy.deadline.replay.Replay.window`), so the policy sees the same arrays
whether it is simulated or run for real.

At each decision point (no attempt running) the plan asks the policy's
``decide(t, progress, IDLE, 0)`` for the current tick ``t`` with the progress the
checkpoints prove (``latest step / total_steps * work``) and maps its answer:

- a zone index: launch spot in that zone's pool (first; the other spot pools with capacity
  follow it, as fallbacks should the zone go away between the look and the launch);
- ``ON_DEMAND``: launch on-demand (cheapest on-demand pool first);
- ``IDLE``: wait until the next tick boundary (never longer than one tick, never past the
  deadline), then ask again. Every registered policy has the safety nets, so an idle job
  is always sent to on-demand in time.

What stays with the retry policy (``spot_core.policy.retry``): done / failed / deadline
passed, the user and infrastructure budgets, the preemption budget (after
``max_preemptions`` the job goes on-demand whatever the deadline policy says, as
DESIGN.md's outcome rules want), jobs that may not use on-demand
(``on_demand_fallback=False``: the deadline policy is not consulted), and any moment
outside the planned window.

**While an attempt runs.** The simulator's policy is asked at every tick, also while the
job runs, and may move a running job (``uniform-progress`` leaves on-demand for spot once
it is ahead; ``default`` leaves a dearer fallback zone for the cheap tier once it is back).
The controller asks the plan once per tick while an attempt runs (``_while_running``: the
policy sees the attempt's zone, or ``ON_DEMAND``, and the restart overhead still left, as
in the simulator); when it names another zone with capacity, the controller *drains* the
attempt (an emergency checkpoint, the sixth outcome ``drained``, no budget spent) and the
next attempt starts there; an idle answer to an on-demand attempt drains it too, and the
job waits (none of the built-in policies was seen to do that; a user's policy may).
``return_to_spot=False`` turns every such move off. A spot attempt is not moved to
on-demand: live, the progress its checkpoints prove trails the work done by up to a
checkpoint interval, and near the deadline that lag alone made the safety net answer
on-demand where the simulator stayed on spot.

Pure, like the rest of ``spot_core.policy``: the plan is built from trace data and the
market's tick arithmetic, then each decision is a function of the record, the offers
and ``now``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeGuard

import numpy as np

from spot_core.errors import ConfigError
from spot_core.model import Attempt, JobRecord, Market, Offer, Outcome, Pool
from spot_core.policy.deadline.base import HISTORY_HOURS, IDLE, ON_DEMAND, Decide, Job, Window
from spot_core.policy.deadline.causal import causal_plan
from spot_core.policy.ranking import rank_pools
from spot_core.policy.retry import Decision, RetryPolicy, last_finished, on_demand_candidates

if TYPE_CHECKING:
    from spot_core.market.trace import ZoneTrace
    from spot_core.market.trace_market import TraceMarket

log = logging.getLogger(__name__)

TICK_EPSILON_WALL_SECONDS = 1e-3
"""How far past a tick boundary an idle wait ends, so the next look is in the next tick."""


def check_deadline_policy(name: str) -> str:
    """``name`` if registered, else a one-line ``ConfigError`` listing the valid names
    (``optimal`` is an offline bound, not a policy a live job can run)."""
    from spot_core.policy.deadline.policies import DEADLINE_POLICIES

    DEADLINE_POLICIES.get(name)
    return name


def is_trace_market(market: object) -> TypeGuard[TraceMarket]:
    """True for markets that replay traces on a tick clock (``TraceMarket``, the local
    cloud's, and any market built on it)."""
    from spot_core.market.trace_market import TraceMarket

    return isinstance(market, TraceMarket)


@dataclass(frozen=True, eq=False)
class DeadlinePlan:
    """One job's window, planned once by a deadline policy, and the live mapping of its
    actions onto controller decisions (see the module docstring)."""

    policy: str
    window: Window
    decide_tick: Decide
    start_tick: int
    pools: tuple[Pool, ...]  # the spot pool of each window zone, in zone order
    work_capacity_seconds: float
    total_steps: int | None
    tick_at: Callable[[float], int]
    wall_time: Callable[[int], float]

    # -- observations -------------------------------------------------------------------
    def tick(self, now: float) -> int:
        """The window tick at wall time ``now`` (may be < 0 or >= ``window.ticks``)."""
        return self.tick_at(now) - self.start_tick

    def progress_seconds(self, record: JobRecord) -> float:
        """Work done as the latest durable checkpoint proves it, in trace seconds."""
        if not self.total_steps or record.latest_checkpoint is None:
            return 0.0
        return self.work_capacity_seconds * min(
            1.0, record.latest_checkpoint.step / self.total_steps
        )

    def action(self, record: JobRecord, now: float) -> int | None:
        """The policy's action at ``now`` for a job on no instance; None outside the window."""
        t = self.tick(now)
        if not 0 <= t < self.window.ticks:
            return None
        return int(self.decide_tick(t, self.progress_seconds(record), IDLE, 0.0))

    # -- the decision -------------------------------------------------------------------
    def decide(
        self,
        record: JobRecord,
        offers: Sequence[Offer],
        retry: RetryPolicy,
        fallback: Decision,
        *,
        now: float,
    ) -> Decision:
        """What the job does next; ``fallback`` is the retry policy's own answer, used
        whenever the deadline policy has no say (see the module docstring)."""
        if fallback.action in ("done", "fail"):
            return fallback
        running = record.current_attempt
        if running is not None:
            return self._while_running(record, running, offers, retry, now)
        if not retry.on_demand_fallback or record.preemptions >= retry.max_preemptions:
            return fallback
        t = self.tick(now)
        if not 0 <= t < self.window.ticks:
            return fallback
        last = last_finished(record)
        if (
            last is not None
            and last.outcome is Outcome.CAPACITY_UNAVAILABLE
            and last.ended_at is not None
            and self.tick(last.ended_at) == t
        ):
            return self._wait(record, t, now, "the last launch found no capacity in this tick")
        progress = self.progress_seconds(record)
        action = int(self.decide_tick(t, progress, IDLE, 0.0))
        where = (
            f"tick {t} of {self.window.ticks}, "
            f"{progress / self.window.job.work_capacity_seconds:.0%} of the work done"
        )
        if action == IDLE:
            return self._wait(record, t, now, f"deadline policy {self.policy} waits ({where})")
        if action != ON_DEMAND and not 0 <= action < len(self.pools):
            raise ValueError(
                f"deadline policy {self.policy} answered {action}, which is no "
                f"zone of its {len(self.pools)}-zone window"
            )
        return self._launch(action, offers, now, where) or fallback

    def _while_running(
        self,
        record: JobRecord,
        running: Attempt,
        offers: Sequence[Offer],
        retry: RetryPolicy,
        now: float,
    ) -> Decision:
        """A running attempt moves when the policy, asked as the simulator asks it (on the
        attempt's zone or on on-demand, with the restart overhead still left), answers
        otherwise: another spot zone with capacity, or (from on-demand) waiting. The
        controller then drains the attempt, and the next decision, asked from idle, picks
        where to go. For the DP policies that is the same place: from idle, every launch
        costs the restart the move did, so a place that beat staying put also beats the
        others and waiting (the live tests check it for ``default`` and
        ``uniform-progress``)."""
        keep = Decision(
            "wait",
            wait_seconds=retry.capacity_wait_seconds,
            reason=f"attempt {running.number} keeps running on "
            f"{running.pool.market} in {running.pool.zone}",
        )
        current = self._place(running.pool)
        t = self.tick(now)
        if (
            current is None
            or not retry.return_to_spot
            or record.preemptions >= retry.max_preemptions
            or not 0 <= t < self.window.ticks
        ):
            return keep
        ran = max(0, t - self.tick(running.started_at)) * self.window.tick_seconds
        left = max(0.0, self.window.job.restart_overhead_capacity_seconds - ran)
        progress = self.progress_seconds(record)
        action = int(self.decide_tick(t, progress, current, left))
        source = "on-demand" if current == ON_DEMAND else f"spot in {running.pool.zone}"
        where = (
            f"move from {source}, tick {t} of {self.window.ticks}, "
            f"{progress / self.window.job.work_capacity_seconds:.0%} of the work done"
        )
        if action == current or action == ON_DEMAND:
            # (on-demand from spot: an answer to the proven progress's lag, see above)
            return keep
        if action == IDLE:
            waiting = self._wait(
                record, t, now, f"deadline policy {self.policy}: stop and wait ({where})"
            )
            return dataclasses.replace(waiting, move=True)
        if not (
            0 <= action < len(self.pools)
            and any(o.pool == self.pools[action] and o.available for o in offers)
        ):
            return keep  # no zone of the window, or one without capacity now
        return dataclasses.replace(self._launch_spot(action, offers, now, where), move=True)

    def _launch(
        self, action: int, offers: Sequence[Offer], now: float, where: str
    ) -> Decision | None:
        """The launch the policy's ``action`` (``ON_DEMAND`` or a window zone) names: the
        zone's spot pool first, the other spot pools with capacity after it (fallbacks
        should it go between the look and the launch), or the on-demand pools; None when
        there is no on-demand pool."""
        if action == ON_DEMAND:
            on_demand = on_demand_candidates(offers)
            if not on_demand:
                return None
            return Decision(
                "launch",
                market=Market.ON_DEMAND,
                pools=on_demand,
                reason=f"deadline policy {self.policy}: on-demand in {on_demand[0].zone} ({where})",
            )
        return self._launch_spot(action, offers, now, where)

    def _launch_spot(self, zone: int, offers: Sequence[Offer], now: float, where: str) -> Decision:
        """Spot in window zone ``zone``'s pool first, the other spot pools after it."""
        chosen = self.pools[zone]
        others = tuple(o.pool for o in rank_pools(offers, now=now) if o.pool != chosen)
        return Decision(
            "launch",
            market=Market.SPOT,
            pools=(chosen,) + others,
            reason=f"deadline policy {self.policy}: spot in {chosen.zone} ({where})",
        )

    def _place(self, pool: Pool) -> int | None:
        """The policy's code for where ``pool`` runs: its window zone, or ``ON_DEMAND``;
        None for a spot pool outside the window (the plan cannot judge a move from it)."""
        if not pool.is_spot:
            return ON_DEMAND
        return self.pools.index(pool) if pool in self.pools else None

    def _wait(self, record: JobRecord, t: int, now: float, reason: str) -> Decision:
        """Wait until the next tick boundary: bounded by one tick and by the deadline."""
        until = self.wall_time(self.start_tick + t + 1) + TICK_EPSILON_WALL_SECONDS
        if record.deadline_at is not None:
            until = min(until, record.deadline_at)
        seconds = max(until - now, TICK_EPSILON_WALL_SECONDS)
        return Decision(
            "wait",
            wait_seconds=seconds,
            reason=f"{reason}; waiting {seconds:.2f} s for the next tick",
        )


def plan_job(
    market: object,
    *,
    policy: str,
    pools: Sequence[Pool],
    created_at: float,
    deadline_at: float,
    work_capacity_seconds: float,
    restart_overhead_capacity_seconds: float,
    total_steps: int | None,
) -> DeadlinePlan | None:
    """Plan a deadline-bound job's window on a trace market; None when the deadline policy
    cannot apply (not a trace market, no spot pool, or a deadline that leaves no window
    the work fits in: the retry policy's safety net then decides, as without a policy)."""
    from spot_core.policy.deadline.policies import DEADLINE_POLICIES
    from spot_core.policy.deadline.replay import Replay

    chosen = DEADLINE_POLICIES.get(policy)
    spot = tuple(dict.fromkeys(p for p in pools if p.is_spot))
    if not is_trace_market(market) or not spot:
        return None
    tick = float(market.tick_seconds)
    start = int(market.tick_at(created_at))
    ticks = int(market.tick_at(deadline_at)) - start
    job = Job(float(work_capacity_seconds), ticks * tick, float(restart_overhead_capacity_seconds))
    if (
        ticks < 1
        or ticks * tick < job.work_capacity_seconds + job.restart_overhead_capacity_seconds - 1e-6
    ):
        log.info(
            "deadline policy %s: %d whole tick(s) before the deadline cannot hold the "
            "work plus one restart; leaving the job to the retry policy",
            policy,
            ticks,
        )
        return None
    past = max(0, start - int(HISTORY_HOURS * 3600 / tick))
    traces = [
        _unrolled(market, market.trace(p.zone, p.instance_type), past, start + ticks) for p in spot
    ]
    try:
        window = Replay.from_traces(traces).window(start - past, job)
    except ConfigError as exc:
        log.info(
            "deadline policy %s cannot plan this job (%s); leaving it to the retry policy",
            policy,
            exc,
        )
        return None
    return DeadlinePlan(
        policy=policy,
        window=window,
        decide_tick=causal_plan(chosen, window),
        start_tick=start,
        pools=spot,
        work_capacity_seconds=float(work_capacity_seconds),
        total_steps=total_steps,
        tick_at=market.tick_at,
        wall_time=market.wall_time,
    )


def _unrolled(market: TraceMarket, trace: ZoneTrace, first: int, end: int) -> ZoneTrace:
    """Absolute market ticks ``[first, end)`` of ``trace`` as the market replays them
    (wrapping around, or holding the last tick, past the trace's end)."""
    ticks = np.arange(first, end)
    n = trace.n_ticks
    index = ticks % n if market.wrap else np.minimum(ticks, n - 1)
    return dataclasses.replace(
        trace, available=trace.available[index], spot_price=trace.spot_price[index]
    )


__all__ = ["DeadlinePlan", "check_deadline_policy", "is_trace_market", "plan_job"]
