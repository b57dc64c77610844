"""SpotJobOperator with ``provider="ec2"`` against moto in server mode.

The instance runtime harness plays the instances moto launches (each runs its
user-data as a local process with its own IMDSv2 emulator). The deferrable test drives
the operator the way Airflow does: ``execute`` defers, the real trigger watches the
lease until it fires, ``execute_complete`` gets its event, and so on to the end.
"""

from __future__ import annotations

import base64
import sys
from datetime import datetime

import pytest
from airflow.sdk import DAG

from airflow_spot.operators.spot import RECORD_KEY, SpotJobOperator, SpotUserStepFailed
from spot_core.model import JobRecord
from spot_emulators.ec2_runtime import Ec2InstanceRuntime, default_instance_env
from tests.support.aws_helpers import (
    bucket,  # noqa: F401 - a fixture / shared name
    client,
    make_network,
    managed_live_instances,  # noqa: F401
    preempt_after_checkpoints,
    unique,
)
from tests.support.spot_helpers import train_command
from tests.support.task_context import TI, StateStore, drive_deferrals

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def ec2(aws_env, bucket, tmp_path):
    net = make_network(aws_env)
    # Interruption warnings go to an EventBridge-fed SQS queue too, as in a real account, so
    # a reclaim is recognised even if the agent's report is slow on a loaded machine.
    queue = client("sqs", aws_env).create_queue(QueueName=unique("spot-events"))["QueueUrl"]
    runtime = Ec2InstanceRuntime(
        aws_env,
        tmp_path / "runtime",
        ("us-east-1",),
        default_instance_env(aws_env, "us-east-1"),
        sqs_queue_url=queue,
        notice_seconds=10.0,
    )
    with runtime:
        yield aws_env, {**net, "queue": queue}, bucket, runtime
    assert managed_live_instances(aws_env) == [], "orphans left"


def _operator(endpoint, net, **kwargs) -> SpotJobOperator:
    options = {
        "region": "us-east-1",
        "endpoint_url": endpoint,
        "subnets": net["subnets"],
        "instance_types": ["g4dn.xlarge"],
        "image_id": net["image_id"],
        "instance_profile": net["instance_profile"],
        "agent_python": sys.executable,
        "watch_poll_interval": 0.1,
        "sqs_queue_url": net["queue"],
    }
    with DAG("ec2_dag", schedule=None, start_date=datetime(2026, 1, 1)):
        return SpotJobOperator(
            task_id="train",
            provider="ec2",
            provider_options=options,
            poll_interval=0.2,
            capacity_wait=1.0,
            **kwargs,
        )


def test_deferrable_ec2_job_is_preempted_and_resumes_from_s3_on_demand(ec2):
    endpoint, net, bucket, runtime = ec2
    uri = f"s3://{bucket}/airflow-train"
    op = _operator(
        endpoint,
        net,
        command=list(train_command(steps=300, every_steps=25)),
        checkpoint_uri=uri,
        max_preemptions=1,
        deferrable=True,
    )
    store, ti = StateStore(), TI()
    preempt_after_checkpoints(runtime, uri, attempts=(1,))
    summary = drive_deferrals(op, {"task_state_store": store, "ti": ti})
    assert summary["status"] == "succeeded" and summary["preemptions"] == 1, summary
    record = JobRecord.from_dict(store.data[RECORD_KEY])
    assert [str(a.pool.market) for a in record.attempts] == ["spot", "on-demand"]
    assert record.attempts[1].checkpoint_step_start > 0, "resumed from the S3 checkpoint"
    assert all(a.cost > 0 for a in record.attempts)
    assert ti.xcom["spot_ec2_instance_link"] == (
        "https://console.aws.amazon.com/ec2/home?region=us-east-1"
        f"#InstanceDetails:instanceId={record.attempts[-1].lease_id}"
    )
    assert ti.xcom[RECORD_KEY]["status"] == "succeeded"


def test_image_reaches_the_instance_and_a_failing_container_is_a_user_failure(ec2):
    endpoint, net, bucket, runtime = ec2
    op = _operator(
        endpoint,
        net,
        command=["python", "train.py"],
        image="ghcr.io/acme/train:1.4",
        checkpoint_uri=f"s3://{bucket}/image-job",
        env={"WANDB_MODE": "offline"},
        deferrable=False,
    )
    store, ti = StateStore(), TI()
    # The image exists nowhere (and no engine need run here): the container cannot start,
    # which is the step failing. tests/images runs image jobs on EC2 under a real engine.
    with pytest.raises(SpotUserStepFailed):
        op.execute({"task_state_store": store, "ti": ti})
    record = JobRecord.from_dict(store.data[RECORD_KEY])
    raw = client("ec2", endpoint).describe_instance_attribute(
        InstanceId=record.attempts[0].lease_id, Attribute="userData"
    )
    script = base64.b64decode(raw["UserData"]["Value"]).decode()
    # The container gets the job's environment by name (values never on the command line),
    # SPOT_CHECKPOINT_INTERVAL (the attempt's checkpoint interval) among it.
    launch = next(line for line in script.splitlines() if "-m spot_core.container" in line)
    assert "--image ghcr.io/acme/train:1.4" in launch and "--env WANDB_MODE" in launch
    assert "--env SPOT_CHECKPOINT_INTERVAL" in launch
    assert launch.rstrip().endswith("-- python train.py") or "-- python train.py" in launch
