"""Container steps under a real engine: `spot-pipelines run --image` with the step image.

The controller runs on this machine; each attempt is a lease of the local spot cloud whose
command is `docker run ... localhost/spot-pipelines-step:dev CMD` (spot_core/container.py),
through the real docker CLI against the engine's Docker API. A reclaim during the step
sends SIGTERM to the docker CLI, which passes it through the engine to the container's
init, the image's `spot-pipelines watch`, and the training step, which saves an emergency
checkpoint into the store (a host folder mounted at the same path) and exits; the next
attempt's container resumes from that checkpoint.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from spot_core.checkpoint import open_store
from spot_core.checkpoint.state import arrays_from_bytes
from spot_core.workloads.softmax_regression import STATE_FILE, TrainConfig, train, weights_sha256
from spot_emulators.ec2_runtime import Ec2InstanceRuntime, default_instance_env
from tests.support.aws_helpers import (
    aws_env,  # noqa: F401 - a fixture / shared name
    bucket,  # noqa: F401 - a fixture / shared name
    make_network,
    managed_live_instances,  # noqa: F401
    moto_server,  # noqa: F401 - a fixture / shared name
)

pytestmark = pytest.mark.timeout(600)

STEPS = 600
STEP_SECONDS = 0.02
# No scheduled checkpoint before the reclaim: what the next attempt resumes from can only
# be the emergency checkpoint the first container saved on its way out.
EVERY_STEPS = 100_000


def _step_command(steps: int = STEPS) -> list[str]:
    """The training step, run by the image's own Python."""
    return [
        "python",
        "-m",
        "spot_core.workloads.softmax_regression",
        "--steps",
        str(steps),
        "--step-seconds",
        str(STEP_SECONDS),
        "--seed",
        "7",
        "--checkpoint-every-steps",
        str(EVERY_STEPS),
    ]


def _run(
    engine, image: str, cwd, *options: str, timeout: float = 300
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "spot_core.cli",
            "run",
            "--image",
            image,
            "--pools",
            "us-east-2a",
            "--json",
            *options,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=engine.env(),
    )


def _containers_of(engine, image: str) -> list[str]:
    """The containers created from ``image`` itself. Not ``--filter ancestor=``, which also
    lists containers of related images: in one full run of the suite it counted the same
    container, created before these tests ran, as left behind by each of them."""
    done = engine.docker("ps", "-a", "--format", "{{.ID}} {{.Image}}")
    assert done.returncode == 0, done.stderr
    rows = (line.split(maxsplit=1) for line in done.stdout.splitlines() if line.strip())
    return [row[0] for row in rows if len(row) == 2 and row[1].strip() == image]


def test_a_reclaimed_step_resumes_in_its_next_container(engine, images, tmp_path):
    step_image = images.step
    store = tmp_path / "store"
    # Tick 450 of the trace: us-east-2a's spot capacity is reclaimed a few seconds in.
    proc = _run(
        engine,
        step_image,
        tmp_path,
        "--start-tick",
        "450",
        "--max-preemptions",
        "1",
        "--checkpoint-uri",
        store.as_uri(),
        "--",
        *_step_command(),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    assert record["status"] == "succeeded" and record["preemptions"] == 1, record
    first, second = record["attempts"][0], record["attempts"][1]
    assert first["outcome"] == "preempted"
    assert second["checkpoint_step_start"] > 0, "the second container resumed from the store"

    # The first container's last act was its emergency checkpoint (no scheduled one comes
    # before step EVERY_STEPS), and the second container started from it.
    assert 0 < first["checkpoint_step_end"] == second["checkpoint_step_start"] < STEPS

    assert not _containers_of(engine, step_image), "no container left behind"

    # The final weights equal those of the same training run without interruption.
    final = open_store(store.as_uri()).latest()
    assert final is not None and final.metadata.get("final")
    state = arrays_from_bytes(open_store(store.as_uri()).load(final)[STATE_FILE])
    reference = train(TrainConfig(steps=STEPS, seed=7)).weights_sha256
    assert weights_sha256(state) == reference


def test_the_reclaims_sigterm_reaches_the_step_inside_its_container(engine, images, tmp_path):
    """A step that reads no notice file and stops only on SIGTERM: the reclaim's SIGTERM
    goes watcher -> docker CLI -> engine -> the container's init -> the image's
    `spot-pipelines watch` -> the step, which records it (with its PID in the container's
    own PID namespace) and exits 143; the next attempt finds the record and finishes."""
    store = tmp_path / "store"
    proc = _run(
        engine,
        images.step,
        tmp_path,
        "--start-tick",
        "450",
        "--max-preemptions",
        "1",
        "--checkpoint-uri",
        store.as_uri(),
        "--",
        "python",
        "-c",
        _SIGTERM_STEP,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    assert record["preemptions"] == 1 and record["status"] == "succeeded", record
    seen = sorted(store.glob("sigterm-*"))
    assert [p.name for p in seen] == ["sigterm-1"], seen
    pid, signum = map(int, seen[0].read_text().split())
    assert signum == 15
    assert pid < 100, f"pid {pid}: not a process of the container's own PID namespace"
    assert not _containers_of(engine, images.step), "no container left behind"


_SIGTERM_STEP = """
import os, pathlib, signal, sys, time
out = pathlib.Path(os.environ["SPOT_CHECKPOINT_URI"].removeprefix("file://"))
if any(out.glob("sigterm-*")):
    sys.exit(0)
def on_term(signum, frame):
    (out / f"sigterm-{os.environ['SPOT_ATTEMPT']}").write_text(f"{os.getpid()} {signum}")
    sys.exit(143)
signal.signal(signal.SIGTERM, on_term)
time.sleep(300)
"""


def test_an_image_job_runs_in_its_container_on_an_ec2_instance(
    engine, images, aws_env, bucket, tmp_path, monkeypatch
):
    """`--provider ec2 --image`: moto launches the instance, the instance runtime harness
    runs its user-data, which starts the step image through the instance's docker CLI; the
    step checkpoints to S3 (moto) with the credentials the instance has."""
    for name, value in engine.environ.items():  # the instances' docker CLI and engine
        monkeypatch.setenv(name, value)
    net = make_network(aws_env)
    uri = f"s3://{bucket}/in-image"
    runtime = Ec2InstanceRuntime(
        aws_env, tmp_path / "runtime", ("us-east-1",), default_instance_env(aws_env, "us-east-1")
    )
    with runtime:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "spot_core.cli",
                "run",
                "--provider",
                "ec2",
                "--endpoint-url",
                aws_env,  # noqa: F401 - a fixture / shared name
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
                "--image",
                images.step,
                "--checkpoint-uri",
                uri,
                "--json",
                "--",
                *_step_command(steps=100),
            ],
            capture_output=True,
            text=True,
            timeout=240,
            cwd=tmp_path,
        )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    assert record["status"] == "succeeded", record
    store = open_store(uri)
    final = store.latest()
    assert final is not None and final.step == 100 and final.metadata.get("final")
    state = arrays_from_bytes(store.load(final)[STATE_FILE])
    assert weights_sha256(state) == train(TrainConfig(steps=100, seed=7)).weights_sha256
    assert managed_live_instances(aws_env) == [], "orphans left"
    assert not _containers_of(engine, images.step), "no container left behind"


def test_an_image_that_is_nowhere_fails_the_step_not_the_controller(engine, images, tmp_path):
    proc = _run(
        engine, "localhost/spot-pipelines-no-such-image:dev", tmp_path, "--", "true", timeout=120
    )
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    assert proc.returncode == 1 and record["status"] == "failed", proc.stderr[-2000:]
    assert record["attempts"][-1]["outcome"] == "user_failed"
