"""The triggerer part of ``make bench-scale`` end to end at a tiny scale, on each backend
(moto's EC2 and S3; the local cloud server): a migrated Airflow metadata database, a DAG
of deferrable spot jobs whose task instances are deferred on SpotJobTrigger rows, and one
real ``airflow triggerer`` process. Every trigger renews its job's heartbeat, every lease
is watched in one describe per poll, the triggerer's stop (a restart) leaves the leases
running, as it must, and at the end no lease and no process the bench started is left.
About 70 s each: `slow`, run with ``-m slow``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
JOBS = 3


def _run(tmp_path, backend: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.scale_triggerer",
            "--backend",
            backend,
            "--jobs",
            str(JOBS),
            "--seconds",
            "5",
            "--poll-interval",
            "1",
            "--sqlite",
            "--idle-seconds",
            "0",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=380,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    label = {"ec2": "ec2_moto", "local": "local_cloud"}[backend]
    result = json.loads(done.stdout)[f"airflow_triggerer_{label}"]
    assert result["deferred_task_instances"] == JOBS
    assert result["triggers_assigned"] == JOBS  # the triggerer took every row
    assert result["polls"] >= 2
    assert result["triggerer_alive_after_window"]
    assert result["cpu_s"] > 0
    assert result["instances_left_by_process"] == JOBS  # a triggerer stop keeps the leases
    assert result["instances_live_at_end"] == 0
    assert result["processes_started"] >= 1 and result["processes_alive_at_end"] == 0
    return result


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_bench_runs_one_triggerer_over_deferred_rows_and_cleans_up(tmp_path):
    result = _run(tmp_path, "ec2")
    assert result["ids_described_per_poll"] == JOBS  # every lease, each poll
    assert result["ec2_describe_calls_per_poll"] == 1.0  # in one DescribeInstances


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_bench_runs_one_triggerer_on_the_local_cloud_and_cleans_up(tmp_path):
    result = _run(tmp_path, "local")
    assert result["describe_calls_per_poll"] == 1.0  # every lease in one describe
    assert result["calls_per_poll"] == 1.0  # and nothing else
