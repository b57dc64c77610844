"""Deadline policies for live jobs: the safety net in wall-clock seconds, and its hook in
``decide_next`` (spot while the work still fits, on-demand once it no longer does)."""

from __future__ import annotations

import pytest

from spot_core.errors import ConfigError
from spot_core.model import Attempt, JobRecord, Market, Offer, Pool
from spot_core.policy.deadline.live import DeadlineWork
from spot_core.policy.deadline.policies import DEADLINE_POLICIES
from spot_core.policy.retry import RetryPolicy, decide_next

T0 = 1_700_000_000.0
SPOT = Pool("aws", "us-east-1", "us-east-1a", "p3.2xlarge")
OD = SPOT.on(Market.ON_DEMAND)
OFFERS = [Offer(SPOT, 0.9, 3.06, True, T0), Offer(OD, 3.06, 3.06, True, T0)]
WORK = DeadlineWork(work_left_seconds=3600, restart_overhead_seconds=300, tick_seconds=60)


def test_forces_on_demand_once_work_and_two_restarts_no_longer_fit():
    # 3600 s of work + 2 x 300 s = 4200 s = 70 whole minutes
    assert not WORK.forces_on_demand(T0 + 71 * 60, T0)
    assert WORK.forces_on_demand(T0 + 70 * 60, T0)
    assert WORK.forces_on_demand(T0 + 70 * 60 + 59, T0)  # only whole ticks count
    assert WORK.slack_seconds(T0 + 80 * 60, T0) == pytest.approx(600)


def test_bad_work_is_a_config_error():
    with pytest.raises(ConfigError):
        DeadlineWork(work_left_seconds=-1, restart_overhead_seconds=0)


def test_decide_next_launches_spot_while_the_work_fits():
    record = JobRecord("j", T0, deadline_at=T0 + 3 * 3600)
    decision = decide_next(record, OFFERS, RetryPolicy(), now=T0, work=WORK)
    assert decision.action == "launch" and decision.market is Market.SPOT


def test_decide_next_goes_on_demand_when_the_safety_net_says_so():
    record = JobRecord("j", T0, deadline_at=T0 + 70 * 60)
    decision = decide_next(record, OFFERS, RetryPolicy(), now=T0, work=WORK)
    assert decision.market is Market.ON_DEMAND and "no longer fit" in decision.reason
    # without the work amount the old behaviour stands
    assert decide_next(record, OFFERS, RetryPolicy(), now=T0).market is Market.SPOT


def test_running_on_demand_stays_when_leaving_would_risk_the_deadline():
    record = JobRecord("j", T0 - 3600, deadline_at=T0 + 70 * 60).start_attempt(
        Attempt(1, OD, T0 - 3600)
    )
    assert decide_next(record, OFFERS, RetryPolicy(), now=T0, work=WORK).action == "wait"
    roomy = JobRecord("j", T0 - 3600, deadline_at=T0 + 5 * 3600).start_attempt(
        Attempt(1, OD, T0 - 3600)
    )
    moved = decide_next(roomy, OFFERS, RetryPolicy(), now=T0, work=WORK)
    assert moved.action == "launch" and moved.market is Market.SPOT


def test_registry_names_the_policies():
    assert {"on-demand", "greedy", "uniform-progress", "default"} <= set(DEADLINE_POLICIES.names())
    with pytest.raises(ConfigError, match="uniform-progress"):
        DEADLINE_POLICIES.get("uniform")
