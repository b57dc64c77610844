"""An EC2 spot job whose credentials come only from an Airflow connection.

The connection is an ``AIRFLOW_CONN_AWS_SPOT`` URI (as a deployment sets it in every
component) with keys, the region, ``endpoint_url`` (moto in server mode) and a
``role_arn`` that the amazon provider's hook assumes through moto's STS. The process runs
with no ``AWS_*`` variable at all: the operator launches through the connection, defers,
and the real trigger runs in a separate process (as in a triggerer) that resolves the
same connection by id, watches the lease, renews the heartbeat in S3 and closes the
attempt. Nothing secret may reach the trigger's kwargs, the instance's user-data or the
logs.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import subprocess
import sys
from datetime import datetime

import pytest
from airflow.sdk import DAG, Connection
from airflow.sdk.exceptions import TaskDeferred

from airflow_spot.hooks.connections import ConnectionMissing, aws_access
from airflow_spot.operators.spot import RECORD_KEY, SpotJobOperator
from spot_core.model import JobRecord
from spot_emulators.ec2_runtime import Ec2InstanceRuntime, default_instance_env
from tests.support.aws_helpers import (
    AWS_ENV,
    bucket,  # noqa: F401 - a fixture / shared name
    client,
    make_network,
    managed_live_instances,  # noqa: F401
    unique,
)
from tests.support.spot_helpers import train_command
from tests.support.task_context import TI, StateStore

pytestmark = pytest.mark.timeout(300)

ROLE = "spot-pipelines-controller"
ACCESS_KEY = "AKIASPOTCONNTEST0001"  # the connection's own keys (moto takes any)
SECRET_KEY = "conn-secret-2b9f7c1e4d8a6f3b0c5e"
WIRE_LOGGERS = ("botocore", "urllib3", "boto3")

# The trigger as a triggerer runs it: rebuilt from its serialized kwargs in another
# process, which resolves the connection by id from its own environment.
TRIGGERER = """
import asyncio, importlib, json, sys
path, kwargs = json.load(sys.stdin)
module, name = path.rsplit(".", 1)
trigger = getattr(importlib.import_module(module), name)(**kwargs)

async def first():
    async for event in trigger.run():
        return event.payload

print("EVENT " + json.dumps(asyncio.run(asyncio.wait_for(first(), timeout=150))))
"""


def _connection_uri(endpoint: str, role_arn: str) -> str:
    extra = {
        "region_name": "us-east-1",
        "endpoint_url": endpoint,
        "role_arn": role_arn,
        # the hook never sends the assume-role call to the global endpoint_url
        "service_config": {"sts": {"endpoint_url": endpoint}},
    }
    return Connection(
        conn_id="aws_spot",
        conn_type="aws",
        login=ACCESS_KEY,
        password=SECRET_KEY,
        extra=json.dumps(extra),
    ).get_uri()


@pytest.fixture
def connected(aws_env, bucket, tmp_path, monkeypatch):
    """moto with a network, a bucket and the controller's role (made with the test's own
    throwaway keys); then a process whose only AWS credentials are the connection."""
    net = make_network(aws_env)
    trust = {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole", "Principal": {"AWS": "*"}}],
    }
    iam = client("iam", aws_env)
    try:
        role_arn = iam.create_role(RoleName=ROLE, AssumeRolePolicyDocument=json.dumps(trust))[
            "Role"
        ]["Arn"]
    except iam.exceptions.EntityAlreadyExistsException:
        role_arn = iam.get_role(RoleName=ROLE)["Role"]["Arn"]
    # The instances' own credentials (what their instance profile would give them).
    runtime = Ec2InstanceRuntime(
        aws_env, tmp_path / "runtime", ("us-east-1",), default_instance_env(aws_env, "us-east-1")
    )
    for name in AWS_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance role either
    monkeypatch.setenv("AIRFLOW_CONN_AWS_SPOT", _connection_uri(aws_env, role_arn))
    assert not [k for k in os.environ if k.startswith("AWS_ACCESS") or k.startswith("AWS_SECRET")]
    with runtime:
        yield aws_env, net, bucket, role_arn
    assert managed_live_instances(aws_env) == [], "orphans left"


def _operator(net: dict, uri: str) -> SpotJobOperator:
    options = {
        "subnets": net["subnets"],
        "instance_types": ["g4dn.xlarge"],
        "image_id": net["image_id"],
        "instance_profile": net["instance_profile"],
        "agent_python": sys.executable,
        "watch_poll_interval": 0.1,
    }
    with DAG("conn_dag", schedule=None, start_date=datetime(2026, 1, 1)):
        return SpotJobOperator(
            task_id="train",
            provider="ec2",
            provider_options=options,
            command=list(train_command(steps=120, every_steps=20)),
            checkpoint_uri=uri,
            aws_conn_id="aws_spot",
            poll_interval=0.2,
            capacity_wait=1.0,
            deferrable=True,
        )


def _trigger_elsewhere(trigger) -> dict:
    """Run the serialized trigger to its first event in a fresh process."""
    done = subprocess.run(
        [sys.executable, "-c", TRIGGERER],
        input=json.dumps(trigger.serialize()),
        capture_output=True,
        text=True,
        timeout=200,
        env=os.environ.copy(),
    )
    events = [line for line in done.stdout.splitlines() if line.startswith("EVENT ")]
    assert done.returncode == 0 and events, done.stderr[-3000:]
    return json.loads(events[-1][len("EVENT ") :]), done.stdout + done.stderr


def test_a_connection_with_role_assumption_drives_an_ec2_job_through_the_trigger(connected, caplog):
    endpoint, net, bucket, role_arn = connected
    caplog.set_level(logging.DEBUG)
    op = _operator(net, f"s3://{bucket}/{unique('conn-job')}")
    store, ti = StateStore(), TI()
    context = {"task_state_store": store, "ti": ti}
    kwargs_seen, trigger_output = [], []
    try:
        summary = op.execute(context)
    except TaskDeferred as deferred:
        pending = deferred
        for _ in range(10):
            kwargs_seen.append(json.dumps(pending.trigger.serialize()[1]))
            payload, output = _trigger_elsewhere(pending.trigger)
            trigger_output.append(output)
            try:
                summary = getattr(op, pending.method_name)(context, payload)
                break
            except TaskDeferred as again:
                pending = again
    assert summary["status"] == "succeeded" and summary["latest_checkpoint_step"] == 120, summary
    assert kwargs_seen, "the operator deferred to the trigger"
    record = JobRecord.from_dict(store.data[RECORD_KEY])

    # The provider called EC2 as the role the connection assumes, not with its own keys.
    provider = op.hook.get_provider()
    frozen = provider.clients["us-east-1"]._request_signer._credentials.get_frozen_credentials()
    assert frozen.access_key != ACCESS_KEY
    import boto3

    sts = boto3.client(
        "sts",
        region_name="us-east-1",
        endpoint_url=endpoint,
        aws_access_key_id=frozen.access_key,
        aws_secret_access_key=frozen.secret_key,
        aws_session_token=frozen.token,
    )
    assert f"assumed-role/{ROLE}/" in sts.get_caller_identity()["Arn"]

    # No credential in trigger kwargs, user-data or logs; the kwargs name the connection.
    secrets = [SECRET_KEY, ACCESS_KEY, frozen.secret_key, frozen.access_key]
    for kwargs in kwargs_seen:
        assert json.loads(kwargs)["aws_conn_id"] == "aws_spot"
        assert not [s for s in secrets if s in kwargs]
    ec2 = boto3.client(
        "ec2",
        region_name="us-east-1",
        endpoint_url=endpoint,
        aws_access_key_id=frozen.access_key,
        aws_secret_access_key=frozen.secret_key,
        aws_session_token=frozen.token,
    )
    for attempt in record.attempts:
        raw = ec2.describe_instance_attribute(InstanceId=attempt.lease_id, Attribute="userData")
        script = base64.b64decode(raw["UserData"]["Value"]).decode()
        assert not [s for s in secrets if s in script]
        assert "AWS_SECRET" not in script and "AWS_ACCESS_KEY" not in script
    # Every logger at DEBUG but the SDK's own wire dumps (botocore and urllib3 print
    # signed headers and STS answers at DEBUG; Airflow runs them at INFO).
    ours = [r for r in caplog.records if not r.name.startswith(WIRE_LOGGERS)]
    logged = "\n".join(r.getMessage() for r in ours) + "".join(trigger_output)
    leaks = {
        s: sorted({r.name for r in ours if s in r.getMessage()}) for s in secrets if s in logged
    }
    assert not leaks, leaks


def test_the_triggers_of_a_process_share_one_session_per_connection_until_it_changes(
    connected, monkeypatch
):
    """Each trigger opens its own hook; a session (and S3 client) per trigger cost about
    0.19 s of CPU and 12 MiB each. One connection gives one session per process, and
    its job stores share one client, until the connection is edited (rotated keys)."""
    from airflow_spot.hooks.spot import SpotHook

    endpoint, net, bucket, role_arn = connected
    first = aws_access("aws_spot")
    assert aws_access("aws_spot") is first
    hooks = [SpotHook("local", {}, aws_conn_id="aws_spot") for _ in range(3)]
    stores = [hook.open_store(f"s3://{bucket}/{unique('job')}") for hook in hooks]
    assert len({id(store.backend.client) for store in stores}) == 1
    stores[0].save(step=2, payload={"w": b"x"})  # the assumed role signs, as before
    assert stores[0].latest().step == 2
    rotated = _connection_uri(endpoint, role_arn).replace(SECRET_KEY, "rotated-" + SECRET_KEY)
    monkeypatch.setenv("AIRFLOW_CONN_AWS_SPOT", rotated)
    assert aws_access("aws_spot") is not first


def test_an_unknown_connection_is_one_line_naming_where_to_define_it(monkeypatch):
    monkeypatch.delenv("AIRFLOW_CONN_AWS_NOWHERE", raising=False)
    with pytest.raises(
        ConnectionMissing, match="AIRFLOW_CONN_AWS_NOWHERE in every Airflow component"
    ):
        aws_access("aws_nowhere")


@pytest.mark.parametrize("bad", ["", "two words", 3])
def test_a_bad_connection_id_fails_at_parse_time(bad):
    with DAG("bad_conn", schedule=None, start_date=datetime(2026, 1, 1)):
        with pytest.raises(ValueError, match="aws_conn_id=.* must be an Airflow connection id"):
            SpotJobOperator(
                task_id="t", command="true", checkpoint_uri="file:///tmp/x", aws_conn_id=bad
            )


def test_a_kubernetes_connection_becomes_the_api_client_of_its_kubeconfig(monkeypatch):
    """cncf-kubernetes' hook turns the connection (an inline kubeconfig and a context in
    its extra) into the API client the kubernetes provider is opened with."""
    from airflow_spot.hooks.connections import kubernetes_client

    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "other",
        "clusters": [
            {
                "name": "spot",
                "cluster": {
                    "server": "https://spot.example:6443",
                    "insecure-skip-tls-verify": True,
                },
            },
            {"name": "other", "cluster": {"server": "https://other.example"}},
        ],
        "users": [{"name": "ci", "user": {"token": "k8s-token-not-a-real-one"}}],
        "contexts": [
            {"name": "spot", "context": {"cluster": "spot", "user": "ci"}},
            {"name": "other", "context": {"cluster": "other", "user": "ci"}},
        ],
    }
    conn = Connection(
        conn_id="k8s_spot",
        conn_type="kubernetes",
        extra=json.dumps({"kube_config": json.dumps(kubeconfig), "cluster_context": "spot"}),
    )
    monkeypatch.setenv("AIRFLOW_CONN_K8S_SPOT", conn.get_uri())
    api = kubernetes_client("k8s_spot")
    assert api.configuration.host == "https://spot.example:6443"
    assert api.configuration.api_key["BearerToken"] == "Bearer k8s-token-not-a-real-one"


def test_task_spot_checkpoints_to_s3_through_the_connection(airflow_home, connected, monkeypatch):
    """``@task.spot(aws_conn_id=...)`` under dag.test(): the restored Checkpointer's store
    and the attempt's fencing reach S3 with the connection's assumed role."""
    from conftest import load_dag

    endpoint, net, bucket, role_arn = connected
    prefix = unique("task-spot")
    monkeypatch.setenv("SPOT_TEST_CONN_STORE", f"s3://{bucket}/{prefix}")
    run = load_dag("spot_task_s3_conn").test()
    (ti,) = run.get_task_instances()
    assert run.state == "success", ti.state
    assert ti.xcom_pull(task_ids="crunch_on_s3", key="return_value") == {"start": 0}
    keys = [
        o["Key"]
        for o in client("s3", endpoint)
        .list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/")
        .get("Contents", [])
    ]
    assert any(k.endswith("FENCE.json") for k in keys) and len(keys) > 3, keys


def test_the_sensor_reads_ec2_prices_through_the_connection(connected):
    from datetime import timedelta

    from airflow_spot.sensors.price_window import POOL_KEY, SpotPriceWindowSensor

    endpoint, net, bucket, role_arn = connected
    pushed = {}

    class SensorTI:
        start_date = datetime.now()

        def xcom_push(self, key, value):
            pushed[key] = value

    options = {
        "subnets": net["subnets"],
        "instance_types": ["g4dn.xlarge"],
        "image_id": net["image_id"],
    }
    with DAG("conn_sensor", schedule=None, start_date=datetime(2026, 1, 1)):
        sensor = SpotPriceWindowSensor(
            task_id="cheap",
            job_hours=1,
            max_price=1000.0,
            window_end=timedelta(hours=8),
            provider="ec2",
            provider_options=options,
            aws_conn_id="aws_spot",
        )
    assert sensor.poke({"ti": SensorTI()}) is True
    assert pushed[POOL_KEY]["pool"]["region"] == "us-east-1" and pushed[POOL_KEY]["price"] > 0
    kwargs = sensor._trigger({"ti": SensorTI()}).serialize()[1]
    assert kwargs["aws_conn_id"] == "aws_spot"
    assert SECRET_KEY not in json.dumps(kwargs) and ACCESS_KEY not in json.dumps(kwargs)
