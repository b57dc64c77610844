"""SpotTaskRunner with provider="ec2": against a real Prefect server, moto in server mode and
the instance runtime harness (each instance moto reports running runs its user-data as a
local process with its own IMDSv2 emulator and the env an instance profile would give).

The call, its result and its error go through the job's S3 store, not a local folder; a
task preempted after its first checkpoint resumes from the S3 checkpoint on a new
instance; nothing is left running. No secret reaches the instance: the runner signs the
payload with an Ed25519 key it keeps and sends only the public half (user-data); the
lease signs its result with its own key and publishes the public half as a tag on its
own instance, where the runner reads it. Forgeries in the store are refused unread.
"""

from __future__ import annotations

import os
import pickle
import sys
import threading
import time
from pathlib import Path

import pytest
from prefect import flow, task

from prefect_spot import SpotConfiguration, SpotTaskRunner, spot_record
from prefect_spot._remote import (
    CALL_PUBKEY_ENV,
    PAYLOAD_KEY,
    PUBKEY_TAG,
    Ed25519Seal,
    UntrustedObject,
    result_key,
)
from spot_core.errors import ConfigError
from spot_core.model import Market, Outcome
from spot_emulators.ec2_runtime import Ec2InstanceRuntime, default_instance_env
from tests.support.aws_helpers import (
    client,
    make_network,
    managed_live_instances,
    preempt_after_checkpoints,
)
from tests.support.prefect_helpers import count_to

pytestmark = pytest.mark.timeout(240)
REGION = "us-east-1"


@task(retries=0)
def bad_column() -> None:
    raise KeyError("no such column: price")


@task(retries=0)
def vanish() -> None:
    """Ends the lease with exit 0 without writing a result: whatever is at result.pkl was
    written by someone else."""
    os._exit(0)


class WritesMarker:
    """Unpickling this writes a file: what a forged pickle would do in the flow runner."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (Path(self.path).write_text, ("pwned",))


@pytest.fixture
def ec2(aws_env, bucket, tmp_path):
    """(endpoint, network, bucket, runtime); afterwards moto shows no live instance."""
    net = make_network(aws_env)
    runtime = Ec2InstanceRuntime(
        aws_env, tmp_path / "runtime", (REGION,), default_instance_env(aws_env, REGION)
    )
    with runtime:
        yield aws_env, net, bucket, runtime
    assert managed_live_instances(aws_env) == [], "orphans left"


@pytest.fixture
def held_ec2(aws_env, bucket, tmp_path):
    """Like ``ec2``, but no instance boots until the test starts the runtime: a forger
    acts between the runner's write and the lease's start, with no race."""
    net = make_network(aws_env)
    runtime = Ec2InstanceRuntime(
        aws_env, tmp_path / "runtime", (REGION,), default_instance_env(aws_env, REGION)
    )
    try:
        yield aws_env, net, bucket, runtime
    finally:
        runtime.stop()
    assert managed_live_instances(aws_env) == [], "orphans left"


def ec2_config(endpoint: str, net: dict, **fields) -> SpotConfiguration:
    options = {
        "endpoint_url": endpoint,
        "region": REGION,
        "subnets": net["subnets"],
        "instance_types": ["g4dn.xlarge"],
        "image_id": net["image_id"],
        "instance_profile": net["instance_profile"],
        "agent_python": sys.executable,
        "watch_poll_interval": 0.1,
    }
    return SpotConfiguration(
        provider="ec2", provider_options=options, capacity_wait=0.5, poll_interval=0.2, **fields
    )


def _wait_for_call(endpoint: str, bucket: str, prefix: str, timeout: float = 120.0) -> str:
    """The S3 key prefix of the job's call exchange, once the runner wrote its payload."""
    s3 = client("s3", endpoint)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        listed = s3.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/")
        payloads = [
            o["Key"]
            for o in listed.get("Contents", [])
            if o["Key"].endswith(f"/call/{PAYLOAD_KEY}")
        ]
        if payloads:
            return payloads[0][: -len(PAYLOAD_KEY)]
        time.sleep(0.1)
    raise AssertionError(f"no call payload under s3://{bucket}/{prefix} in {timeout:g}s")


def preempt_first_attempt(runtime, endpoint: str, bucket: str, prefix: str) -> threading.Thread:
    """Find the job's store from its call payload in S3 (the job id holds the task run id),
    then reclaim attempt 1's instance once it has committed a checkpoint."""

    def run():
        call = _wait_for_call(endpoint, bucket, prefix)
        job = call[: -len("/call/")]
        preempt_after_checkpoints(runtime, f"s3://{bucket}/{job}", attempts=(1,)).join()

    thread = threading.Thread(target=run, daemon=True, name="find-and-preempt")
    thread.start()
    return thread


def forge_then_boot(
    runtime, endpoint: str, bucket: str, prefix: str, name: str, blob: bytes
) -> threading.Thread:
    """Another writer of the store puts ``blob`` at ``call/<name>`` once the runner has
    written its payload, then the instances boot."""

    def run():
        try:
            call = _wait_for_call(endpoint, bucket, prefix)
            client("s3", endpoint).put_object(Bucket=bucket, Key=call + name, Body=blob)
        finally:
            runtime.start()

    thread = threading.Thread(target=run, daemon=True, name="forge-then-boot")
    thread.start()
    return thread


def test_task_preempted_on_ec2_resumes_from_s3_checkpoint_on_a_new_instance(
    prefect_api, ec2, tmp_path
):
    endpoint, net, bucket, runtime = ec2
    config = ec2_config(endpoint, net, max_preemptions=1)
    workdir = tmp_path / "runner"

    @flow(
        task_runner=SpotTaskRunner(
            config,
            checkpoint_storage=f"s3://{bucket}/tasks",
            checkpoint_every_steps=10,
            workdir=workdir,
        )
    )
    def pipeline():
        future = count_to.submit(300, 0.02)
        return future.result(), spot_record(future)

    preempter = preempt_first_attempt(runtime, endpoint, bucket, "tasks")
    result, record = pipeline()
    preempter.join(timeout=5)

    assert managed_live_instances(endpoint) == [], "the runner terminated every instance"
    assert result["total"] == 300
    assert record.preemptions == 1
    first, last = record.attempts[0], record.attempts[-1]
    assert first.outcome is Outcome.PREEMPTED and first.pool.market is Market.SPOT
    assert last.outcome is Outcome.SUCCEEDED
    assert first.lease_id.startswith("i-") and last.lease_id.startswith("i-")
    assert last.lease_id != first.lease_id
    # The function ran on the (harness's) instance and resumed from the S3 checkpoint.
    assert result["instance"] == last.lease_id
    assert result["started_at"] > 0 and result["started_at"] == last.checkpoint_step_start

    # The call went through the job's store (the preempter found its payload there while
    # the task ran), was deleted once the result was read, and no local folder was used.
    job = record.job_id
    keys = {
        o["Key"]
        for o in client("s3", endpoint)
        .list_objects_v2(Bucket=bucket, Prefix=f"tasks/{job}/call/")
        .get("Contents", [])
    }
    assert keys == set(), "the pickled call and its result are deleted once read"
    assert not (workdir / "jobs").exists()
    # What went to the instances: the instance's own Python, no credentials, no local
    # paths, and of the call's keys only the runner's public one.
    scripts = [p.read_text() for p in (tmp_path / "runtime").glob("*.user-data.sh")]
    assert len(scripts) == len(record.attempts)
    for script in scripts:
        assert "prefect_spot._remote" in script and f"s3://{bucket}/tasks/{job}/call" in script
        assert "AWS_SECRET_ACCESS_KEY" not in script and "AWS_ACCESS_KEY_ID" not in script
        assert "PYTHONPATH" not in script and "SPOT_CALL_KEY=" not in script
        assert f"{CALL_PUBKEY_ENV}=" in script
    # Each lease published its own public key on its own instance, and only there.
    ec2_client = client("ec2", endpoint)
    published = {}
    for attempt in record.attempts:
        [reservation] = ec2_client.describe_instances(InstanceIds=[attempt.lease_id])[
            "Reservations"
        ]
        tags = {t["Key"]: t["Value"] for t in reservation["Instances"][0].get("Tags", [])}
        published[attempt.lease_id] = tags[PUBKEY_TAG]
    assert len(set(published.values())) == len(record.attempts)
    for script in scripts:
        assert not any(key in script for key in published.values())


def test_task_error_on_ec2_reaches_prefect_through_s3(prefect_api, ec2):
    endpoint, net, bucket, runtime = ec2
    config = ec2_config(endpoint, net, max_preemptions=0)

    @flow(task_runner=SpotTaskRunner(config, checkpoint_storage=f"s3://{bucket}/errors"))
    def pipeline():
        future = bad_column.submit()
        return future.wait() or future.state, spot_record(future)

    state, record = pipeline()
    assert state.is_failed()
    with pytest.raises(KeyError, match="no such column"):
        state.result()
    assert record.user_failures == 1 and len(record.attempts) == 1
    assert record.attempts[0].lease_id.startswith("i-")
    assert managed_live_instances(endpoint) == []


def _forged(marker: Path, name: str, how: str) -> bytes:
    evil = pickle.dumps(WritesMarker(marker))
    if how == "unsigned":
        return evil
    # Signed by another job's node with its own key: it can publish that key only on its
    # own instance, never on this call's.
    return Ed25519Seal.generate().sign(name, evil)


def _instance_logs(runtime) -> str:
    """The tail of every log the instance runtime kept (boot, watcher, step)."""
    return "\n".join(
        f"--- {path.name}\n{path.read_text(errors='replace')[-1500:]}"
        for path in sorted(runtime.workdir.glob("*.log"))
    )


@pytest.mark.parametrize("how", ["unsigned", "another node's key"])
def test_a_result_forged_in_s3_is_refused_unread_by_the_runner(
    prefect_api, held_ec2, tmp_path, how
):
    """The lease exits 0 without a result; a forged result.pkl is there instead."""
    endpoint, net, bucket, runtime = held_ec2
    config = ec2_config(endpoint, net, max_preemptions=0)
    marker = tmp_path / "marker"
    name = result_key(1)

    @flow(task_runner=SpotTaskRunner(config, checkpoint_storage=f"s3://{bucket}/forged"))
    def pipeline():
        future = vanish.submit()
        return future.wait() or future.state, spot_record(future)

    forger = forge_then_boot(runtime, endpoint, bucket, "forged", name, _forged(marker, name, how))
    state, record = pipeline()
    forger.join(timeout=5)
    assert state.is_failed()
    with pytest.raises(UntrustedObject, match="refused unread") as caught:
        state.result()
    # (Once in many runs the lease's key tag was missing instead: the instances' logs say why.)
    assert name in str(caught.value) and "\n" not in str(caught.value), _instance_logs(runtime)
    assert record.attempts[-1].outcome is Outcome.SUCCEEDED  # the lease did exit 0
    assert not marker.exists(), "the forged pickle ran in the flow runner"


def test_a_payload_forged_in_s3_is_refused_by_the_lease_and_never_runs(
    prefect_api, held_ec2, tmp_path
):
    endpoint, net, bucket, runtime = held_ec2
    config = ec2_config(endpoint, net, max_preemptions=0)
    marker = tmp_path / "marker"

    @flow(task_runner=SpotTaskRunner(config, checkpoint_storage=f"s3://{bucket}/payload"))
    def pipeline():
        future = count_to.submit(5, 0.0)
        return future.wait() or future.state, spot_record(future)

    forger = forge_then_boot(
        runtime,
        endpoint,
        bucket,
        "payload",
        PAYLOAD_KEY,
        _forged(marker, PAYLOAD_KEY, "another node's key"),
    )
    state, record = pipeline()
    forger.join(timeout=5)
    assert state.is_failed()
    with pytest.raises(UntrustedObject, match=f"{PAYLOAD_KEY} does not verify"):
        state.result()  # the lease's own signed report says why
    assert record.attempts[0].outcome is Outcome.USER_FAILED
    assert not marker.exists(), "the forged payload ran on the lease"


def test_ec2_runner_needs_an_s3_store(prefect_api, aws_env):
    config = SpotConfiguration(
        provider="ec2",
        provider_options={
            "region": REGION,
            "subnets": ["subnet-1"],
            "instance_types": ["g4dn.xlarge"],
            "image_id": "ami-1",
        },
    )

    @flow(task_runner=SpotTaskRunner(config))
    def pipeline():
        return bad_column.submit().result()

    with pytest.raises(ConfigError, match="needs checkpoint_storage 's3://bucket/prefix'"):
        pipeline()


@pytest.mark.parametrize(
    "options, message",
    [
        (
            {
                "subnets": ["subnet-1"],
                "image_id": "ami-1",
                "instance_types": ["g5.xlarge"],
                "aws_secret_access_key": "x",
            },
            r"provider_options\['aws_secret_access_key'\] looks like a credential",
        ),
        (
            {"image_id": "ami-1", "instance_types": ["g5.xlarge"]},
            r"needs provider_options \['subnets'\]",
        ),
        ({"subnets": ["subnet-1"], "image_id": "ami-1"}, r"\['instance_types'\]"),
    ],
)
def test_bad_ec2_configuration_is_rejected_up_front(options, message):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=message):
        SpotConfiguration(provider="ec2", provider_options=options)


def test_ec2_instance_types_may_come_from_the_configuration():
    config = SpotConfiguration(
        provider="ec2",
        instance_types=["g5.xlarge"],
        provider_options={"subnets": ["subnet-1"], "image_id": "ami-1"},
    )
    assert config.provider == "ec2"
