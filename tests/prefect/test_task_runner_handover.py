"""SpotTaskRunner hands over on the notice (against a real Prefect server and a local
cloud server replaying a made-up trace that reclaims one zone with a notice): each task
is its own job, so its replacement lease starts beside the old one at once, waits for the
old attempt's emergency checkpoint, fences the store and resumes from it, inside the
same Prefect try of the task run."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from prefect import flow, task

from prefect_spot import SpotConfiguration, SpotTaskRunner, spot_record
from spot_core.checkpoint import open_store
from spot_core.checkpoint.resumed import read_resumed
from spot_core.errors import FencedOut
from spot_core.localcloud.cloud import LocalCloudConfig
from spot_core.localcloud.server import LocalCloudServer
from spot_core.model import Outcome
from tests.support.spot_helpers import marked_processes, trace, wait_until

pytestmark = pytest.mark.timeout(240)
STEPS, STEP_SECONDS, SAVE_SECONDS = 1000, 0.02, 1.5  # 20 s of work
# One trace tick per wall second from the runner's first connection: zone a (the cheaper)
# is reclaimed at 15 s, with a 2 s notice; zone b is up throughout, at a higher price.
ZONES = (
    trace("us-east-1a_v100_1", "1" * 15 + "0" * 2000, price=0.5),
    trace("us-east-1b_v100_1", "1" * 2015, price=0.9),
)


@task
def sums_steps_on_spot(
    total_steps: int, step_seconds: float, save_seconds: float, marks: str, checkpointer=None
) -> dict:
    from spot_test_flows import sum_steps

    total = sum_steps(checkpointer, total_steps, step_seconds, save_seconds, marks)
    return {"total": total, "attempt": int(os.environ["SPOT_ATTEMPT"])}


def test_a_task_hands_over_on_the_notice_and_resumes_from_the_emergency_save(prefect_api, tmp_path):
    from prefect import get_client

    with LocalCloudServer.from_traces(
        list(ZONES),
        time_scale=60.0,
        workdir=tmp_path / "cloud",
        config=LocalCloudConfig(min_notice_wall_seconds=2.0, grace_wall_seconds=2.0),
        start_on_first_client=True,
    ) as cloud:
        config = SpotConfiguration(
            provider_options={"url": cloud.url, "workdir": str(cloud.cloud.workdir)},
            on_demand_fallback=False,
            max_preemptions=2,
            capacity_wait=0.5,
            poll_interval=0.2,
        )

        @flow(task_runner=SpotTaskRunner(config, checkpoint_every_steps=10, workdir=tmp_path))
        def pipeline():
            future = sums_steps_on_spot.submit(STEPS, STEP_SECONDS, SAVE_SECONDS, str(tmp_path))
            return future.result(), spot_record(future), future.task_run_id

        result, record, task_run_id = pipeline()
        assert wait_until(lambda: not marked_processes(str(tmp_path)), timeout=20), (
            "a lease process outlived the task"
        )
    old, new = record.attempts
    assert (old.outcome, new.outcome) == (Outcome.PREEMPTED, Outcome.SUCCEEDED), record.attempts
    assert old.pool.zone == "us-east-1a" and new.pool.zone == "us-east-1b"
    # launched before the old lease ended, adopted once it had
    assert new.started_at < old.ended_at
    assert old.replacement["state"] == "adopted" and old.replacement["attempt"] == new.number
    # resumed from the old attempt's emergency checkpoint, not an older one
    store = open_store(record.checkpoint_uri)
    emergency = json.loads(Path(tmp_path, f"emergency-{old.number}.json").read_text())["step"]
    resumed = read_resumed(store, new.number)
    assert resumed is not None and resumed.step == emergency
    assert old.checkpoint_step_end == new.checkpoint_step_start == emergency
    # the result of an uninterrupted run, returned by the replacement
    assert result == {"total": sum(range(STEPS)), "attempt": new.number}
    # a zombie of the old attempt cannot save after the handover
    with pytest.raises(FencedOut):
        store.save(STEPS + 1, {"state.json": b"{}"}, attempt=old.number)
    # the preemption spent none of the task's Prefect runs
    with get_client(sync_client=True) as client:
        task_run = client.read_task_run(task_run_id)
    assert task_run.run_count == 1 and task_run.state.is_completed()
    assert record.preemptions == 1 and len(record.time_to_resume_seconds) == 1
