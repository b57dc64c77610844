"""The project's default deadline policy: plan against a forecast, act on what is seen.

Uniform Progress and greedy are rules of thumb about one question: is the slack left
(time left minus work left) better spent waiting for spot or kept for later? This
policy answers it by dynamic programming against a *forecast* of the market, not the
market itself, so it never peeks at the future it is replayed on:

1. From the history before the window (up to a week, ``HISTORY_HOURS``) it fits a
   small Markov model of spot capacity: from each tick to the next, does capacity
   anywhere come or go, and does the zone a job sits in keep it, lose it while another
   zone still has some (a *hop*: one restart), or lose it with every zone gone? A
   short history is padded with a weak prior.
2. It solves the model exactly: expected cost to finish by the deadline, backwards over
   (tick, progress, instance, capacity now), with the README's billing, restarts and
   preemption rules, and with any risk of missing the deadline priced at infinity, so
   the plan never gambles the deadline (the safety nets still run first, belt and
   braces).
3. At each tick it looks up the best action for the state it observes (where progress
   actually is, whether capacity is there now, which instance it is on and whether its
   restart is over). Spot goes to the zone it is in while that lasts, else to the
   zone with the best price for its expected run length (long runs beat a cheap price:
   each preemption costs restarts).

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
from spot_core.policy.deadline import (IDLE, ON_DEMAND, Decide, Window, safety_net)

_IDLE, _OD, _SPOT = 0, 1, 2
"""Action codes in the decision table."""


@dataclass(frozen=True)
class MarketModel:
    """Per-tick transition probabilities of spot capacity, and the prices planned with.

    ``up_from_down``/``up_from_up``: capacity somewhere next tick, given none / some now.
    ``stay``/``hop``/``drop``: for a spot job, its zone keeps capacity / loses it while
    another zone has some / every zone is gone (they sum to one).
    """

    up_from_down: float
    up_from_up: float
    stay: float
    hop: float
    drop: float
    spot_price: float
    on_demand_price: float


@dataclass(frozen=True)
class ForecastDP:
    """Plan each window by DP against a Markov forecast fitted to its history.

    ``prior_ticks``: weight of the prior (runs of ``prior_run_hours``, outages of
    ``prior_outage_hours``) in the fit, in ticks of pseudo-observations.
    ``history_hours``: how far back the fit looks. ``replan_hours``: re-fit and re-solve
    this often with the window so far added to the history (0: plan once; re-planning
    did not pay on the development set and costs a solve each time).
    ``churn_factor``: scales the fitted loss-of-capacity rates (1: as measured).
    ``max_band`` / ``coarse_band``: progress cells of the plan's table and of the
    tier-choosing plans (coarser is faster, finer closer to exact).
    ``tier_tolerance``: zones priced within this fraction of a tier's cheapest belong to
    it. ``tier_margin``: a smaller zone set must be forecast this much cheaper to win.
    All defaults were chosen on the development set (bench/README.md).
    """

    prior_ticks: float = 24.0
    prior_run_hours: float = 4.0
    prior_outage_hours: float = 2.0
    history_hours: float = 168.0
    replan_hours: float = 0.0
    max_band: int = 300
    coarse_band: int = 80
    tier_tolerance: float = 0.1
    churn_factor: float = 1.0
    tier_margin: float = 0.02

    def __post_init__(self) -> None:
        if not (self.prior_ticks > 0 and self.prior_run_hours > 0
                and self.prior_outage_hours > 0 and self.max_band >= 10):
            raise ConfigError("ForecastDP needs positive priors and max_band >= 10")

    def plan(self, window: Window) -> Decide:
        zones = self.choose_zones(window)
        sub = restrict(window, zones)
        every = (max(1, round(self.replan_hours * 3600 / window.tick_seconds))
                 if self.replan_hours > 0 else window.ticks)
        tables: dict[str, _Table] = {}
        chooser = _ZoneChooser(sub)

        def table_at(t: int) -> _Table:
            """Re-fit and re-solve every ``replan_hours`` with what has been seen by tick t."""
            if t % every == 0 or "now" not in tables:
                model = fit_model(seen_by(sub, t), self)
                tables["now"] = _Table.solve(sub, model, self.max_band, first=t)[0]
            return tables["now"]

        def decide(t: int, progress: float, current: int, left: float) -> int:
            table = table_at(t)
            forced = safety_net(window, t, progress, current, left)
            if forced is not None:
                return forced
            up = bool(sub.available[:, t].any())
            mine = zones.index(current) if current >= 0 else current
            action = table.action(t, up, progress, mine, left)
            if action == _IDLE:
                return IDLE
            if action == _OD or not up:
                return ON_DEMAND
            return current if current >= 0 else zones[chooser.best(t)]
        return decide

    def choose_zones(self, window: Window) -> list[int]:
        """The cheapest price tiers worth waiting for, by the forecast's expected cost.

        Zones are sorted by their historical price; each nested set (the cheapest tier,
        the two cheapest, ...) is planned coarsely and the set with the lowest expected
        cost wins. Why: a job with slack often does better waiting for the cheap zones to
        come back than hopping to a dearer one, and with little slack the reverse.
        """
        order = _price_order(window)
        if len(order) == 1:
            return order
        best: tuple[float, list[int]] | None = None
        for size in reversed(_tier_sizes(window, order, self.tier_tolerance)):
            sub = restrict(window, order[:size])
            _, value = _Table.solve(sub, fit_model(sub, self), self.coarse_band)
            if best is None or value < best[0] * (1 - self.tier_margin):
                best = (value, order[:size])
        return sorted(best[1]) if best is not None else order


def seen_by(window: Window, t: int) -> Window:
    """The window with its first ``t`` ticks moved into the history: what tick t knows."""
    if t == 0:
        return window
    return dataclasses.replace(
        window, past_available=np.concatenate([window.past_available, window.available[:, :t]], 1),
        past_price=np.concatenate([window.past_price, window.price[:, :t]], 1))


def restrict(window: Window, zones: list[int]) -> Window:
    """The window seen through a subset of its zones (the others never offer capacity)."""
    pick = list(zones)
    return dataclasses.replace(window, available=window.available[pick], price=window.price[pick],
                               past_available=window.past_available[pick],
                               past_price=window.past_price[pick],
                               zones=tuple(window.zones[z] for z in pick))


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
    """Transition counts from the history before the window, plus a weak prior."""
    tick_hours = window.tick_seconds / 3600
    keep = int(config.history_hours / tick_hours)
    past = window.past_available[:, -keep:] if keep > 0 else window.past_available[:, :0]
    prices = window.past_price[:, past.shape[1] and -past.shape[1]:]
    counts = _follow_counts(past, prices) if past.shape[1] > 1 else np.zeros(6)
    weight = config.prior_ticks
    p_drop = tick_hours / config.prior_run_hours
    p_up = tick_hours / config.prior_outage_hours
    hop_share = 0.0 if window.n_zones == 1 else 0.5
    down_up, down_down, up_up, up_down, stay, hop = counts
    up_from_down = (down_up + weight * p_up) / (down_up + down_down + weight)
    up_from_up = (up_up + weight * (1 - p_drop * (1 - hop_share))) / (up_up + up_down + weight)
    moved = stay + hop + up_down
    stay_p = (stay + weight * (1 - p_drop)) / (moved + weight)
    hop_p = (hop + weight * p_drop * hop_share) / (moved + weight)
    lost = min(1.0, (1 - stay_p) * config.churn_factor)
    hop_p = lost * hop_p / max(1 - stay_p, 1e-12)
    up_from_up = 1 - min(1.0, (1 - up_from_up) * config.churn_factor)
    price = _planned_spot_price(window)
    return MarketModel(_clip(up_from_down), _clip(up_from_up), _clip(1 - lost), _clip(hop_p),
                       _clip(lost - hop_p), price, window.on_demand_price)


def _clip(p: float) -> float:
    return float(min(max(p, 1e-6), 1 - 1e-6))


def _follow_counts(available: np.ndarray, price: np.ndarray) -> np.ndarray:
    """Replay "stay in a zone while it lasts, else the cheapest up" over the history.

    Returns counts: down->up, down->down, up->up, up->down (capacity anywhere), and for
    the followed zone: kept its capacity, lost it while another zone had some (hop).
    """
    anywhere = available.any(axis=0)
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
    """The DP's best action per (tick, capacity now, instance state, progress cell)."""

    window: Window
    unit: float
    step: int
    work: int
    phases: int
    actions: np.ndarray  # (ticks, 2, 1 + 2 * phases, width) uint8

    @classmethod
    def solve(cls, window: Window, model: MarketModel, max_band: int,
              first: int = 0) -> tuple[_Table, float]:
        """Backwards from the deadline down to tick ``first``; returns the table and the
        expected cost from tick ``first`` idle at the least progress band's top."""
        unit, step, work, gains = _grid(window, max_band)
        phases = len(gains) - 1
        width = max(0, window.ticks * step - work) + 1
        actions = np.zeros((window.ticks, 2, 1 + 2 * phases, width), dtype=np.uint8)
        values = _terminal(phases, width)
        shifts = _Shifts.build(gains, step, width)
        for t in range(window.ticks - 1, first - 1, -1):
            remaining = (window.ticks - t) * step
            values = [_solve_tick(values, model, window, shifts, remaining, up, actions[t, up])
                      for up in (0, 1)]
        start = values[int(window.available[:, first].any())][0][-1]
        return cls(window, unit, step, work, phases, actions), float(start)

    def action(self, t: int, up: bool, progress: float, current: int, left: float) -> int:
        offset = math.floor(progress / self.unit + 1e-9) - (self.work - (self.window.ticks - t)
                                                             * self.step)
        if offset < 0:
            return _OD
        offset = min(offset, self.actions.shape[-1] - 1)
        return int(self.actions[t, int(up), self._state(current, left), offset])

    def _state(self, current: int, left: float) -> int:
        """0 idle; 1..P on-demand in phase p; P+1..2P spot in phase p (p ticks since launch)."""
        if current == IDLE:
            return 0
        overhead = self.window.job.overhead_seconds
        ran = self.phases if left <= 1e-9 else round((overhead - left) / self.window.tick_seconds)
        phase = min(max(ran, 1), self.phases)
        return phase if current == ON_DEMAND else self.phases + phase


def _grid(window: Window, max_band: int) -> tuple[float, int, int, list[int]]:
    """(unit s, tick units, work units, gain units per phase): a unit that divides the tick.

    Gains are rounded down, so the plan never thinks it is further along than it is.
    """
    job, tick = window.job, window.tick_seconds
    band = max(window.ticks * tick - job.task_seconds, tick)
    cells = max(1, min(round(tick), math.ceil(max_band * tick / band)))
    unit = tick / cells
    phases = max(1, math.ceil(job.overhead_seconds / tick - 1e-9))
    gains = [min(tick, max(0.0, (j + 1) * tick - job.overhead_seconds)) for j in range(phases + 1)]
    return (unit, cells, math.ceil(job.task_seconds / unit - 1e-9),
            [math.floor(g / unit + 1e-9) for g in gains])


def _terminal(phases: int, width: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    unfinished = np.full(width, np.inf)
    stack = np.full((phases, width), np.inf)
    return [(unfinished, stack, stack), (unfinished, stack, stack)]


def _solve_tick(values, model: MarketModel, window: Window, shifts: _Shifts, remaining: int,
                up: int, out: np.ndarray):
    """Values at this tick for capacity state ``up``; writes the best actions into ``out``.

    Ties go to the cheaper-to-hold action in the order idle, on-demand, spot.
    """
    (idle0, od0, spot0), (idle1, od1, spot1) = values
    p_up = model.up_from_up if up else model.up_from_down
    hours = window.tick_seconds / 3600
    e_idle = p_up * idle1 + (1 - p_up) * idle0
    od_runs = shifts.runs(p_up * od1 + (1 - p_up) * od0, model.on_demand_price * hours, remaining)
    options = [shifts.idle(e_idle, remaining), od_runs[0]]
    if up:
        e_spot = model.stay * spot1 + model.hop * idle1 + model.drop * idle0
        spot_runs = shifts.runs(e_spot, model.spot_price * hours, remaining)
        options.append(spot_runs[0])
    stacked = np.stack(options)
    pick = np.argmin(stacked, axis=0)
    best = np.take_along_axis(stacked, pick[None, :], axis=0)[0]
    choice = _CODES[pick]
    phases = od_runs.shape[0] - 1
    out[0] = choice
    od_states, out[1:phases + 1] = _keep_if_better(best, choice, od_runs[1:], _OD)
    if up:
        spot_states, out[phases + 1:] = _keep_if_better(best, choice, spot_runs[1:], _SPOT)
    else:
        spot_states = np.broadcast_to(best, od_states.shape)
        out[phases + 1:] = choice
    return best, od_states, spot_states


_CODES = np.array([_IDLE, _OD, _SPOT], dtype=np.uint8)


def _keep_if_better(best: np.ndarray, choice: np.ndarray, runs: np.ndarray, code: int):
    """Continuing the running instance where that beats the best fresh choice."""
    wins = runs < best
    return np.where(wins, runs, best), np.where(wins, np.uint8(code), choice)


@dataclass(frozen=True, eq=False)
class _Shifts:
    """Index tables that move a value row to the next tick's progress cells in one gather.

    Running in phase ``p`` gains ``gains[p]`` units while the progress floor rises by
    ``step``: cell ``o`` reads cell ``o + gain - step`` of the next phase's row (below
    zero: the deadline is lost, inf); from ``o + gain >= remaining`` on, the job is done.
    """

    rows: np.ndarray
    cols: np.ndarray
    reach: np.ndarray
    step: int

    @classmethod
    def build(cls, gains: list[int], step: int, width: int) -> _Shifts:
        phases = len(gains) - 1
        cells = np.arange(width)[None, :]
        gain = np.array(gains)[:, None]
        rows = np.array([min(p + 1, phases) - 1 for p in range(phases + 1)])[:, None]
        return cls(rows, cells + gain, cells + gain, step)

    def runs(self, values: np.ndarray, price: float, remaining: int) -> np.ndarray:
        padded = np.concatenate([np.full((values.shape[0], self.step), np.inf), values], axis=1)
        out = padded[self.rows, self.cols]
        out[self.reach >= remaining] = 0.0
        return out + price

    def idle(self, values: np.ndarray, remaining: int) -> np.ndarray:
        width = values.size
        out = np.full(width, np.inf)
        if self.step < width:
            out[self.step:] = values[:width - self.step]
        out[remaining:] = 0.0
        return out


class _ZoneChooser:
    """Which zone to start spot in: the best price for the expected run length."""

    def __init__(self, window: Window) -> None:
        self.window = window
        full = np.concatenate([window.past_available, window.available], axis=1)
        self.offset = window.past_available.shape[1]
        ends = np.zeros(full.shape, dtype=np.int64)
        ends[:, 1:] = full[:, :-1] & ~full[:, 1:]
        self.ends = np.cumsum(ends, axis=1)
        self.up = np.cumsum(full, axis=1)

    def mean_run(self, zone: int, t: int) -> float:
        col = self.offset + t
        return float(self.up[zone, col]) * self.window.tick_seconds / (self.ends[zone, col] + 1)

    def best(self, t: int) -> int:
        overhead = self.window.job.overhead_seconds
        scores = [(self.window.price[z, t] * (1 + 2 * overhead / max(self.mean_run(z, t), 1.0)), z)
                  for z in np.flatnonzero(self.window.available[:, t])]
        return int(min(scores)[1])
