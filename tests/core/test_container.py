"""Image + command jobs: how a step reaches ``docker run``, and the error without Docker.

The jobs themselves run in real containers in tests/images (test_step_image.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from spot_core import container
from spot_core.errors import ConfigError


def test_docker_argv_passes_names_not_values_and_mounts_what_the_step_reads(tmp_path):
    notice = tmp_path / "notice" / "notice.json"
    store = tmp_path / "ckpt"
    environ = {
        "SPOT_CHECKPOINT_URI": store.as_uri(),
        "SPOT_ATTEMPT": "2",
        "SPOT_NOTICE_FILE": str(notice),
        "WANDB_MODE": "offline",
        "AWS_SECRET_ACCESS_KEY": "k",
        "AWS_PROFILE": "dev",
        "HOME": "/root",
        "PATH": "/usr/bin",
    }
    argv = container.docker_argv(
        "ghcr.io/acme/train:1.4",
        ["python", "train.py"],
        environ,
        ["WANDB_MODE"],
        name="spot-step-1",
    )
    # Named, not --rm: the shim removes it after reading its exit code (container.py).
    assert argv[:7] == ["docker", "run", "--name", "spot-step-1", "--init", "--network", "host"]
    assert argv[-3:] == ["ghcr.io/acme/train:1.4", "python", "train.py"]
    passed = {argv[i + 1] for i, word in enumerate(argv) if word == "-e"}
    assert passed == {
        "SPOT_CHECKPOINT_URI",
        "SPOT_ATTEMPT",
        "SPOT_NOTICE_FILE",
        "WANDB_MODE",
        "AWS_SECRET_ACCESS_KEY",
    }  # the SDK's credentials by name, no profile
    assert "offline" not in argv and "/root" not in argv, "values stay in the environment"
    mounts = {argv[i + 1] for i, word in enumerate(argv) if word == "-v"}
    assert mounts == {f"{notice.parent}:{notice.parent}", f"{store}:{store}"}
    # The step shares the watcher's notice file and the store's folder: it runs as their owner.
    assert argv[argv.index("--user") + 1] == f"{os.getuid()}:{os.getgid()}"


def test_s3_store_needs_no_mount():
    argv = container.docker_argv("img:1", ["run"], {"SPOT_CHECKPOINT_URI": "s3://b/p"})
    assert "-v" not in argv


def test_wrap_runs_the_shim_under_the_given_python():
    wrapped = container.wrap("img:1", ("python", "train.py"), ("B", "A"), python="python3")
    assert wrapped == (
        "python3",
        "-m",
        "spot_core.container",
        "--image",
        "img:1",
        "--env",
        "A",
        "--env",
        "B",
        "--",
        "python",
        "train.py",
    )
    with pytest.raises(ConfigError, match="not an image reference"):
        container.wrap("my image", ("true",), ())


def test_run_with_an_image_and_no_docker_engine_is_one_clear_line(tmp_path):
    # DOCKER_HOST points at a socket nobody listens on, so no engine answers even on a
    # machine that runs one: the test never needs to skip.
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path / 'no-engine.sock'}"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "spot_core.cli",
            "run",
            "--image",
            "python:3.11-slim",
            "--pools",
            "us-east-2a",
            "--",
            "python",
            "-c",
            "print(1)",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Docker" in lines[0] and "drop image=" in lines[0], proc.stderr
    expected = "no 'docker' is on PATH" if shutil.which("docker") is None else "docker info"
    assert expected in lines[0]
