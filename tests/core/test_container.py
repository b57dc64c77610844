"""Image + command jobs: how a step reaches ``docker run``, and the error without Docker."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from spot_core import container
from spot_core.errors import ConfigError
from spot_helpers import train_command


def test_docker_argv_passes_names_not_values_and_mounts_what_the_step_reads(tmp_path):
    notice = tmp_path / "notice" / "notice.json"
    store = tmp_path / "ckpt"
    environ = {"SPOT_CHECKPOINT_URI": store.as_uri(), "SPOT_ATTEMPT": "2",
               "SPOT_NOTICE_FILE": str(notice), "WANDB_MODE": "offline",
               "HOME": "/root", "PATH": "/usr/bin"}
    argv = container.docker_argv("ghcr.io/acme/train:1.4", ["python", "train.py"], environ,
                                 ["WANDB_MODE"])
    assert argv[:6] == ["docker", "run", "--rm", "--init", "--network", "host"]
    assert argv[-3:] == ["ghcr.io/acme/train:1.4", "python", "train.py"]
    passed = {argv[i + 1] for i, word in enumerate(argv) if word == "-e"}
    assert passed == {"SPOT_CHECKPOINT_URI", "SPOT_ATTEMPT", "SPOT_NOTICE_FILE", "WANDB_MODE"}
    assert "offline" not in argv and "/root" not in argv, "values stay in the environment"
    mounts = {argv[i + 1] for i, word in enumerate(argv) if word == "-v"}
    assert mounts == {f"{notice.parent}:{notice.parent}", f"{store}:{store}"}


def test_s3_store_needs_no_mount():
    argv = container.docker_argv("img:1", ["run"], {"SPOT_CHECKPOINT_URI": "s3://b/p"})
    assert "-v" not in argv


def test_wrap_runs_the_shim_under_the_given_python():
    wrapped = container.wrap("img:1", ("python", "train.py"), ("B", "A"), python="python3")
    assert wrapped == ("python3", "-m", "spot_core.container", "--image", "img:1",
                       "--env", "A", "--env", "B", "--", "python", "train.py")
    with pytest.raises(ConfigError, match="not an image reference"):
        container.wrap("my image", ("true",), ())


def test_run_with_an_image_and_no_docker_engine_is_one_clear_line(tmp_path):
    # DOCKER_HOST points at a socket nobody listens on, so no engine answers even on a
    # machine that runs one: the test never needs to skip.
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path / 'no-engine.sock'}"}
    proc = subprocess.run([sys.executable, "-m", "spot_core.cli", "run", "--image",
                           "python:3.11-slim", "--pools", "us-east-2a", "--",
                           "python", "-c", "print(1)"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Docker" in lines[0] and "drop image=" in lines[0], proc.stderr
    expected = "no 'docker' is on PATH" if shutil.which("docker") is None else "docker info"
    assert expected in lines[0]


@pytest.fixture
def docker_engine(monkeypatch):
    """The real docker CLI against the Engine API emulator (no engine can run here)."""
    if shutil.which("docker") is None:
        pytest.skip("no docker CLI on PATH")
    from spot_core.emulators.docker_engine import FakeDockerEngine

    with FakeDockerEngine(["spot-pipelines/train:1"]) as engine:
        monkeypatch.setenv("DOCKER_HOST", engine.url)
        yield engine


def test_an_image_job_is_preempted_in_its_container_and_resumes(docker_engine, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "spot_core.cli", "run", "--image",
                           "spot-pipelines/train:1", "--start-tick", "450", "--max-preemptions",
                           "1", "--pools", "us-east-2a", "--json", "--",
                           *train_command(steps=600, step_seconds=0.01)],
                          capture_output=True, text=True, timeout=100, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    assert record["status"] == "succeeded" and record["preemptions"] == 1
    assert record["attempts"][1]["checkpoint_step_start"] > 0, "resumed from its checkpoint"
    creates = [c for c in docker_engine.calls if c == "POST /containers/create"]
    kills = [c for c in docker_engine.calls if c.endswith("/kill")]
    assert len(creates) == 2, "each attempt ran in a container"
    assert kills, "the notice reached the container through the CLI's signal proxy"
    assert docker_engine.containers == {}, "--rm: nothing left behind"


def test_an_unknown_image_fails_the_step_not_the_controller(docker_engine, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "spot_core.cli", "run", "--image",
                           "no/such:image", "--pools", "us-east-2a", "--json", "--", "true"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    assert proc.returncode == 1 and record["status"] == "failed"
    assert record["attempts"][-1]["outcome"] == "user_failed"
