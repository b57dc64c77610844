"""The spot worker: job variables validated; end to end (on a Prefect server backed by
PostgreSQL), a preempted flow run is rescheduled and resumes from its checkpoint instead
of ending Crashed."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from pydantic import ValidationError

from prefect_spot.workers import SpotJobConfiguration, SpotJobVariables, SpotWorker
from spot_core.model import JobRecord, Outcome
from tests.support.prefect_helpers import (
    PREFECT,
    deploy_example_flow,
    final_record,
    running_worker,
    wait_completed,
)


@pytest.fixture
def prefect_api(prefect_server_on_postgres):
    """This module's tests talk to a Prefect server on PostgreSQL, as production runs."""
    yield


def test_worker_type_is_discoverable_as_spot():
    from prefect.workers.base import BaseWorker

    assert BaseWorker.get_worker_class_from_type("spot") is SpotWorker
    proc = subprocess.run(
        [str(PREFECT), "worker", "start", "--help"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0


def test_base_job_template_describes_every_variable():
    template = SpotWorker.get_default_base_job_template()
    properties = template["variables"]["properties"]
    for name in (
        "zones",
        "instance_types",
        "max_spot_price",
        "max_preemptions",
        "on_demand_fallback",
        "checkpoint_root",
        "provider_options",
    ):
        assert properties[name]["description"], name
        assert template["job_configuration"][name] == "{{ " + name + " }}"
    assert properties["max_preemptions"]["minimum"] == 0


@pytest.mark.parametrize(
    "values, message",
    [
        ({"max_preemptions": -1}, "spot worker: max_preemptions=-1 must be >= 0"),
        ({"max_spot_price": 0}, "spot worker: max_spot_price=0 must be > 0 USD/h"),
        ({"checkpoint_root": "ftp://host/ckpt"}, "pass file:///absolute/path or s3://"),
        ({"provider": "azure-batch"}, "provider='azure-batch' is not installed; choose one of"),
        ({"max_capacity_waits": 0}, "max_capacity_waits=0 must be >= 1"),
        ({"heartbeat_timeout": "soon"}, "heartbeat_timeout='soon' is not a duration"),
    ],
)
def test_bad_job_variables_are_rejected_with_clear_messages(values, message):
    with pytest.raises(ValidationError, match=message):
        SpotJobVariables(**values)
    with pytest.raises(ValidationError, match=message):
        SpotJobConfiguration(**values)


def test_server_rejects_a_deployment_with_bad_job_variables(prefect_api):
    from prefect import get_client
    from prefect.client.schemas.actions import WorkPoolCreate

    with get_client(sync_client=True) as client:
        client.create_work_pool(
            WorkPoolCreate(
                name="spot-validation",
                type="spot",
                base_job_template=SpotWorker.get_default_base_job_template(),
            ),
            overwrite=True,
        )
        flow_id = client.create_flow_from_name("validation-flow")
        with pytest.raises(Exception, match="max_preemptions|-1"):
            client.create_deployment(
                flow_id=flow_id,
                name="bad",
                work_pool_name="spot-validation",
                job_variables={"max_preemptions": -1},
                entrypoint="x.py:f",
            )


def _artifacts_of(flow_run_id, record: JobRecord, timeout: float = 30) -> list:
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    deadline, found = time.monotonic() + timeout, []
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            found = client.read_artifacts(
                artifact_filter=ArtifactFilter(
                    flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])
                )
            )
            if _final_table(found, record) is not None:
                return found
            time.sleep(0.5)
    return found


def _rows(artifact) -> list[dict]:
    return json.loads(artifact.data) if isinstance(artifact.data, str) else artifact.data


def _final_table(artifacts: list, record: JobRecord):
    """The table artifact version that shows every attempt (earlier versions show fewer)."""
    return next(
        (a for a in artifacts if a.type == "table" and len(_rows(a)) == len(record.attempts)), None
    )


def test_worker_reschedules_a_preempted_flow_run_which_resumes_and_completes(prefect_api, tmp_path):
    from prefect import get_client
    from prefect.deployments import run_deployment

    pool = "spot-e2e"
    # us-west-2b keeps its capacity for about 30 s after trace tick 479 at half an hour
    # per second (the trace starts when the worker opens its cloud, at its first run),
    # then loses it: the flow run is preempted in the middle of training, with room for
    # a slow flow-run start on a busy machine.
    deployment_id = deploy_example_flow(
        pool,
        "e2e",
        {
            "zones": ["us-west-2b"],
            "max_preemptions": 1,
            "provider_options": {"start_tick": 479, "time_scale": 1800.0},
            "checkpoint_root": (tmp_path / "ckpt").as_uri(),
            "capacity_wait": 0.5,
            # the reschedule path; the default hands over (test_worker_handover.py)
            "handover": "off",
        },
    )
    with running_worker(pool, tmp_path / "worker.log"):
        run = run_deployment(
            deployment_id,
            timeout=0,
            parameters={"workdir": str(tmp_path / "work"), "steps": 4000, "step_seconds": 0.01},
        )
        with get_client(sync_client=True) as client:
            run = wait_completed(client, run.id, timeout=240)
            states = client.read_flow_run_states(run.id)
        record = final_record(run.id)
        found = _artifacts_of(run.id, record)  # the worker publishes them as it finishes
    logs = (tmp_path / "worker.log").read_text(errors="replace")
    assert run.state.is_completed(), f"{run.state!r}\n{logs[-4000:]}"
    names = [s.name for s in states]
    # A preemption never shows as a final state, even for a moment (automations on
    # Failed or Crashed would fire): the worker puts the Running run back.
    assert "AwaitingRetry" in names and not {"Failed", "Crashed"} & set(names), names
    assert record.preemptions >= 1
    assert record.attempts[0].outcome is Outcome.PREEMPTED
    assert record.attempts[-1].outcome is Outcome.SUCCEEDED
    resumed = record.summary()["resumed_from_steps"]
    assert resumed and resumed[-1] > 0
    rows = _rows(_final_table(found, record))
    assert any(a.type == "markdown" and "preemptions" in a.data for a in found)
    assert [row["outcome"] for row in rows] == [str(a.outcome) for a in record.attempts]
    assert rows[-1]["resumed from step"] == resumed[-1]


def test_a_flow_run_whose_worker_is_killed_ends_failed_rather_than_running(prefect_api, tmp_path):
    """Only a reclaim notice hands a run back without a final state: when the worker is
    killed, nobody would reschedule it, so after the heartbeat timeout the lease's
    watcher stops the step (a driver_lost notice) and the run ends Failed, not left
    Running for ever."""
    from prefect import get_client
    from prefect.deployments import run_deployment

    from spot_core.checkpoint import open_store

    pool = "spot-orphan"
    # us-west-2b has capacity for hours of trace time from tick 479 at real time.
    deployment_id = deploy_example_flow(
        pool,
        "orphan",
        {
            "zones": ["us-west-2b"],
            "heartbeat_timeout": 15,
            "provider_options": {"start_tick": 479, "time_scale": 1.0},
            "checkpoint_root": (tmp_path / "ckpt").as_uri(),
        },
    )
    with get_client(sync_client=True) as client:
        with running_worker(pool, tmp_path / "worker.log") as worker:
            run = run_deployment(
                deployment_id,
                timeout=0,
                parameters={
                    "workdir": str(tmp_path / "work"),
                    "steps": 100_000,
                    "step_seconds": 0.01,
                },
            )
            store = open_store((tmp_path / "ckpt" / str(run.id)).as_uri())
            deadline = time.monotonic() + 120
            while store.latest() is None:  # the spot_task is training
                assert time.monotonic() < deadline, client.read_flow_run(run.id).state
                time.sleep(0.5)
            worker.kill()
            worker.wait(timeout=30)
        deadline = time.monotonic() + 120
        while not (state := client.read_flow_run(run.id).state).is_final():
            assert time.monotonic() < deadline, f"still {state.name} 120 s after the kill"
            time.sleep(1)
    assert state.is_failed(), state


def test_kill_infrastructure_terminates_the_lease(prefect_api, tmp_path):
    import anyio

    from spot_core.providers.base import LaunchSpec

    configuration = SpotJobConfiguration(zones=["us-west-2b"], provider_options={"start_tick": 600})

    async def scenario():
        async with SpotWorker(work_pool_name="spot-kill", create_pool_if_not_found=True) as worker:
            provider = worker._provider(configuration)
            pool = next(p for p in provider.pools() if p.zone == "us-west-2b")
            lease = provider.launch(
                LaunchSpec(
                    job_id="kill-me",
                    attempt=1,
                    command=(sys.executable, "-c", "import time; time.sleep(120)"),
                    checkpoint_uri=(tmp_path / "ckpt").as_uri(),
                ),
                pool,
            )
            assert not provider.observe([lease])[lease.lease_id].ended
            await worker.kill_infrastructure(lease.lease_id, configuration, grace_seconds=1)
            status = provider.observe([lease])[lease.lease_id]
            from prefect.exceptions import InfrastructureNotFound

            with pytest.raises(InfrastructureNotFound):
                await worker.kill_infrastructure("i-local-nope", configuration)
            return status

    status = anyio.run(scenario)
    assert status.ended and status.state.value == "terminated"


def test_kill_infrastructure_reaches_a_lease_launched_by_another_process(prefect_api, tmp_path):
    """With a shared local cloud server, the lease outlives the process that launched it
    and the worker terminates it by id (as on cancellation from the UI)."""
    import anyio

    from spot_core.localcloud.server import LocalCloudServer
    from spot_core.providers import open_provider
    from spot_core.providers.base import LaunchSpec

    with LocalCloudServer.from_traces(workdir=tmp_path / "cloud", start_tick=600) as server:
        launcher = open_provider(
            "local", url=server.url, workdir=server.cloud.workdir
        )  # stands in for another process
        pool = next(p for p in launcher.pools() if p.zone == "us-west-2b")
        lease = launcher.launch(
            LaunchSpec(
                job_id="remote",
                attempt=1,
                command=(sys.executable, "-c", "import time; time.sleep(120)"),
                checkpoint_uri=(tmp_path / "ckpt").as_uri(),
            ),
            pool,
        )
        configuration = SpotJobConfiguration(
            provider_options={"url": server.url, "workdir": str(server.cloud.workdir)}
        )

        async def kill():
            async with SpotWorker(work_pool_name="spot-kill-remote") as worker:
                await worker.kill_infrastructure(lease.lease_id, configuration)

        anyio.run(kill)
        status = launcher.observe([lease])[lease.lease_id]
    assert status.ended and status.state.value == "terminated"
