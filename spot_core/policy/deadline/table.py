"""Solving the default deadline policy's plan (``mdp.ForecastDP``): expected cost to
finish by the deadline, backwards over (tick, progress, instance, capacity state), with
the simulator's billing, restarts and preemption rules, and any risk of missing the
deadline priced prohibitively (``LOST``). ``DecisionTable`` holds the best action per
state; the policy looks up the state it observes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from spot_core.policy.deadline.base import IDLE, ON_DEMAND, Window
from spot_core.policy.deadline.forecast import MarketModel

CODE_IDLE, CODE_ON_DEMAND, CODE_SPOT, CODE_FALLBACK = 0, 1, 2, 3
"""Action codes in the decision table (``CODE_FALLBACK``: spot in a fallback zone)."""


@dataclass(frozen=True, eq=False)
class DecisionTable:
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
    ) -> tuple[DecisionTable, float]:
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
        idle = np.full((k, width), LOST)
        od = np.full((k, phases, width), LOST)
        spots = [np.full((k, phases, width), LOST) for _ in classes]
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
                runs[~up] = LOST  # no capacity in the class now: neither launched nor kept
                spot_runs.append(runs)
                options.append(runs[:, 0])
            stacked = np.stack(options)
            # ties go to the cheaper-to-hold action: idle, then on-demand, then spot
            choice = np.argmin(stacked, axis=0).astype(np.uint8)
            best = stacked.min(axis=0)
            out = actions[t]
            out[:, 0] = choice
            od, out[:, 1 : phases + 1] = _keep_if_better(
                best, choice, od_runs[:, 1:], CODE_ON_DEMAND
            )
            for j, runs in enumerate(spot_runs):
                first_col = (1 + j) * phases + 1
                spots[j], out[:, first_col : first_col + phases] = _keep_if_better(
                    best, choice, runs[:, 1:], CODE_SPOT + j
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
            return CODE_ON_DEMAND
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


LOST = 1e30
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
        out = np.full((values.shape[0], len(self.gains), width), LOST)
        for p, (gain, row) in enumerate(zip(self.gains, self.rows, strict=True)):
            shift = step - gain  # cell o reads cell o - shift
            if shift < width:
                out[:, p, shift:] = values[:, row, : width - shift]
            out[:, p, max(0, remaining - gain) :] = 0.0
        out += price
        return out

    def idle(self, values: np.ndarray, remaining: int) -> np.ndarray:
        width = values.shape[-1]
        out = np.full(values.shape, LOST)
        if self.step < width:
            out[:, self.step :] = values[:, : width - self.step]
        out[:, remaining:] = 0.0
        return out
