"""SpotTaskRunner with provider="ec2": against a real Prefect server, moto in server mode and
the instance runtime harness.

The runner exchanges a pickled call with its lease, authenticated with a per-job key; no
channel to an EC2 instance carries that key safely (user-data is readable with
DescribeInstanceAttribute, the store is what the key protects against), so the runner
refuses ec2 in one line before anything is launched or written. EC2 flows run on the
spot worker (tests/prefect/test_worker_ec2.py).
"""

from __future__ import annotations

import sys

import pytest
from prefect import flow, task

from aws_helpers import client, make_network, managed_live_instances
from prefect_helpers import count_to
from prefect_spot import SpotConfiguration, SpotTaskRunner
from spot_core.errors import ConfigError
from spot_core.emulators.ec2_runtime import Ec2InstanceRuntime, default_instance_env

pytestmark = pytest.mark.timeout(240)
REGION = "us-east-1"


@task(retries=0)
def bad_column() -> None:
    raise KeyError("no such column: price")


@pytest.fixture
def ec2(aws_env, bucket, tmp_path):
    """(endpoint, network, bucket, runtime); afterwards moto shows no live instance."""
    net = make_network(aws_env)
    runtime = Ec2InstanceRuntime(aws_env, tmp_path / "runtime", (REGION,),
                                 default_instance_env(aws_env, REGION))
    with runtime:
        yield aws_env, net, bucket, runtime
    assert managed_live_instances(aws_env) == [], "orphans left"


def ec2_config(endpoint: str, net: dict, **fields) -> SpotConfiguration:
    options = {"endpoint_url": endpoint, "region": REGION, "subnets": net["subnets"],
               "instance_types": ["g4dn.xlarge"], "image_id": net["image_id"],
               "instance_profile": net["instance_profile"], "agent_python": sys.executable,
               "watch_poll_interval": 0.1}
    return SpotConfiguration(provider="ec2", provider_options=options,
                             capacity_wait=0.5, poll_interval=0.2, **fields)


def test_the_runner_refuses_ec2_before_anything_is_launched_or_written(prefect_api, ec2,
                                                                      tmp_path):
    """The per-job key that authenticates the pickled call could only reach an EC2
    instance through user-data or the store: refused in one line, nothing launched, no
    pickle in S3 (docs/reliability.md, "Prefect")."""
    endpoint, net, bucket, runtime = ec2
    config = ec2_config(endpoint, net, max_preemptions=1)

    @flow(task_runner=SpotTaskRunner(config, checkpoint_storage=f"s3://{bucket}/tasks",
                                     workdir=tmp_path / "runner"))
    def pipeline():
        return count_to.submit(10, 0.0).result()

    with pytest.raises(ConfigError) as caught:
        pipeline()
    message = str(caught.value)
    assert "\n" not in message and "provider 'ec2'" in message
    assert "provider='local'" in message and "spot worker" in message
    assert managed_live_instances(endpoint) == []
    assert client("s3", endpoint).list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0
    assert not list((tmp_path / "runtime").glob("*.user-data.sh"))


def test_the_refusal_comes_before_the_store_check(prefect_api, aws_env):
    config = SpotConfiguration(provider="ec2", provider_options={
        "region": REGION, "subnets": ["subnet-1"], "instance_types": ["g4dn.xlarge"],
        "image_id": "ami-1"})

    @flow(task_runner=SpotTaskRunner(config))
    def pipeline():
        return bad_column.submit().result()

    with pytest.raises(ConfigError, match="SpotTaskRunner cannot run tasks on provider 'ec2'"):
        pipeline()


@pytest.mark.parametrize("options, message", [
    ({"subnets": ["subnet-1"], "image_id": "ami-1", "instance_types": ["g5.xlarge"],
      "aws_secret_access_key": "x"}, r"unknown ec2 provider option\(s\) \['aws_secret_access_key'\]"),
    ({"image_id": "ami-1", "instance_types": ["g5.xlarge"]}, r"needs provider_options \['subnets'\]"),
    ({"subnets": ["subnet-1"], "image_id": "ami-1"}, r"\['instance_types'\]"),
])
def test_bad_ec2_configuration_is_rejected_up_front(options, message):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=message):
        SpotConfiguration(provider="ec2", provider_options=options)


def test_ec2_instance_types_may_come_from_the_configuration():
    config = SpotConfiguration(provider="ec2", instance_types=["g5.xlarge"],
                               provider_options={"subnets": ["subnet-1"], "image_id": "ami-1"})
    assert config.provider == "ec2"
