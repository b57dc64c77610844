"""moto in server mode for the AWS tests: one real HTTP endpoint per test session.

``moto_server`` starts one ``moto_server`` per test session
(``spot_emulators.moto_server.running_moto``, which the benchmarks use too);
``aws_env`` points boto3 and every subprocess at it with throwaway credentials (moto
accepts any). moto's state is not reset between tests (that costs seconds each): tests
use fresh buckets and job ids, and each leaves no live instance behind.
"""

from __future__ import annotations

import os
import time

import pytest

from spot_emulators.moto_server import running_moto  # noqa: F401  (also imported from here)
from tests.support.process_helpers import free_port  # noqa: F401  (also imported from here)

REGION = "us-east-1"


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory):
    pytest.importorskip("moto")
    with running_moto(tmp_path_factory.mktemp("moto") / "moto.log") as url:
        yield url


AWS_ENV = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_DEFAULT_REGION",
    "AWS_REGION",
    "AWS_ENDPOINT_URL",
    "SPOT_S3_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CONFIG_FILE",
)


@pytest.fixture
def aws_env(moto_server, monkeypatch):
    """Credentials and endpoints for moto, in this process and its children; fresh state."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("SPOT_S3_ENDPOINT_URL", moto_server)
    # No reset between tests: rebuilding moto's EC2 backend costs seconds per test. Tests use
    # fresh buckets, queues and job ids instead, and each leaves no live instance behind.
    return moto_server


_counter = iter(range(10**9))


def unique(prefix: str) -> str:
    return f"{prefix}-{os.getpid()}-{next(_counter)}"


@pytest.fixture
def bucket(aws_env) -> str:
    name = unique("ckpt")
    client("s3", aws_env).create_bucket(Bucket=name)
    return name


def client(service: str, endpoint: str, region: str = REGION):
    """The tests' own (administrator's) client: moto's throwaway keys given explicitly,
    so it works in tests whose process has no AWS credentials at all."""
    import boto3

    return boto3.client(
        service,
        region_name=region,
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def managed_live_instances(endpoint: str, regions=(REGION,)) -> list[str]:
    """Every pending/running instance tagged by the project, as moto reports it."""
    found = []
    for region in regions:
        ec2 = client("ec2", endpoint, region)
        pages = ec2.get_paginator("describe_instances").paginate(
            Filters=[
                {"Name": "tag:spot-pipelines:managed", "Values": ["true"]},
                {"Name": "instance-state-name", "Values": ["pending", "running"]},
            ]
        )
        found += [i["InstanceId"] for p in pages for r in p["Reservations"] for i in r["Instances"]]
    return found


_networks: dict[tuple[str, str, int], dict] = {}


def make_network(endpoint: str, region: str = REGION, zones: int = 2) -> dict:
    """A VPC with one subnet per zone, an AMI id and an instance profile, in moto
    (made once per moto server, region and zone count)."""
    key = (endpoint, region, zones)
    if key not in _networks:
        _networks[key] = _make_network(endpoint, region, zones)
    return dict(_networks[key])


def _make_network(endpoint: str, region: str, zones: int) -> dict:
    ec2 = client("ec2", endpoint, region)
    vpc = ec2.create_vpc(CidrBlock=f"10.{zones}.0.0/16")["Vpc"]["VpcId"]
    subnets = [
        ec2.create_subnet(
            VpcId=vpc, CidrBlock=f"10.{zones}.{i}.0/24", AvailabilityZone=f"{region}{'abcdef'[i]}"
        )["Subnet"]["SubnetId"]
        for i in range(zones)
    ]
    image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    iam = client("iam", endpoint, region)
    try:
        iam.create_instance_profile(InstanceProfileName="spot-pipelines-step")
    except iam.exceptions.EntityAlreadyExistsException:
        pass
    return {
        "region": region,
        "subnets": subnets,
        "image_id": image,
        "instance_profile": "spot-pipelines-step",
    }


def inject_errors(
    client, operation: str, code: str, *, times: int | None = None, when=lambda params: True
) -> list[dict]:
    """A fault injector in front of a real client: raise ``code`` for ``operation`` calls
    whose parameters match ``when`` (at most ``times`` times). Returns the calls it failed."""
    from botocore.exceptions import ClientError

    failed: list[dict] = []

    def hook(params, **kwargs):
        if when(params) and (times is None or len(failed) < times):
            failed.append(dict(params))
            raise ClientError({"Error": {"Code": code, "Message": f"injected {code}"}}, operation)

    service = client.meta.service_model.service_name
    client.meta.events.register(f"provide-client-params.{service}.{operation}", hook)
    return failed


def count_calls(client) -> dict[str, int]:
    """Operation name -> number of calls made through ``client`` from now on."""
    counts: dict[str, int] = {}

    def hook(model, **kwargs):
        counts[model.name] = counts.get(model.name, 0) + 1

    client.meta.events.register("before-call.*.*", hook)
    return counts


def preempt_after_checkpoints(runtime, store_uri: str, attempts, timeout: float = 90.0):
    """Background thread: once attempt N has committed a checkpoint, reclaim the spot
    instance it runs on (so every preemption happens after real progress, whatever the
    machine's load). Returns the started thread; it ends after the last attempt."""
    import threading

    from spot_core.checkpoint import open_store

    store = open_store(store_uri)

    def victim():
        with runtime._lock:
            running = [
                i
                for i in runtime.instances.values()
                if i.spot and i.notice_at is None and i.process.poll() is None
            ]
        return running[0].instance_id if running else None

    def run():
        deadline = time.monotonic() + timeout
        for attempt in attempts:
            while time.monotonic() < deadline:
                if any(r.attempt == attempt for r in store.list()) and victim():
                    runtime.preempt(victim())
                    break
                time.sleep(0.1)

    thread = threading.Thread(target=run, daemon=True, name="preempter")
    thread.start()
    return thread
