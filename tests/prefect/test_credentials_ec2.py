"""EC2 spot work whose AWS credentials come only from a saved prefect-aws AwsCredentials
block: no ``AWS_*`` variable in the process (no profile, no instance role either).

- SpotTaskRunner: a saved SpotConfiguration and CheckpointStorage that reference the
  saved block launch, watch and bill an EC2 task (moto in server mode, the instance
  runtime playing the instances) and exchange the call through S3.
- The spot worker: the work pool's ``aws_credentials`` variable defaults to a reference to
  the block; the worker resolves it into its job configuration and reaches EC2 with it.

A credential never appears in a saved configuration, the job variables, the user-data or
the logs.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import uuid

import pytest
from prefect import flow

from prefect_spot import CheckpointStorage, SpotConfiguration, SpotTaskRunner, spot_record
from spot_core.model import Outcome
from spot_emulators.ec2_runtime import Ec2InstanceRuntime, default_instance_env
from tests.support.aws_helpers import (
    AWS_ENV,
    bucket,  # noqa: F401 - a fixture / shared name
    make_network,
    managed_live_instances,  # noqa: F401
    unique,
)
from tests.support.prefect_helpers import count_to

pytestmark = pytest.mark.timeout(240)
REGION = "us-east-1"
ACCESS_KEY = "AKIASPOTBLOCKTEST001"
SECRET_KEY = "block-secret-7d1e9a4c2b6f8e0a3c5d"
WIRE_LOGGERS = ("botocore", "urllib3", "boto3")  # the SDK's own wire dumps at DEBUG


@pytest.fixture
def block_only(prefect_api, aws_env, bucket, tmp_path, monkeypatch):
    """moto with a network and a bucket; a saved AwsCredentials block pointing at it; then
    a process with no AWS credentials of its own."""
    from prefect_aws import AwsCredentials
    from prefect_aws.client_parameters import AwsClientParameters

    net = make_network(aws_env)
    name = unique("spot-aws")
    AwsCredentials(
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        region_name=REGION,
        aws_client_parameters=AwsClientParameters(endpoint_url=aws_env),
    ).save(name)
    runtime = Ec2InstanceRuntime(
        aws_env, tmp_path / "runtime", (REGION,), default_instance_env(aws_env, REGION)
    )
    for variable in AWS_ENV:
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with runtime:
        yield aws_env, net, bucket, name
    assert managed_live_instances(aws_env) == [], "orphans left"


def _provider_options(net: dict) -> dict:
    """No endpoint, no region: both come from the credentials block."""
    return {
        "subnets": net["subnets"],
        "instance_types": ["g4dn.xlarge"],
        "image_id": net["image_id"],
        "instance_profile": net["instance_profile"],
        "agent_python": sys.executable,
        "watch_poll_interval": 0.1,
    }


def _no_secret_in(text: str) -> list[str]:
    return [s for s in (ACCESS_KEY, SECRET_KEY) if s in text]


def test_a_saved_credentials_block_drives_a_task_on_ec2(block_only, tmp_path, caplog):
    from prefect import get_client
    from prefect_aws import AwsCredentials

    endpoint, net, bucket, name = block_only
    caplog.set_level(logging.DEBUG)
    credentials = AwsCredentials.load(name)
    config_name, storage_name = unique("spot-ec2"), unique("spot-ckpt")
    SpotConfiguration(
        provider="ec2",
        provider_options=_provider_options(net),
        capacity_wait=0.5,
        poll_interval=0.2,
        aws_credentials=credentials,
    ).save(config_name)
    CheckpointStorage(uri=f"s3://{bucket}/block-tasks", aws_credentials=credentials).save(
        storage_name
    )

    @flow(
        task_runner=SpotTaskRunner(
            config_name,
            checkpoint_storage=storage_name,
            checkpoint_every_steps=10,
            workdir=tmp_path / "runner",
        )
    )
    def pipeline():
        future = count_to.submit(60, 0.01)
        return future.result(), spot_record(future)

    result, record = pipeline()
    assert result["total"] == 60 and result["instance"] == record.attempts[-1].lease_id
    assert record.attempts[-1].outcome is Outcome.SUCCEEDED and record.attempts[-1].cost > 0

    # The saved blocks hold a reference to the credentials block, not a copy of its keys
    # (reading one back hydrates the reference: prefect-aws shows the key id, never the
    # secret key).
    with get_client(sync_client=True) as client:
        for block, slug in (
            (config_name, "spot-configuration"),
            (storage_name, "spot-checkpoint-storage"),
        ):
            document = client.read_block_document_by_name(block, slug, include_secrets=False)
            reference = document.block_document_references["aws_credentials"]
            assert str(reference["block_document"]["id"]) == str(credentials._block_document_id)
            assert SECRET_KEY not in json.dumps(document.data, default=str)
    scripts = [p.read_text() for p in (tmp_path / "runtime").glob("*.user-data.sh")]
    assert scripts and not [s for s in scripts if _no_secret_in(s)]
    ours = [r for r in caplog.records if not r.name.startswith(WIRE_LOGGERS)]
    assert not _no_secret_in("\n".join(r.getMessage() for r in ours))


def test_the_work_pool_references_the_block_and_the_worker_reaches_ec2_with_it(block_only):
    """As prefect-aws' ECS pools: the work pool's ``aws_credentials`` variable defaults to
    a reference to the saved block; deployments and flow runs carry no credential, and
    the worker resolves the reference when it builds the job configuration."""
    import anyio
    from prefect import get_client
    from prefect.client.schemas.objects import FlowRun
    from prefect_aws import AwsCredentials

    from prefect_spot.workers import SpotJobConfiguration, SpotWorker
    from spot_core.providers.base import LaunchSpec
    from tests.support.prefect_helpers import deploy_example_flow

    endpoint, net, bucket, name = block_only
    reference = {"$ref": {"block_document_id": str(AwsCredentials.load(name)._block_document_id)}}
    template = SpotWorker.get_default_base_job_template()
    template["variables"]["properties"]["aws_credentials"]["default"] = reference
    pool = unique("spot-block-pool")
    deployment_id = deploy_example_flow(
        pool,
        "block-credentials",
        {
            "provider": "ec2",
            "checkpoint_root": f"s3://{bucket}/flows",
            "provider_options": _provider_options(net),
        },
        base_job_template=template,
    )
    with get_client(sync_client=True) as client:
        stored = client.read_deployment(deployment_id).job_variables
        pool_template = client.read_work_pool(pool).base_job_template
    assert pool_template["variables"]["properties"]["aws_credentials"]["default"] == reference
    assert not _no_secret_in(json.dumps(stored)) and not _no_secret_in(json.dumps(pool_template))

    async def scenario():
        async with get_client() as client:
            configuration = await SpotJobConfiguration.from_template_and_values(
                pool_template, stored, client=client
            )
        assert configuration.aws_credentials.aws_access_key_id == ACCESS_KEY  # resolved here
        flow_run = FlowRun(id=uuid.uuid4(), name="block-run", flow_id=uuid.uuid4())
        configuration.prepare_for_flow_run(flow_run)
        assert not _no_secret_in(json.dumps(configuration.env, default=str))
        async with SpotWorker(work_pool_name=pool) as worker:
            provider = worker._provider(configuration)
            assert {p.region for p in provider.pools()} == {REGION}  # the block's region
            lease = provider.launch(
                LaunchSpec(
                    job_id="block-job",
                    attempt=1,
                    command=("sleep", "60"),
                    checkpoint_uri=f"s3://{bucket}/flows/block-job",
                ),
                provider.pools()[0],
            )
            assert lease.lease_id in managed_live_instances(endpoint)
            await worker.kill_infrastructure(lease.lease_id, configuration, grace_seconds=1)
            assert lease.lease_id not in managed_live_instances(endpoint)

    anyio.run(scenario)
    assert not [k for k in os.environ if k.startswith(("AWS_ACCESS", "AWS_SECRET"))]


@pytest.mark.timeout(420)
def test_the_spot_worker_runs_a_flow_run_on_ec2_with_the_block_only(block_only, tmp_path):
    """End to end: ``prefect worker start --type spot`` with no AWS credentials in its
    environment runs a flow run on an (emulated) EC2 instance, launching, watching,
    renewing the heartbeat in S3 and billing with the block the work pool references."""
    from prefect import get_client
    from prefect.deployments import run_deployment
    from prefect_aws import AwsCredentials

    from prefect_spot.workers import SpotWorker
    from tests.support.prefect_helpers import (
        deploy_example_flow,
        final_record,
        running_worker,
        wait_completed,
    )

    endpoint, net, bucket, name = block_only
    reference = {"$ref": {"block_document_id": str(AwsCredentials.load(name)._block_document_id)}}
    template = SpotWorker.get_default_base_job_template()
    template["variables"]["properties"]["aws_credentials"]["default"] = reference
    pool = unique("spot-block-e2e")
    deployment_id = deploy_example_flow(
        pool,
        "block-e2e",
        {
            "provider": "ec2",
            "capacity_wait": 0.5,
            "checkpoint_root": f"s3://{bucket}/flows",
            "provider_options": _provider_options(net),
        },
        base_job_template=template,
    )
    log = tmp_path / "worker.log"
    with running_worker(pool, log):
        run = run_deployment(
            deployment_id,
            timeout=0,
            parameters={"workdir": str(tmp_path / "work"), "steps": 200, "step_seconds": 0.01},
        )
        with get_client(sync_client=True) as client:
            run = wait_completed(client, run.id, timeout=300)
            variables = client.read_flow_run(run.id).job_variables
        record = final_record(run.id)
    logs = log.read_text(errors="replace")
    assert run.state.is_completed(), f"{run.state!r}\n{logs[-3000:]}"
    assert record.attempts[-1].outcome is Outcome.SUCCEEDED
    assert record.attempts[-1].lease_id.startswith("i-") and record.attempts[-1].cost > 0
    assert not _no_secret_in(json.dumps(variables or {})) and not _no_secret_in(logs)
    scripts = [p.read_text() for p in (tmp_path / "runtime").glob("*.user-data.sh")]
    assert scripts and not [s for s in scripts if _no_secret_in(s)]


def test_stores_opened_with_one_block_share_a_session_and_a_client(block_only):
    """A worker watching many flow runs opens a store per run: one boto3 session per
    block (not per store: about 0.19 s of CPU and 12 MiB each), one client for its
    stores; an edited block (another key) gets its own."""
    from prefect_aws import AwsCredentials

    endpoint, net, bucket, name = block_only
    storages = [
        CheckpointStorage(
            uri=f"s3://{bucket}/{unique('run')}", aws_credentials=AwsCredentials.load(name)
        )
        for _ in range(3)
    ]
    stores = [storage.open(unique("job")) for storage in storages]
    assert len({id(store.backend.client) for store in stores}) == 1
    stores[0].save(step=4, payload={"w": b"y"})  # signed with the block's keys
    assert stores[0].latest().step == 4
    assert storages[0].aws_session() is storages[1].aws_session()
    other = AwsCredentials.load(name)
    other.aws_access_key_id = "AKIASPOTBLOCKTEST002"
    assert (
        CheckpointStorage(uri=storages[0].uri, aws_credentials=other).aws_session()
        is not storages[0].aws_session()
    )
