"""Deadline policies are causal by construction: what happens after tick t cannot change
what any policy does up to t, and a policy that tries to look ahead is stopped."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from spot_core.market.trace import load_traces
from spot_core.policy.deadline.base import IDLE, ON_DEMAND, Job, Window
from spot_core.policy.deadline.causal import FutureRead, causal_plan
from spot_core.policy.deadline.policies import DEADLINE_POLICIES
from spot_core.policy.deadline.replay import Replay
from spot_core.sim.simulator import random_starts, run_window

TRACES = Path(__file__).resolve().parents[2] / "traces"
MARKETS = {
    "gcp-us-8-zones": sorted((TRACES / "gcp-h100-2025-10").glob("us-*.json")),
    "aws-4node-3-zones": sorted((TRACES / "aws-v100-4node-600s").glob("*.json")),
}


def _windows(paths: list[Path], count: int, deadline_hours: float, overhead_hours: float):
    replay = Replay.from_traces(load_traces([str(p) for p in paths]))
    job = Job.from_hours(48, deadline_hours, overhead_hours)
    starts = random_starts(replay.n_ticks, replay.deadline_ticks(job), count, seed=7)
    return [replay.window(start, job) for start in starts]


def _scrambled_after(window: Window, t: int, rng: np.random.Generator) -> Window:
    """The same window up to tick t; random availability and prices after it."""
    available, price = window.available.copy(), window.price.copy()
    after = available[:, t + 1 :].shape
    available[:, t + 1 :] = rng.random(after) < 0.5
    price[:, t + 1 :] = rng.uniform(0.1, 3.0, after) * price.max()
    return dataclasses.replace(window, available=available, price=price)


def _actions(policy_name: str, window: Window) -> list[int]:
    actions: list[int] = []
    decide = causal_plan(DEADLINE_POLICIES.get(policy_name), window)

    def recording(t: int, progress: float, current: int, left: float) -> int:
        actions.append(decide(t, progress, current, left))
        return actions[-1]

    run_window(window, recording)
    return actions


@pytest.mark.parametrize("market", sorted(MARKETS))
@pytest.mark.parametrize("policy", DEADLINE_POLICIES.names())
def test_actions_up_to_t_do_not_depend_on_what_comes_after(policy: str, market: str) -> None:
    rng = np.random.default_rng(11)
    for deadline, overhead in ((52, 0.2), (70, 0.05)):
        for window in _windows(MARKETS[market], 2, deadline, overhead):
            real = _actions(policy, window)
            for t in sorted(rng.choice(window.ticks - 2, size=3, replace=False)):
                other = _actions(policy, _scrambled_after(window, int(t), rng))
                upto = min(int(t) + 1, len(real), len(other))
                assert real[:upto] == other[:upto], (
                    f"{policy} on {market} acted differently before tick {t} once the "
                    "future changed"
                )


def _window() -> Window:
    return _windows(MARKETS["aws-4node-3-zones"], 1, 52, 0.05)[0]


@dataclasses.dataclass(frozen=True)
class _PeeksAtNextTick:
    def plan(self, window: Window):
        return lambda t, progress, current, left: 0 if window.available[0, t + 1] else ON_DEMAND


@dataclasses.dataclass(frozen=True)
class _PlansOnTheWholeWindow:
    def plan(self, window: Window):
        share = float(np.asarray(window.available).mean())
        return lambda t, progress, current, left: IDLE if share > 0.5 else ON_DEMAND


@dataclasses.dataclass(frozen=True)
class _SumsTheFuture:
    def plan(self, window: Window):
        return lambda t, progress, current, left: (
            ON_DEMAND if window.price[:, t : t + 5].sum() > 0 else IDLE
        )


@dataclasses.dataclass(frozen=True)
class _CallsArrayMethods:
    def plan(self, window: Window):
        up = window.available.any()
        return lambda t, progress, current, left: 0 if up else ON_DEMAND


@pytest.mark.parametrize(
    "cheat",
    [_PeeksAtNextTick(), _PlansOnTheWholeWindow(), _SumsTheFuture(), _CallsArrayMethods()],
    ids=lambda c: type(c).__name__,
)
def test_a_policy_that_reads_ahead_is_stopped(cheat) -> None:
    with pytest.raises(FutureRead, match="tick"):
        run_window(_window(), causal_plan(cheat, _window()))


def test_reads_up_to_now_and_the_history_are_allowed() -> None:
    window = _window()
    seen: list[float] = []

    @dataclasses.dataclass(frozen=True)
    class Honest:
        def plan(self, view: Window):
            seen.append(float(view.past_price.mean()))
            return lambda t, progress, current, left: (
                seen.append(float(view.price[:, : t + 1].sum()) + int(view.available[-1, t]))
                or ON_DEMAND
            )

    result = run_window(window, causal_plan(Honest(), window))
    assert result.finished and len(seen) > 1
