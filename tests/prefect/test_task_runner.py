"""SpotTaskRunner against a real Prefect server and the trace-driven local spot cloud."""

from __future__ import annotations

import pytest
from prefect import flow, task

from prefect_spot import SpotConfiguration, SpotTaskRunner, spot_record
from spot_core.model import Market, Outcome
from tests.support.prefect_helpers import count_to

# In the shipped trace, us-east-2a loses its capacity 74 ticks (14,430 trace seconds)
# after tick 450: 12 s of wall time at 1,200 trace seconds per second, a bound a loaded
# 2-core machine meets for starting the step and saving its first checkpoints (at one
# trace hour per second it was 4 s, less than a step's start-up under load). us-west-2b
# stays up for 37 s more. The step computes for 20 s, so the preemption still comes.
PREEMPT_SOON = SpotConfiguration(
    provider_options={"start_tick": 450, "time_scale": 1200.0},
    max_preemptions=2,
    capacity_wait=0.5,
    poll_interval=0.1,
    min_on_demand="365d",
)


@task
def square(x: int) -> int:
    return x * x


@task(retries=1, retry_delay_seconds=0)
def fails_once(marker: str) -> str:
    from pathlib import Path

    path = Path(marker)
    if not path.exists():
        path.write_text("failed once")
        raise ValueError("the step's own bug, first time only")
    return "second try worked"


@task(retries=0)
def always_fails() -> None:
    raise KeyError("no such column: price")


def test_preempted_task_resumes_from_its_checkpoint(prefect_api, tmp_path):
    @flow(task_runner=SpotTaskRunner(PREEMPT_SOON, checkpoint_every_steps=10, workdir=tmp_path))
    def pipeline():
        future = count_to.submit(400, 0.05)
        return future.result(), spot_record(future), future.task_run_id

    result, record, task_run_id = pipeline()
    assert result["total"] == 400
    assert record.preemptions >= 1
    assert record.attempts[0].outcome is Outcome.PREEMPTED
    assert record.attempts[0].pool.zone == "us-east-2a"
    assert record.attempts[-1].outcome is Outcome.SUCCEEDED
    resumed = record.summary()["resumed_from_steps"]
    assert resumed and resumed[0] > 0
    assert result["started_at"] == record.attempts[-1].checkpoint_step_start
    assert record.user_failures == 0
    from prefect import get_client

    with get_client(sync_client=True) as client:
        task_run = client.read_task_run(task_run_id)
    assert task_run.run_count == 1, "a preemption spent one of the task's Prefect runs"
    assert task_run.state.is_completed()


def test_futures_resolve_with_results_and_map(prefect_api, tmp_path):
    config = SpotConfiguration(provider_options={"start_tick": 600}, zones=["us-west-2b"])

    @flow(task_runner=SpotTaskRunner(config, workdir=tmp_path))
    def pipeline():
        futures = square.map([1, 2, 3])
        return [f.result() for f in futures], [spot_record(f) for f in futures]

    values, records = pipeline()
    assert values == [1, 4, 9]
    calls = list(tmp_path.glob("jobs/*/checkpoints/call"))
    assert len(calls) == 3, "one call folder per mapped task"
    leftovers = [p for call in calls for p in call.rglob("*") if p.is_file()]
    assert leftovers == [], "the pickled call and its result are deleted once read"
    assert all(r.attempts[-1].pool.zone == "us-west-2b" for r in records)
    assert all(r.attempts[-1].pool.market is Market.SPOT for r in records)


def test_user_error_uses_the_tasks_own_retries(prefect_api, tmp_path):
    # A trace minute per wall second: us-west-2b's spot stays up for the whole test
    # (at the default hour per second the trace reclaims it 8.4 s in, and a loaded machine
    # saw preemptions this test is not about).
    config = SpotConfiguration(provider_options={"start_tick": 600, "time_scale": 60.0})

    @flow(task_runner=SpotTaskRunner(config, workdir=tmp_path))
    def pipeline():
        ok = fails_once.submit(str(tmp_path / "marker"))
        bad = always_fails.submit()
        return ok.result(), spot_record(ok), bad.wait() or bad.state, spot_record(bad)

    value, ok_record, bad_state, bad_record = pipeline()
    assert value == "second try worked"
    assert ok_record.user_failures == 1 and ok_record.preemptions == 0
    assert [a.outcome for a in ok_record.attempts] == [Outcome.USER_FAILED, Outcome.SUCCEEDED]
    assert bad_state.is_failed()
    with pytest.raises(KeyError, match="no such column"):
        bad_state.result()
    assert bad_record.user_failures == 1 and len(bad_record.attempts) == 1


def test_runner_pickles_and_duplicates_with_its_configuration():
    import cloudpickle

    runner = SpotTaskRunner(PREEMPT_SOON, spot_tag="spot", checkpoint_every_steps=5)
    assert cloudpickle.loads(cloudpickle.dumps(runner)) == runner
    assert runner.duplicate() == runner
    assert runner.duplicate() != SpotTaskRunner(PREEMPT_SOON)
