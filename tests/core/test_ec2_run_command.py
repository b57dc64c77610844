"""`spot-pipelines run --provider ec2 --endpoint-url URL` end to end against moto, with the
instance runtime harness playing the instances; and Ctrl-C leaves no instance behind."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

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

pytestmark = pytest.mark.timeout(150)


@pytest.fixture
def setup(aws_env, bucket):
    net = make_network(aws_env)
    yield aws_env, net, bucket
    assert managed_live_instances(aws_env) == [], "orphans left"


def _args(endpoint, net, *extra):
    return [
        sys.executable,
        "-m",
        "spot_core.cli",
        "run",
        "--provider",
        "ec2",
        "--endpoint-url",
        endpoint,
        "--region",
        "us-east-1",
        "--subnets",
        ",".join(net["subnets"]),
        "--instance-types",
        "g4dn.xlarge",
        "--image-id",
        net["image_id"],
        "--instance-profile",
        net["instance_profile"],
        "--ec2-option",
        f"agent_python={sys.executable}",
        "--ec2-option",
        "watch_poll_interval=0.1",
        *extra,
    ]


def test_run_with_ec2_provider_preempts_resumes_and_finishes(setup, tmp_path):
    endpoint, net, bucket = setup
    queue = client("sqs", endpoint).create_queue(QueueName=unique("spot-events"))["QueueUrl"]
    runtime = Ec2InstanceRuntime(
        endpoint,
        tmp_path / "runtime",
        ("us-east-1",),
        default_instance_env(endpoint, "us-east-1"),
        sqs_queue_url=queue,
    )
    with runtime:
        preempt_after_checkpoints(runtime, f"s3://{bucket}/cli-job", attempts=(1,))
        proc = subprocess.run(
            _args(
                endpoint,
                net,
                "--checkpoint-uri",
                f"s3://{bucket}/cli-job",
                "--ec2-option",
                f"sqs_queue_url={queue}",
                "--max-preemptions",
                "1",
                "--json",
                "--",
                *train_command(steps=200, step_seconds=0.01, every_steps=25),
            ),
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
        )
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    assert record["status"] == "succeeded" and record["preemptions"] == 1, proc.stdout[-3000:]
    assert [a["pool"]["market"] for a in record["attempts"]] == ["spot", "on-demand"]
    assert record["attempts"][1]["checkpoint_step_start"] > 0
    assert "preempted" in proc.stdout


def test_sigint_to_run_terminates_its_instance(setup, tmp_path):
    endpoint, net, bucket = setup
    runtime = Ec2InstanceRuntime(
        endpoint, tmp_path / "runtime", ("us-east-1",), default_instance_env(endpoint, "us-east-1")
    )
    with runtime:
        proc = subprocess.Popen(
            _args(
                endpoint,
                net,
                "--checkpoint-uri",
                f"s3://{bucket}/sigint",
                "--",
                *train_command(steps=100000, step_seconds=0.01),
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
        )
        try:
            assert runtime.wait_for(
                lambda rt: any(i.process.poll() is None for i in rt.instances.values()), timeout=60
            )
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=30)
        finally:
            proc.kill()
        assert managed_live_instances(endpoint) == []
        assert runtime.wait_for(
            lambda rt: all(i.done or i.process.poll() is not None for i in rt.instances.values()),
            timeout=15,
        )
    assert proc.returncode != 0
    assert not runtime.live_pids(), "the instance's processes went with it"


def test_bad_ec2_options_are_one_line(setup, tmp_path):
    endpoint, net, bucket = setup
    proc = subprocess.run(
        _args(endpoint, net, "--checkpoint-uri", "file:///tmp/x", "--", "true"),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert proc.returncode == 2 and "s3://" in proc.stderr and "Traceback" not in proc.stderr
    proc = subprocess.run(
        _args(
            endpoint,
            net,
            "--checkpoint-uri",
            f"s3://{bucket}/x",
            "--ec2-option",
            "colour=blue",
            "--",
            "true",
        ),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert proc.returncode == 2 and "colour" in proc.stderr
