"""Deadline policies: spot, on-demand or idle, tick by tick, so a job finishes by its deadline.

The setting is the NSDI'24 "Can't Be Late" one (see ``traces/README.md`` in the repository): a
job needs ``C`` seconds of work by deadline ``D``; spot is cheap but comes and goes,
on-demand is dear and always there, and every new instance costs a restart overhead
``R``. A policy ``plan``s one :class:`Window` and returns ``decide(t, progress, current,
overhead_left) -> action`` with the action ``IDLE``, ``ON_DEMAND`` or a zone index (spot
there). At tick ``t`` a policy reads the window's arrays only up to column ``t``, plus
the history before the window, so it can run unchanged on a live market; the simulator and
the live planner enforce it (:mod:`spot_core.policy.deadline.causal`: a read past the current tick
raises).

Policies here:

- ``on-demand``: always on-demand (the reference cost).
- ``greedy``: spot whenever some zone has it (stay in a zone while it lasts, else the
  cheapest available); on-demand only when the safety nets force it.
- ``uniform-progress``: the paper's rules (its artifact's ``rc_cr_threshold``), lifted
  to several zones like the artifact's multi-region version: spot whenever available;
  otherwise idle while on or above the line ``C * t / D`` and on-demand below it; once on
  on-demand, stay until spot is available and progress is above where the line will be
  two overheads from now; plus both safety nets (:func:`safety_net`).
- ``default``: the project's own, :class:`spot_core.policy.deadline.mdp.ForecastDP`.
- ``optimal``: the offline oracle, in :mod:`spot_core.policy.deadline.optimal`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from spot_core.errors import ConfigError

IDLE = -1
ON_DEMAND = -2
"""Actions: ``IDLE``, ``ON_DEMAND`` or a zone index (spot in that zone)."""

HISTORY_HOURS = 7 * 24.0
"""How much trace before a window a policy may look back at (a week: hour-of-week
patterns and run lengths need that much)."""

PLAN_SLACK_TICKS = 512
"""Ticks of slack a policy that plans tables (``default``'s DP) holds beyond the work and
two restarts. Its tables grow with the window's ticks times its slack: a 14-day deadline
took 35 s and 2 GB to plan a job of one hour (live and in ``simulate``), 50 years would
have asked for hundreds of GiB. A deadline further away is planned as if it were this
close (``planning_horizon``): the tables are sized from the work, and the job can only
finish earlier. 512 ticks: 28 h of 195 s ticks, 85 h of 600 s ones; every window of the
evaluation and development sets (48 h of work, 52-70 h deadlines) is planned whole."""

PLAN_MAX_TICKS = 10_000
"""The most ticks such a plan holds (the work, two restarts and the slack): a job whose
work needs more is refused up front in one line (at most about 440 MB and a few seconds
of planning, bench/README.md)."""

Decide = Callable[[int, float, int, float], int]
"""``decide(t, progress_seconds, current, overhead_left_seconds) -> action``."""


@dataclass(frozen=True, eq=False)
class Job:
    """What must be done: work, deadline (from the window's start) and restart overhead,
    all in capacity seconds (trace seconds: the window's clock)."""

    work_capacity_seconds: float
    deadline_capacity_seconds: float
    restart_overhead_capacity_seconds: float

    @classmethod
    def from_hours(cls, task: float, deadline: float, overhead: float) -> Job:
        for name, value in (
            ("task hours", task),
            ("deadline hours", deadline),
            ("restart overhead hours", overhead),
        ):
            if not (isinstance(value, (int, float)) and math.isfinite(value)):
                raise ConfigError(f"{name} must be a finite number, got {value!r}")
        if not task > 0 or overhead < 0:
            raise ConfigError(
                f"task hours must be > 0 and restart overhead >= 0 (got {task:g}, {overhead:g})"
            )
        if deadline < task:
            raise ConfigError(
                f"the deadline ({deadline:g} h) is shorter than the work "
                f"({task:g} h); no policy can finish in time: raise "
                "--deadline-hours"
            )
        return cls(task * 3600.0, deadline * 3600.0, overhead * 3600.0)


@dataclass(frozen=True, eq=False)
class Window:
    """One replay: ``ticks`` whole ticks of every zone, starting at trace row ``start``.

    ``available``/``price`` are (zones x ticks); ``past_available``/``past_price`` the
    same zones over up to ``HISTORY_HOURS`` before the window (what a real scheduler
    would have logged already).
    """

    start: int
    ticks: int
    tick_seconds: float
    job: Job
    available: np.ndarray
    price: np.ndarray
    on_demand_price: float
    past_available: np.ndarray
    past_price: np.ndarray
    zones: tuple[str, ...]

    @property
    def n_zones(self) -> int:
        return int(self.available.shape[0])


class DeadlinePolicy(Protocol):
    """A deadline policy: ``plan`` a window, get a per-tick ``decide`` function back."""

    def plan(self, window: Window) -> Decide: ...


# -- shared rules ------------------------------------------------------------------------------
def whole_ticks(seconds: float, tick: float) -> int:
    return math.ceil(seconds / tick - 1e-9)


def planning_horizon(job: Job, tick: float, ticks: int, *, policy: str = "") -> int:
    """The ticks a plan holds of a ``ticks``-long window: the work, two restarts and
    ``PLAN_SLACK_TICKS`` (fewer if the window is shorter); a one-line ``ConfigError`` past
    ``PLAN_MAX_TICKS``."""
    need = whole_ticks(job.work_capacity_seconds + 2 * job.restart_overhead_capacity_seconds, tick)
    horizon = min(ticks, need + PLAN_SLACK_TICKS)
    if horizon > PLAN_MAX_TICKS:
        most = (PLAN_MAX_TICKS - PLAN_SLACK_TICKS) * tick / 3600
        raise ConfigError(
            f"deadline policy {policy or 'plans'}: the work and two restarts "
            f"need {need:,} ticks of {tick:g} s; a plan holds at most "
            f"{PLAN_MAX_TICKS:,} (work up to about {most:,.0f} h here); split "
            "the job, or use a policy without tables (greedy, "
            "uniform-progress), or none"
        )
    return horizon


def truncated(window: Window, ticks: int) -> Window:
    """The window's first ``ticks`` ticks, its deadline moved to their end."""
    if ticks >= window.ticks:
        return window
    job = Job(
        window.job.work_capacity_seconds,
        ticks * window.tick_seconds,
        window.job.restart_overhead_capacity_seconds,
    )
    return dataclasses.replace(
        window,
        ticks=ticks,
        job=job,
        available=_first_ticks(window.available, ticks),
        price=_first_ticks(window.price, ticks),
    )


def _first_ticks(array: np.ndarray, ticks: int) -> np.ndarray:
    """``array[:, :ticks]``; a causal view (``spot_core.policy.deadline.causal``) cuts itself
    without reading the ticks still to come."""
    head = getattr(type(array), "head", None)
    first: np.ndarray = head(array, ticks) if head is not None else array[:, :ticks]
    return first


def safety_net(window: Window, t: int, progress: float, current: int, left: float) -> int | None:
    """The deadline policies' two safety nets, or None when neither applies.

    With ``n`` whole ticks left and ``w`` work left: if ``n <= ceil((w + 2R) / tick)`` and
    the job is not on spot, on-demand; if ``n <= ceil((w + R) / tick)``, only a spot
    instance already past its restart overhead may continue, anything else goes
    on-demand. Why two: the first leaves room for one more preemption, the second is the
    last moment at which a fresh instance can still make it.
    """
    job, tick = window.job, window.tick_seconds
    ticks_left = window.ticks - t
    work_left = job.work_capacity_seconds - progress
    if ticks_left <= whole_ticks(work_left + job.restart_overhead_capacity_seconds, tick):
        return current if current >= 0 and left <= 1e-9 else ON_DEMAND
    if (
        ticks_left <= whole_ticks(work_left + 2 * job.restart_overhead_capacity_seconds, tick)
        and current < 0
    ):
        return ON_DEMAND
    return None


def cheapest_available(window: Window, t: int, current: int) -> int | None:
    """Stay in the current spot zone while it lasts, else the cheapest available zone."""
    if current >= 0:
        return current
    column = window.available[:, t]
    if not column.any():
        return None
    prices = np.where(column, window.price[:, t], np.inf)
    return int(np.argmin(prices))


# -- baselines ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class AlwaysOnDemand:
    """Never touches spot: the cost every saving is measured against."""

    def plan(self, window: Window) -> Decide:
        return lambda t, progress, current, left: ON_DEMAND


@dataclass(frozen=True)
class Greedy:
    """Spot whenever some zone has it; on-demand only when the safety nets force it."""

    def plan(self, window: Window) -> Decide:
        def decide(t: int, progress: float, current: int, left: float) -> int:
            forced = safety_net(window, t, progress, current, left)
            if forced is not None:
                return forced
            spot = cheapest_available(window, t, current)
            return IDLE if spot is None else spot

        return decide


@dataclass(frozen=True)
class UniformProgress:
    """The paper's Uniform Progress (see the module docstring for its rules)."""

    def plan(self, window: Window) -> Decide:
        job, tick = window.job, window.tick_seconds
        rate = job.work_capacity_seconds / job.deadline_capacity_seconds

        def decide(t: int, progress: float, current: int, left: float) -> int:
            forced = safety_net(window, t, progress, current, left)
            if forced is not None:
                return forced
            spot = cheapest_available(window, t, current)
            if current == ON_DEMAND:
                ahead = progress > rate * (t * tick + 2 * job.restart_overhead_capacity_seconds)
                return spot if spot is not None and ahead else ON_DEMAND
            if spot is not None:
                return spot
            return IDLE if progress >= rate * t * tick else ON_DEMAND

        return decide
