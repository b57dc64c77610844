"""Which zones the default deadline policy (``mdp.ForecastDP``) runs spot in: the price
tiers a plan is made for (zones by their historical price) and, at each tick, the zone
with the best price per unit of progress over the run it is expected still to have
(``ZoneChooser``).
"""

from __future__ import annotations

import math

import numpy as np

from spot_core.policy.deadline.base import Window


def zone_prices(window: Window) -> list[float]:
    """Each zone's mean price while available in the history (its price now without any)."""
    past, prices = window.past_available, window.past_price
    means = []
    for z in range(window.n_zones):
        seen = prices[z][past[z]] if past.shape[1] else np.empty(0)
        means.append(round(float(seen.mean()) if seen.size else float(window.price[z, 0]), 6))
    return means


def price_order(window: Window) -> list[int]:
    """Zones cheapest first."""
    means = zone_prices(window)
    return sorted(range(window.n_zones), key=lambda z: (means[z], z))


def tier_sizes(window: Window, order: list[int], tolerance: float) -> list[int]:
    """Set sizes that end at a price boundary: zones within ``tolerance`` of the tier's
    cheapest go together (a 1% dearer zone is not worth waiting out)."""
    means = zone_prices(window)
    sizes, floor = [], means[order[0]]
    for i, zone in enumerate(order[1:], start=1):
        if means[zone] > floor * (1 + tolerance):
            sizes.append(i)
            floor = means[zone]
    return sizes + [len(order)]


class ZoneChooser:
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
