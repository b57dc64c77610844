"""Killing `spot-pipelines run` mid-attempt leaks no capacity, on the local cloud and on EC2.

SIGTERM: `run` cleans up as on Ctrl-C, so its lease goes at once. SIGKILL: nothing cleans
up, so the lease ends itself once the driver's heartbeat is older than --heartbeat-timeout
(the node's watcher stops the step after an emergency save); a re-run of the same job id
then resumes from the newest checkpoint above the dead run's attempt, and a zombie writer
of the dead attempt is fenced out. Real processes throughout: the `run` CLI, the local
cloud's lease processes (found by their marker in /proc), moto with the instance runtime.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spot_core.checkpoint import open_store
from spot_core.checkpoint.heartbeat import HEARTBEAT_KEY
from spot_emulators.ec2_runtime import Ec2InstanceRuntime, default_instance_env
from tests.support.aws_helpers import (
    bucket,  # noqa: F401 - a fixture / shared name
    make_network,
    managed_live_instances,  # noqa: F401
    unique,
)
from tests.support.spot_helpers import ZOMBIE_WRITER, marked_processes, train_command, wait_until

pytestmark = pytest.mark.timeout(180)

HEARTBEAT = 3.0  # seconds: the heartbeat timeout of the killed runs
SLACK = 20.0  # seconds: what a loaded machine may add to any wait here


def calm_trace(tmp_path: Path) -> Path:
    """One zone whose spot capacity never goes away (JSON traces count 1 as preempted)."""
    path = tmp_path / "us-east-1a_calm.json"
    path.write_text(
        json.dumps(
            {
                "metadata": {
                    "gap_seconds": 600,
                    "price_info": {"price": 0.9, "on_demand_price": 3.06},
                },
                "data": [0] * 5000,
            }
        )
    )
    return path


def start_run(tmp_path: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "spot_core.cli", "run", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )


def wait_for_checkpoint(store, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    """Until the running attempt has committed real progress (or `run` died)."""
    assert wait_until(
        lambda: store.latest() is not None or proc.poll() is not None, timeout=timeout
    ), "no checkpoint in time"
    assert proc.poll() is None, proc.communicate(timeout=10)


def local_args(tmp_path: Path, job_id: str, uri: str, heartbeat: float, steps: int) -> list:
    return [
        "--trace",
        str(calm_trace(tmp_path)),
        "--job-id",
        job_id,
        "--checkpoint-uri",
        uri,
        "--heartbeat-timeout",
        f"{heartbeat:g}s",
        "--json",
        "--",
        *train_command(steps=steps, step_seconds=0.02, every_steps=20),
    ]


def test_sigkill_of_run_ends_the_lease_after_the_heartbeat_timeout_and_a_rerun_resumes(tmp_path):
    job_id, uri = unique("killed"), (tmp_path / "ckpt").as_uri()
    store = open_store(uri)
    proc = start_run(tmp_path, *local_args(tmp_path, job_id, uri, HEARTBEAT, steps=600))
    try:
        wait_for_checkpoint(store, proc)
        proc.kill()
        proc.wait(timeout=10)
        killed_at = time.monotonic()
        assert marked_processes(str(tmp_path)), "the lease outlived its driver (for now)"
        assert wait_until(lambda: not marked_processes(str(tmp_path)), timeout=HEARTBEAT + SLACK), (
            "the lease never ended itself"
        )
        assert time.monotonic() - killed_at >= HEARTBEAT - 1.0
    finally:
        proc.kill()
    dead = store.latest()
    assert dead.attempt == 1 and dead.step > 0

    rerun = start_run(tmp_path, *local_args(tmp_path, job_id, uri, 30.0, steps=600))
    out, err = rerun.communicate(timeout=120)
    assert rerun.returncode == 0, err[-2000:]
    record = json.loads(out.strip().splitlines()[-1])
    assert record["status"] == "succeeded"
    first = record["attempts"][0]
    assert first["number"] > dead.attempt, "numbered above the dead run's attempt"
    assert first["checkpoint_step_start"] >= dead.step, "resumed from the newest checkpoint"

    zombie = subprocess.run(
        [sys.executable, "-c", ZOMBIE_WRITER, uri], capture_output=True, text=True, timeout=30
    )
    assert zombie.stdout.split() == ["fenced", "1000"], zombie.stdout + zombie.stderr
    assert all(ref.metadata.get("writer") != "zombie" for ref in store.list())
    assert not marked_processes(str(tmp_path))


def test_with_one_driver_beat_the_lease_lives_while_run_does_and_ends_after_a_sigkill(tmp_path):
    """--heartbeat-uri: the job's heartbeat is a pointer to the process's one beat, which
    keeps the lease alive past the timeout while `run` lives; after a SIGKILL nobody
    renews it and the lease ends itself, as with the job's own beat."""
    job_id, uri = unique("pointed"), (tmp_path / "ckpt").as_uri()
    store = open_store(uri)
    proc = start_run(
        tmp_path,
        "--heartbeat-uri",
        (tmp_path / "drivers").as_uri(),
        *local_args(tmp_path, job_id, uri, HEARTBEAT, steps=100000),
    )
    try:
        wait_for_checkpoint(store, proc)
        time.sleep(2 * HEARTBEAT)
        assert proc.poll() is None and marked_processes(str(tmp_path)), (
            "the lease lived past the timeout on the process's one beat"
        )
        pointer = json.loads(store.get_object(HEARTBEAT_KEY))
        (beat,) = (tmp_path / "drivers" / "drivers").glob("*.json")
        assert beat.name == f"{pointer['driver']}.json"
        assert json.loads(beat.read_text())["jobs"] == {job_id: 1}
        proc.kill()
        proc.wait(timeout=10)
        killed_at = time.monotonic()
        assert wait_until(lambda: not marked_processes(str(tmp_path)), timeout=HEARTBEAT + SLACK), (
            "the lease never ended itself"
        )
        assert time.monotonic() - killed_at >= HEARTBEAT - 1.0
    finally:
        proc.kill()
    assert store.latest().metadata.get("emergency"), "the step saved on its way out"


def test_sigterm_of_run_terminates_the_lease_at_once(tmp_path):
    job_id, uri = unique("termed"), (tmp_path / "ckpt").as_uri()
    store = open_store(uri)
    long_heartbeat = 60.0  # far longer than the bound below: it must not be what ends it
    proc = start_run(tmp_path, *local_args(tmp_path, job_id, uri, long_heartbeat, steps=100000))
    try:
        wait_for_checkpoint(store, proc)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=SLACK)
        assert wait_until(lambda: not marked_processes(str(tmp_path)), timeout=10)
    finally:
        proc.kill()
    assert proc.returncode != 0


@pytest.fixture
def ec2_setup(aws_env, bucket):  # noqa: F811 - pytest fixture by name
    net = make_network(aws_env)
    yield aws_env, net, bucket
    assert managed_live_instances(aws_env) == [], "orphans left"


@pytest.mark.parametrize("beat", ["own-store", "driver-beat"])
def test_sigkill_of_run_on_ec2_leaves_no_running_instance_after_the_timeout(
    ec2_setup, tmp_path, beat
):
    """With --heartbeat-uri the instance follows its job's pointer to the driver's one
    beat in S3 (its own credentials, the same bucket)."""
    endpoint, net, bucket_name = ec2_setup
    uri = f"s3://{bucket_name}/{unique('killed')}"
    drivers = (
        ["--heartbeat-uri", f"s3://{bucket_name}/{unique('drivers')}"]
        if beat == "driver-beat"
        else []
    )
    store = open_store(uri)
    runtime = Ec2InstanceRuntime(
        endpoint, tmp_path / "runtime", ("us-east-1",), default_instance_env(endpoint, "us-east-1")
    )
    with runtime:
        proc = start_run(
            tmp_path,
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
            "--checkpoint-uri",
            uri,
            "--heartbeat-timeout",
            f"{HEARTBEAT:g}s",
            *drivers,
            "--",
            *train_command(steps=100000, step_seconds=0.01, every_steps=20),
        )
        try:
            wait_for_checkpoint(store, proc, timeout=90)
            if drivers:  # alive past the timeout on the one beat
                time.sleep(2 * HEARTBEAT)
                assert proc.poll() is None and managed_live_instances(endpoint)
                assert "driver" in json.loads(store.get_object(HEARTBEAT_KEY))
            proc.kill()
            proc.wait(timeout=10)
            assert managed_live_instances(endpoint), "the instance outlived its driver (for now)"
            assert wait_until(
                lambda: not managed_live_instances(endpoint),
                timeout=HEARTBEAT + SLACK,
                interval=0.5,
            )
        finally:
            proc.kill()
        assert runtime.wait_for(
            lambda rt: all(i.done or i.process.poll() is not None for i in rt.instances.values()),
            timeout=15,
        )
        assert not runtime.live_pids(), "the instance's processes went with it"
        emergency = [r for r in store.list() if r.metadata.get("emergency")]
        assert emergency, "the step saved on its way out"
        logs = [p.read_text() for p in (tmp_path / "runtime").glob("*.watch.log")]
        assert any('"event": "driver_lost"' in text for text in logs), logs
