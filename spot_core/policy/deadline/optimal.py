"""The offline optimum: the cheapest schedule with full knowledge of the window's future.

Dynamic programming backwards over ticks, on the state (tick, progress, instance), where
the instance is idle or (market/zone, ticks since its launch, capped where the restart
overhead is over). It is the lower bound the benchmark reports against, never a policy a
live job can run.

Progress is counted in units of ``gcd(tick, overhead)`` seconds, in which every gain a
tick can make is a whole number, so the optimum is exact for the simulator's model
whenever both are whole seconds (the shipped traces' 195 s / 600 s ticks with 0.05 h or
0.2 h overheads are). Only progress within the slack band matters: at tick ``t`` a job
still able to finish has done at least ``C - (T - t) * tick``, and at most ``t * tick``,
so the table is (instances x band) wide, not (instances x C). If the band would exceed
``MAX_BAND`` units the unit is coarsened and gains rounded down, which keeps every
schedule it finds feasible (the value is then an upper bound on the optimum).
"""

from __future__ import annotations

import math

import numpy as np

from spot_core.policy.deadline.base import Window

MAX_BAND = 20_000


def _units(window: Window) -> tuple[float, int, int, list[int]]:
    """(unit seconds, tick units, work units, gain units per phase since launch)."""
    job, tick = window.job, window.tick_seconds
    millis = [round(tick * 1000), round(job.restart_overhead_capacity_seconds * 1000)]
    exact = all(
        abs(m - v * 1000) < 1e-6
        for m, v in zip(millis, (tick, job.restart_overhead_capacity_seconds), strict=True)
    )
    unit = math.gcd(*millis) / 1000 if exact and millis[1] else (tick if exact else 1.0)
    slack = window.ticks * tick - job.work_capacity_seconds
    unit = max(unit, slack / MAX_BAND) if slack > 0 else unit
    phases = max(1, math.ceil(job.restart_overhead_capacity_seconds / tick - 1e-9))
    gains = [
        min(tick, max(0.0, (j + 1) * tick - job.restart_overhead_capacity_seconds))
        for j in range(phases + 1)
    ]
    return (
        unit,
        math.floor(tick / unit + 1e-9),
        math.ceil(job.work_capacity_seconds / unit - 1e-9),
        [math.floor(g / unit + 1e-9) for g in gains],
    )


def optimal_cost(window: Window) -> float:
    """Minimum cost to finish the window's job by its deadline (``inf`` if impossible)."""
    unit, step, work, gains = _units(window)
    ticks = window.ticks
    band = ticks * step - work
    if band < 0:
        return math.inf
    width = band + 1
    phases = len(gains) - 1  # continuing states 1..phases; ``phases`` = past the overhead
    n_spot = window.n_zones
    hours = window.tick_seconds / 3600.0
    od_cost = window.on_demand_price * hours
    idle = np.full(width, np.inf)
    cont = np.full((n_spot + 1, phases, width), np.inf)  # [instance, phase-1, offset]
    for t in range(ticks - 1, -1, -1):
        remaining = (ticks - t) * step
        price = np.empty((n_spot + 1, 1))
        price[:n_spot, 0] = np.where(window.available[:, t], window.price[:, t] * hours, np.inf)
        price[n_spot, 0] = od_cost
        runs = [
            price + _after(cont[:, min(p + 1, phases) - 1], gains[p], step, remaining)
            for p in range(phases + 1)
        ]
        new_idle = np.minimum(_after(idle, 0, step, remaining), runs[0].min(axis=0))
        cont = np.minimum(np.stack(runs[1:], axis=1), new_idle)
        idle = new_idle
    return float(idle[band])


def _after(values: np.ndarray, gain: int, step: int, remaining: int) -> np.ndarray:
    """Value at the next tick after gaining ``gain`` units, for every offset of this tick.

    Offset ``o`` (progress above the least that can still finish) becomes
    ``o + gain - step``; below zero the deadline can no longer be met (inf); once
    ``o + gain`` reaches ``remaining`` the job is done and costs nothing more.
    """
    width = values.shape[-1]
    out = np.full(values.shape, np.inf)
    shift = step - gain
    if shift < width:
        out[..., shift:] = values[..., : width - shift]
    done = max(0, remaining - gain)
    if done < width:
        out[..., done:] = 0.0
    return out
