"""`spot-pipelines demo --workload batch-inference|sweep --json`: the batch and sweep demos
end to end as a user runs them, each reclaimed at least once, each ending in its contract."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

BATCH = {
    "items_total",
    "items_done",
    "duplicates",
    "preemptions",
    "outputs_sha256",
    "uninterrupted_outputs_sha256",
}
SWEEP = {
    "trials_total",
    "trials_complete",
    "preemptions",
    "best_value",
    "uninterrupted_best_value",
    "storage",
}


def demo(workload: str, workdir) -> tuple[subprocess.CompletedProcess, dict]:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "spot_core.cli",
            "demo",
            "--workload",
            workload,
            "--json",
            "--workdir",
            str(workdir),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(260)
def test_batch_demo_loses_and_repeats_nothing_through_reclaims(tmp_path):
    proc, report = demo("batch-inference", tmp_path)
    assert BATCH <= set(report)
    assert report["items_done"] == report["items_total"] > 0
    assert report["duplicates"] == 0
    assert report["preemptions"] >= 1
    assert report["outputs_sha256"] == report["uninterrupted_outputs_sha256"]
    assert "(equal)" in proc.stdout and " preempted " in proc.stdout


@pytest.mark.timeout(260)
def test_sweep_demo_trials_survive_reclaims_with_the_same_best_value(tmp_path):
    proc, report = demo("sweep", tmp_path)
    assert SWEEP <= set(report)
    assert report["trials_complete"] == report["trials_total"] > 0
    assert report["preemptions"] >= 1
    assert report["best_value"] == report["uninterrupted_best_value"]
    assert report["storage"] == "sqlite"
    assert "(equal)" in proc.stdout


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--engine", "airflow"], "runs on the local spot cloud without an engine"),
        (["--start-tick", "3"], "--steps and --start-tick are the training demo's"),
        (["--steps", "500"], "--steps and --start-tick are the training demo's"),
    ],
)
def test_a_workload_demo_refuses_the_training_demos_flags_in_one_line(extra, message):
    proc = subprocess.run(
        [sys.executable, "-m", "spot_core.cli", "demo", "--workload", "batch-inference", *extra],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr


def test_a_workload_demo_refuses_a_workdir_that_is_a_file(tmp_path):
    target = tmp_path / "file"
    target.write_text("keep me")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "spot_core.cli",
            "demo",
            "--workload",
            "sweep",
            "--workdir",
            str(target),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "is not a folder" in proc.stderr
    assert target.read_text() == "keep me"
