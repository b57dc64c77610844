"""The spot worker with provider="ec2": the job configuration is checked up front (clear
messages, no cloud call), the worker opens the EC2 provider against moto in server mode,
builds the flow-run command with the instance's Python, keeps credentials out of the
lease's environment, and terminates an instance by id on cancellation."""

from __future__ import annotations

import logging
import sys
import uuid

import pytest
from pydantic import ValidationError

from prefect_spot import _jobs
from prefect_spot.workers import SpotJobConfiguration, SpotJobVariables, SpotWorker
from tests.support.aws_helpers import make_network, managed_live_instances

pytestmark = pytest.mark.timeout(180)
REGION = "us-east-1"
GOOD = {
    "region": REGION,
    "subnets": ["subnet-1"],
    "image_id": "ami-1",
    "instance_types": ["g4dn.xlarge"],
}


@pytest.mark.parametrize(
    "values, message",
    [
        (
            {"provider_options": {**GOOD, "colour": "blue"}, "checkpoint_root": "s3://b/flows"},
            r"unknown ec2 provider option\(s\) \['colour'\]",
        ),
        (
            {
                "provider_options": {k: v for k, v in GOOD.items() if k != "image_id"},
                "checkpoint_root": "s3://b/flows",
            },
            r"needs provider_options \['image_id'\]",
        ),
        ({"provider_options": GOOD}, "needs checkpoint_root 's3://bucket/prefix'"),
        (
            {"provider_options": GOOD, "checkpoint_root": "file:///tmp/ckpt"},
            "its instances cannot see this machine's disk",
        ),
    ],
)
def test_bad_ec2_job_variables_are_rejected_with_clear_messages(values, message):
    for model in (SpotJobVariables, SpotJobConfiguration):
        with pytest.raises(ValidationError, match=message):
            model(provider="ec2", **values)


def test_ec2_job_variables_are_accepted_and_offered_in_the_template():
    config = SpotJobConfiguration(
        provider="ec2", provider_options=GOOD, checkpoint_root="s3://b/flows"
    )
    assert config.spot_configuration().provider == "ec2"
    template = SpotWorker.get_default_base_job_template()
    assert template["variables"]["properties"]["provider"]["enum"] == ["local", "ec2", "kubernetes"]


def test_lease_env_keeps_credentials_off_remote_leases(caplog):
    env = {
        "PREFECT_API_URL": "http://prefect:4200/api",
        "PREFECT_API_KEY": "pnu_x",
        "DB_PASSWORD": "hunter2",
        "BATCH": "7",
    }
    with caplog.at_level(logging.WARNING):
        remote = _jobs.lease_env("ec2", env, logging.getLogger("test"))
    assert remote == {"PREFECT_API_URL": "http://prefect:4200/api", "BATCH": "7"}
    assert "PREFECT_API_KEY" in caplog.text and "pnu_x" not in caplog.text
    assert _jobs.lease_env("local", env) == env


def test_worker_opens_ec2_and_terminates_an_instance_by_id(prefect_api, aws_env, bucket):
    import anyio
    from prefect.client.schemas.objects import FlowRun

    from spot_core.providers.base import LaunchSpec

    net = make_network(aws_env)
    configuration = SpotJobConfiguration(
        provider="ec2",
        checkpoint_root=f"s3://{bucket}/flows",
        provider_options={
            "endpoint_url": aws_env,
            "region": REGION,
            "subnets": net["subnets"],
            "instance_types": ["g4dn.xlarge"],
            "image_id": net["image_id"],
            "instance_profile": net["instance_profile"],
            "agent_python": "/opt/step/bin/python",
        },
    )
    flow_run = FlowRun(id=uuid.uuid4(), name="ec2-run", flow_id=uuid.uuid4())
    configuration.prepare_for_flow_run(flow_run)
    assert configuration.command.startswith("/opt/step/bin/python -m prefect_spot._engine")

    async def scenario():
        async with SpotWorker(work_pool_name="spot-ec2", create_pool_if_not_found=True) as worker:
            provider = worker._provider(configuration)
            assert provider.name == "ec2"
            assert {p.zone for p in provider.pools()} == {f"{REGION}a", f"{REGION}b"}
            assert (
                worker._checkpoint_uri(configuration, flow_run)
                == f"s3://{bucket}/flows/{flow_run.id}"
            )
            lease = provider.launch(
                LaunchSpec(
                    job_id="kill-me",
                    attempt=1,
                    command=("sleep", "120"),
                    checkpoint_uri=f"s3://{bucket}/flows/kill-me",
                ),
                provider.pools()[0],
            )
            assert lease.lease_id in managed_live_instances(aws_env)
            await worker.kill_infrastructure(lease.lease_id, configuration, grace_seconds=1)
            # Gone now, not only when the worker closes its providers on exit.
            assert lease.lease_id not in managed_live_instances(aws_env)

    anyio.run(scenario)
    assert managed_live_instances(aws_env) == []


def _options(aws_env: str, net: dict) -> dict:
    """The ec2 provider options of the end-to-end runs: moto's network, the agent in this
    interpreter, the node's watcher polling fast."""
    return {
        "endpoint_url": aws_env,
        "region": REGION,
        "subnets": net["subnets"],
        "instance_types": ["g4dn.xlarge"],
        "image_id": net["image_id"],
        "instance_profile": net["instance_profile"],
        "agent_python": sys.executable,
        "watch_poll_interval": 0.1,
    }


@pytest.mark.timeout(420)
def test_worker_runs_a_flow_run_on_ec2_reschedules_it_when_preempted_and_it_completes(
    prefect_api, aws_env, bucket, tmp_path
):
    """End to end: the flow run itself on an (emulated) EC2 instance; reclaimed after its
    first S3 checkpoint, rescheduled, resumed from S3 on a new instance, completed."""
    from prefect import get_client
    from prefect.deployments import run_deployment

    from spot_core.model import Outcome
    from spot_emulators.ec2_runtime import Ec2InstanceRuntime, default_instance_env
    from tests.support.aws_helpers import preempt_after_checkpoints
    from tests.support.prefect_helpers import (
        deploy_example_flow,
        final_record,
        running_worker,
        wait_completed,
    )

    net = make_network(aws_env)
    pool = "spot-ec2-e2e"
    deployment_id = deploy_example_flow(
        pool,
        "ec2-e2e",
        {
            "provider": "ec2",
            "max_preemptions": 1,
            # the reschedule path (the default hands over: test_worker_handover.py)
            "handover": "off",
            "capacity_wait": 0.5,
            "checkpoint_root": f"s3://{bucket}/flows",
            "provider_options": _options(aws_env, net),
        },
    )
    # A notice long enough for the flow run's engine to save, report its state and exit,
    # and for the on-instance agent to write its status report (EC2 gives two minutes).
    runtime = Ec2InstanceRuntime(
        aws_env,
        tmp_path / "runtime",
        (REGION,),
        default_instance_env(aws_env, REGION),
        notice_seconds=20.0,
        grace_seconds=5.0,
    )
    with runtime, running_worker(pool, tmp_path / "worker.log"):
        run = run_deployment(
            deployment_id,
            timeout=0,
            parameters={"workdir": str(tmp_path / "work"), "steps": 600, "step_seconds": 0.01},
        )
        preempt_after_checkpoints(
            runtime, f"s3://{bucket}/flows/{run.id}", attempts=(1,), timeout=150
        )
        with get_client(sync_client=True) as client:
            run = wait_completed(client, run.id, timeout=240)
            states = client.read_flow_run_states(run.id)
        record = final_record(run.id)
    logs = (tmp_path / "worker.log").read_text(errors="replace")
    instance_logs = "\n".join(
        p.read_text(errors="replace")[-1500:] for p in (tmp_path / "runtime").glob("i-*.log")
    )
    assert run.state.is_completed(), f"{run.state!r}\n{logs[-3000:]}\n{instance_logs}"
    assert "AwaitingRetry" in [s.name for s in states]
    assert record.preemptions == 1
    assert record.attempts[0].outcome is Outcome.PREEMPTED
    assert record.attempts[-1].outcome is Outcome.SUCCEEDED
    assert all(a.lease_id.startswith("i-") for a in record.attempts)
    assert record.attempts[-1].checkpoint_step_start > 0
    assert managed_live_instances(aws_env) == []
    for script in (tmp_path / "runtime").glob("*.user-data.sh"):
        text = script.read_text()
        assert "AWS_SECRET_ACCESS_KEY" not in text and "PREFECT_API_KEY" not in text


@pytest.mark.timeout(300)
def test_worker_hands_over_on_ec2_on_the_notice_and_the_same_flow_run_completes(
    prefect_api, aws_env, bucket, tmp_path
):
    """handover=on_notice (EC2's default, the notice from EventBridge through SQS): the
    replacement instance boots while the old one saves; its engine starts on the worker's
    go, the same flow run resumes from the emergency checkpoint in S3 and completes."""
    import json
    from pathlib import Path

    from prefect import get_client
    from prefect.deployments import run_deployment

    from spot_core.checkpoint import open_store
    from spot_core.checkpoint.resumed import read_resumed
    from spot_core.errors import FencedOut
    from spot_core.model import Outcome
    from spot_emulators.ec2_runtime import Ec2InstanceRuntime, default_instance_env
    from tests.support.aws_helpers import client, preempt_after_checkpoints, unique
    from tests.support.prefect_helpers import (
        deploy_example_flow,
        final_record,
        running_worker,
        wait_completed,
    )

    net = make_network(aws_env)
    queue = client("sqs", aws_env).create_queue(QueueName=unique("spot-events"))["QueueUrl"]
    pool, steps = "spot-ec2-handover", 1000
    deployment_id = deploy_example_flow(
        pool,
        "ec2-handover",
        {
            "provider": "ec2",
            "max_preemptions": 1,
            "capacity_wait": 0.5,
            "poll_interval": 0.5,
            "checkpoint_root": f"s3://{bucket}/flows",
            "provider_options": {**_options(aws_env, net), "sqs_queue_url": queue},
        },
        source=Path(__file__).resolve().parent,
        entrypoint="spot_test_flows.py:sums_through_a_handover",
    )
    runtime = Ec2InstanceRuntime(
        aws_env,
        tmp_path / "runtime",
        (REGION,),
        default_instance_env(aws_env, REGION),
        notice_seconds=20.0,
        grace_seconds=5.0,
        sqs_queue_url=queue,
    )
    with runtime, running_worker(pool, tmp_path / "worker.log"):
        run = run_deployment(
            deployment_id,
            timeout=0,
            parameters={
                "total_steps": steps,
                "step_seconds": 0.02,
                "save_seconds": 1.5,
                "result": str(tmp_path / "result.json"),
            },
        )
        store_uri = f"s3://{bucket}/flows/{run.id}"
        preempt_after_checkpoints(runtime, store_uri, attempts=(1,), timeout=150)
        with get_client(sync_client=True) as prefect:
            run = wait_completed(prefect, run.id, timeout=240)
            names = [s.name for s in prefect.read_flow_run_states(run.id)]
        record = final_record(run.id)
    logs = (tmp_path / "worker.log").read_text(errors="replace")
    assert run.state.is_completed(), f"{run.state!r} {names}\n{logs[-3000:]}"
    old, new = record.attempts
    assert (old.outcome, new.outcome) == (Outcome.PREEMPTED, Outcome.SUCCEEDED), record.attempts
    assert new.started_at < old.ended_at and old.replacement["state"] == "adopted"
    assert "AwaitingRetry" not in names and not {"Failed", "Crashed"} & set(names), names
    store = open_store(store_uri)
    emergency = json.loads((tmp_path / f"emergency-{old.number}.json").read_text())["step"]
    resumed = read_resumed(store, new.number)
    assert resumed is not None and resumed.step == emergency == new.checkpoint_step_start
    assert json.loads((tmp_path / "result.json").read_text())["total"] == sum(range(steps))
    with pytest.raises(FencedOut):
        store.save(steps + 1, {"state.json": b"{}"}, attempt=old.number)
    assert managed_live_instances(aws_env) == []
