"""decide_next as a table: record + offers + now -> action, market, first pool, reason."""

from __future__ import annotations

import dataclasses

import pytest

from spot_core.errors import ConfigError
from spot_core.model import Attempt, JobRecord, JobStatus, Market, Offer, Outcome, Pool
from spot_core.policy.retry import RETRY_POLICIES, Decision, RetryPolicy, decide_next

T0 = 1_700_000_000.0
A = Pool("aws", "us-east-1", "us-east-1a", "p3.2xlarge")
B = Pool("aws", "us-east-1", "us-east-1b", "p3.2xlarge")
OD_A, OD_B = A.on(Market.ON_DEMAND), B.on(Market.ON_DEMAND)
P, U, I, C, S = (  # noqa: E741 - the outcomes' initials, for the tables below
    Outcome.PREEMPTED,
    Outcome.USER_FAILED,
    Outcome.INFRASTRUCTURE_FAILED,
    Outcome.CAPACITY_UNAVAILABLE,
    Outcome.SUCCEEDED,
)
D = Outcome.DISRUPTED
DEFAULT = RetryPolicy()
NO_FALLBACK = RetryPolicy(on_demand_fallback=False)


def offers(a: bool = True, b: bool = True, on_demand: bool = True) -> list[Offer]:
    """Spot A at 1.00 and B at 0.90 $/h (B cheaper), plus their on-demand pools."""
    made = [Offer(A, 1.0, 3.06, a, T0), Offer(B, 0.9, 3.06, b, T0)]
    if on_demand:
        made += [Offer(OD_A, 3.06, 3.06, True, T0), Offer(OD_B, 3.10, 3.10, True, T0)]
    return made


def record(
    *history: tuple[Pool, Outcome],
    gap: float = 100.0,
    deadline: float | None = None,
    running: Pool | None = None,
    running_for: float = 0.0,
) -> JobRecord:
    """Attempts back to back, each `gap` seconds long, the last ending at T0."""
    rec = JobRecord(job_id="j", created_at=T0 - gap * (len(history) + 1), deadline_at=deadline)
    for n, (pool, outcome) in enumerate(history, start=1):
        start = T0 - gap * (len(history) - n + 1)
        rec = rec.start_attempt(Attempt(n, pool, start))
        rec = rec.finish_attempt(Attempt(n, pool, start, ended_at=start + gap, outcome=outcome))
    if running is not None:
        rec = rec.start_attempt(Attempt(len(history) + 1, running, T0 - running_for))
    return rec


# (id, record, offers, policy, now offset, action, market, first pool, reason fragment)
CASES = [
    (
        "fresh job: cheapest spot",
        record(),
        offers(),
        DEFAULT,
        0,
        "launch",
        Market.SPOT,
        B,
        "launching on spot in us-east-1b",
    ),
    ("succeeded", record((B, S)), offers(), DEFAULT, 0, "done", None, None, "succeeded"),
    (
        "already failed",
        dataclasses.replace(record(), status=JobStatus.FAILED),
        offers(),
        DEFAULT,
        0,
        "fail",
        None,
        None,
        "already ended",
    ),
    (
        "deadline passed",
        record((B, P), deadline=T0 + 5),
        offers(),
        DEFAULT,
        10,
        "fail",
        None,
        None,
        "deadline missed",
    ),
    (
        "user failure, no user retries",
        record((B, U)),
        offers(),
        DEFAULT,
        0,
        "fail",
        None,
        None,
        "user retries are used up (max_user_retries=0)",
    ),
    (
        "user failure, one retry allowed",
        record((B, U)),
        offers(),
        RetryPolicy(max_user_retries=1),
        0,
        "launch",
        Market.SPOT,
        B,
        "launching on spot",
    ),
    (
        "infrastructure budget spent",
        record(*[(B, I)] * 4),
        offers(),
        DEFAULT,
        0,
        "fail",
        None,
        None,
        "infrastructure retries are used up",
    ),
    ("infrastructure retry", record((B, I)), offers(), DEFAULT, 0, "launch", Market.SPOT, B, ""),
    (
        "preemption does not spend user retries",
        record((B, P), (A, P)),
        offers(),
        DEFAULT,
        0,
        "launch",
        Market.SPOT,
        B,
        "after preemption 2",
    ),
    (
        "preempted pool goes last",
        record((B, P)),
        offers(),
        DEFAULT,
        0,
        "launch",
        Market.SPOT,
        A,
        "after preemption 1",
    ),
    (
        "preemption budget spent -> on-demand",
        record((B, P), (A, P), (B, P)),
        offers(),
        DEFAULT,
        0,
        "launch",
        Market.ON_DEMAND,
        OD_A,
        "budget is spent (3 of 3",
    ),
    (
        # a replacement launched on spot on a notice before the budget was spent, then
        # preempted too: the count is past the budget, and said so (issue 50: "3 of 2")
        "preemptions past the budget -> on-demand, said as such",
        record((B, P), (A, P), (B, P)),
        offers(),
        RetryPolicy(max_preemptions=2),
        0,
        "launch",
        Market.ON_DEMAND,
        OD_A,
        "budget is spent (3 preemptions, past the budget of 2)",
    ),
    (
        "voluntary disruptions spend no preemption and stay on spot",
        record((B, D), (B, D), (B, D), (B, D)),
        offers(),
        DEFAULT,
        0,
        "launch",
        Market.SPOT,
        B,
        "after voluntary disruption 4 (no preemption spent)",
    ),
    (
        "a disruption after two preemptions does not tip the job to on-demand",
        record((B, P), (A, P), (B, D)),
        offers(),
        DEFAULT,
        0,
        "launch",
        Market.SPOT,
        B,
        "after voluntary disruption 1",
    ),
    (
        "disruption budget spent -> fail",
        record(*[(B, D)] * 3),
        offers(),
        RetryPolicy(max_disruptions=2),
        0,
        "fail",
        None,
        None,
        "max_disruptions=2 is used up",
    ),
    (
        "preemption budget spent, no fallback -> fail",
        record((B, P), (A, P), (B, P)),
        offers(),
        NO_FALLBACK,
        0,
        "fail",
        None,
        None,
        "on-demand fallback is off",
    ),
    (
        "no spot capacity -> on-demand",
        record(),
        offers(a=False, b=False),
        DEFAULT,
        0,
        "launch",
        Market.ON_DEMAND,
        OD_A,
        "no spot pool has capacity now",
    ),
    (
        "no spot capacity, no fallback -> bounded wait",
        record(),
        offers(a=False, b=False),
        NO_FALLBACK,
        0,
        "wait",
        None,
        None,
        "on-demand fallback is off",
    ),
    (
        "no spot capacity, waited long enough -> fail",
        record(),
        offers(a=False, b=False),
        NO_FALLBACK,
        600,
        "fail",
        None,
        None,
        "gave up after waiting",
    ),
    (
        "only one spot pool has capacity",
        record(),
        offers(b=False),
        DEFAULT,
        0,
        "launch",
        Market.SPOT,
        A,
        "",
    ),
    (
        "launch just found no spot capacity -> on-demand",
        record((B, C)),
        offers(),
        DEFAULT,
        0,
        "launch",
        Market.ON_DEMAND,
        OD_A,
        "found no spot capacity",
    ),
    (
        "launch just found none, no fallback -> wait",
        record((B, C)),
        offers(),
        NO_FALLBACK,
        20,
        "wait",
        None,
        None,
        "found no spot capacity",
    ),
    (
        "capacity miss a while ago, no fallback -> try spot again",
        record((B, C)),
        offers(),
        NO_FALLBACK,
        70,
        "launch",
        Market.SPOT,
        A,
        "",
    ),
    (
        "ten launches without capacity -> fail",
        record(*[(B, C)] * 10, gap=1.0),
        offers(),
        NO_FALLBACK,
        100,
        "fail",
        None,
        None,
        "10 launch(es) in a row found no capacity",
    ),
    (
        "back on spot after an on-demand attempt",
        record((B, P), (OD_A, I)),
        offers(),
        DEFAULT,
        0,
        "launch",
        Market.SPOT,
        B,
        "returning to spot",
    ),
    (
        "stay on on-demand when return_to_spot is off",
        record((B, P), (OD_A, I)),
        offers(),
        RetryPolicy(return_to_spot=False),
        0,
        "launch",
        Market.ON_DEMAND,
        OD_A,
        "return_to_spot is off",
    ),
    (
        "stay on on-demand once the budget is spent",
        record((B, P), (A, P), (B, P), (OD_A, I)),
        offers(),
        DEFAULT,
        0,
        "launch",
        Market.ON_DEMAND,
        OD_A,
        "budget is spent",
    ),
    (
        "on-demand had no capacity, spot neither -> wait",
        record((OD_A, C)),
        offers(a=False, b=False),
        DEFAULT,
        10,
        "wait",
        None,
        None,
        "on-demand had no capacity at the last launch",
    ),
    (
        "deadline close -> on-demand",
        record(deadline=T0 + 100),
        offers(),
        RetryPolicy(deadline_safety_seconds=600),
        0,
        "launch",
        Market.ON_DEMAND,
        OD_A,
        "deadline",
    ),
    (
        "on-demand pools derived from spot offers",
        record(),
        offers(False, False, on_demand=False),
        DEFAULT,
        0,
        "launch",
        Market.ON_DEMAND,
        OD_A,
        "",
    ),
    (
        "on-demand preset never uses spot",
        record(),
        offers(),
        RETRY_POLICIES.get("on-demand"),
        0,
        "launch",
        Market.ON_DEMAND,
        OD_A,
        "",
    ),
    (
        "running on spot -> keep it",
        record(running=B),
        offers(),
        DEFAULT,
        0,
        "wait",
        None,
        None,
        "running on spot",
    ),
    (
        "on-demand running long, spot back -> move",
        record((B, P), running=OD_A, running_for=700),
        offers(),
        DEFAULT,
        0,
        "launch",
        Market.SPOT,
        A,
        "back to spot",
    ),
    (
        "on-demand running briefly -> keep (no flapping)",
        record((B, P), running=OD_A, running_for=100),
        offers(),
        DEFAULT,
        0,
        "wait",
        None,
        None,
        "running on on-demand",
    ),
    (
        "on-demand running, budget spent -> keep",
        record((B, P), (A, P), (B, P), running=OD_A, running_for=7000),
        offers(),
        DEFAULT,
        0,
        "wait",
        None,
        None,
        "running on on-demand",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_decide_next(case):
    _, rec, offered, policy, offset, action, market, first, fragment = case
    decision = decide_next(rec, offered, policy, now=T0 + offset)
    assert decision.action == action, decision.reason
    assert decision.market == market
    if first is not None:
        assert decision.pools[0] == first
    assert fragment in decision.reason
    assert decision.reason  # always something to show the user


def test_launch_never_names_an_unavailable_spot_pool():
    decision = decide_next(record(), offers(b=False), DEFAULT, now=T0)
    assert decision.pools == (A,)


@pytest.mark.parametrize(
    "offset,deadline,expected",
    [
        (0, None, 60.0),  # a full wait
        (570, None, 30.0),  # only what is left of 10 x 60 s
        (0, T0 + 12, 12.0),  # never past the deadline
    ],
)
def test_wait_is_bounded(offset, deadline, expected):
    rec = record(deadline=deadline)
    rec = dataclasses.replace(rec, created_at=T0)
    decision = decide_next(rec, offers(False, False), NO_FALLBACK, now=T0 + offset)
    assert decision.action == "wait"
    assert decision.wait_seconds == pytest.approx(expected)


def test_wait_after_capacity_miss_is_the_rest_of_the_cooldown():
    decision = decide_next(record((B, C)), offers(), NO_FALLBACK, now=T0 + 20)
    assert decision.wait_seconds == pytest.approx(40.0)


@pytest.mark.parametrize("preemptions", range(0, 3))
def test_preemptions_never_spend_user_retries(preemptions):
    rec = record(*[(B, P)] * preemptions, (A, U))
    decision = decide_next(rec, offers(), RetryPolicy(max_user_retries=1), now=T0)
    assert decision.action == "launch"
    assert rec.user_failures == 1 and rec.preemptions == preemptions


def test_decide_next_is_pure():
    rec, offered = record((B, P)), offers()
    assert decide_next(rec, offered, DEFAULT, now=T0) == decide_next(rec, offered, DEFAULT, now=T0)
    assert rec == record((B, P))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_preemptions": -1},
        {"max_user_retries": 1.5},
        {"max_infrastructure_retries": True},
        {"capacity_wait_seconds": 0},
        {"max_capacity_waits": 0},
        {"deadline_safety_seconds": -1},
        {"min_on_demand_seconds": float("nan")},
        {"max_spot_price": 0},
        {"max_spot_price": "1"},
    ],
)
def test_bad_policy(kwargs):
    with pytest.raises(ConfigError):
        RetryPolicy(**kwargs)


def test_decision_invariants():
    with pytest.raises(ValueError):
        Decision("launch", Market.SPOT, ())
    with pytest.raises(ValueError):
        Decision("wait", wait_seconds=0)


def test_registry_of_retry_policies():
    assert RETRY_POLICIES.get() == RetryPolicy()
    assert "spot-only" in RETRY_POLICIES and not RETRY_POLICIES.get("spot-only").on_demand_fallback
    with pytest.raises(ConfigError, match="unknown retry policy 'yolo'"):
        RETRY_POLICIES.get("yolo")


CAPPED = RetryPolicy(max_spot_price=0.95, capacity_wait_seconds=60, max_capacity_waits=3)


def test_price_cap_picks_the_pool_under_it():
    decision = decide_next(
        record(),
        [Offer(A, 1.0, 3.06, True, T0), Offer(B, 0.9, 3.06, False, T0)] + offers()[2:],
        CAPPED,
        now=T0,
    )
    assert (decision.action, decision.market) == ("wait", None), "B is down, A is too dear"
    assert "above max_spot_price $0.95/h" in decision.reason and "cheaper window" in decision.reason
    decision = decide_next(record(), offers(), CAPPED, now=T0)
    assert decision.action == "launch" and decision.pools == (B,)


def test_a_price_wait_is_bounded_then_on_demand_or_fail():
    dear = [Offer(A, 1.2, 3.06, True, T0), Offer(B, 1.1, 3.06, True, T0)]
    late = T0 + 1000  # the job has been idle longer than 3 waits of 60 s
    decision = decide_next(record(), dear + offers()[2:], CAPPED, now=late)
    assert decision.action == "launch" and decision.market is Market.ON_DEMAND
    assert "the price window did not come" in decision.reason
    no_fallback = dataclasses.replace(CAPPED, on_demand_fallback=False)
    assert decide_next(record(), dear, no_fallback, now=late).action == "fail"


def test_budget_and_deadline_come_before_the_price_window():
    dear = [Offer(A, 1.2, 3.06, True, T0), Offer(B, 1.1, 3.06, True, T0)] + offers()[2:]
    spent = decide_next(record(*[(B, P)] * 3), dear, CAPPED, now=T0)
    assert spent.market is Market.ON_DEMAND and "budget is spent" in spent.reason
