"""What a job does next: launch on spot, launch on on-demand, wait, fail, or stop as done.

``decide_next`` is a pure function of the ``JobRecord``, the market's offers and ``now``;
the controller applies its ``Decision``. The rules, in order:

1. A job that succeeded is done; one that already failed stays failed.
2. A passed deadline fails the job (the reason says so).
3. Budgets are separate, as in Flyte: user failures spend ``max_user_retries``,
   infrastructure failures ``max_infrastructure_retries``; preemptions spend only
   ``max_preemptions`` and never a user retry, because losing a node is not the step's
   fault. Voluntary disruptions (a cluster consolidating, draining or scaling down its
   nodes) spend ``max_disruptions`` alone: they resume from the checkpoint like a
   preemption but say nothing about spot capacity, so they never move the job to
   on-demand.
4. The job runs on on-demand (if ``on_demand_fallback``) when the preemption budget is
   spent, when the deadline is within ``deadline_safety_seconds``, when no spot pool has
   capacity now, or right after a launch found none in any spot pool it tried.
5. **Returning to spot.** After a fallback the next attempt goes back to spot only if
   ``return_to_spot`` is on, a spot pool has capacity now, *and* the job has been
   preempted fewer than ``max_preemptions`` times. Why: a fallback for lack of capacity
   is transient, and staying on on-demand after capacity returns throws the savings
   away; a fallback because the preemption budget is spent is the user's stated limit on
   lost work, and returning would let the job churn without bound. A running on-demand
   attempt is moved back only after ``min_on_demand_seconds``, so a flickering zone
   cannot make the job flap between markets (each move costs a restart).
6. **Price cap.** With ``max_spot_price`` set, spot pools dearer than it count as
   having no capacity for this job; when that is the only reason spot is out, the job
   waits for a cheaper window (bounded like a capacity wait) instead of paying even
   more for on-demand, and falls back to on-demand only when the waits run out (or
   when the deadline or the preemption budget say so, which come first).
7. With no capacity anywhere usable, the job waits ``capacity_wait_seconds`` at a time,
   and fails after ``max_capacity_waits`` waits' worth of time or consecutive failed
   launches: every wait is bounded. Without fallback, a spent preemption budget fails at
   once, since waiting cannot refill it.

Spot candidates are ranked by ``rank_pools``; the pool that just preempted the job or
had no capacity goes last (SkyPilot's EAGER_NEXT_REGION idea: capacity that just went
away tends to stay away for a while).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from spot_core.errors import ConfigError
from spot_core.market.base import PoolStats
from spot_core.model import Attempt, JobRecord, JobStatus, Market, Offer, Outcome, Pool
from spot_core.policy.deadline.live import DeadlineWork
from spot_core.policy.ranking import RankingConfig, rank_pools
from spot_core.policy.registry import Registry

Action = Literal["launch", "wait", "fail", "done"]


@dataclass(frozen=True)
class RetryPolicy:
    """Budgets and fallback rules for one job (see the module docstring for the rules).

    Users set these through ``spot_core.settings`` (``SpotSettings.retry_policy()``);
    the defaults here are the settings model's (a test holds them equal), in seconds.
    """

    max_preemptions: int = 3
    max_user_retries: int = 0
    max_infrastructure_retries: int = 3
    max_disruptions: int = 10
    on_demand_fallback: bool = True
    return_to_spot: bool = True
    capacity_wait_seconds: float = 60.0
    max_capacity_waits: int = 10
    deadline_safety_seconds: float = 0.0
    min_on_demand_seconds: float = 600.0
    max_spot_price: float | None = None

    def __post_init__(self) -> None:
        for name in (
            "max_preemptions",
            "max_user_retries",
            "max_infrastructure_retries",
            "max_disruptions",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"RetryPolicy.{name} must be a whole number >= 0, got {value!r}")
        if not isinstance(self.max_capacity_waits, int) or self.max_capacity_waits < 1:
            raise ConfigError(
                "RetryPolicy.max_capacity_waits must be a whole number >= 1, "
                f"got {self.max_capacity_waits!r}"
            )
        if not self.capacity_wait_seconds > 0:
            raise ConfigError(
                f"RetryPolicy.capacity_wait_seconds must be > 0, got {self.capacity_wait_seconds!r}"
            )
        for name in ("deadline_safety_seconds", "min_on_demand_seconds"):
            if not getattr(self, name) >= 0:
                raise ConfigError(f"RetryPolicy.{name} must be >= 0, got {getattr(self, name)!r}")
        if self.max_spot_price is not None and not (
            isinstance(self.max_spot_price, (int, float)) and self.max_spot_price > 0
        ):
            raise ConfigError(
                "RetryPolicy.max_spot_price must be a price in $/h > 0 (or None "
                f"for no cap), got {self.max_spot_price!r}"
            )

    @property
    def max_total_wait_seconds(self) -> float:
        return self.capacity_wait_seconds * self.max_capacity_waits


RETRY_POLICIES: Registry[RetryPolicy] = Registry("retry policy")
RETRY_POLICIES.register("default", RetryPolicy())
RETRY_POLICIES.register("spot-only", RetryPolicy(on_demand_fallback=False))
RETRY_POLICIES.register("sticky-fallback", RetryPolicy(return_to_spot=False))
RETRY_POLICIES.register("on-demand", RetryPolicy(max_preemptions=0, return_to_spot=False))


@dataclass(frozen=True)
class Decision:
    """What to do next; ``pools`` are the candidates to try, in order.

    ``move``: asked while an attempt runs, the answer is to stop it (the controller drains
    it: an emergency checkpoint, outcome ``drained``) and then launch or wait as said;
    without it, a decision made while an attempt runs keeps that attempt."""

    action: Action
    market: Market | None = None
    pools: tuple[Pool, ...] = ()
    wait_seconds: float = 0.0
    reason: str = ""
    move: bool = False

    def __post_init__(self) -> None:
        if self.action == "launch" and (not self.pools or self.market is None):
            raise ValueError("a launch decision needs a market and at least one pool")
        if self.action == "wait" and not self.wait_seconds > 0:
            raise ValueError("a wait decision needs a positive wait_seconds")


def decide_next(
    record: JobRecord,
    offers: Sequence[Offer],
    policy: RetryPolicy,
    *,
    now: float,
    stats: PoolStats | None = None,
    ranking: RankingConfig | None = None,
    work: DeadlineWork | None = None,
) -> Decision:
    """The next step for ``record`` given what the market offers at ``now``.

    ``work``: the work left and restart overhead of a deadline-bound job; with it and
    ``record.deadline_at``, the deadline policies' safety net decides when spot is no
    longer safe (see ``spot_core.policy.deadline.live``).
    """
    settled = _settled(record, policy, now)
    if settled is not None:
        return settled
    spot, priced_out = _spot_candidates(record, offers, now, stats, ranking, policy.max_spot_price)
    running = record.current_attempt
    if running is not None:
        return _while_running(record, running, spot, policy, now, work, offers)
    return _next_launch(record, spot, on_demand_candidates(offers), policy, now, work, priced_out)


# -- terminal states and budgets ---------------------------------------------------------------
def _settled(record: JobRecord, policy: RetryPolicy, now: float) -> Decision | None:
    last = last_finished(record)
    if record.status is JobStatus.SUCCEEDED or (last and last.outcome is Outcome.SUCCEEDED):
        return Decision("done", reason=f"the job succeeded after {len(record.attempts)} attempt(s)")
    if record.status in (JobStatus.FAILED, JobStatus.DEADLINE_MISSED):
        return Decision("fail", reason=f"the job already ended as {record.status}")
    if record.deadline_at is not None and now >= record.deadline_at:
        return Decision(
            "fail",
            reason=f"deadline missed: it passed at {_when(record.deadline_at)} "
            f"before the job finished ({_progress(record)})",
        )
    if record.user_failures > policy.max_user_retries:
        return Decision(
            "fail",
            reason=f"the step's own code failed {record.user_failures} "
            f"time(s); user retries are used up "
            f"(max_user_retries={policy.max_user_retries})",
        )
    if record.infrastructure_failures > policy.max_infrastructure_retries:
        return Decision(
            "fail",
            reason=f"{record.infrastructure_failures} infrastructure "
            "failures; infrastructure retries are used up "
            f"(max_infrastructure_retries="
            f"{policy.max_infrastructure_retries})",
        )
    if record.disruptions > policy.max_disruptions:
        return Decision(
            "fail",
            reason=f"the cluster disrupted the job {record.disruptions} "
            "time(s) on purpose (consolidation, drain, scale-down); "
            f"max_disruptions={policy.max_disruptions} is used up",
        )
    misses = _trailing_capacity_misses(record)
    if misses >= policy.max_capacity_waits:
        return Decision(
            "fail",
            reason=f"{misses} launch(es) in a row found no capacity "
            f"(max_capacity_waits={policy.max_capacity_waits})",
        )
    return None


# -- candidates ---------------------------------------------------------------------------------
def _spot_candidates(
    record: JobRecord,
    offers: Sequence[Offer],
    now: float,
    stats: PoolStats | None,
    ranking: RankingConfig | None,
    max_price: float | None = None,
) -> tuple[tuple[Pool, ...], float | None]:
    """Ranked spot pools with capacity now, at or below ``max_price``; the pool that just
    let the job down goes last. Also the cheapest price of those the cap left out."""
    usable = rank_pools(offers, stats, now=now, config=ranking)
    dear = [
        o.price_per_hour for o in usable if max_price is not None and o.price_per_hour > max_price
    ]
    ranked = [o.pool for o in usable if max_price is None or o.price_per_hour <= max_price]
    last = last_finished(record)
    if last and last.outcome in (Outcome.PREEMPTED, Outcome.CAPACITY_UNAVAILABLE):
        ranked.sort(key=lambda pool: pool == last.pool)
    return tuple(ranked), (min(dear) if dear else None)


def on_demand_candidates(offers: Sequence[Offer]) -> tuple[Pool, ...]:
    """On-demand offers the market made, cheapest first; else derived from the spot offers."""
    explicit = [o for o in offers if not o.pool.is_spot and o.available]
    if explicit:
        return tuple(o.pool for o in sorted(explicit, key=lambda o: (o.price_per_hour, o.pool.key)))
    derived = sorted(
        (
            (
                o.on_demand_price_per_hour,
                o.pool.on(Market.ON_DEMAND).key,
                o.pool.on(Market.ON_DEMAND),
            )
            for o in offers
            if o.pool.is_spot
        ),
        key=lambda item: item[:2],
    )
    return tuple(dict.fromkeys(pool for _, _, pool in derived))


def _budget_used(record: JobRecord, policy: RetryPolicy) -> str:
    """ "2 of 2 preemptions"; past the budget (a replacement launched on spot before the
    budget was spent was preempted too) never "3 of 2", which reads as a miscount."""
    if record.preemptions <= policy.max_preemptions:
        return f"{record.preemptions} of {policy.max_preemptions} preemptions"
    return f"{record.preemptions} preemptions, past the budget of {policy.max_preemptions}"


# -- choosing a market --------------------------------------------------------------------------
def _why_on_demand(
    record: JobRecord,
    spot: tuple[Pool, ...],
    policy: RetryPolicy,
    now: float,
    work: DeadlineWork | None = None,
) -> tuple[str, str] | None:
    """(kind, reason) for not using spot now, or None when spot is fine."""
    last = last_finished(record)
    if record.preemptions >= policy.max_preemptions:
        return "budget", f"the spot preemption budget is spent ({_budget_used(record, policy)})"
    if policy.on_demand_fallback and _near_deadline(record, policy, now):
        return "deadline", (
            f"the deadline ({_when(record.deadline_at)}) is less than "
            f"{policy.deadline_safety_seconds:g} s away"
        )
    if policy.on_demand_fallback and work is not None and _work_forces_on_demand(record, work, now):
        return "deadline", (
            f"{work.work_left_seconds:.0f} s of work and two restarts no longer "
            f"fit before the deadline ({_when(record.deadline_at)}) on spot"
        )
    if policy.on_demand_fallback and last and not last.pool.is_spot and not policy.return_to_spot:
        return "sticky", "the job fell back to on-demand and return_to_spot is off"
    if last and last.pool.is_spot and _recent_capacity_miss(last, policy, now):
        return "capacity", "the last launch found no spot capacity in any pool it tried"
    if not spot:
        return "capacity", "no spot pool has capacity now"
    return None


def _next_launch(
    record: JobRecord,
    spot: tuple[Pool, ...],
    on_demand: tuple[Pool, ...],
    policy: RetryPolicy,
    now: float,
    work: DeadlineWork | None = None,
    priced_out: float | None = None,
) -> Decision:
    why = _why_on_demand(record, spot, policy, now, work)
    if why is None:
        return _launch(Market.SPOT, spot, _spot_reason(record, spot, policy))
    kind, reason = why
    if kind == "capacity" and not spot and priced_out is not None:
        waiting = _wait(
            record,
            policy,
            now,
            f"spot costs ${priced_out:.4g}/h, above max_spot_price ${policy.max_spot_price:.4g}/h",
            "a cheaper window",
        )
        if waiting.action == "wait" or not (policy.on_demand_fallback and on_demand):
            return waiting
        reason = f"{waiting.reason}; the price window did not come"
    if policy.on_demand_fallback and on_demand:
        last = last_finished(record)
        if last and not last.pool.is_spot and _recent_capacity_miss(last, policy, now):
            return _wait(
                record, policy, now, f"{reason}, and on-demand had no capacity at the last launch"
            )
        target = f"{on_demand[0].zone} {on_demand[0].instance_type}"
        return _launch(Market.ON_DEMAND, on_demand, f"{reason}; running on on-demand {target}")
    if kind == "budget":
        return Decision("fail", reason=f"{reason} and on-demand fallback is off")
    missing = (
        "the market offers no on-demand pool"
        if policy.on_demand_fallback
        else "on-demand fallback is off"
    )
    return _wait(record, policy, now, f"{reason} and {missing}")


def _while_running(
    record: JobRecord,
    running: Attempt,
    spot: tuple[Pool, ...],
    policy: RetryPolicy,
    now: float,
    work: DeadlineWork | None = None,
    offers: Sequence[Offer] = (),
) -> Decision:
    """Keep a running attempt, unless an on-demand one may move back to spot (the
    controller then drains it: an emergency checkpoint, and the next attempt on spot)."""
    keep = Decision(
        "wait",
        wait_seconds=policy.capacity_wait_seconds,
        reason=f"attempt {running.number} is running on {running.pool.market} "
        f"in {running.pool.zone}",
    )
    if running.pool.is_spot or not (policy.return_to_spot and spot):
        return keep
    if record.preemptions >= policy.max_preemptions or _near_deadline(record, policy, now):
        return keep
    if _work_forces_on_demand(record, work, now):
        return keep
    if now - running.started_at < policy.min_on_demand_seconds:
        return keep
    if not _move_pays(running, spot[0], offers, work):
        return keep
    return Decision(
        "launch",
        market=Market.SPOT,
        pools=spot,
        move=True,
        reason=f"spot capacity is back in {spot[0].zone}; move the job from "
        f"on-demand back to spot ({_progress(record)})",
    )


MOVE_MARGIN = 2.0
"""A move back to spot must save this many times what its restart costs."""


def _move_pays(
    running: Attempt, target: Pool, offers: Sequence[Offer], work: DeadlineWork | None
) -> bool:
    """Whether the saving over the work left repays the restart (``MOVE_MARGIN`` times):
    ``(on-demand - spot) * work left > margin * on-demand * restart overhead``. Unknown
    work left (no ``work``): the move is taken, as ``min_on_demand_seconds`` already kept
    the job on on-demand long enough not to flap."""
    if work is None:
        return True
    prices = {o.pool.key: o.price_per_hour for o in offers}
    spot_price = prices.get(target.key)
    on_demand = prices.get(
        running.pool.key,
        next((o.on_demand_price_per_hour for o in offers if o.pool.key == target.key), None),
    )
    if spot_price is None or on_demand is None:
        return True
    saving = (on_demand - spot_price) * work.work_left_seconds
    return saving > MOVE_MARGIN * on_demand * work.restart_overhead_seconds


def _launch(market: Market, pools: tuple[Pool, ...], reason: str) -> Decision:
    return Decision("launch", market=market, pools=pools, reason=reason)


def _spot_reason(record: JobRecord, spot: tuple[Pool, ...], policy: RetryPolicy) -> str:
    last = last_finished(record)
    where = f"{spot[0].zone} {spot[0].instance_type}"
    if last and not last.pool.is_spot:
        return (
            f"spot capacity is back; returning to spot in {where} ({record.preemptions} of "
            f"{policy.max_preemptions} preemptions used)"
        )
    if last and last.outcome is Outcome.PREEMPTED:
        return f"resuming on spot in {where} after preemption {record.preemptions}"
    if last and last.outcome is Outcome.DISRUPTED:
        return (
            f"resuming on spot in {where} after voluntary disruption {record.disruptions} "
            "(no preemption spent)"
        )
    return f"launching on spot in {where}, the best of {len(spot)} pool(s) with capacity"


# -- bounded waiting -----------------------------------------------------------------------------
def _wait(
    record: JobRecord, policy: RetryPolicy, now: float, reason: str, what: str = "capacity"
) -> Decision:
    """Wait for capacity, never longer in total than ``max_capacity_waits`` waits."""
    waited = now - _idle_since(record)
    limit = policy.max_total_wait_seconds
    if waited >= limit:
        return Decision(
            "fail",
            reason=f"{reason}; gave up after waiting {waited:.0f} s "
            f"(max_capacity_waits={policy.max_capacity_waits} x "
            f"{policy.capacity_wait_seconds:g} s)",
        )
    seconds = min(policy.capacity_wait_seconds, limit - waited)
    last = last_finished(record)
    if last and _recent_capacity_miss(last, policy, now) and last.ended_at is not None:
        seconds = min(seconds, last.ended_at + policy.capacity_wait_seconds - now)
    if record.deadline_at is not None:
        seconds = min(seconds, record.deadline_at - now)
    return Decision(
        "wait",
        wait_seconds=max(seconds, 1e-3),
        reason=f"{reason}; waiting {seconds:.0f} s for {what}",
    )


def _trailing_capacity_misses(record: JobRecord) -> int:
    count = 0
    for attempt in reversed(record.attempts):
        if attempt.outcome is not Outcome.CAPACITY_UNAVAILABLE:
            break
        count += 1
    return count


def _idle_since(record: JobRecord) -> float:
    """When the job last stopped running (failed launches do not count as running)."""
    for attempt in reversed(record.attempts):
        if attempt.outcome is not Outcome.CAPACITY_UNAVAILABLE and attempt.ended_at is not None:
            return attempt.ended_at
    return record.created_at


def _recent_capacity_miss(attempt: Attempt, policy: RetryPolicy, now: float) -> bool:
    return (
        attempt.outcome is Outcome.CAPACITY_UNAVAILABLE
        and attempt.ended_at is not None
        and now - attempt.ended_at < policy.capacity_wait_seconds
    )


# -- small helpers -------------------------------------------------------------------------------
def last_finished(record: JobRecord) -> Attempt | None:
    finished = [a for a in record.attempts if a.finished]
    return finished[-1] if finished else None


def _work_forces_on_demand(record: JobRecord, work: DeadlineWork | None, now: float) -> bool:
    """The deadline policies' safety net: spot is no longer safe for this job."""
    return (
        work is not None
        and record.deadline_at is not None
        and work.forces_on_demand(record.deadline_at, now)
    )


def _near_deadline(record: JobRecord, policy: RetryPolicy, now: float) -> bool:
    return (
        policy.deadline_safety_seconds > 0
        and record.deadline_at is not None
        and record.deadline_at - now <= policy.deadline_safety_seconds
    )


def _when(moment: float | None) -> str:
    if moment is None:
        return "never"
    return datetime.fromtimestamp(moment, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _progress(record: JobRecord) -> str:
    return (
        f"{len(record.attempts)} attempt(s), {record.preemptions} preemption(s), "
        f"{record.fallbacks} fallback(s) so far"
    )
