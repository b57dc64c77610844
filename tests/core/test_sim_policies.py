"""The policy simulator and the deadline policies on hand-built traces with known answers."""

from __future__ import annotations

import numpy as np
import pytest

from spot_core.errors import ConfigError
from spot_core.market.trace import ZoneTrace
from spot_core.policy.deadline.base import IDLE, ON_DEMAND, Job, UniformProgress, Window
from spot_core.policy.deadline.optimal import optimal_cost
from spot_core.policy.deadline.policies import DEADLINE_POLICIES
from spot_core.policy.deadline.replay import Replay
from spot_core.sim.simulator import run_window, simulate

HOUR = 3600.0


def _replay(*zones: tuple[list[int], float], od: float = 10.0) -> Replay:
    traces = [
        ZoneTrace(
            f"zone{i}_x",
            HOUR,
            np.array(avail, dtype=bool),
            np.full(len(avail), price),
            od,
            None,
            "test",
        )
        for i, (avail, price) in enumerate(zones)
    ]
    return Replay.from_traces(traces)


def _costs(replay: Replay, job: Job) -> dict[str, float]:
    names = ["on-demand", "greedy", "uniform-progress", "default", "optimal"]
    return {n: simulate(replay, job, n, [0]).costs[0] for n in names}


def test_waiting_for_spot_beats_uniform_progress_without_overhead():
    # spot arrives at tick 2; UP goes on-demand at tick 1 (behind its line) and its
    # hysteresis keeps it there one more tick; greedy and the optimum simply wait.
    costs = _costs(_replay(([0, 0, 1, 1, 1, 1], 1.0)), Job.from_hours(3, 6, 0))
    assert costs["on-demand"] == pytest.approx(30.0)
    assert costs["greedy"] == pytest.approx(3.0)
    assert costs["uniform-progress"] == pytest.approx(21.0)
    assert costs["optimal"] == pytest.approx(3.0)
    assert costs["default"] == pytest.approx(3.0)


def test_restart_overhead_and_safety_net():
    # 0.5 h overhead per new instance; spot for 3 ticks, an outage of 2, spot again.
    # The optimum restarts on spot after the outage (5 $); greedy and UP idle through
    # the outage, then the two-overhead safety net puts them on on-demand (23 $).
    replay = _replay(([1, 1, 1, 0, 0, 1, 1, 1], 1.0))
    job = Job.from_hours(4, 8, 0.5)
    costs = _costs(replay, job)
    assert costs["on-demand"] == pytest.approx(50.0)  # ceil(4.5 h) ticks at 10 $/h
    assert costs["greedy"] == pytest.approx(23.0)
    assert costs["uniform-progress"] == pytest.approx(23.0)
    assert costs["optimal"] == pytest.approx(5.0)
    assert costs["optimal"] <= costs["default"] <= costs["greedy"]
    result = run_window(
        replay.window(0, job), DEADLINE_POLICIES.get("greedy").plan(replay.window(0, job))
    )
    assert (result.preemptions, result.restarts, result.spot_ticks, result.on_demand_ticks) == (
        1,
        2,
        3,
        2,
    )


def test_multi_zone_costs():
    # zone 0 at 1 $/h comes and goes, zone 1 at 2 $/h stays: the optimum idles a tick to
    # use zone 0 again (4 $); greedy and UP hop to zone 1 and stay (5 $).
    replay = _replay(([1, 0, 0, 1], 1.0), ([1, 1, 1, 1], 2.0))
    costs = _costs(replay, Job.from_hours(3, 4, 0))
    assert costs["on-demand"] == pytest.approx(30.0)
    assert costs["greedy"] == pytest.approx(5.0)
    assert costs["uniform-progress"] == pytest.approx(5.0)
    assert costs["optimal"] == pytest.approx(4.0)
    assert costs["optimal"] <= costs["default"] <= costs["greedy"]


def test_billing_is_per_whole_tick_and_overhead_in_seconds():
    # 195 s ticks, 180 s overhead: the first tick makes 15 s of progress.
    trace = ZoneTrace("z_x", 195.0, np.ones(40, dtype=bool), np.full(40, 1.0), 3.06, None, "t")
    replay = Replay.from_traces([trace])
    job = Job(
        work_capacity_seconds=195.0 * 3,
        deadline_capacity_seconds=195.0 * 40,
        restart_overhead_capacity_seconds=180.0,
    )
    result = run_window(
        replay.window(0, job), DEADLINE_POLICIES.get("greedy").plan(replay.window(0, job))
    )
    assert result.finish_tick == 3 and result.spot_ticks == 4  # 15 + 195 + 195 + 195 s
    assert result.cost == pytest.approx(4 * 195 / 3600)
    assert optimal_cost(replay.window(0, job)) == pytest.approx(result.cost)


def test_optimal_is_a_lower_bound_on_random_traces():
    rng = np.random.default_rng(7)
    for _ in range(15):
        zones = [
            (list(rng.random(30) < rng.uniform(0.3, 0.9)), float(rng.uniform(0.5, 3)))
            for _ in range(int(rng.integers(1, 4)))
        ]
        replay = _replay(*zones)
        job = Job.from_hours(float(rng.integers(8, 20)), 28, float(rng.choice([0, 0.5, 1.5])))
        costs = _costs(replay, job)
        assert costs["optimal"] <= min(costs.values()) + 1e-9
        for name in ("greedy", "uniform-progress", "default"):
            assert simulate(replay, job, name, [0]).deadline_misses == 0


def test_policies_never_read_the_future():
    rng = np.random.default_rng(3)
    avail = rng.random((2, 60)) < 0.6
    replay = Replay.from_traces(
        [
            ZoneTrace(f"z{i}_x", HOUR, avail[i], np.full(60, 1.0 + i), 10.0, None, "t")
            for i in range(2)
        ]
    )
    job = Job.from_hours(40, 55, 0.5)
    for name in ("greedy", "uniform-progress", "default"):
        base = _actions(replay.window(0, job), name)
        changed = avail.copy()
        changed[:, 30:] = ~changed[:, 30:]
        other = Replay.from_traces(
            [
                ZoneTrace(f"z{i}_x", HOUR, changed[i], np.full(60, 1.0 + i), 10.0, None, "t")
                for i in range(2)
            ]
        )
        assert _actions(other.window(0, job), name)[:30] == base[:30], name


def _actions(window: Window, name: str) -> list[int]:
    decide = DEADLINE_POLICIES.get(name).plan(window)
    seen: list[int] = []

    def record(t, progress, current, left):
        seen.append(decide(t, progress, current, left))
        return seen[-1]

    run_window(window, record)
    return seen


# -- uniform progress, rule by rule -------------------------------------------------------------
def _up_window(
    avail: list[int], task: float = 4.0, deadline: float = 8.0, overhead: float = 0.5
) -> tuple[Window, object]:
    replay = _replay((avail, 1.0))
    window = replay.window(0, Job.from_hours(task, deadline, overhead))
    return window, UniformProgress().plan(window)


def test_up_takes_spot_whenever_available_even_when_behind():
    _, decide = _up_window([0, 0, 1, 1, 1, 1, 1, 1])
    assert decide(2, 0.0, IDLE, 0.0) == 0


def test_up_idles_when_ahead_and_uses_on_demand_when_behind():
    _, decide = _up_window([0] * 8)
    assert decide(0, 0.0, IDLE, 0.0) == IDLE  # on the line counts as ahead
    assert decide(2, 1.0 * HOUR, IDLE, 0.0) == IDLE  # target 1.0 h: on it
    assert decide(2, 0.9 * HOUR, IDLE, 0.0) == ON_DEMAND


def test_up_hysteresis_keeps_on_demand_until_ahead_of_target_two_overheads_on():
    _, decide = _up_window([1] * 8)
    # at t = 2 h the target in 2R = 1 h is 0.5 * 3 h = 1.5 h
    assert decide(2, 1.5 * HOUR, ON_DEMAND, 0.0) == ON_DEMAND
    assert decide(2, 1.6 * HOUR, ON_DEMAND, 0.0) == 0


def test_up_safety_net_two_overheads_when_not_on_spot():
    _, decide = _up_window([1] * 8)
    # 4 whole ticks left, 2.5 h of work: ceil((2.5 + 1) / 1) = 4 -> on-demand, even with
    # spot available and progress far ahead of the line
    assert decide(4, 1.5 * HOUR, IDLE, 0.0) == ON_DEMAND
    assert decide(4, 1.5 * HOUR, 0, 0.0) == 0  # a running spot instance may stay


def test_up_safety_net_one_overhead_only_spot_past_its_overhead_continues():
    _, decide = _up_window([1] * 8)
    # 4 ticks left, 3.5 h of work: ceil((3.5 + 0.5) / 1) = 4
    assert decide(4, 0.5 * HOUR, 0, 0.0) == 0
    assert decide(4, 0.5 * HOUR, 0, 0.3 * HOUR) == ON_DEMAND
    assert decide(4, 0.5 * HOUR, IDLE, 0.0) == ON_DEMAND


# -- the default's forecast: run ages, zone choice ----------------------------------------------
def _with_history(
    avail: list[list[int]], past: list[list[int]], prices: list[float], job: Job
) -> Window:
    """A one-hour-tick window with the given history before it (zones x ticks)."""
    a, h = np.array(avail, dtype=bool), np.array(past, dtype=bool)
    price = np.array(prices, dtype=float)[:, None]
    ticks = int(job.deadline_capacity_seconds // HOUR)
    return Window(
        0,
        ticks,
        HOUR,
        job,
        a[:, :ticks],
        np.repeat(price, ticks, 1),
        10.0,
        h,
        np.repeat(price, h.shape[1], 1),
        tuple(f"z{i}" for i in range(len(avail))),
    )


def test_capacity_states_are_age_buckets_of_the_current_run():
    from spot_core.policy.deadline.mdp import capacity_states

    anywhere = np.array([1, 1, 1, 1, 0, 0, 1], dtype=bool)
    # up ages 0,1 -> bucket 0, 2+ -> 1; down age 0 -> state 2, 1+ -> state 3
    assert capacity_states(anywhere, (2.0,), (1.0,)).tolist() == [0, 0, 1, 1, 2, 3, 0]


FLICKERS = ([1, 0, 0] * 4 + [1] * 12 + [0, 0]) * 8  # 1-tick flickers, then 12-tick runs


def test_semi_markov_forecast_learns_that_young_runs_end_soon():
    from spot_core.policy.deadline.mdp import ForecastDP, fit_model

    job = Job.from_hours(10, 40, 1.5)
    window = _with_history([[0] * 40], [FLICKERS], [1.0], job)
    # the whole history alike: at these 1-hour ticks the default 48-hour half-life leaves
    # about 70 ticks' weight of it against the prior's 24
    model = fit_model(
        window, ForecastDP(up_edges_hours=(1.0,), down_edges_hours=(), history_half_life_hours=0.0)
    )
    assert model.n_up == 2 and model.n_states == 3
    young_drop, old_drop = model.trans[0, 2], model.trans[1, 2]
    assert young_drop > 0.5 and old_drop < 0.15 and young_drop > 3 * old_drop


def test_default_waits_out_flickers_a_restart_cannot_repay():
    # a 1.5 h restart on 1 h ticks: a 1-tick run gives no progress at all. The history
    # says fresh runs mostly die after a tick, runs past one tick last; the window
    # repeats that. The semi-Markov default starts spot only on runs a tick old (12 $);
    # the memoryless forecast takes every flicker (15 $).
    from spot_core.policy.deadline.mdp import ForecastDP

    job = Job.from_hours(10, 60, 1.5)
    avail = [1, 0, 0, 1, 0, 0, 1, 0, 0] + [1] * 51
    window = _with_history([avail], [FLICKERS], [1.0], job)
    decide = ForecastDP(up_edges_hours=(1.0,), down_edges_hours=()).plan(window)
    seen: list[int] = []

    def record(t, progress, current, left):
        seen.append(decide(t, progress, current, left))
        return seen[-1]

    result = run_window(window, record)
    assert result.finished and result.preemptions == 0 and result.cost == pytest.approx(12.0)
    assert seen[:10] == [IDLE] * 10 and seen[10] == 0
    memoryless = ForecastDP(up_edges_hours=(), down_edges_hours=()).plan(window)
    assert run_window(window, memoryless).cost == pytest.approx(15.0)


def test_zone_chooser_expects_old_runs_to_last_and_moves_for_a_real_saving():
    from spot_core.policy.deadline.zones import ZoneChooser

    job = Job.from_hours(10, 30, 0.5)
    history = [FLICKERS, [1] * len(FLICKERS), [1] * len(FLICKERS)]
    window = _with_history([[1] * 30] * 3, history, [2.0, 1.0, 1.02], job)
    chooser = ZoneChooser(window)
    # zone 0's run starts at the window: of its past runs, only the 12-tick ones lasted
    # past one tick, so 11 more ticks are expected, not the mean run (flickers included)
    assert chooser.rest(0, 0) == pytest.approx(11 * HOUR)
    assert chooser.mean_run(0, 0) < 4 * HOUR
    assert chooser.best(0) == 1  # the cheapest, on a long run
    assert chooser.switch(0, 0, 10 * HOUR, margin=1.0) == 1  # half the price: worth a restart
    assert chooser.switch(0, 2, 10 * HOUR, margin=1.0) == 2  # 2% dearer: not worth one
    assert chooser.switch(0, 0, 10 * HOUR, margin=float("inf")) == 0


def test_zone_chooser_never_moves_between_zones_of_one_price():
    # zone 0's runs last 7 ticks and its current one is 6 ticks old: one more tick is
    # expected. Zone 1, at the same price, has never gone down. A move costs a restart now
    # for sure; staying costs one only if zone 0 ends first, and then the job moves
    # anyway. So a move pays only through a lower price, never through a longer run.
    from spot_core.policy.deadline.zones import ZoneChooser

    job = Job.from_hours(10, 30, 0.5)
    ending = ([1] * 7 + [0]) * 10 + [1] * 5
    window = _with_history([[1] * 30] * 2, [ending, [1] * len(ending)], [1.0, 1.0], job)
    chooser = ZoneChooser(window)
    assert chooser.rest(0, 0) == pytest.approx(1 * HOUR)
    assert chooser.best(0) == 1  # a fresh launch goes where the run is expected to last
    assert chooser.switch(0, 0, 10 * HOUR, margin=1.0) == 0


def test_history_half_life_fits_the_recent_market():
    # last week's first half: 1-tick runs and 9-tick outages; its second half the reverse.
    # The plain fit (half-life 0) averages them (an outage ends with chance ~0.2 a tick);
    # with a 5-hour half-life the recent half decides (outages of one tick: ~1)
    from spot_core.policy.deadline.mdp import ForecastDP, fit_model

    history = [1] + [0] * 9
    history = history * 10 + ([1] * 9 + [0]) * 10
    window = _with_history([[0] * 30], [history], [1.0], Job.from_hours(10, 30, 0.5))
    params = dict(prior_ticks=0.1, up_edges_hours=(), down_edges_hours=())
    plain = fit_model(window, ForecastDP(**params, history_half_life_hours=0.0))
    recent = fit_model(window, ForecastDP(**params, history_half_life_hours=5.0))
    assert plain.trans[1, 0] == pytest.approx(0.2, abs=0.05)
    assert recent.trans[1, 0] > 0.8
    with pytest.raises(ConfigError):
        ForecastDP(history_half_life_hours=-1.0)


@pytest.mark.parametrize("dear_price", [1.5, 6.0])
def test_default_bridges_the_cheap_tiers_outage_on_dearer_spot_and_comes_back(dear_price):
    # zone 0 (1 $/h) has had 12-hour runs and 4-hour outages all week; zone 1 (dearer) is
    # always up; on-demand is 10 $/h. In the window zone 0 goes down for 12 hours, more
    # than the 6 hours of slack. The default plans zone 0's tier with zone 1 as its
    # fallback class: through the outage it runs on zone 1's spot, never on-demand, and
    # goes back to zone 0 once it returns. Planning both zones as one class instead
    # (fallback_spot=False) bridges on on-demand at 6 $/h; at 1.5 $/h it also runs on zone
    # 1 and moves back (it stayed there until the voluntary move's margin fell to 4).
    from spot_core.policy.deadline.mdp import ForecastDP

    job = Job.from_hours(20, 26, 0.25)
    history = [([1] * 12 + [0] * 4) * 6, [1] * 96]
    window = _with_history(
        [[1] * 5 + [0] * 12 + [1] * 20, [1] * 37], history, [1.0, dear_price], job
    )
    results = {}
    for fallback in (True, False):
        decide = ForecastDP(fallback_spot=fallback).plan(window)
        seen: list[int] = []

        def record(t, progress, current, left, seen=seen, decide=decide):
            seen.append(decide(t, progress, current, left))
            return seen[-1]

        results[fallback] = run_window(window, record), seen
    result, seen = results[True]
    assert result.finished and ON_DEMAND not in seen
    assert seen[:5] == [0] * 5 and 1 in seen[5:17] and seen[17:] == [0] * len(seen[17:])
    assert result.cost <= results[False][0].cost
    assert dear_price < 6.0 or result.cost < results[False][0].cost
    assert optimal_cost(window) <= result.cost
