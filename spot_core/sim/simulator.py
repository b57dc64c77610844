"""The policy simulator: replay deadline policies on real spot traces, tick by tick.

The model is the one in the repository's ``traces/README.md`` (the NSDI'24 paper's):

- time moves in ticks; in each tick the job is idle, on on-demand (always there) or on
  spot in one zone (only where that zone is available in that tick);
- a spot instance used during tick ``t`` is preempted if its zone is unavailable at
  ``t + 1``;
- every new instance (first launch, after a preemption, on switching market or zone)
  pays the restart overhead in seconds first, so the tick in which it ends makes
  partial progress;
- a tick on an instance is billed in full at that tick's price, the last one too;
- only the ``floor(D / tick)`` whole ticks that end by the deadline count.

A job that has not finished by the deadline counts as a miss; its cost then includes
finishing the remaining work (plus one restart) on on-demand, so a miss never looks
cheap. Policies see a :class:`Window` and, at tick ``t``, may read its arrays only up to
``t`` (and the history before the window): the simulator hands them the whole window
for speed, and the tests check that no policy's choice changes when the future does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from spot_core.bounds import MAX_SEED, MAX_WINDOWS
from spot_core.errors import ConfigError
from spot_core.policy.deadline.base import IDLE, Decide, Job, Window
from spot_core.policy.deadline.causal import causal_plan
from spot_core.policy.deadline.optimal import optimal_cost
from spot_core.policy.deadline.policies import DEADLINE_POLICIES
from spot_core.policy.deadline.replay import Replay


@dataclass(frozen=True)
class WindowResult:
    """What one policy did in one window."""

    cost: float
    finished: bool
    finish_tick: int
    preemptions: int
    restarts: int
    spot_ticks: int
    on_demand_ticks: int


# -- window starts -----------------------------------------------------------------------------
def random_starts(n_ticks: int, window_ticks: int, count: int, seed: int) -> list[int]:
    """``count`` distinct window starts drawn uniformly with ``seed``, in start order."""
    if not 1 <= count <= MAX_WINDOWS:
        raise ConfigError(f"--windows must be from 1 to {MAX_WINDOWS:,}, got {count}")
    if not 0 <= seed <= MAX_SEED:
        raise ConfigError(f"--seed must be a whole number from 0 to {MAX_SEED}, got {seed}")
    room = n_ticks - window_ticks + 1
    if room < 1:
        raise ConfigError(
            f"the traces ({n_ticks} ticks) are shorter than one window "
            f"({window_ticks} ticks); shorten the deadline"
        )
    rng = np.random.default_rng(seed)
    picks = (
        rng.choice(room, size=count, replace=False)
        if count <= room
        else rng.integers(0, room, size=count)
    )
    return sorted(int(s) for s in picks)


# -- one replay ---------------------------------------------------------------------------------
def run_window(window: Window, decide: Decide) -> WindowResult:
    """Replay one policy in one window under the billing and preemption rules above."""
    job, tick = window.job, window.tick_seconds
    avail, price, od = window.available, window.price, window.on_demand_price
    dt_hours = tick / 3600.0
    target = job.work_capacity_seconds - 1e-6
    progress, current, left, cost = 0.0, IDLE, 0.0, 0.0
    preemptions = restarts = spot_ticks = od_ticks = 0
    for t in range(window.ticks):
        if current >= 0 and not avail[current, t]:
            current, preemptions = IDLE, preemptions + 1
        action = decide(t, progress, current, left)
        if action == IDLE:
            current = IDLE
            continue
        if action >= 0:
            if not avail[action, t]:
                raise RuntimeError(
                    f"policy chose spot in zone {action} at tick {t}, where it is unavailable"
                )
            cost += price[action, t] * dt_hours
            spot_ticks += 1
        else:
            cost += od * dt_hours
            od_ticks += 1
        if action != current:
            current, left, restarts = action, job.restart_overhead_capacity_seconds, restarts + 1
        progress += max(0.0, tick - left)
        left = max(0.0, left - tick)
        if progress >= target:
            return WindowResult(cost, True, t, preemptions, restarts, spot_ticks, od_ticks)
    remaining = job.work_capacity_seconds - progress + job.restart_overhead_capacity_seconds
    return WindowResult(
        cost + od * remaining / 3600.0,
        False,
        window.ticks,
        preemptions,
        restarts,
        spot_ticks,
        od_ticks,
    )


def on_demand_cost(window: Window) -> float:
    """Always-on-demand: one launch, whole ticks until the work and one overhead are done."""
    job = window.job
    ticks = math.ceil(
        (job.work_capacity_seconds + job.restart_overhead_capacity_seconds) / window.tick_seconds
        - 1e-9
    )
    return ticks * window.tick_seconds / 3600.0 * window.on_demand_price


# -- many windows, one policy ---------------------------------------------------------------
OPTIMAL = "optimal"
"""The offline oracle answers by name too, though it is a bound rather than a policy."""


def policy_names() -> list[str]:
    return sorted(set(DEADLINE_POLICIES.names()) | {OPTIMAL})


@dataclass(frozen=True)
class SimulationReport:
    """One policy over many windows: the ``spot-pipelines simulate`` JSON contract."""

    policy: str
    starts: tuple[int, ...]
    costs: tuple[float, ...]
    deadline_misses: int
    on_demand_costs: tuple[float, ...]

    @property
    def mean_cost(self) -> float:
        return float(np.mean(self.costs))

    @property
    def mean_cost_vs_on_demand(self) -> float:
        return self.mean_cost / float(np.mean(self.on_demand_costs))

    def to_dict(self) -> dict[str, object]:
        return {
            "policy": self.policy,
            "mean_cost": self.mean_cost,
            "costs": list(self.costs),
            "deadline_misses": self.deadline_misses,
            "mean_cost_vs_on_demand": self.mean_cost_vs_on_demand,
            "start_ticks": list(self.starts),
        }


def window_cost(window: Window, policy: str) -> tuple[float, bool]:
    """(cost, finished in time) of the named policy in one window."""
    if policy == OPTIMAL:
        cost = optimal_cost(window)
        return cost, math.isfinite(cost)
    result = run_window(window, causal_plan(DEADLINE_POLICIES.get(policy), window))
    return result.cost, result.finished


def simulate(replay: Replay, job: Job, policy: str, starts: Sequence[int]) -> SimulationReport:
    """Replay ``policy`` in a window at each start tick (reported in ascending start order)."""
    if policy not in policy_names():
        raise ConfigError(f"unknown policy {policy!r}; choose one of {', '.join(policy_names())}")
    if not starts:
        raise ConfigError("no windows to simulate: pass --windows N (N >= 1) or --start-tick T")
    ordered = tuple(sorted(int(s) for s in starts))
    windows = [replay.window(s, job) for s in ordered]
    results = [window_cost(w, policy) for w in windows]
    return SimulationReport(
        policy,
        ordered,
        tuple(c for c, _ in results),
        sum(1 for _, ok in results if not ok),
        tuple(on_demand_cost(w) for w in windows),
    )
