"""Causal by construction: a deadline policy sees its window only up to the current tick.

A policy ``plan``s a :class:`~spot_core.policy.deadline.base.Window` and answers
``decide(t, ...)`` tick by tick. Replayed on a trace, the whole window is in memory, so
"never read ahead" used to be a convention. Here it is enforced: :func:`causal_plan`
hands the policy a window whose ``available`` and ``price`` are :class:`CausalArray`
views over the real arrays, tied to a clock that the wrapper moves to ``t`` before each
``decide(t, ...)`` (and holds at tick 0 while planning). Any read of a column past the
clock (an index, a slice, a mask, or converting the whole array) raises
:class:`FutureRead`. The history before the window (``past_available`` /
``past_price``) is untouched: a live scheduler has logged it already.

Why a view and not a copy cut at ``t``: the policy's code runs unchanged on a live market,
where a window is only ever known up to now, and a test can prove a policy never peeks by
replaying it on windows that differ only after tick ``t``.

The offline ``optimal`` oracle is not a policy and never goes through this.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Any, NoReturn, cast

import numpy as np

from spot_core.policy.deadline.base import DeadlinePolicy, Decide, Window


class FutureRead(RuntimeError):
    """A deadline policy read a tick of its window past the current one."""


class Clock:
    """The current tick of one planned window (shared by all its views)."""

    __slots__ = ("now",)

    def __init__(self, now: int = 0) -> None:
        self.now = now


class CausalArray:
    """A read-only view of a (zones x ticks) or (ticks,) array that refuses the future.

    Rows (zones) may be picked freely; the last axis (ticks) may be read up to
    ``clock.now`` only. Reads that return data hand back plain ``numpy`` arrays.
    """

    __slots__ = ("_data", "_clock")

    def __init__(self, data: np.ndarray, clock: Clock) -> None:
        self._data = data
        self._clock = clock

    # -- what may be asked without reading ticks -----------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return self._data.shape

    @property
    def ndim(self) -> int:
        return self._data.ndim

    @property
    def dtype(self) -> np.dtype:
        return self._data.dtype

    def __len__(self) -> int:
        return len(self._data)

    def head(self, ticks: int) -> CausalArray:
        """The view of the first ``ticks`` ticks (cutting the window reads none of them)."""
        return CausalArray(self._data[..., :ticks], self._clock)

    # -- reads -----------------------------------------------------------------------------
    def __getitem__(self, key: Any) -> Any:
        if self._data.ndim == 1:
            self._check(key)
            return self._data[key]
        if not isinstance(key, tuple):
            rows = self._data[key]
            return CausalArray(rows, self._clock) if np.ndim(rows) else rows
        if len(key) == 1:
            return self[key[0]]
        if len(key) != 2 or any(k is Ellipsis or k is None for k in key):
            raise FutureRead(
                f"index {key!r} is not (zones, ticks); a policy reads its window "
                "as window.available[zones, ticks]"
            )
        self._check(key[1])
        return self._data[key]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        self._check(slice(None))
        return np.asarray(self._data, dtype=dtype)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise FutureRead(
            f"window.available/price offer only indexing up to the current tick; "
            f"`.{name}` of the whole array would read ticks still to come"
        )

    def __iter__(self) -> NoReturn:
        raise FutureRead("iterating a window array reads every tick; index it up to now")

    def _check(self, ticks: Any) -> None:
        """Raise unless every tick that ``ticks`` selects is at or before the clock."""
        n, now = self._data.shape[-1], self._clock.now
        last = _last_index(ticks, n)
        if last is not None and last > now:
            raise FutureRead(
                f"a deadline policy read tick {last} of its window at tick {now}; "
                "a policy may read only up to the current tick"
            )


def _last_index(ticks: Any, n: int) -> int | None:
    """The highest tick index ``ticks`` selects on an axis of length ``n`` (None: none)."""
    if isinstance(ticks, slice):
        selected = range(*ticks.indices(n))
        return max(selected[0], selected[-1]) if len(selected) else None
    if isinstance(ticks, (list, np.ndarray)):
        chosen = np.asarray(ticks)
        if chosen.dtype == bool:
            chosen = np.flatnonzero(chosen)
        if chosen.size == 0:
            return None
        return int(np.max(np.where(chosen < 0, chosen + n, chosen)))
    index = operator.index(ticks)
    return index + n if index < 0 else index


def causal_window(window: Window, clock: Clock) -> Window:
    """``window`` with its ticks behind ``clock`` (the history stays readable)."""
    # A CausalArray stands in for the window's arrays: a policy indexes it as it would them.
    return dataclasses.replace(
        window,
        available=cast(np.ndarray, CausalArray(window.available, clock)),
        price=cast(np.ndarray, CausalArray(window.price, clock)),
    )


def causal_plan(policy: DeadlinePolicy, window: Window) -> Decide:
    """Plan ``window`` with ``policy`` seeing tick 0 only, and a ``decide`` that sees each
    tick ``t`` it is asked about, and none after it."""
    clock = Clock(0)
    decide = policy.plan(causal_window(window, clock))

    def decide_now(t: int, progress: float, current: int, left: float) -> int:
        clock.now = t
        return decide(t, progress, current, left)

    return decide_now


__all__ = ["CausalArray", "Clock", "FutureRead", "causal_plan", "causal_window"]
