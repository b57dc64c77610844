"""Replays of real traces: walk a TraceMarket tick by tick and let decide_next drive a job.

The job needs ``work_ticks`` ticks of progress and checkpoints every tick (so a
preemption loses no work here; the point is the decisions). As in the published
simulator, a spot instance used during tick t is preempted if its zone is unavailable
at tick t+1. Properties checked on every decision, not just at the end.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field

import pytest

from spot_core.market import TraceMarket, ZoneTrace, default_json_trace, default_traces, load_traces
from spot_core.model import Attempt, JobRecord, Market, Outcome
from spot_core.policy.retry import Decision, RetryPolicy, decide_next
from tests.support.spot_helpers import TRACES

ORIGIN = 1_700_000_000.0


@dataclass
class Replay:
    record: JobRecord
    decisions: list[tuple[int, Decision, JobRecord]] = field(default_factory=list)

    def launches(self) -> list[tuple[int, Decision, JobRecord]]:
        return [d for d in self.decisions if d[1].action == "launch"]


def _finish(record: JobRecord, outcome: Outcome, now: float) -> JobRecord:
    running = record.current_attempt
    return record.finish_attempt(dataclasses.replace(running, ended_at=now, outcome=outcome))


def _observe(
    market: TraceMarket,
    record: JobRecord,
    tick: int,
    progress: int,
    work: int,
    user_failure_at: int | None,
) -> JobRecord:
    running, now = record.current_attempt, market.wall_time(tick)
    if running is None:
        return record
    if running.pool.is_spot and not market.is_available(running.pool.zone, now):
        return _finish(record, Outcome.PREEMPTED, now)
    if tick == user_failure_at:
        return _finish(record, Outcome.USER_FAILED, now)
    if progress >= work:
        return _finish(record, Outcome.SUCCEEDED, now)
    return record


def replay(
    traces: list[ZoneTrace],
    policy: RetryPolicy,
    *,
    work_ticks: int,
    start: int = 0,
    user_failure_at: int | None = None,
) -> Replay:
    market = TraceMarket(traces, ORIGIN, wrap=False)
    pools = market.pools() + market.pools(Market.ON_DEMAND)
    state = Replay(JobRecord("replay", created_at=market.wall_time(start)))
    progress = 0
    for tick in range(start, traces[0].n_ticks):
        now = market.wall_time(tick)
        state.record = _observe(market, state.record, tick, progress, work_ticks, user_failure_at)
        if state.record.current_attempt is None:
            decision = decide_next(
                state.record,
                market.offers(pools, now),
                policy,
                now=now,
                stats=market.stats(pools, now),
            )
            state.decisions.append((tick, decision, state.record))
            if decision.action in ("done", "fail"):
                break
            if decision.action == "launch":
                attempt = Attempt(state.record.next_attempt_number, decision.pools[0], now)
                state.record = state.record.start_attempt(attempt)
        progress += state.record.current_attempt is not None
    return state


def _assert_invariants(traces: list[ZoneTrace], state: Replay, policy: RetryPolicy) -> None:
    market = TraceMarket(traces, ORIGIN, wrap=False)
    for tick, decision, before in state.decisions:
        if decision.action == "launch" and decision.market is Market.SPOT:
            # never into a pool the trace says has no capacity at that tick
            assert all(market.is_available(p.zone, market.wall_time(tick)) for p in decision.pools)
            assert before.preemptions < policy.max_preemptions
        if decision.action == "wait":
            assert 0 < decision.wait_seconds <= policy.capacity_wait_seconds
    rec = state.record
    assert rec.preemptions <= policy.max_preemptions
    assert rec.user_failures == sum(a.outcome is Outcome.USER_FAILED for a in rec.attempts)
    assert rec.preemptions == sum(a.outcome is Outcome.PREEMPTED for a in rec.attempts)


def _after_budget_all_on_demand(state: Replay, policy: RetryPolicy) -> bool:
    spent = [d for d in state.launches() if d[2].preemptions >= policy.max_preemptions]
    return all(d[1].market is Market.ON_DEMAND for d in spent) and bool(spent)


@pytest.fixture(scope="module")
def fixture_traces() -> dict[str, ZoneTrace]:
    return {t.zone: t for t in default_traces()}


def test_flaky_zones_hop_then_fall_back_after_the_preemption_budget(fixture_traces):
    traces = [fixture_traces["us-east-1d"], fixture_traces["us-east-2a"]]
    policy = RetryPolicy(max_preemptions=3)
    state = replay(traces, policy, work_ticks=600)
    _assert_invariants(traces, state, policy)
    assert state.decisions[-1][1].action == "done"
    assert state.record.preemptions == 3
    assert _after_budget_all_on_demand(state, policy)
    assert state.record.user_failures == 0  # preemptions never spend user retries


def test_preempted_zone_is_not_retried_first(fixture_traces):
    traces = [fixture_traces["us-east-1d"], fixture_traces["us-east-2a"]]
    state = replay(traces, RetryPolicy(max_preemptions=3), work_ticks=600)
    attempts = state.record.attempts
    hops = [
        (p.pool.zone, n.pool.zone)
        for p, n in itertools.pairwise(attempts)
        if p.outcome is Outcome.PREEMPTED and n.pool.is_spot
    ]
    assert hops and all(a != b for a, b in hops)


@pytest.mark.parametrize("start", [0, 300, 600])
def test_spot_only_waits_boundedly_and_never_exceeds_budget(fixture_traces, start):
    traces = [fixture_traces["us-east-1d"]]
    policy = RetryPolicy(
        max_preemptions=3,
        on_demand_fallback=False,
        capacity_wait_seconds=195,
        max_capacity_waits=200,
    )
    state = replay(traces, policy, work_ticks=250, start=start)
    _assert_invariants(traces, state, policy)
    assert not any(a.pool.market is Market.ON_DEMAND for a in state.record.attempts)
    final = state.decisions[-1][1]
    assert final.action in ("done", "fail")
    if final.action == "fail":
        assert "budget" in final.reason or "gave up" in final.reason


def test_user_failure_spends_user_retries_only(fixture_traces):
    traces = [fixture_traces["us-west-2b"], fixture_traces["us-east-2a"]]
    policy = RetryPolicy(max_user_retries=1)
    state = replay(traces, policy, work_ticks=500, user_failure_at=40)
    _assert_invariants(traces, state, policy)
    assert state.record.user_failures == 1
    assert state.decisions[-1][1].action == "done"
    # preemption events leave the user-failure count alone
    for prev, nxt in itertools.pairwise(state.decisions):
        if nxt[2].preemptions > prev[2].preemptions:
            assert nxt[2].user_failures == prev[2].user_failures


def test_second_user_failure_fails_the_job(fixture_traces):
    traces = [fixture_traces["us-west-2b"]]
    state = replay(traces, RetryPolicy(max_user_retries=0), work_ticks=500, user_failure_at=40)
    assert state.decisions[-1][1].action == "fail"
    assert "user retries" in state.decisions[-1][1].reason


def test_replay_of_the_json_format_excerpt():
    traces = [default_json_trace()]  # 600 s ticks, stored as 1 = preempted
    policy = RetryPolicy()
    state = replay(traces, policy, work_ticks=200)
    _assert_invariants(traces, state, policy)
    assert state.decisions[-1][1].action == "done"
    assert any(a.pool.is_spot for a in state.record.attempts)


@pytest.mark.parametrize("start", [0, 5000, 12000])
def test_replay_on_the_full_evaluation_set(start):
    folder = TRACES / "aws-v100-2023-02"
    names = ("us-east-1a", "us-east-1c", "us-east-2b")
    traces = [
        t.slice(start, start + 1200)
        for t in load_traces([folder / f"{z}_v100_1.csv" for z in names])
    ]
    policy = RetryPolicy(max_preemptions=2)
    state = replay(traces, policy, work_ticks=800)
    _assert_invariants(traces, state, policy)
    assert state.decisions[-1][1].action == "done"
    if state.record.preemptions >= policy.max_preemptions:
        assert _after_budget_all_on_demand(state, policy)
