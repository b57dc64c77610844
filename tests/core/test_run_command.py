"""`spot-pipelines run`: a job from the command line, and bad input in one line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.spot_helpers import marked_processes, train_command

pytestmark = pytest.mark.timeout(120)


def _run(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "spot_core.cli", "run", *args],
        capture_output=True,
        text=True,
        timeout=100,
        cwd=cwd,
    )


def test_run_finishes_a_preempted_job_and_prints_its_record(tmp_path):
    proc = _run(
        "--start-tick",
        "450",
        "--max-preemptions",
        "1",
        "--pools",
        "us-east-2a",
        "--json",
        "--",
        *train_command(steps=600, step_seconds=0.01),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    assert record["status"] == "succeeded"
    assert record["preemptions"] == 1
    assert record["attempts"][-1]["pool"]["market"] == "on-demand"
    assert "preempted" in proc.stderr and "job-" in proc.stderr  # stdout: the JSON alone
    assert (tmp_path / ".spot-runs" / record["job_id"] / "checkpoints").is_dir()


@pytest.mark.parametrize(
    "args, words",
    [
        (["--max-preemptions", "-1", "--", "true"], "--max-preemptions"),
        (["--pools", "atlantis-1a", "--", "true"], "unknown pool"),
        (["--", "no-such-command-xyz"], "not found"),
        (["--checkpoint-uri", "file:///proc/spot-nope", "--", "true"], "writable"),
        (["--checkpoint-uri", "ftp://x/y", "--", "true"], "file://"),
        (["--trace", "/nonexistent/trace.csv", "--", "true"], "does not exist"),
        (["--deadline", "soonish", "--", "true"], "--deadline"),
        (["--work", "lots", "--", "true"], "--work"),
        (["--provider", "ec2", "--", "true"], "--subnets"),
        ([], "no command"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_no_lease(tmp_path, args, words):
    proc = _run(*args, cwd=tmp_path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in proc.stderr
    assert not marked_processes(containing=str(tmp_path))
