"""The project's default deadline policy: plan against a forecast, act on what is seen.

Uniform Progress and greedy are rules of thumb about one question: is the slack left
(time left minus work left) better spent waiting for spot or kept for later? This
policy answers it by dynamic programming against a *forecast* of the market, not the
market itself, so it never peeks at the future it is replayed on:

1. From the history before the window (up to a week, ``HISTORY_HOURS``) it fits a
   small *semi-Markov* model of spot capacity: the state is whether some zone has
   capacity and how long that has lasted (the age of the current run or outage, in a few
   log-spaced buckets), with the chances per tick of moving between these states
   counted in the history; and, for a spot job, whether its own zone keeps capacity or
   it must *hop* (one restart) to another. A short history is padded with a weak prior.
   Why ages: run lengths are heavy-tailed (many short flickers, a few runs of many
   hours), so a run that has just begun is far likelier to end soon than one that has
   lasted an hour; a memoryless (Markov) forecast cannot tell them apart, and at a large
   restart overhead it takes short runs whose restart is never repaid, or leaves
   on-demand for spot too eagerly.
2. It solves the model exactly: expected cost to finish by the deadline, backwards over
   (tick, progress, instance, capacity state), with the simulator's billing, restarts and
   preemption rules, and with any risk of missing the deadline priced prohibitively, so
   the plan never gambles the deadline (the safety nets still run first, belt and
   braces).
3. At each tick it looks up the best action for the state it observes (where progress
   actually is, the capacity state and age, which instance it is on and whether its
   restart is over). Spot goes to the zone with the best price per unit of progress
   over the run each zone is expected still to have given its age (Young/Daly: a run of
   expected length E costs a restart per E), and a job on spot moves to another zone
   when the lower price there, over that zone's expected run, repays the restart
   ``switch_margin`` times (and the slack leaves room for this restart and two more).
   A longer run alone never justifies a move: moving costs a restart for sure, staying
   costs one only if the zone ends first, and the job moves then anyway.
   With several price tiers, the plan is for the cheapest tier, and the dearer zones are
   a second spot class the DP may use through the tier's outages (their own up/down
   forecast and price) rather than on-demand; a job there moves back to the tier when
   the plan says it pays.

Why a model rather than more rules: the trade-offs (wait or pay now, bridge an outage
on on-demand or idle through it, leave on-demand when spot returns) all depend on how
long runs and outages last and on the restart overhead; the DP weighs them
consistently for any deadline, overhead and zone set, which is what the benchmark asks.

The policy in parts: ``forecast`` (the model, its fit, the window views it is fitted
on), ``table`` (solving the plan), ``zones`` (price tiers and the zone to run in); this
module holds ``ForecastDP``, which plans with them, and re-exports the forecast's names.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from spot_core.errors import ConfigError
from spot_core.policy.deadline.base import (
    IDLE,
    ON_DEMAND,
    Decide,
    Window,
    planning_horizon,
    safety_net,
    truncated,
)
from spot_core.policy.deadline.forecast import (
    Fallback,
    MarketModel,
    SeenStates,
    capacity_states,
    fit_fallback,
    fit_model,
    restrict,
    seen_by,
)
from spot_core.policy.deadline.table import (
    CODE_FALLBACK,
    CODE_IDLE,
    CODE_SPOT,
    DecisionTable,
)
from spot_core.policy.deadline.zones import ZoneChooser, price_order, tier_sizes

__all__ = [
    "Fallback",
    "ForecastDP",
    "MarketModel",
    "capacity_states",
    "fit_fallback",
    "fit_model",
    "restrict",
    "seen_by",
]


@dataclass(frozen=True)
class ForecastDP:
    """Plan each window by DP against a Markov forecast fitted to its history.

    ``prior_ticks``: weight of the prior (runs of ``prior_run_hours``, outages of
    ``prior_outage_hours``) in the fit, in ticks of pseudo-observations.
    ``history_hours``: how far back the fit looks. ``replan_hours``: re-fit and re-solve
    this often with the window so far added to the history (0: plan once; every 16 h paid
    on the development set, every 8 h less, and each re-plan costs a solve).
    ``max_band`` / ``coarse_band``: progress cells of the plan's table and of the
    tier-choosing plans (coarser is faster, finer closer to exact).
    ``tier_tolerance``: zones priced within this fraction of a tier's cheapest belong to
    it. ``tier_margin``: a smaller zone set must be forecast this much cheaper to win.
    ``up_edges_hours`` / ``down_edges_hours``: the age buckets of the semi-Markov
    forecast (empty: the memoryless Markov model). ``zone_weight``: restarts counted per
    expected run when ranking zones; ``switch_margin``: a voluntary move to a cheaper zone
    must save this many times its restart (``inf``: never move while the zone lasts).
    ``history_half_life_hours``: weigh each tick of the history by one half per this
    many hours of age in the fit (0: all alike; 48 paid on the development set, 24 did
    not). Why: a re-plan adds what the window has shown so far to a week of history; when
    the market has changed since (a zone up 15% of last week and 75% of today), the plain
    fit keeps planning for last week.
    ``fallback_spot``: the zones left out of the planned set are a second spot class
    (:class:`Fallback`) the plan may use through the set's outages, and with at least
    ``fallback_history_hours`` of history the planned set is simply the cheapest price
    tier (with less, it is chosen by comparing plans, ``choose_zones``: a chain fitted to
    a few hours is its prior, and the development set's short-history windows lost with
    the tier alone).
    All defaults were chosen on the development set (bench/README.md).
    """

    prior_ticks: float = 24.0
    prior_run_hours: float = 4.0
    prior_outage_hours: float = 2.0
    history_hours: float = 168.0
    replan_hours: float = 16.0
    max_band: int = 300
    coarse_band: int = 80
    tier_tolerance: float = 0.1
    tier_margin: float = 0.02
    zone_weight: float = 0.5
    switch_margin: float = 4.0
    up_edges_hours: tuple[float, ...] = (0.25, 1.0, 4.0)
    down_edges_hours: tuple[float, ...] = (0.25, 1.0, 4.0)
    history_half_life_hours: float = 48.0
    fallback_spot: bool = True
    fallback_history_hours: float = 24.0

    def __post_init__(self) -> None:
        if not (
            self.prior_ticks > 0
            and self.prior_run_hours > 0
            and self.prior_outage_hours > 0
            and self.max_band >= 10
        ):
            raise ConfigError("ForecastDP needs positive priors and max_band >= 10")
        if not self.history_half_life_hours >= 0:
            raise ConfigError("ForecastDP's history_half_life_hours must be >= 0 (0: off)")

    def plan(self, window: Window) -> Decide:
        """Plan at most ``PLAN_SLACK_TICKS`` of slack (``planning_horizon``): the tables
        are sized from the work, and a far deadline is planned as if it were that close;
        past the planned ticks (the job is then done or on on-demand) the safety net and
        on-demand decide."""
        horizon = planning_horizon(window.job, window.tick_seconds, window.ticks, policy="default")
        if horizon >= window.ticks:
            return self._plan(window)
        inner = self._plan(truncated(window, horizon))

        def decide(t: int, progress: float, current: int, left: float) -> int:
            if t < horizon:
                return inner(t, progress, current, left)
            forced = safety_net(window, t, progress, current, left)
            return forced if forced is not None else ON_DEMAND

        return decide

    def _plan(self, window: Window) -> Decide:
        zones = self.choose_zones(window)
        others = [z for z in range(window.n_zones) if z not in zones] if self.fallback_spot else []
        sub = restrict(window, zones)
        every = (
            max(1, round(self.replan_hours * 3600 / window.tick_seconds))
            if self.replan_hours > 0
            else window.ticks
        )
        tables: dict[str, DecisionTable] = {}
        chooser = ZoneChooser(sub, self.zone_weight)
        spare_chooser = ZoneChooser(restrict(window, others), self.zone_weight) if others else None
        model0 = self.fit(window, zones, others)
        states = SeenStates(model0, sub)

        def state_at(t: int) -> int:
            return model0.joint(
                states.at(t), bool(others) and bool(window.available[others, t].any())
            )

        def table_at(t: int) -> DecisionTable:
            """Re-fit and re-solve every ``replan_hours`` with what has been seen by tick t."""
            if t % every == 0 or "now" not in tables:
                model = model0 if t == 0 else self.fit(seen_by(window, t), zones, others)
                tables["now"] = DecisionTable.solve(
                    sub, model, self.max_band, first=t, state0=state_at(t)
                )[0]
            return tables["now"]

        def decide(t: int, progress: float, current: int, left: float) -> int:
            table = table_at(t)
            forced = safety_net(window, t, progress, current, left)
            if forced is not None:
                return forced
            spare = current >= 0 and current not in zones  # on a fallback zone
            instance = (1 if spare else 0) if current >= 0 else current
            action = table.action(t, state_at(t), progress, instance, left)
            if action == CODE_IDLE:
                return IDLE
            if (
                action == CODE_FALLBACK
                and spare_chooser is not None
                and window.available[others, t].any()
            ):
                return current if spare else others[spare_chooser.best(t)]
            if action != CODE_SPOT or not sub.available[:, t].any():
                return ON_DEMAND
            if current < 0 or spare:
                return zones[chooser.best(t)]
            job = window.job
            slack = (window.ticks - t) * window.tick_seconds - (
                job.work_capacity_seconds - progress
            )
            if (
                left <= 1e-9
                and slack > 3 * job.restart_overhead_capacity_seconds + window.tick_seconds
            ):
                # room for this restart and two more: a voluntary move cannot cost the deadline
                return zones[
                    chooser.switch(
                        t,
                        zones.index(current),
                        job.work_capacity_seconds - progress,
                        self.switch_margin,
                    )
                ]
            return current

        return decide

    def fit(self, window: Window, zones: list[int], others: list[int]) -> MarketModel:
        """The forecast of ``zones`` (and of ``others`` as the fallback class, if any)."""
        model = fit_model(restrict(window, zones), self)
        if not others:
            return model
        return dataclasses.replace(model, fallback=fit_fallback(restrict(window, others), self))

    def choose_zones(self, window: Window) -> list[int]:
        """The cheapest price tiers worth waiting for, by the forecast's expected cost.

        Zones are sorted by their historical price; each nested set (the cheapest tier,
        the two cheapest, ...) is planned coarsely and the set with the lowest expected
        cost wins. Why: a job with slack often does better waiting for the cheap zones to
        come back than hopping to a dearer one, and with little slack the reverse. With
        ``fallback_spot`` and ``fallback_history_hours`` of history, the cheapest tier: the
        other zones are its fallback class, so no comparison is needed.
        """
        order = price_order(window)
        if len(order) == 1:
            return order
        if self.fallback_spot and (
            window.past_available.shape[1] * window.tick_seconds
            >= self.fallback_history_hours * 3600
        ):
            return sorted(order[: tier_sizes(window, order, self.tier_tolerance)[0]])
        best: tuple[float, list[int]] | None = None
        for size in reversed(tier_sizes(window, order, self.tier_tolerance)):
            sub = restrict(window, order[:size])
            model = fit_model(sub, self)
            seen = np.concatenate([sub.past_available, sub.available[:, :1]], axis=1)
            _, value = DecisionTable.solve(
                sub, model, self.coarse_band, state0=int(model.states(seen)[-1])
            )
            if best is None or value < best[0] * (1 - self.tier_margin):
                best = (value, order[:size])
        return sorted(best[1]) if best is not None else order
