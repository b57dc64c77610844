"""The forecast the default deadline policy plans against (``mdp.ForecastDP``): a
semi-Markov model of spot capacity fitted to the history before a window, and the views
of a window it is fitted on.

The state is whether some zone has capacity and how long that has lasted (the age of the
current run or outage, in a few log-spaced buckets); the chances per tick of moving
between states are counted in the history, weighted by age and padded with a weak prior.
``MarketModel`` holds the fit, ``Fallback`` the zones outside the planned set as a second
spot class, ``SeenStates`` the state of each window tick as the policy reaches it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from spot_core.policy.deadline.base import Window


class ForecastConfig(Protocol):
    """What a fit reads of its policy's knobs (``ForecastDP``'s, documented there)."""

    @property
    def prior_ticks(self) -> float: ...
    @property
    def prior_run_hours(self) -> float: ...
    @property
    def prior_outage_hours(self) -> float: ...
    @property
    def history_hours(self) -> float: ...
    @property
    def history_half_life_hours(self) -> float: ...
    @property
    def up_edges_hours(self) -> tuple[float, ...]: ...
    @property
    def down_edges_hours(self) -> tuple[float, ...]: ...


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


class SeenStates:
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


def fit_model(window: Window, config: ForecastConfig, *, ages: bool = True) -> MarketModel:
    """Transition counts between age-bucketed capacity states in the history before the
    window, plus a weak prior (geometric runs of ``prior_run_hours`` and outages of
    ``prior_outage_hours``, ``prior_ticks`` pseudo-observations per state). ``ages=False``:
    one up and one down state, the memoryless chain (the fallback's)."""
    tick_hours = window.tick_seconds / 3600
    keep_ticks = int(config.history_hours / tick_hours)
    past = (
        window.past_available[:, -keep_ticks:] if keep_ticks > 0 else window.past_available[:, :0]
    )
    prices = window.past_price[:, past.shape[1] and -past.shape[1] :]
    up_edges = tuple(e / tick_hours for e in config.up_edges_hours) if ages else ()
    down_edges = tuple(e / tick_hours for e in config.down_edges_hours) if ages else ()
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


def fit_fallback(spare: Window, config: ForecastConfig) -> Fallback:
    """The ``spare`` zones as one up/down Markov chain (capacity in any of them), fitted
    to the history like the main forecast (same history length, half-life and prior),
    with their keep chance and planned price."""
    model = fit_model(spare, config, ages=False)
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
