"""A store that goes read-only, fills up or stops answering is the infrastructure's fault.

Real faults only: a tmpfs in a private user and mount namespace (``unshare -rm``, no
privilege needed) remounted read-only or filled by the step itself midway, and an S3
store whose moto server the step kills. Each step entry point (the batch worker, a sweep
trial, the training step) then exits with the infrastructure exit code (74) and one line
on stderr, never a traceback; under the controller the attempt is
``infrastructure_failed`` and no user retry is spent. A store remounted read-only
mid-batch used to end the worker with exit 1 and a traceback, spending a user retry.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from spot_core.attempt_env import INFRASTRUCTURE_EXIT_CODE
from spot_core.workloads.batch import ItemRange, WorkQueue
from tests.support.aws_helpers import client, free_port, unique

pytestmark = pytest.mark.timeout(300)

# Runs in its own user and mount namespace: mounts a tmpfs at MOUNT, puts the step's store
# there, runs the step (which breaks the store midway, or finds it broken), and prints
# what a user sees: the exit code, stdout and stderr (and the record for `run --json`).
IN_A_NAMESPACE = textwrap.dedent("""
    import json, os, subprocess, sys
    mount, fault, kind, work = sys.argv[1:5]
    size = "64k" if fault == "full" else "2m"
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", mount], check=True)
    os.environ.update(FAULT=fault, FAULT_MOUNT=mount)
    py = sys.executable
    store = f"file://{mount}/store"
    if kind in ("batch", "batch-under-run"):
        from spot_core.workloads.batch import ItemRange, WorkQueue
        WorkQueue.create(store, ItemRange(0, 8), unit_size=2)
        command = [py, "-m", "spot_core.workloads.batch_worker", "--queue", store,
                   "--function", "tests.support.faulty_store_steps:process"]
        if kind == "batch-under-run":
            command = [py, "-m", "spot_core.cli", "run", "--json", "--job-id", "faulty",
                       "--max-user-retries", "1", "--max-infrastructure-retries", "0",
                       "--checkpoint-uri", f"file://{work}/job", "--", *command]
    else:  # the step starts on a store an earlier attempt wrote, broken since
        from tests.support.faulty_store_steps import break_the_store
        from spot_core.checkpoint import open_store
        open_store(store).save(1, {"x": b"0"}, attempt=1)
        os.environ.update(SPOT_CHECKPOINT_URI=store, SPOT_ATTEMPT="2")
        if kind == "trial":
            import optuna
            storage = f"sqlite:///{work}/study.db"
            study = optuna.create_study(study_name="s", storage=storage)
            command = [py, "-m", "spot_core.sweeps.trial_step", "--storage", storage,
                       "--study", "s", "--trial", str(study.ask().number),
                       "--objective", "tests.support.faulty_store_steps:objective"]
        elif kind == "user":  # breaks the store itself, after its first save
            command = [py, "-c",
                       "import tests.support.faulty_store_steps as f; f.user_training_loop()"]
        else:
            command = [py, "-m", "spot_core.workloads.softmax_regression", "--steps", "40",
                       "--checkpoint-every-steps", "10"]
        if kind != "user":
            break_the_store()
    done = subprocess.run(command, capture_output=True, text=True, timeout=200)
    print(json.dumps({"code": done.returncode, "stdout": done.stdout, "stderr": done.stderr}))
""")


def in_a_namespace(tmp_path: Path, fault: str, kind: str) -> dict:
    if shutil.which("unshare") is None:
        pytest.fail("this test needs util-linux 'unshare' (apt-get install util-linux)")
    mount, work = tmp_path / "mnt", tmp_path / "work"
    mount.mkdir()
    work.mkdir()
    script = tmp_path / "in_a_namespace.py"
    script.write_text(IN_A_NAMESPACE)
    done = subprocess.run(
        ["unshare", "-rm", sys.executable, str(script), str(mount), fault, kind, str(work)],
        capture_output=True,
        text=True,
        timeout=280,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        cwd=work,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def assert_one_line_exit_74(result: dict) -> None:
    """What a user sees: the infrastructure's exit code, one line, no traceback."""
    lines = [line for line in result["stderr"].splitlines() if line.strip()]
    assert result["code"] == INFRASTRUCTURE_EXIT_CODE, result
    assert len(lines) == 1 and "Traceback" not in result["stderr"], result
    assert lines[0].startswith("error: infrastructure failure"), result
    assert json.loads(result["stdout"].strip().splitlines()[-1])["infrastructure_failed"]


@pytest.mark.parametrize("fault", ["read-only", "full"])
def test_a_batch_worker_whose_store_breaks_midway_exits_74_in_one_line(tmp_path, fault) -> None:
    assert_one_line_exit_74(in_a_namespace(tmp_path, fault, "batch"))


@pytest.mark.parametrize("fault", ["read-only", "full"])
@pytest.mark.parametrize("kind", ["trial", "train"])
def test_a_sweep_trial_or_training_step_on_a_broken_store_exits_74_in_one_line(
    tmp_path, kind, fault
) -> None:
    assert_one_line_exit_74(in_a_namespace(tmp_path, fault, kind))


@pytest.mark.parametrize("fault", ["read-only", "full"])
def test_a_users_own_loop_whose_store_breaks_exits_74_in_one_line(tmp_path, fault) -> None:
    # No try/except in the user's loop: Checkpointer.from_env's hook ends it as the
    # project's own steps end (it used to exit 1 with a traceback: a user failure).
    assert_one_line_exit_74(in_a_namespace(tmp_path, fault, "user"))


def test_under_the_controller_a_store_gone_read_only_is_no_user_failure(tmp_path) -> None:
    result = in_a_namespace(tmp_path, "read-only", "batch-under-run")
    record = json.loads(result["stdout"].strip().splitlines()[-1])
    outcomes = [a["outcome"] for a in record["attempts"]]
    # the trace may reclaim the worker's capacity first (then its next attempt breaks it)
    assert outcomes[-1] == "infrastructure_failed", (outcomes, result["stderr"][-2000:])
    assert "user_failed" not in outcomes and record["user_failures"] == 0, outcomes
    assert record["infrastructure_failures"] == 1 and record["status"] == "failed"
    assert "Traceback" not in result["stderr"]


# -- an S3 store that stops answering ------------------------------------------------------
def _moto(port: int) -> subprocess.Popen:
    binary = Path(sys.executable).with_name("moto_server")
    command = [str(binary)] if binary.exists() else [sys.executable, "-m", "moto.server"]
    proc = subprocess.Popen(
        [*command, "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/moto-api/", timeout=2)
            return proc
        except OSError:
            time.sleep(0.2)
    proc.kill()
    pytest.fail("moto_server did not answer in 60 s")


def test_a_batch_worker_whose_s3_store_stops_answering_exits_74_in_one_line(
    monkeypatch,
) -> None:
    """The worker kills the moto server holding its queue while it works on a unit."""
    port = free_port()
    moto = _moto(port)
    try:
        endpoint = f"http://127.0.0.1:{port}"
        for name, value in {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
            "AWS_CONFIG_FILE": "/dev/null",
            "SPOT_S3_ENDPOINT_URL": endpoint,
            "FAULT": "unreachable",
            "FAULT_MOTO_PID": str(moto.pid),
            "PYTHONPATH": os.pathsep.join(sys.path),
        }.items():
            monkeypatch.setenv(name, value)
        bucket = unique("faults")
        client("s3", endpoint).create_bucket(Bucket=bucket)
        uri = f"s3://{bucket}/queue"
        WorkQueue.create(uri, ItemRange(0, 8), unit_size=2)
        done = subprocess.run(
            [sys.executable, "-m", "spot_core.workloads.batch_worker", "--queue", uri]
            + ["--function", "tests.support.faulty_store_steps:process"],
            capture_output=True,
            text=True,
            timeout=280,
        )
    finally:
        moto.kill()
        moto.wait(timeout=10)
    assert_one_line_exit_74({"code": done.returncode, "stdout": done.stdout, "stderr": done.stderr})
