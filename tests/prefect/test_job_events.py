"""Which `spot.job.*` events a transition emits, and the numbers they carry (a table of
records; the events reaching a real server are in test_example_flow.py)."""

from __future__ import annotations

import pytest

from prefect_spot.events import events_for, job_metrics
from spot_core.model import Attempt, JobRecord, Market, Outcome, Pool

SPOT = Pool("aws", "us-east-1", "us-east-1a", "p3.2xlarge")
OTHER = Pool("aws", "us-west-2", "us-west-2b", "p3.2xlarge")
ON_DEMAND = SPOT.on(Market.ON_DEMAND)


def _closed(record: JobRecord, pool: Pool, outcome: Outcome, **kw) -> JobRecord:
    n = record.next_attempt_number
    record = record.start_attempt(Attempt(n, pool, 100.0 * n))
    return record.finish_attempt(
        Attempt(n, pool, 100.0 * n, ended_at=100.0 * n + 50, outcome=outcome, **kw)
    )


FRESH = JobRecord(job_id="j", created_at=0.0)
PREEMPTED = _closed(
    FRESH,
    SPOT,
    Outcome.PREEMPTED,
    cost=0.5,
    on_demand_cost=3.0,
    checkpoint_step_end=40,
    lost_work_seconds=30.0,
)


@pytest.mark.parametrize(
    "kind, record, expected",
    [
        ("launched", FRESH.start_attempt(Attempt(1, SPOT, 0.0)), ["spot.job.launched"]),
        (
            "launched",
            PREEMPTED.start_attempt(Attempt(2, OTHER, 200.0, checkpoint_step_start=40)),
            ["spot.job.launched", "spot.job.resumed"],
        ),
        (
            "launched",
            PREEMPTED.start_attempt(Attempt(2, ON_DEMAND, 200.0, checkpoint_step_start=40)),
            ["spot.job.launched", "spot.job.resumed", "spot.job.fallback"],
        ),
        ("preempted", PREEMPTED, ["spot.job.preempted"]),
        ("notice", PREEMPTED, ["spot.job.notice"]),
        ("succeeded", PREEMPTED, ["spot.job.succeeded"]),
        ("done", PREEMPTED, []),
        ("failed", PREEMPTED, ["spot.job.failed"]),
        ("user_failed", PREEMPTED, ["spot.job.user-failed"]),
    ],
)
def test_events_for_each_transition(kind, record, expected):
    assert events_for(kind, record) == expected


def test_metrics_are_the_records_numbers():
    record = PREEMPTED.start_attempt(Attempt(2, ON_DEMAND, 200.0, checkpoint_step_start=40))
    metrics = job_metrics(record)
    assert metrics == {
        "attempts": 2,
        "preemptions": 1,
        "fallbacks": 1,
        "user_failures": 0,
        "spot_cost": 0.5,
        "on_demand_cost": 3.0,
        "saved": 2.5,
        "savings_fraction": pytest.approx(2.5 / 3.0, abs=1e-6),
        "lost_work_seconds": 30.0,
        "pool": ON_DEMAND.key,
        "market": "on-demand",
        "resumed_from_step": 40,
        "time_to_resume_seconds": None,
    }
