"""The JobRecord must survive the engine's storage exactly: lossless JSON, pure transitions."""

from __future__ import annotations

import dataclasses
import json

import pytest

from spot_core.errors import (
    CapacityUnavailable,
    ConfigError,
    CorruptCheckpoint,
    FencedOut,
    Preempted,
    SpotError,
    UserStepFailed,
)
from spot_core.model import (
    Attempt,
    CheckpointRef,
    CostLedger,
    JobRecord,
    JobStatus,
    Market,
    Outcome,
    Pool,
)

SPOT = Pool("aws", "us-east-1", "us-east-1a", "p3.2xlarge")
ON_DEMAND = SPOT.on(Market.ON_DEMAND)


def _finished(number: int, pool: Pool, outcome: Outcome, **kw) -> Attempt:
    return Attempt(
        number=number,
        pool=pool,
        started_at=1000.0 + number,
        ended_at=2000.1 + number,
        outcome=outcome,
        **kw,
    )


def _record_with_history() -> JobRecord:
    record = JobRecord(
        job_id="train-42", created_at=1_700_000_000.123456789, deadline_at=1.7e9 + 0.1
    )
    record = record.start_attempt(Attempt(1, SPOT, 1000.0, lease_id="i-1"))
    record = record.finish_attempt(
        _finished(
            1,
            SPOT,
            Outcome.PREEMPTED,
            lease_id="i-1",
            cost=0.1 + 0.2,
            on_demand_cost=3.06,
            checkpoint_step_start=None,
            checkpoint_step_end=40,
            lost_work_seconds=12.5,
            checkpoint_overhead_seconds=0.7,
        )
    )
    record = record.with_checkpoint(
        CheckpointRef("file:///tmp/x", "step-40", 40, 1, 1500.5, {"loss": 0.25, "tags": ["a", "b"]})
    )
    record = record.start_attempt(Attempt(2, ON_DEMAND, 2100.0, checkpoint_step_start=40))
    return record.finish_attempt(
        _finished(
            2,
            ON_DEMAND,
            Outcome.SUCCEEDED,
            cost=1.0 / 3.0,
            on_demand_cost=1.0 / 3.0,
            checkpoint_step_start=40,
        )
    )


def test_json_round_trip_is_lossless():
    record = _record_with_history()
    text = record.to_json()
    again = JobRecord.from_json(text)
    assert again == record
    assert again.to_json() == text
    assert again.ledger.spent == 0.1 + 0.2 + 1.0 / 3.0  # exact float, not rounded
    assert isinstance(again.attempts, tuple) and again.attempts[1].pool.market is Market.ON_DEMAND


def test_a_record_never_writes_nan_or_infinity():
    """`run --json` wrote a cost of Infinity that `report` (and every strict reader) then
    refused; the record refuses to write one, naming the field."""
    record = JobRecord(job_id="train-42", created_at=1.0)
    record = record.start_attempt(Attempt(1, SPOT, 1000.0))
    record = record.finish_attempt(_finished(1, SPOT, Outcome.SUCCEEDED, cost=float("inf")))
    with pytest.raises(ConfigError, match=r"attempts\[0\]\.cost=inf"):
        record.to_json()


def test_counters_and_ledger_follow_outcomes():
    record = _record_with_history()
    assert record.status is JobStatus.SUCCEEDED
    assert (record.preemptions, record.user_failures, record.fallbacks) == (1, 0, 1)
    assert record.ledger.lost_work_seconds == 12.5
    assert record.ledger.saved == pytest.approx(3.06 - 0.3)
    summary = record.summary()
    assert summary["resumed_from_steps"] == [40]
    json.dumps(summary)  # the UI summary must be JSON-able as is


def test_only_user_failures_consume_user_retries():
    consuming = {o for o in Outcome if o.consumes_user_retry}
    assert consuming == {Outcome.USER_FAILED}


def test_cannot_start_two_attempts_at_once():
    record = JobRecord("j", 0.0).start_attempt(Attempt(1, SPOT, 0.0))
    with pytest.raises(ValueError, match="still running"):
        record.start_attempt(Attempt(2, SPOT, 1.0))


def test_older_checkpoint_never_replaces_newer():
    record = JobRecord("j", 0.0).with_checkpoint(CheckpointRef("u", "b", 50, 2, 1.0))
    assert record.with_checkpoint(CheckpointRef("u", "a", 10, 1, 2.0)).latest_checkpoint.step == 50


@pytest.mark.parametrize(
    "text, fix",
    [
        ("{not json", "to_json"),
        ('{"schema_version": 99}', "upgrade"),
        ('{"schema_version": 1, "job_id": "x"}', "malformed"),
    ],
)
def test_bad_record_text_gets_a_clear_error(text, fix):
    with pytest.raises(ConfigError, match=fix):
        JobRecord.from_json(text)


def test_retryability_is_data():
    assert Preempted("x").retryable and Preempted("x").outcome == "preempted"
    assert CapacityUnavailable("x").retryable
    assert not UserStepFailed("x").retryable and UserStepFailed("x").outcome == "user_failed"
    assert not FencedOut("x").retryable and not CorruptCheckpoint("x").retryable
    assert SpotError("x", retryable=True).retryable
    assert isinstance(ConfigError("x"), ValueError)  # parse-time errors in DAGs are ValueErrors


def test_ledger_savings_fraction():
    ledger = CostLedger(spent=1.0, on_demand_equivalent=4.0)
    assert ledger.savings_fraction == 0.75
    assert CostLedger().savings_fraction == 0.0


def test_data_transfer_is_itemised_in_the_ledger_and_old_records_still_load():
    running = Attempt(1, SPOT, 0.0)
    cross = dataclasses.replace(
        running,
        ended_at=10.0,
        outcome=Outcome.SUCCEEDED,
        cost=0.5,
        on_demand_cost=1.0,
        data_transfer_cost=0.2,
    )
    record = JobRecord("j", 0.0).start_attempt(running).finish_attempt(cross)
    assert record.ledger.spent == 0.5 and record.ledger.data_transfer_cost == 0.2
    assert record.summary()["data_transfer_cost"] == 0.2
    old = json.loads(record.to_json())
    for attempt in old["attempts"]:
        del attempt["data_transfer_cost"]
    del old["ledger"]["data_transfer_cost"]
    assert JobRecord.from_dict(old).attempts[0].data_transfer_cost == 0.0


def test_a_voluntary_disruption_has_its_own_counter_and_old_records_still_load():
    record = JobRecord(job_id="train-7", created_at=1000.0)
    record = record.start_attempt(Attempt(1, SPOT, 1000.0))
    record = record.finish_attempt(_finished(1, SPOT, Outcome.DISRUPTED))
    assert (record.disruptions, record.preemptions, record.infrastructure_failures) == (1, 0, 0)
    assert record.summary()["disruptions"] == 1
    assert JobRecord.from_json(record.to_json()) == record
    old = record.to_dict()
    del old["disruptions"]  # written before voluntary disruptions had a budget
    assert JobRecord.from_dict(old).disruptions == 0
