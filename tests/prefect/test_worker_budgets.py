"""The spot worker end to end against a local cloud server replaying a made-up trace:
preemptions leave ``@flow(retries=...)`` for the flow's own errors, and a transient
failure to observe the lease does not end a healthy attempt."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from spot_core.localcloud.cloud import LocalCloudConfig
from spot_core.localcloud.server import LocalCloudServer
from spot_core.model import Outcome
from tests.support.fault_proxy import FaultProxy
from tests.support.prefect_helpers import (
    deploy_example_flow,
    final_record,
    running_worker,
    wait_completed,
)
from tests.support.spot_helpers import marked_processes, trace, wait_until

HERE = Path(__file__).resolve().parent
FAST = LocalCloudConfig(min_notice_wall_seconds=1.0, grace_wall_seconds=1.0)
pytestmark = pytest.mark.timeout(420)


def _cloud(tmp_path, pattern: str, time_scale: float) -> LocalCloudServer:
    """A one-zone local cloud whose clock starts when the worker first connects."""
    return LocalCloudServer.from_traces(
        [trace("us-east-1a_v100_1", pattern)],
        time_scale=time_scale,
        workdir=tmp_path / "cloud",
        config=FAST,
        start_on_first_client=True,
    )


def test_preemptions_leave_the_flows_retries_for_its_own_errors(prefect_api, tmp_path):
    """retries=1, preempted twice, then its own code fails once: still retried, Completed."""
    from prefect import get_client
    from prefect.deployments import run_deployment

    # One trace tick per second: up 25 s, down 3 s, up 25 s, down 3 s, then up.
    pattern = "1" * 25 + "0" * 3 + "1" * 25 + "0" * 3 + "1" * 2000
    with _cloud(tmp_path, pattern, time_scale=60.0) as cloud:
        deployment_id = deploy_example_flow(
            "spot-budgets",
            "budgets",
            {
                "provider_options": {"url": cloud.url, "workdir": str(cloud.cloud.workdir)},
                "on_demand_fallback": False,
                "max_preemptions": 3,
                "capacity_wait": 0.5,
                "max_capacity_waits": 200,
                "checkpoint_root": (tmp_path / "ckpt").as_uri(),
            },
            source=HERE,
            entrypoint="spot_test_flows.py:preempted_twice_then_fails_once",
        )
        with running_worker("spot-budgets", tmp_path / "worker.log"):
            run = run_deployment(
                deployment_id, timeout=0, parameters={"marks": str(tmp_path / "marks")}
            )
            with get_client(sync_client=True) as client:
                run = wait_completed(client, run.id, timeout=300)
                names = [s.name for s in client.read_flow_run_states(run.id)]
            record = final_record(run.id)
        assert wait_until(lambda: not marked_processes(str(tmp_path)), timeout=20), (
            "a lease process outlived the flow run"
        )
    logs = (tmp_path / "worker.log").read_text(errors="replace")
    assert run.state.is_completed(), f"{run.state!r} {names}\n{logs[-3000:]}"
    assert [a.outcome for a in record.attempts] == [
        Outcome.PREEMPTED,
        Outcome.PREEMPTED,
        Outcome.SUCCEEDED,
    ], record.attempts
    # A plain flow (no spot_task) is handed back on the reclaim notice too: never shown
    # Crashed or Failed on the way, so automations on those states do not fire.
    assert not {"Crashed", "Failed"} & set(names), names
    # Prefect itself retried the flow's own error once, in the third attempt's process.
    assert names[-4:] == ["Running", "AwaitingRetry", "Running", "Completed"], names
    assert (tmp_path / "marks" / "failed-once").exists()
    # Runs spent by preemptions were given back: the one retry is still the user's.
    assert run.empirical_policy.retries == run.run_count - 1, (run.run_count, run.empirical_policy)
    assert record.preemptions == 2 and record.user_failures == 0


def test_transient_observe_errors_do_not_end_the_attempt(prefect_api, tmp_path):
    from prefect import get_client
    from prefect.deployments import run_deployment

    marks = tmp_path / "marks"
    with (
        _cloud(tmp_path, "1" * 5000, time_scale=60.0) as cloud,
        FaultProxy(cloud.url, match="/describe") as proxy,
    ):
        deployment_id = deploy_example_flow(
            "spot-flaky",
            "flaky",
            {
                "provider_options": {"url": proxy.url, "workdir": str(cloud.cloud.workdir)},
                "checkpoint_root": (tmp_path / "ckpt").as_uri(),
            },
            source=HERE,
            entrypoint="spot_test_flows.py:naps",
        )
        with running_worker("spot-flaky", tmp_path / "worker.log"):
            run = run_deployment(
                deployment_id, timeout=0, parameters={"seconds": 12.0, "marks": str(marks)}
            )
            assert wait_until(lambda: (marks / "started").exists(), timeout=120)
            for mode in ("503", "reset"):  # the cloud API fails for a while, then heals
                proxy.mode = mode
                time.sleep(2.5)
            proxy.mode = None
            with get_client(sync_client=True) as client:
                run = wait_completed(client, run.id, timeout=120)
            record = final_record(run.id)
    logs = (tmp_path / "worker.log").read_text(errors="replace")
    assert proxy.failed > 0, "the proxy never failed a describe call"
    assert run.state.is_completed(), f"{run.state!r}\n{logs[-3000:]}"
    assert [a.outcome for a in record.attempts] == [Outcome.SUCCEEDED], record.attempts


def test_cancelling_a_flow_run_stops_its_attempt_and_lease(prefect_api, tmp_path):
    from prefect import get_client
    from prefect.deployments import run_deployment
    from prefect.states import Cancelling

    from prefect_spot.artifacts import load_record, record_key

    marks = tmp_path / "marks"
    with _cloud(tmp_path, "1" * 5000, time_scale=60.0) as cloud:
        deployment_id = deploy_example_flow(
            "spot-cancel",
            "cancel",
            {
                "provider_options": {"url": cloud.url, "workdir": str(cloud.cloud.workdir)},
                "checkpoint_root": (tmp_path / "ckpt").as_uri(),
            },
            source=HERE,
            entrypoint="spot_test_flows.py:naps",
        )
        with running_worker("spot-cancel", tmp_path / "worker.log"):
            run = run_deployment(
                deployment_id, timeout=0, parameters={"seconds": 240.0, "marks": str(marks)}
            )
            assert wait_until(lambda: (marks / "started").exists(), timeout=120)
            with get_client(sync_client=True) as client:
                client.set_flow_run_state(run.id, Cancelling(), force=True)
                assert wait_until(
                    lambda: client.read_flow_run(run.id).state.is_cancelled(), timeout=60
                )
            assert wait_until(
                lambda: load_record(record_key(run.id)).current_attempt is None, timeout=30
            )
            assert wait_until(lambda: not marked_processes(str(tmp_path)), timeout=20), (
                "the cancelled flow run's lease is still running"
            )
            record = load_record(record_key(run.id))
    assert len(record.attempts) == 1 and record.attempts[0].outcome is not None
    assert record.attempts[0].outcome is not Outcome.SUCCEEDED
