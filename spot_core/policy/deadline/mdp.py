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
"""

from __future__ import annotations

import dataclasses
import math
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

_IDLE, _OD, _SPOT, _FALLBACK = 0, 1, 2, 3
"""Action codes in the decision table (``_FALLBACK``: spot in a fallback zone)."""


@dataclass(frozen=True, eq=False)
class MarketModel:
    """A semi-Markov forecast of spot capacity, and the prices planned with.

    The capacity state is "some zone has capacity now or not" together with how long
    that has lasted (the *age* of the current run or outage, in a few log-spaced
    buckets): states ``0 .. n_up - 1`` are up with increasing age, the rest down with
    increasing age. ``trans[i, j]`` is the chance to move from state i to state j in a
    tick. Why ages: real run lengths are heavy-tailed (many short flickers, a few very
    long runs), so a run that has just begun is far likelier to end soon than one that
    has lasted hours; a memoryless model cannot tell them apart and takes short runs
    whose restart overhead is never repaid. ``keep``: for a spot job, the chance its own
    zone keeps capacity given some zone still has it (1 with one zone; else a *hop*, one
    restart).
    """

    trans: np.ndarray
    n_up: int
    keep: float
    spot_price: float
    on_demand_price: float
    up_edges: tuple[float, ...]
    down_edges: tuple[float, ...]
    fallback: Fallback | None = None

    @property
    def n_states(self) -> int:
        return int(self.trans.shape[0])

    @property
    def n_joint(self) -> int:
        """States the plan is solved over: the capacity state, times the fallback's up or
        down when there is one (index ``2 * state + (0 up | 1 down)``)."""
        return self.n_states * (1 if self.fallback is None else 2)

    def joint(self, state: int, fallback_up: bool) -> int:
        return state if self.fallback is None else 2 * state + (0 if fallback_up else 1)

    def joint_trans(self) -> np.ndarray:
        """Chances per tick between joint states (the fallback moves independently)."""
        if self.fallback is None:
            return self.trans
        return np.kron(self.trans, self.fallback.trans)

    def classes(self) -> list[tuple[np.ndarray, float, float]]:
        """Per spot class (0: the planned zones; 1: the fallback zones), the joint states
        in which it has capacity, the chance a job there keeps its zone from one tick to
        the next while the class has capacity, and its price."""
        cheap = np.arange(self.n_states) < self.n_up
        if self.fallback is None:
            return [(cheap, self.keep, self.spot_price)]
        return [
            (np.repeat(cheap, 2), self.keep, self.spot_price),
            (np.tile([True, False], self.n_states), self.fallback.keep, self.fallback.price),
        ]

    def states(self, available: np.ndarray) -> np.ndarray:
        """The capacity state at each tick of a (zones x ticks) availability array, from
        that tick and the ones before it only."""
        return capacity_states(np.asarray(available.any(axis=0)), self.up_edges, self.down_edges)

    def state(self, up: bool, age: int) -> int:
        """The capacity state of one tick: up or down, ``age`` ticks into its run."""
        if up:
            return int(np.searchsorted(self.up_edges, age, side="right"))
        return self.n_up + int(np.searchsorted(self.down_edges, age, side="right"))


@dataclass(frozen=True, eq=False)
class Fallback:
    """The zones outside the planned set, as a second spot class: capacity there or not
    (a two-state Markov chain, ``trans[0]`` from up, ``trans[1]`` from down, independent
    of the planned zones), the chance a job keeps its zone while the class has capacity,
    and the price planned with. Why: without it, the plan for a cheap tier sees
    on-demand as the only way through the tier's outages, and so prefers the whole,
    dearer set where the cheap tier plus spot elsewhere during its outages costs less."""

    trans: np.ndarray
    keep: float
    price: float


class _SeenStates:
    """The capacity state at each window tick, folded in one tick at a time as the
    policy reaches it (the same states as :meth:`MarketModel.states` over the history
    and the window, without reading a tick before its time)."""

    def __init__(self, model: MarketModel, window: Window) -> None:
        self.model, self.window = model, window
        anywhere = np.asarray(window.past_available.any(axis=0))
        self.up: bool | None = bool(anywhere[-1]) if anywhere.size else None
        self.age = _run_age(anywhere)
        self.seen: list[int] = []

    def at(self, t: int) -> int:
        while len(self.seen) <= t:
            up = bool(self.window.available[:, len(self.seen)].any())
            self.age = self.age + 1 if up == self.up else 0
            self.up = up
            self.seen.append(self.model.state(up, self.age))
        return self.seen[t]


def _run_age(anywhere: np.ndarray) -> int:
    """Ticks since the run in progress at the end of ``anywhere`` began (0: just began)."""
    if anywhere.size == 0:
        return 0
    changes = np.flatnonzero(anywhere[1:] != anywhere[:-1])
    begin = int(changes[-1]) + 1 if changes.size else 0
    return anywhere.size - 1 - begin


def capacity_states(
    anywhere: np.ndarray, up_edges: tuple[float, ...], down_edges: tuple[float, ...]
) -> np.ndarray:
    """State index per tick: the up/down bucket of the age of the run the tick is in.

    Edges are in ticks; age 0 is the first tick of a run (a run already going when the
    array starts counts from there, so ages are never overstated).
    """
    n = anywhere.size
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    index = np.arange(n)
    starts = np.ones(n, dtype=bool)
    starts[1:] = anywhere[1:] != anywhere[:-1]
    age = index - np.maximum.accumulate(np.where(starts, index, 0))
    up = np.searchsorted(np.asarray(up_edges, dtype=float), age, side="right")
    down = np.searchsorted(np.asarray(down_edges, dtype=float), age, side="right")
    return np.where(anywhere, up, len(up_edges) + 1 + down).astype(np.int64)


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
        tables: dict[str, _Table] = {}
        chooser = _ZoneChooser(sub, self.zone_weight)
        spare_chooser = _ZoneChooser(restrict(window, others), self.zone_weight) if others else None
        model0 = self.fit(window, zones, others)
        states = _SeenStates(model0, sub)

        def state_at(t: int) -> int:
            return model0.joint(
                states.at(t), bool(others) and bool(window.available[others, t].any())
            )

        def table_at(t: int) -> _Table:
            """Re-fit and re-solve every ``replan_hours`` with what has been seen by tick t."""
            if t % every == 0 or "now" not in tables:
                model = model0 if t == 0 else self.fit(seen_by(window, t), zones, others)
                tables["now"] = _Table.solve(
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
            if action == _IDLE:
                return IDLE
            if (
                action == _FALLBACK
                and spare_chooser is not None
                and window.available[others, t].any()
            ):
                return current if spare else others[spare_chooser.best(t)]
            if action != _SPOT or not sub.available[:, t].any():
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
        order = _price_order(window)
        if len(order) == 1:
            return order
        if self.fallback_spot and (
            window.past_available.shape[1] * window.tick_seconds
            >= self.fallback_history_hours * 3600
        ):
            return sorted(order[: _tier_sizes(window, order, self.tier_tolerance)[0]])
        best: tuple[float, list[int]] | None = None
        for size in reversed(_tier_sizes(window, order, self.tier_tolerance)):
            sub = restrict(window, order[:size])
            model = fit_model(sub, self)
            seen = np.concatenate([sub.past_available, sub.available[:, :1]], axis=1)
            _, value = _Table.solve(
                sub, model, self.coarse_band, state0=int(model.states(seen)[-1])
            )
            if best is None or value < best[0] * (1 - self.tier_margin):
                best = (value, order[:size])
        return sorted(best[1]) if best is not None else order


def seen_by(window: Window, t: int) -> Window:
    """The window with its first ``t`` ticks moved into the history: what tick t knows."""
    if t == 0:
        return window
    return dataclasses.replace(
        window,
        past_available=np.concatenate([window.past_available, window.available[:, :t]], 1),
        past_price=np.concatenate([window.past_price, window.price[:, :t]], 1),
    )


def restrict(window: Window, zones: list[int]) -> Window:
    """The window seen through a subset of its zones (the others never offer capacity)."""
    pick = list(zones)
    return dataclasses.replace(
        window,
        available=window.available[pick],
        price=window.price[pick],
        past_available=window.past_available[pick],
        past_price=window.past_price[pick],
        zones=tuple(window.zones[z] for z in pick),
    )


def _zone_prices(window: Window) -> list[float]:
    """Each zone's mean price while available in the history (its price now without any)."""
    past, prices = window.past_available, window.past_price
    means = []
    for z in range(window.n_zones):
        seen = prices[z][past[z]] if past.shape[1] else np.empty(0)
        means.append(round(float(seen.mean()) if seen.size else float(window.price[z, 0]), 6))
    return means


def _price_order(window: Window) -> list[int]:
    """Zones cheapest first."""
    means = _zone_prices(window)
    return sorted(range(window.n_zones), key=lambda z: (means[z], z))


def _tier_sizes(window: Window, order: list[int], tolerance: float) -> list[int]:
    """Set sizes that end at a price boundary: zones within ``tolerance`` of the tier's
    cheapest go together (a 1% dearer zone is not worth waiting out)."""
    means = _zone_prices(window)
    sizes, floor = [], means[order[0]]
    for i, zone in enumerate(order[1:], start=1):
        if means[zone] > floor * (1 + tolerance):
            sizes.append(i)
            floor = means[zone]
    return sizes + [len(order)]


# -- fitting the forecast -----------------------------------------------------------------------
def fit_model(window: Window, config: ForecastDP) -> MarketModel:
    """Transition counts between age-bucketed capacity states in the history before the
    window, plus a weak prior (geometric runs of ``prior_run_hours`` and outages of
    ``prior_outage_hours``, ``prior_ticks`` pseudo-observations per state)."""
    tick_hours = window.tick_seconds / 3600
    keep_ticks = int(config.history_hours / tick_hours)
    past = (
        window.past_available[:, -keep_ticks:] if keep_ticks > 0 else window.past_available[:, :0]
    )
    prices = window.past_price[:, past.shape[1] and -past.shape[1] :]
    up_edges = tuple(e / tick_hours for e in config.up_edges_hours)
    down_edges = tuple(e / tick_hours for e in config.down_edges_hours)
    n_up, n_down = len(up_edges) + 1, len(down_edges) + 1
    k = n_up + n_down
    counts = np.zeros((k, k))
    if past.shape[1] > 1:
        states = capacity_states(np.asarray(past.any(axis=0)), up_edges, down_edges)
        weight: float | np.ndarray = 1.0
        if config.history_half_life_hours > 0:  # the newest transition weighs 1
            age = np.arange(past.shape[1] - 2, -1, -1) * tick_hours
            weight = 0.5 ** (age / config.history_half_life_hours)
        np.add.at(counts, (states[:-1], states[1:]), weight)
    p_drop = min(1.0, tick_hours / config.prior_run_hours)
    p_up = min(1.0, tick_hours / config.prior_outage_hours)
    prior = np.zeros((k, k))
    for edges, first, n, other, p_leave in (
        (up_edges, 0, n_up, n_up, p_drop),
        (down_edges, n_up, n_down, 0, p_up),
    ):
        bounds = (0.0,) + edges
        for b in range(n):
            state = first + b
            prior[state, other] = p_leave
            advance = 0.0
            if b + 1 < n:
                advance = (1 - p_leave) / max(1.0, bounds[b + 1] - bounds[b])
                prior[state, state + 1] = advance
            prior[state, state] = 1 - p_leave - advance
    trans = counts + config.prior_ticks * prior
    trans = trans / trans.sum(axis=1, keepdims=True)
    keep = 1.0
    if window.n_zones > 1:
        follow = _follow_counts(past, prices) if past.shape[1] > 1 else np.zeros(6)
        stay, hop = follow[4], follow[5]
        weight = config.prior_ticks
        keep = (stay + weight * (1 - p_drop)) / (stay + hop + weight * (1 - p_drop / 2))
    return MarketModel(
        trans,
        n_up,
        _clip(keep),
        _planned_spot_price(window),
        window.on_demand_price,
        up_edges,
        down_edges,
    )


def fit_fallback(spare: Window, config: ForecastDP) -> Fallback:
    """The ``spare`` zones as one up/down Markov chain (capacity in any of them), fitted
    to the history like the main forecast (same history length, half-life and prior),
    with their keep chance and planned price."""
    model = fit_model(spare, dataclasses.replace(config, up_edges_hours=(), down_edges_hours=()))
    return Fallback(model.trans, model.keep, model.spot_price)


def _clip(p: float) -> float:
    return float(min(max(p, 1e-6), 1 - 1e-6))


def _follow_counts(available: np.ndarray, price: np.ndarray) -> np.ndarray:
    """Replay "stay in a zone while it lasts, else the cheapest up" over the history.

    Returns counts: down->up, down->down, up->up, up->down (capacity anywhere), and for
    the followed zone: kept its capacity, lost it while another zone had some (hop).
    """
    anywhere = np.asarray(available.any(axis=0))
    counts = np.zeros(6)
    zone = -1
    for t in range(available.shape[1] - 1):
        now, nxt = anywhere[t], anywhere[t + 1]
        if not now:
            counts[0 if nxt else 1] += 1
            zone = -1
            continue
        counts[2 if nxt else 3] += 1
        if zone < 0 or not available[zone, t]:
            zone = int(np.argmin(np.where(available[:, t], price[:, t], np.inf)))
        if available[zone, t + 1]:
            counts[4] += 1
        elif nxt:
            counts[5] += 1
    return counts


def _planned_spot_price(window: Window) -> float:
    """Mean spot price of the zones' history while available (tick 0's price without any)."""
    past_up = window.past_available
    if past_up.shape[1] > 0 and past_up.any():
        cheapest = np.where(past_up, window.past_price, np.inf).min(axis=0)
        return float(cheapest[np.isfinite(cheapest)].mean())
    column = window.available[:, 0]
    prices = window.price[:, 0][column] if column.any() else window.price[:, 0]
    return float(prices.min())


# -- solving the plan -----------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class _Table:
    """The DP's best action per (tick, capacity state, instance state, progress cell)."""

    window: Window
    unit: float
    step: int
    work: int
    phases: int
    actions: np.ndarray  # (ticks, states, 1 + 2 * phases, width) uint8

    @classmethod
    def solve(
        cls,
        window: Window,
        model: MarketModel,
        max_band: int,
        first: int = 0,
        state0: int | None = None,
    ) -> tuple[_Table, float]:
        """Backwards from the deadline down to tick ``first``; returns the table and the
        expected cost from tick ``first`` idle at the least progress band's top, in
        joint state ``state0`` (default: the youngest up or down state seen then, with
        the fallback up)."""
        unit, step, work, gains = _grid(window, max_band)
        phases = len(gains) - 1
        width = max(0, window.ticks * step - work) + 1
        k = model.n_joint
        classes = model.classes()
        actions = np.zeros(
            (window.ticks, k, 1 + (1 + len(classes)) * phases, width), dtype=np.uint8
        )
        idle = np.full((k, width), _LOST)
        od = np.full((k, phases, width), _LOST)
        spots = [np.full((k, phases, width), _LOST) for _ in classes]
        shifts = _Shifts.build(gains, step, width)
        hours = window.tick_seconds / 3600
        od_price = model.on_demand_price * hours
        trans = model.joint_trans()
        for t in range(window.ticks - 1, first - 1, -1):
            remaining = (window.ticks - t) * step
            e_idle = _expect(trans, idle)
            od_runs = shifts.runs(_expect(trans, od), od_price, remaining)
            options = [shifts.idle(e_idle, remaining), od_runs[:, 0]]
            spot_runs = []
            for (up, keep, price), spot in zip(classes, spots, strict=True):
                # next tick: still in the zone (the class up, the zone kept), else idle
                stay = keep * up
                after = stay[:, None, None] * spot + (1 - stay)[:, None, None] * idle[:, None]
                runs = shifts.runs(_expect(trans, after), price * hours, remaining)
                runs[~up] = _LOST  # no capacity in the class now: neither launched nor kept
                spot_runs.append(runs)
                options.append(runs[:, 0])
            stacked = np.stack(options)
            # ties go to the cheaper-to-hold action: idle, then on-demand, then spot
            choice = np.argmin(stacked, axis=0).astype(np.uint8)
            best = stacked.min(axis=0)
            out = actions[t]
            out[:, 0] = choice
            od, out[:, 1 : phases + 1] = _keep_if_better(best, choice, od_runs[:, 1:], _OD)
            for j, runs in enumerate(spot_runs):
                first_col = (1 + j) * phases + 1
                spots[j], out[:, first_col : first_col + phases] = _keep_if_better(
                    best, choice, runs[:, 1:], _SPOT + j
                )
            idle = best
        if state0 is None:
            up_now = bool(window.available[:, first].any())
            state0 = model.joint(0 if up_now else model.n_up, True)
        start = float(idle[state0][-1])
        return cls(window, unit, step, work, phases, actions), start if start < 1e20 else math.inf

    def action(self, t: int, state: int, progress: float, instance: int, left: float) -> int:
        """The best action code; ``instance``: ``IDLE``, ``ON_DEMAND`` or a spot class
        (0: the planned zones, 1: the fallback zones)."""
        offset = math.floor(progress / self.unit + 1e-9) - (
            self.work - (self.window.ticks - t) * self.step
        )
        if offset < 0:
            return _OD
        offset = min(offset, self.actions.shape[-1] - 1)
        return int(self.actions[t, state, self._state(instance, left), offset])

    def _state(self, instance: int, left: float) -> int:
        """0 idle; 1..P on-demand in phase p; then P per spot class (p ticks since launch)."""
        if instance == IDLE:
            return 0
        overhead = self.window.job.restart_overhead_capacity_seconds
        ran = self.phases if left <= 1e-9 else round((overhead - left) / self.window.tick_seconds)
        phase = min(max(ran, 1), self.phases)
        return phase if instance == ON_DEMAND else (1 + instance) * self.phases + phase


def _grid(window: Window, max_band: int) -> tuple[float, int, int, list[int]]:
    """(unit s, tick units, work units, gain units per phase): a unit that divides the tick.

    Gains are rounded down, so the plan never thinks it is further along than it is.
    """
    job, tick = window.job, window.tick_seconds
    band = max(window.ticks * tick - job.work_capacity_seconds, tick)
    cells = max(1, min(round(tick), math.ceil(max_band * tick / band)))
    unit = tick / cells
    phases = max(1, math.ceil(job.restart_overhead_capacity_seconds / tick - 1e-9))
    gains = [
        min(tick, max(0.0, (j + 1) * tick - job.restart_overhead_capacity_seconds))
        for j in range(phases + 1)
    ]
    return (
        unit,
        cells,
        math.ceil(job.work_capacity_seconds / unit - 1e-9),
        [math.floor(g / unit + 1e-9) for g in gains],
    )


_LOST = 1e30
"""The value of a lost deadline: finite so that a zero chance of it costs exactly zero in
the expectations, and so large that any positive chance of it (the fitted chances are
never below ~1e-6 a tick) outweighs every saving."""


def _expect(trans: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``trans @ values`` over the first axis."""
    flat = values.reshape(values.shape[0], -1)
    expected: np.ndarray = (trans @ flat).reshape((trans.shape[0],) + values.shape[1:])
    return expected


def _keep_if_better(
    best: np.ndarray, choice: np.ndarray, runs: np.ndarray, code: int
) -> tuple[np.ndarray, np.ndarray]:
    """Continuing the running instance where that beats the best fresh choice.

    ``best``/``choice``: (states, width); ``runs``: (states, phases, width)."""
    wins = runs < best[:, None]
    return (np.minimum(runs, best[:, None]), np.where(wins, np.uint8(code), choice[:, None]))


@dataclass(frozen=True, eq=False)
class _Shifts:
    """Moves value rows to the next tick's progress cells, one slice per phase.

    Running in phase ``p`` gains ``gains[p]`` units while the progress floor rises by
    ``step``: cell ``o`` reads cell ``o + gain - step`` of the next phase's row (below
    zero: the deadline is lost); from ``o + gain >= remaining`` on, the job is done.
    """

    gains: tuple[int, ...]
    rows: tuple[int, ...]
    step: int
    width: int

    @classmethod
    def build(cls, gains: list[int], step: int, width: int) -> _Shifts:
        phases = len(gains) - 1
        rows = tuple(min(p + 1, phases) - 1 for p in range(phases + 1))
        return cls(tuple(gains), rows, step, width)

    def runs(self, values: np.ndarray, price: float, remaining: int) -> np.ndarray:
        """(states, phases, width) next-tick values -> (states, phases + 1, width)."""
        width, step = self.width, self.step
        out = np.full((values.shape[0], len(self.gains), width), _LOST)
        for p, (gain, row) in enumerate(zip(self.gains, self.rows, strict=True)):
            shift = step - gain  # cell o reads cell o - shift
            if shift < width:
                out[:, p, shift:] = values[:, row, : width - shift]
            out[:, p, max(0, remaining - gain) :] = 0.0
        out += price
        return out

    def idle(self, values: np.ndarray, remaining: int) -> np.ndarray:
        width = values.shape[-1]
        out = np.full(values.shape, _LOST)
        if self.step < width:
            out[:, self.step :] = values[:, : width - self.step]
        out[:, remaining:] = 0.0
        return out


class _ZoneChooser:
    """Which zone to run spot in: the best price per unit of progress over the run a zone
    is expected still to have (the Young/Daly view: a run of expected length E costs a
    restart R per E of it), judged from the age of each zone's current run.

    Run lengths are heavy-tailed, so the expected rest of a run grows with its age: it is
    estimated from the zone's completed runs (history and window so far) that outlasted
    the current age; with none, as long again as it has lasted (at least its mean run).
    The window's ticks are folded in one at a time as the policy reaches them, so the
    chooser never reads a tick before its time.
    """

    def __init__(self, window: Window, weight: float = 0.5) -> None:
        self.window, self.weight = window, weight
        past = window.past_available
        self.offset: int = past.shape[1]
        self.folded = -1  # the last window tick folded in
        n = window.n_zones
        self.value = past[:, -1].copy() if self.offset else np.zeros(n, dtype=bool)
        self.up = past.sum(axis=1).astype(np.int64)
        self.ends = (past[:, :-1] & ~past[:, 1:]).sum(axis=1).astype(np.int64)
        self.begin = np.zeros(n, dtype=np.int64)
        self.runs: list[tuple[list[int], list[int]]] = []  # per zone: (end column, length)
        index = np.arange(self.offset)
        for z in range(n):
            row = past[z]
            starts = np.ones(row.size, dtype=bool)
            starts[1:] = row[1:] != row[:-1]
            begin = np.maximum.accumulate(np.where(starts, index, 0))
            self.begin[z] = begin[-1] if row.size else 0
            last = np.flatnonzero(row[:-1] & ~row[1:])  # last up column of each completed run
            complete = begin[last] > 0  # a run cut off by the start of the array is not
            self.runs.append(
                (
                    [int(c) for c in last[complete] + 1],
                    [int(c) for c in (last - begin[last] + 1)[complete]],
                )
            )

    def _fold(self, t: int) -> None:
        """Fold window ticks up to ``t`` into the per-zone counts."""
        if t < self.folded:
            raise ValueError(
                f"the zone chooser is at tick {self.folded}; it cannot go back to tick {t}"
            )
        while self.folded < t:
            self.folded += 1
            col = self.offset + self.folded
            now = np.asarray(self.window.available[:, self.folded], dtype=bool)
            if col == 0:
                self.value = now.copy()
                self.up += now
                continue
            fell = self.value & ~now
            for z in np.flatnonzero(fell):
                if self.begin[z] > 0:
                    self.runs[z][0].append(col)
                    self.runs[z][1].append(col - int(self.begin[z]))
            self.ends += fell
            self.begin[self.value != now] = col
            self.up += now
            self.value = now.copy()

    def mean_run(self, zone: int, t: int) -> float:
        self._fold(t)
        return float(self.up[zone]) * self.window.tick_seconds / (int(self.ends[zone]) + 1)

    def rest(self, zone: int, t: int) -> float:
        """Expected seconds left of the zone's current run at tick t (seen by t only)."""
        self._fold(t)
        age = self.offset + t - int(self.begin[zone]) + 1
        length = np.asarray(self.runs[zone][1], dtype=np.int64)
        longer = length[length > age]
        tick = self.window.tick_seconds
        if longer.size:
            return float(longer.mean() - age) * tick
        return max(age * tick, self.mean_run(zone, t))

    def score(self, zone: int, t: int) -> float:
        overhead = self.window.job.restart_overhead_capacity_seconds
        return float(self.window.price[zone, t]) * (
            1 + self.weight * overhead / max(self.rest(zone, t), 1.0)
        )

    def best(self, t: int) -> int:
        zones = [int(z) for z in np.flatnonzero(self.window.available[:, t])]
        scores = [(self.score(z, t), z) for z in zones]
        return int(min(scores)[1])

    def switch(self, t: int, zone: int, work_left: float, margin: float) -> int:
        """Move to the best-ranked other zone when its lower price, over its expected run,
        repays a restart ``margin`` times over; else stay.

        The saving is in price alone. A move costs a restart now; staying costs one only
        if this zone's run ends first, and the job moves then. So between zones of one
        price a move never pays, however much longer the other zone's run looks (with the
        ranking's restart term in the saving, the default hopped between equal-priced
        zones and paid a restart each time: bench/README.md, tenth round)."""
        column = self.window.available[:, t]
        if margin == math.inf or column.sum() < 2:
            return zone
        other = min((self.score(z, t), z) for z in map(int, np.flatnonzero(column)) if z != zone)[1]
        prices = self.window.price[:, t]
        gain = float(prices[zone] - prices[other]) * min(self.rest(other, t), work_left) / 3600
        cost = float(prices[other]) * self.window.job.restart_overhead_capacity_seconds / 3600
        return int(other) if gain > margin * cost else zone
