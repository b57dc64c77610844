"""The example flow (flows/spot_ml_pipeline.py, ``spot_ml_pipeline_on_worker``) on the
``spot`` worker, reclaimed in the middle of its training step with the notice a
compressed trace gives (1 s of wall time, as the shipped trace at one trace hour per wall
second does): the preempted attempt saves its emergency checkpoint inside the notice
window (never SIGKILLed for outliving it), its record shows no lost work, and the flow
run completes with an uninterrupted run's weights."""

from __future__ import annotations

from pathlib import Path

import pytest

from spot_core.checkpoint import open_store
from spot_core.checkpoint.resumed import read_resumed
from spot_core.localcloud.cloud import LocalCloudConfig
from spot_core.localcloud.server import LocalCloudServer
from spot_core.model import Outcome
from tests.support.prefect_helpers import (
    deploy_example_flow,
    final_record,
    running_worker,
    wait_completed,
)
from tests.support.spot_helpers import marked_processes, trace, wait_until

pytestmark = pytest.mark.timeout(600)
STEPS, STEP_SECONDS = 12000, 0.01  # 120 s of training, 0.25 s between checkpoints
# Two trace ticks per wall second from the worker's first connection: zone a (the cheaper)
# is reclaimed 75 s in (after the flow run's engine started, in the middle of training),
# with AWS's 120 s notice scaled to 1 s of wall time; zone b is up throughout.
ZONE_A, ZONE_B = "us-east-1a_v100_1", "us-east-1b_v100_1"


@pytest.fixture
def prefect_api(prefect_server_on_postgres):
    """This module's tests talk to a Prefect server on PostgreSQL, as production runs."""
    yield


def _cloud(tmp_path: Path) -> LocalCloudServer:
    return LocalCloudServer.from_traces(
        [
            trace(ZONE_A, "1" * 150 + "0" * 4000, price=0.5),
            trace(ZONE_B, "1" * 4150, price=0.9),
        ],
        time_scale=120.0,
        workdir=tmp_path / "cloud",
        config=LocalCloudConfig(min_notice_wall_seconds=1.0),
        start_on_first_client=True,
    )


def test_the_example_flow_saves_its_emergency_checkpoint_inside_a_short_notice(
    prefect_api, tmp_path
):
    from prefect import get_client
    from prefect.deployments import run_deployment

    pool = "spot-notice"
    with _cloud(tmp_path) as cloud:
        deployment_id = deploy_example_flow(
            pool,
            pool,
            {
                "provider_options": {"url": cloud.url, "workdir": str(cloud.cloud.workdir)},
                "on_demand_fallback": False,
                "max_preemptions": 2,
                "capacity_wait": 0.5,
                "checkpoint_root": (tmp_path / "ckpt").as_uri(),
            },
        )
        with running_worker(pool, tmp_path / "worker.log"):
            run = run_deployment(
                deployment_id,
                timeout=0,
                parameters={
                    "workdir": str(tmp_path / "work"),
                    "steps": STEPS,
                    "step_seconds": STEP_SECONDS,
                },
            )
            with get_client(sync_client=True) as client:
                run = wait_completed(client, run.id, timeout=420)
            record = final_record(run.id)
        assert wait_until(lambda: not marked_processes(str(tmp_path)), timeout=20)
    logs = (tmp_path / "worker.log").read_text(errors="replace")
    leases = "\n".join(
        p.read_text(errors="replace") for p in sorted((tmp_path / "cloud").glob("*.log"))
    )
    assert run.state.is_completed(), f"{run.state!r}\n{logs[-4000:]}"
    assert "outlived its notice deadline" not in leases, leases[-6000:]
    preempted = [a for a in record.attempts if a.outcome is Outcome.PREEMPTED]
    assert preempted and record.attempts[-1].outcome is Outcome.SUCCEEDED, record.summary()
    # each preempted attempt ended on its own emergency checkpoint (the controller counts
    # no lost work only then) and the next attempt resumed from it
    store = open_store((tmp_path / "ckpt" / str(run.id)).as_uri())
    for attempt, after in zip(record.attempts, record.attempts[1:], strict=False):
        if attempt.outcome is Outcome.PREEMPTED:
            assert attempt.lost_work_seconds == 0.0, attempt
            resumed = read_resumed(store, after.number)
            assert resumed is not None and resumed.step == attempt.checkpoint_step_end > 0
