"""The EC2 provider against moto in server mode, with the instance runtime harness.

Jobs launched by the provider run their user-data as local processes (the harness), are
preempted (notice through IMDSv2 and EventBridge/SQS, then termination in moto), resume
from the S3 checkpoint on a new instance, fall back to on-demand after N preemptions and
finish. Launch parameters are checked on what moto recorded; capacity errors and
throttling are injected in front of the real client. After every test, moto shows no
running instance tagged by the project.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import sys
import time

import pytest

from spot_core.controller import Controller, JobSpec
from spot_core.errors import CapacityUnavailable, ConfigError, InfrastructureError
from spot_core.model import Lease, Market, Pool
from spot_core.policy.retry import RetryPolicy
from spot_core.providers.base import LaunchSpec, LeaseState
from spot_core.providers.ec2 import Ec2Provider
from spot_emulators.ec2_runtime import Ec2InstanceRuntime, default_instance_env
from tests.support import SUPPORT
from tests.support.aws_helpers import (
    client,
    count_calls,
    inject_errors,
    make_network,
    managed_live_instances,
    preempt_after_checkpoints,
    running_moto,
    unique,
)
from tests.support.spot_helpers import train_command

pytestmark = pytest.mark.timeout(120)
BUCKET = "ckpt"  # plus a per-test suffix: see the net fixture


@pytest.fixture
def net(aws_env, monkeypatch):
    name = unique("ckpt")
    monkeypatch.setattr(sys.modules[__name__], "BUCKET", name)
    client("s3", aws_env).create_bucket(Bucket=name)
    network = make_network(aws_env)
    yield network
    assert managed_live_instances(aws_env, ("us-east-1", "us-west-2")) == [], "orphans left"


def _provider(endpoint, net, **extra) -> Ec2Provider:
    return Ec2Provider.from_options(
        region="us-east-1",
        endpoint_url=endpoint,
        subnets=net["subnets"],
        instance_types=["g4dn.xlarge", "g5.xlarge"],
        image_id=net["image_id"],
        instance_profile=net["instance_profile"],
        agent_python=sys.executable,
        watch_poll_interval=0.1,
        **extra,
    )


def _spec(job="job-1", attempt=1, command=("true",), env=None) -> LaunchSpec:
    return LaunchSpec(
        job_id=job,
        attempt=attempt,
        command=tuple(command),
        checkpoint_uri=f"s3://{BUCKET}/{job}",
        env=env or {},
    )


def _described(endpoint, instance_id, region="us-east-1") -> dict:
    ec2 = client("ec2", endpoint, region)
    return ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]


def test_launch_parameters_as_moto_recorded_them(aws_env, net):
    with _provider(aws_env, net) as provider:
        pool = provider.pools()[0]
        lease = provider.launch(
            _spec(command=("python", "train.py", "--lr", "0.1"), env={"WANDB_MODE": "offline"}),
            pool,
        )
        got = _described(aws_env, lease.lease_id)
        assert got["InstanceLifecycle"] == "spot"
        assert got["MetadataOptions"]["HttpTokens"] == "required"
        assert got["InstanceType"] == pool.instance_type
        assert got["Placement"]["AvailabilityZone"] == pool.zone
        assert got["IamInstanceProfile"]["Arn"].endswith("/spot-pipelines-step")
        tags = {t["Key"]: t["Value"] for t in got["Tags"]}
        assert tags["spot-pipelines:managed"] == "true"
        assert (tags["spot-pipelines:job"], tags["spot-pipelines:attempt"]) == ("job-1", "1")
        ec2 = client("ec2", aws_env)
        volumes = ec2.describe_volumes(
            Filters=[{"Name": "attachment.instance-id", "Values": [lease.lease_id]}]
        )["Volumes"]
        assert volumes and all(
            {"Key": "spot-pipelines:job", "Value": "job-1"} in v.get("Tags", []) for v in volumes
        )
        raw = ec2.describe_instance_attribute(InstanceId=lease.lease_id, Attribute="userData")
        script = base64.b64decode(raw["UserData"]["Value"]).decode()
        assert "spot-pipelines watch --cloud aws" in script and "train.py --lr 0.1" in script
        assert "SPOT_ATTEMPT=1" in script and f"s3://{BUCKET}/job-1" in script
        assert "WANDB_MODE=offline" in script
        for secret in (
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_SESSION_TOKEN",
            "testing",
        ):
            assert secret not in script
        for name in ("HF_TOKEN", "PREFECT_API_KEY", "WANDB_API_KEY", "PREFECT_API_AUTH_STRING"):
            with pytest.raises(ConfigError, match="credentials"):
                provider.launch(_spec(job="job-2", env={name: "s3cr3t"}), pool)
        on_demand = provider.launch(_spec(job="job-3"), pool.on(Market.ON_DEMAND))
        assert "InstanceLifecycle" not in _described(aws_env, on_demand.lease_id)
    assert all(
        _described(aws_env, i)["State"]["Name"] == "terminated"
        for i in (lease.lease_id, on_demand.lease_id)
    ), "close() terminates every lease"


def test_an_image_job_runs_under_docker_from_user_data(aws_env, net):
    with _provider(aws_env, net) as provider:
        spec = dataclasses.replace(
            _spec(job="job-img", command=("python", "train.py"), env={"WANDB_MODE": "offline"}),
            image="ghcr.io/acme/train:1.4",
        )
        lease = provider.launch(spec, provider.pools()[0])
        raw = client("ec2", aws_env).describe_instance_attribute(
            InstanceId=lease.lease_id, Attribute="userData"
        )
        script = base64.b64decode(raw["UserData"]["Value"]).decode()
        step = (
            f"{sys.executable} -m spot_core.container --image ghcr.io/acme/train:1.4 "
            "--env WANDB_MODE -- python train.py"
        )
        assert f"spot-pipelines watch --cloud aws --report --poll-interval 0.1 -- {step}" in script
        for secret in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "testing"):
            assert secret not in script


def test_capacity_errors_move_the_job_to_the_next_pool(aws_env, net, tmp_path):
    with _provider(aws_env, net) as provider, _runtime(aws_env, tmp_path) as runtime:
        first = provider.pools()[0]
        failed = inject_errors(
            provider.clients["us-east-1"],
            "RunInstances",
            "InsufficientInstanceCapacity",
            when=lambda p: p["InstanceType"] == first.instance_type,
        )
        record = _run(provider, train_command(steps=60, step_seconds=0.0), pools=provider.pools())
    assert record.status == "succeeded" and failed
    assert record.attempts[-1].pool.instance_type != first.instance_type
    assert runtime.instances, "the job ran on an instance the harness booted"


@pytest.mark.parametrize(
    "code", ["InsufficientInstanceCapacity", "SpotMaxPriceTooLow", "MaxSpotInstanceCountExceeded"]
)
def test_capacity_codes_are_capacity_unavailable_in_every_subnet(aws_env, net, code):
    with _provider(aws_env, net) as provider:
        pool = provider.pools()[0]
        failed = inject_errors(provider.clients["us-east-1"], "RunInstances", code)
        with pytest.raises(CapacityUnavailable, match=code):
            provider.launch(_spec(), pool)
        assert len(failed) == 1, "one subnet per zone here, so one try"


def test_no_capacity_anywhere_is_capacity_unavailable(aws_env, net):
    with _provider(aws_env, net) as provider:
        inject_errors(provider.clients["us-east-1"], "RunInstances", "InsufficientInstanceCapacity")
        with pytest.raises(CapacityUnavailable, match="InsufficientInstanceCapacity"):
            provider.launch(_spec(), provider.pools()[0])
        assert not provider.market.offers([provider.pools()[0]], time.time())[0].available


def test_throttling_is_backed_off_and_bounded(aws_env, net):
    with _provider(aws_env, net) as provider:
        ec2 = provider.clients["us-east-1"]
        throttled = inject_errors(ec2, "RunInstances", "RequestLimitExceeded", times=2)
        lease = provider.launch(_spec(), provider.pools()[0])
        assert len(throttled) == 2 and lease.lease_id.startswith("i-")
        inject_errors(ec2, "DescribeInstances", "RequestLimitExceeded")
        started = time.monotonic()
        with pytest.raises(InfrastructureError, match="throttling"):
            provider.observe([lease])
        assert time.monotonic() - started < 15, "backoff is bounded"


def test_preempted_job_resumes_from_s3_then_falls_back_to_on_demand(aws_env, net, tmp_path):
    sqs = client("sqs", aws_env)
    queue = sqs.create_queue(QueueName=unique("spot-events"))["QueueUrl"]
    with (
        _provider(aws_env, net, sqs_queue_url=queue) as provider,
        _runtime(aws_env, tmp_path, sqs_queue_url=queue) as runtime,
    ):
        preempt_after_checkpoints(runtime, f"s3://{BUCKET}/run", attempts=(1, 2))
        record = _run(
            provider,
            train_command(steps=200, step_seconds=0.01, every_steps=20),
            pools=provider.pools(),
            max_preemptions=2,
        )
    assert record.status == "succeeded", record.summary()
    assert record.preemptions == 2 and record.fallbacks == 1
    markets = [a.pool.market for a in record.attempts]
    assert markets == [Market.SPOT, Market.SPOT, Market.ON_DEMAND]
    resumed = record.summary()["resumed_from_steps"]
    assert len(resumed) == 2 and 0 < resumed[0] < resumed[1] < 200
    assert len({a.lease_id for a in record.attempts}) == 3, "each attempt on a new instance"
    assert len(runtime.preempted) == 2
    final_log = (tmp_path / "runtime" / f"{record.attempts[-1].lease_id}.log").read_text()
    assert f'"resumed_from_step": {resumed[1]}' in final_log


def test_observe_batches_many_leases_into_few_calls(aws_env, net):
    """A poll of running leases is one DescribeInstances that answers with none of them
    (only the ended ones are asked for); the first poll also describes the spot instances
    whose request id the launch did not give (moto gives none), once."""
    with _provider(aws_env, net) as provider:
        leases = [
            provider.launch(_spec(job=f"job-{i}"), provider.pools()[i % 4]) for i in range(12)
        ]
        assert {s.state for s in provider.observe(leases).values()} == {LeaseState.RUNNING}
        counts, answered = count_calls(provider.clients["us-east-1"]), []
        provider.clients["us-east-1"].meta.events.register(
            "after-call.ec2.DescribeInstances",
            lambda parsed, **_: answered.extend(
                i["InstanceId"] for r in parsed["Reservations"] for i in r["Instances"]
            ),
        )
        statuses = provider.observe(leases)
        assert {s.state for s in statuses.values()} == {LeaseState.RUNNING}
        assert counts == {"DescribeInstances": 1} and answered == []
        provider.terminate(leases[0])
        provider.terminate(leases[0])  # idempotent
        statuses = provider.observe(leases)
        assert statuses[leases[0].lease_id].state is LeaseState.TERMINATED
        assert [s.state for s in statuses.values()].count(LeaseState.RUNNING) == 11
        assert answered == [leases[0].lease_id]


def _spot_leases(endpoint: str, net: dict, count: int) -> list[Lease]:
    """``count`` spot instances with spot requests, tagged as the provider tags its own
    (bulk-made by the test's client: launching each through the provider takes minutes)."""
    ec2 = client("ec2", endpoint)
    vpc = ec2.describe_subnets(SubnetIds=net["subnets"][:1])["Subnets"][0]["VpcId"]
    cidr = f"10.{vpc_octet(ec2, vpc)}.64.0/20"  # 4,091 addresses; the net's /24s hold 251
    subnet = (
        next(
            (
                s["SubnetId"]
                for s in ec2.describe_subnets(Filters=[{"Name": "cidr-block", "Values": [cidr]}])[
                    "Subnets"
                ]
            ),
            None,
        )
        or ec2.create_subnet(VpcId=vpc, CidrBlock=cidr, AvailabilityZone="us-east-1a")["Subnet"][
            "SubnetId"
        ]
    )
    answer = ec2.request_spot_instances(
        InstanceCount=count,
        LaunchSpecification={
            "ImageId": net["image_id"],
            "InstanceType": "g5.xlarge",
            "SubnetId": subnet,
        },
    )
    requests = [r["SpotInstanceRequestId"] for r in answer["SpotInstanceRequests"]]
    described = ec2.describe_spot_instance_requests(SpotInstanceRequestIds=requests)[
        "SpotInstanceRequests"
    ]
    assert len(described) == count and all(r.get("InstanceId") for r in described)
    job = unique("many")
    ec2.create_tags(
        Resources=[r["InstanceId"] for r in described],
        Tags=[
            {"Key": "spot-pipelines:managed", "Value": "true"},
            {"Key": "spot-pipelines:job", "Value": job},
            {"Key": "spot-pipelines:attempt", "Value": "1"},
        ],
    )
    pool = Pool("aws", "us-east-1", "us-east-1a", "g5.xlarge", Market.SPOT)
    return [
        Lease(
            lease_id=r["InstanceId"],
            pool=pool,
            job_id=f"{job}-{n}",
            attempt=1,
            started_at=time.time(),
            price_per_hour=1.0,
            details={"spot_request_id": r["SpotInstanceRequestId"]},
        )
        for n, r in enumerate(described)
    ]


def _add_spot_request_ids(ec2, leases: list[Lease]) -> None:
    """moto's instances lack the ``SpotInstanceRequestId`` EC2 reports for a spot instance
    (docs/aws.md, moto limits): put moto's own request id back into each answer."""
    ids = {each.lease_id: each.details["spot_request_id"] for each in leases}

    def add(parsed, **_):
        for reservation in parsed.get("Reservations", []):
            for instance in reservation["Instances"]:
                if instance["InstanceId"] in ids:
                    instance["SpotInstanceRequestId"] = ids[instance["InstanceId"]]

    ec2.meta.events.register("after-call.ec2.DescribeInstances", add)


def vpc_octet(ec2, vpc: str) -> str:
    return ec2.describe_vpcs(VpcIds=[vpc])["Vpcs"][0]["CidrBlock"].split(".")[1]


def test_an_instance_ec2_does_not_know_reads_as_ended_not_alive(aws_env, net):
    """Only ended instances are asked for, so an absent one counts as alive: an id EC2
    refuses (launched an hour ago and long gone) must read as ended, and the others stay
    running. One launched a moment ago is still starting (EC2's API is eventually
    consistent: a new instance can be unknown to DescribeInstances for a while)."""
    with _provider(aws_env, net) as provider:
        real = [provider.launch(_spec(job=f"known-{i}"), provider.pools()[0]) for i in range(3)]
        ghost = Lease(
            lease_id="i-0123456789abcdef0",
            pool=real[0].pool,
            job_id="ghost",
            attempt=1,
            started_at=time.time() - 3600,
            price_per_hour=1.0,
            details={"spot_request_id": "sir-ghost"},
        )
        newborn = dataclasses.replace(ghost, lease_id="i-0fedcba9876543210", started_at=time.time())
        statuses = provider.observe([real[0], ghost, *real[1:], newborn])
        assert statuses[ghost.lease_id].ended
        assert [statuses[each.lease_id].state for each in real] == [LeaseState.RUNNING] * 3
        assert statuses[newborn.lease_id].state is LeaseState.RUNNING


@pytest.mark.timeout(300)  # moto takes ~20 s to make 600 spot requests
def test_observe_asks_few_requests_for_many_leases(aws_env, tmp_path):
    """600 watched spot leases: two DescribeInstances by id (500 per call) asking only for
    the ended ones, and one DescribeSpotInstanceRequests listing, reach the server per poll;
    instances terminated meanwhile are in the answer and read as ended; a few leases take
    one call each. Requests are counted where moto receives them. On a moto server of its
    own: 600 more instances would slow every later describe on the shared one."""
    with running_moto(tmp_path / "moto.log") as endpoint:
        _observe_many(endpoint, make_network(endpoint))


def _observe_many(endpoint: str, net: dict) -> None:
    from tests.support.fault_proxy import FaultProxy

    leases = _spot_leases(endpoint, net, 600)
    ec2 = client("ec2", endpoint)
    try:
        with FaultProxy(endpoint) as proxy, _provider(proxy.url, net) as provider:
            _add_spot_request_ids(provider.clients["us-east-1"], leases)
            proxy.forwarded.clear()
            statuses = provider.observe(leases)
            assert len(statuses) == 600
            assert {s.state for s in statuses.values()} == {LeaseState.RUNNING}
            assert proxy.forwarded == {"DescribeInstances": 2, "DescribeSpotInstanceRequests": 1}

            gone = [leases[3].lease_id, leases[400].lease_id]
            ec2.terminate_instances(InstanceIds=gone)
            proxy.forwarded.clear()
            statuses = provider.observe(leases)
            ended = {lid for lid, s in statuses.items() if s.ended}
            assert ended == set(gone)
            assert all(statuses[lid].state is LeaseState.TERMINATED for lid in gone)
            assert proxy.forwarded == {"DescribeInstances": 2, "DescribeSpotInstanceRequests": 1}

            proxy.forwarded.clear()
            few = provider.observe(leases[:3])
            assert [few[each.lease_id].state for each in leases[:3]] == [
                LeaseState.RUNNING,
                LeaseState.RUNNING,
                LeaseState.RUNNING,
            ]
            assert proxy.forwarded == {"DescribeInstances": 1, "DescribeSpotInstanceRequests": 1}
    finally:
        ec2.terminate_instances(InstanceIds=[each.lease_id for each in leases])
        ec2.cancel_spot_instance_requests(
            SpotInstanceRequestIds=[each.details["spot_request_id"] for each in leases]
        )


def test_cleanup_orphans_terminates_what_is_tagged(aws_env, net):
    with _provider(aws_env, net) as launcher:
        ids = {
            job: launcher.launch(_spec(job=job), launcher.pools()[0]).lease_id
            for job in ("job-a", "job-b")
        }
        other = _provider(aws_env, net)  # e.g. after the controller's process died
        assert other.cleanup_orphans(job_id="job-a") == [ids["job-a"]]
        assert managed_live_instances(aws_env) == [ids["job-b"]]
        assert other.cleanup_orphans() == [ids["job-b"]]
        assert managed_live_instances(aws_env) == []


@pytest.mark.parametrize("mode,operation", [("instance", "RunInstances"), ("fleet", "CreateFleet")])
def test_a_stop_landing_as_the_launch_answers_leaves_no_instance(aws_env, net, mode, operation):
    """A Ctrl-C (or the CLI's SIGTERM) arriving just after EC2 made the instance, before its
    answer is read: the instance is found by its tags and terminated, not left running."""

    def interrupted(**_):
        raise KeyboardInterrupt

    provider = _provider(aws_env, net, launch_mode=mode)
    provider.clients["us-east-1"].meta.events.register(f"after-call.ec2.{operation}", interrupted)
    with pytest.raises(KeyboardInterrupt):
        provider.launch(_spec(job="cut"), provider.pools()[0])
    assert managed_live_instances(aws_env) == [], "the cut-short launch left an instance"
    assert provider.pools()  # still usable


def test_fleet_launch_diversifies_over_pools(aws_env, net):
    with _provider(aws_env, net, launch_mode="fleet") as provider:
        pools = provider.pools()
        lease = provider.launch_any(_spec(), pools)
        got = _described(aws_env, lease.lease_id)
        assert lease.pool in pools and got["InstanceType"] == lease.pool.instance_type
        tags = {t["Key"]: t["Value"] for t in got.get("Tags", [])}
        assert tags.get("spot-pipelines:managed") == "true"
        assert not client("ec2", aws_env).describe_launch_templates()["LaunchTemplates"]
        single = provider.launch(_spec(job="job-9"), pools[1])
        assert single.pool == pools[1]


def test_cross_region_attempt_counts_the_checkpoint_transfer(aws_env, net):
    west = make_network(aws_env, region="us-west-2", zones=1)
    from spot_core.checkpoint import open_store

    open_store(f"s3://{BUCKET}/job-x").save(5, {"w.bin": b"x" * 3_000_000})
    provider = Ec2Provider.from_options(
        endpoint_url=aws_env,
        subnets={"us-east-1": net["subnets"][:1], "us-west-2": west["subnets"]},
        instance_types=["g5.xlarge"],
        image_id={"us-east-1": net["image_id"], "us-west-2": west["image_id"]},
        checkpoint_region="us-east-1",
        data_transfer_price_per_gb=0.02,
    )
    with provider:
        assert {p.region for p in provider.pools()} == {"us-east-1", "us-west-2"}
        [west_pool] = [p for p in provider.pools() if p.region == "us-west-2"]
        lease = provider.launch(_spec(job="job-x"), west_pool)
        assert int(lease.details["data_transfer_bytes"]) >= 3_000_000
        bill = provider.bill(lease, lease.started_at)
        assert bill.cost == pytest.approx(3_000_000 / (1 << 30) * 0.02, rel=0.01)
        assert bill.data_transfer_cost == bill.cost, "itemised for the ledger"
        home = provider.launch(
            _spec(job="job-x", attempt=2),
            [p for p in provider.pools() if p.region == "us-east-1"][0],
        )
        assert home.details["data_transfer_bytes"] == "0"
        reopened = Ec2Provider.from_options(**json.loads(json.dumps(provider.options)))
        assert reopened.pools() == provider.pools()


# -- helpers ---------------------------------------------------------------------------------
def _runtime(
    endpoint,
    tmp_path,
    *,
    preempt_after=None,
    max_preemptions=0,
    sqs_queue_url=None,
    notice_seconds=2.0,
):
    return Ec2InstanceRuntime(
        endpoint,
        tmp_path / "runtime",
        ("us-east-1",),
        default_instance_env(endpoint, "us-east-1"),
        preempt_spot_after=preempt_after,
        max_auto_preemptions=max_preemptions,
        notice_seconds=notice_seconds,
        sqs_queue_url=sqs_queue_url,
    )


def _run(provider, command, *, pools, max_preemptions=3, **controller):
    policy = RetryPolicy(
        max_preemptions=max_preemptions, capacity_wait_seconds=1.0, max_capacity_waits=5
    )
    spec = JobSpec(
        job_id=f"job-{int(time.time() * 1000) % 10**8}",
        command=tuple(command),
        checkpoint_uri=f"s3://{BUCKET}/run",
        pools=tuple(pools),
    )
    return Controller(
        provider, provider.market, policy, poll_interval_seconds=0.2, **controller
    ).run(spec)


def test_an_instance_whose_driver_goes_silent_ends_itself(aws_env, net, tmp_path):
    """No renewed heartbeat for the job's timeout: the instance's watcher stops the step,
    user-data reports and powers off, and the lease reads as terminated, not as a failure
    of the step or a reclaim."""
    from spot_core.attempt_env import DRIVER_LOST_EXIT_CODE
    from spot_core.checkpoint import open_store
    from spot_core.checkpoint.heartbeat import Heartbeat

    spec = dataclasses.replace(
        _spec(job=unique("job-hb"), command=(sys.executable, "-c", "import time; time.sleep(120)")),
        heartbeat_timeout_seconds=2.0,
    )
    Heartbeat(open_store(spec.checkpoint_uri)).renew(1, time.time())  # then silence
    runtime = Ec2InstanceRuntime(
        aws_env, tmp_path / "runtime", ("us-east-1",), default_instance_env(aws_env, "us-east-1")
    )
    with runtime, _provider(aws_env, net) as provider:
        lease = provider.launch(spec, provider.pools()[0])
        raw = client("ec2", aws_env).describe_instance_attribute(
            InstanceId=lease.lease_id, Attribute="userData"
        )
        assert "SPOT_HEARTBEAT_TIMEOUT=2" in base64.b64decode(raw["UserData"]["Value"]).decode()
        started = time.monotonic()
        assert runtime.wait_for(
            lambda rt: lease.lease_id in rt.instances and rt.instances[lease.lease_id].done,
            timeout=40,
        )
        assert time.monotonic() - started < 30
        status = provider.observe([lease])[lease.lease_id]
        assert status.state is LeaseState.TERMINATED, status
        assert status.exit_code == DRIVER_LOST_EXIT_CODE and "heartbeat" in status.message
        assert managed_live_instances(aws_env) == []


@pytest.mark.parametrize("mode", ["503", "reset"])
def test_transient_describe_failures_do_not_end_an_attempt(aws_env, net, tmp_path, mode):
    """EC2 answering 503 (or dropping connections) to DescribeInstances for a while: botocore's
    standard retries and the controller's observe tolerance keep the attempt alive."""
    from tests.support.fault_proxy import FaultProxy

    with (
        FaultProxy(aws_env, match="Action=DescribeInstances") as proxy,
        _provider(proxy.url, net) as provider,
        _runtime(aws_env, tmp_path),
    ):
        spec = JobSpec(
            job_id=unique("job-flaky"),
            checkpoint_uri=f"s3://{BUCKET}/flaky",
            command=(sys.executable, "-c", "import time; time.sleep(6)"),
            pools=provider.pools()[:1],
        )
        controller = Controller(
            provider,
            provider.market,
            RetryPolicy(max_infrastructure_retries=0),
            poll_interval_seconds=0.2,
            observe_failure_timeout_seconds=60.0,
        )
        nxt = controller.advance(spec, controller.new_record(spec))
        proxy.mode = mode
        flaky_until = time.monotonic() + 4
        while nxt.action == "watch":
            if time.monotonic() > flaky_until:
                proxy.mode = None
            time.sleep(0.2)
            nxt = controller.check(spec, nxt)
        assert proxy.failed > 0
        record = nxt.record
        assert [str(a.outcome) for a in record.attempts] == ["succeeded"], record.attempts[
            -1
        ].message


def test_handover_launches_beside_the_reclaimed_instance_and_resumes_its_emergency_save(
    aws_env, net, tmp_path
):
    """handover=on_notice (EC2's default): the replacement instance is launched on the
    notice, while the old one still saves; it resumes from that instance's emergency
    checkpoint in S3, and the old attempt can no longer save once it took over."""

    from spot_core.checkpoint import open_store
    from spot_core.checkpoint.resumed import read_resumed
    from spot_core.errors import FencedOut

    step = SUPPORT / "handover_step.py"
    result = tmp_path / "result.json"
    sqs = client("sqs", aws_env)
    queue = sqs.create_queue(QueueName=unique("spot-events"))["QueueUrl"]
    with (
        _provider(aws_env, net, sqs_queue_url=queue) as provider,
        _runtime(aws_env, tmp_path, sqs_queue_url=queue) as runtime,
    ):
        preempt_after_checkpoints(runtime, f"s3://{BUCKET}/run", attempts=(1,))
        record = _run(
            provider,
            (sys.executable, str(step), "300", "0.02", "1.5", str(result)),
            pools=provider.pools(),
        )
    assert record.status == "succeeded", record.summary()
    old, new = record.attempts[0], record.attempts[1]
    assert old.outcome == "preempted" and new.started_at < old.ended_at
    assert old.replacement is not None and old.replacement["state"] == "adopted"
    store = open_store(f"s3://{BUCKET}/run")
    emergency = [r for r in store.list() if r.attempt == old.number and "emergency" in r.metadata]
    assert len(emergency) == 1
    resumed = read_resumed(store, new.number)
    assert resumed is not None and resumed.step == emergency[0].step
    assert json.loads(result.read_text())["total"] == sum(range(300))
    with pytest.raises(FencedOut):
        store.save(10**6, {"state.json": b"{}"}, attempt=old.number)


@pytest.mark.timeout(240)
def test_on_notice_hands_over_without_an_event_queue(aws_env, net, tmp_path):
    """handover=on_notice with no EventBridge queue: EC2's API says nothing of a notice
    until the instance is gone, so the node's watcher writes it to the job's store the
    moment it sees it and the provider reads it there. With a 20 s notice the replacement
    is launched before the old instance ends and resumes from its emergency checkpoint
    well inside the notice; every instance ends terminated and tagged. (Before, the
    notice was learned at the end: time to resume 22.9 s, after the notice window.)"""

    from spot_core.checkpoint import open_store
    from spot_core.checkpoint.resumed import read_resumed

    notice_seconds = 20.0
    step = SUPPORT / "handover_step.py"
    result = tmp_path / "result.json"
    with (
        _provider(aws_env, net) as provider,
        _runtime(aws_env, tmp_path, notice_seconds=notice_seconds) as runtime,
    ):
        preempt_after_checkpoints(runtime, f"s3://{BUCKET}/run", attempts=(1,))
        record = _run(
            provider,
            (sys.executable, str(step), "300", "0.02", "1.5", str(result)),
            pools=provider.pools(),
            handover="on_notice",
        )
    assert record.status == "succeeded", record.summary()
    old, new = record.attempts[0], record.attempts[1]
    assert old.outcome == "preempted", old.message
    assert new.started_at < old.ended_at, (new.started_at, old.ended_at)
    assert old.replacement is not None and old.replacement["state"] == "adopted"
    store = open_store(f"s3://{BUCKET}/run")
    emergency = [r for r in store.list() if r.attempt == old.number and "emergency" in r.metadata]
    assert len(emergency) == 1
    resumed = read_resumed(store, new.number)
    assert resumed is not None and resumed.step == emergency[0].step
    waits = record.time_to_resume_seconds
    assert waits and waits[0] < notice_seconds, waits
    assert json.loads(result.read_text())["total"] == sum(range(300))
    _instances_ended_and_tagged(aws_env, record)


# -- handover=on_rebalance ---------------------------------------------------------------------
REBALANCE_STEPS = 300  # 6 s of steps plus 30 saves to S3: the signals land well inside it


def _rebalance_then_reclaim(runtime, store_uri: str, *, reclaim: bool, timeout: float = 90.0):
    """Background thread, as EC2 often behaves: once attempt 1 has made progress (a
    checkpoint), a rebalance recommendation for its instance (IMDS and EventBridge); with
    ``reclaim``, the interruption notice a second after the replacement instance booted
    and the old step's rebalance checkpoint was committed (so the replacement is provably
    launched on the rebalance, not on the notice, however loaded the machine)."""
    import threading

    from spot_core.checkpoint import open_store

    store = open_store(store_uri)
    give_up = time.monotonic() + timeout

    def first_instance():
        with runtime._lock:
            return next(iter(runtime.instances.values()), None)

    def wait(predicate) -> bool:
        while time.monotonic() < give_up:
            if predicate():
                return True
            time.sleep(0.05)
        return False

    def rebalance_saved() -> bool:
        return any(r.metadata.get("rebalance") for r in store.list())

    def run():
        if not wait(lambda: first_instance() is not None and store.list()):
            return
        old = first_instance().instance_id
        runtime.recommend_rebalance(old)
        if reclaim and wait(lambda: len(runtime.instances) >= 2 and rebalance_saved()):
            time.sleep(1.0)
            runtime.preempt(old)

    thread = threading.Thread(target=run, daemon=True, name="rebalancer")
    thread.start()
    return thread


def _instances_ended_and_tagged(endpoint: str, record) -> None:
    """Every instance the job launched is terminated in EC2 and tagged with its attempt."""
    ec2 = client("ec2", endpoint)
    pages = ec2.get_paginator("describe_instances").paginate(
        Filters=[{"Name": "tag:spot-pipelines:job", "Values": [record.job_id]}]
    )
    found = {i["InstanceId"]: i for p in pages for r in p["Reservations"] for i in r["Instances"]}
    launched = {a.lease_id: a.number for a in record.attempts if a.lease_id}
    for attempt in record.attempts:
        if attempt.replacement is not None:
            launched[attempt.replacement["lease"]["lease_id"]] = attempt.replacement["attempt"]
    assert set(found) == set(launched), (sorted(found), launched)
    for instance_id, number in launched.items():
        described = found[instance_id]
        tags = {t["Key"]: t["Value"] for t in described.get("Tags", [])}
        assert described["State"]["Name"] == "terminated", (instance_id, described["State"])
        assert tags["spot-pipelines:managed"] == "true"
        assert tags["spot-pipelines:attempt"] == str(number)


def _rebalance_run(aws_env, net, tmp_path, *, reclaim: bool):

    step = SUPPORT / "handover_step.py"
    result = tmp_path / "result.json"
    sqs = client("sqs", aws_env)
    queue = sqs.create_queue(QueueName=unique("spot-events"))["QueueUrl"]
    with (
        _provider(aws_env, net, sqs_queue_url=queue) as provider,
        # a 4 s notice (AWS gives 120 s): the 1.5 s emergency save fits on a loaded machine
        _runtime(aws_env, tmp_path, sqs_queue_url=queue, notice_seconds=4.0) as runtime,
    ):
        thread = _rebalance_then_reclaim(runtime, f"s3://{BUCKET}/run", reclaim=reclaim)
        record = _run(
            provider,
            (sys.executable, str(step), str(REBALANCE_STEPS), "0.02", "1.5", str(result)),
            pools=provider.pools(),
            handover="on_rebalance",
        )
        thread.join(10)
        signals = {i.instance_id: (i.rebalance_at, i.notice_at) for i in runtime.instances.values()}
    return record, signals, json.loads(result.read_text())


def test_on_rebalance_the_replacement_waits_for_the_notice_and_resumes_its_emergency_save(
    aws_env, net, tmp_path
):
    """handover=on_rebalance on EC2: a rebalance recommendation (IMDS + EventBridge), then
    the interruption notice. The replacement instance is launched on the recommendation,
    before any notice; the old step saves at once on the recommendation and works on (not
    cut short by the waiting replacement); on the notice it saves again, and the
    replacement resumes from that emergency checkpoint, not the rebalance one. A zombie of
    the old attempt cannot save after; every instance ends terminated and tagged."""
    from spot_core.checkpoint import open_store
    from spot_core.checkpoint.resumed import read_resumed
    from spot_core.errors import FencedOut

    record, signals, result = _rebalance_run(aws_env, net, tmp_path, reclaim=True)
    assert record.status == "succeeded", record.summary()
    old, new = record.attempts[0], record.attempts[1]
    rebalance_at, notice_at = signals[old.lease_id]
    assert rebalance_at is not None and notice_at is not None and rebalance_at < notice_at
    assert old.outcome == "preempted" and old.replacement["state"] == "adopted"
    # launched on the recommendation: before the notice, not after it
    assert rebalance_at < new.started_at < notice_at
    store = open_store(f"s3://{BUCKET}/run")
    mine = [r for r in store.list() if r.attempt == old.number]
    on_rebalance = [r for r in mine if r.metadata.get("rebalance")]
    emergency = [r for r in mine if "emergency" in r.metadata]
    assert len(on_rebalance) == 1 and len(emergency) == 1
    # the rebalance checkpoint was taken at once (not at the next scheduled save), and the
    # old step worked on past it until the notice
    assert rebalance_at <= on_rebalance[0].created_at < min(rebalance_at + 5.0, notice_at)
    assert on_rebalance[0].step < emergency[0].step and emergency[0].created_at >= notice_at
    resumed = read_resumed(store, new.number)
    assert resumed is not None and resumed.step == emergency[0].step
    assert new.checkpoint_step_start == emergency[0].step
    assert result["total"] == sum(range(REBALANCE_STEPS))  # no step lost or done twice
    with pytest.raises(FencedOut):
        store.save(10**6, {"state.json": b"{}"}, attempt=old.number)
    _instances_ended_and_tagged(aws_env, record)


def test_on_rebalance_without_a_reclaim_the_old_attempt_finishes_and_the_replacement_ends(
    aws_env, net, tmp_path
):
    """A rebalance recommendation that no notice follows: the old attempt saves once and
    runs to success; the replacement launched on the recommendation never fences or
    restores (it would take the job over from the attempt that finished it) and its
    instance is terminated unused, billed to the attempt."""
    from spot_core.checkpoint import open_store

    record, signals, result = _rebalance_run(aws_env, net, tmp_path, reclaim=False)
    assert record.status == "succeeded", record.summary()
    assert len(record.attempts) == 1
    only = record.attempts[0]
    rebalance_at, notice_at = signals[only.lease_id]
    assert rebalance_at is not None and notice_at is None
    assert only.outcome == "succeeded" and only.replacement["state"] == "terminated"
    assert "ended unused" in only.message
    assert result["total"] == sum(range(REBALANCE_STEPS))
    store = open_store(f"s3://{BUCKET}/run")
    assert [r.attempt for r in store.list()] == [only.number] * len(store.list())
    assert any(r.metadata.get("rebalance") for r in store.list())
    assert store.fence_level() == only.number  # the unused replacement never fenced
    _instances_ended_and_tagged(aws_env, record)


@pytest.mark.parametrize(
    ("seen_at", "node_at", "expected"),
    [
        (100.0, 100.37, 100.37),  # EventBridge's whole second, the node's sight inside it
        (100.0, 101.2, 100.0),  # the node saw it a poll later than that second: keep it
        (100.0, 99.8, 100.0),  # a node clock behind: never earlier than the event
        (100.0, None, 100.0),
        (None, 100.37, 100.37),
        (None, None, None),
    ],
)
def test_the_notice_time_is_the_nodes_within_the_events_whole_second(seen_at, node_at, expected):
    """EventBridge stamps events in whole seconds; a time to resume measured from the
    truncated time reads up to a second long, so the node's millisecond sight is used when
    it falls inside that second."""
    from spot_core.providers.ec2 import _precise_notice

    assert _precise_notice(seen_at, node_at) == expected
