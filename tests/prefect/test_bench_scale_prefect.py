"""The Prefect part of ``make bench-scale`` end to end at a tiny scale: a real Prefect
server, moto, a ``spot`` work pool on EC2 and one ``prefect worker start`` process; the
worker launches a lease per flow run, all of them are described in one call per poll, and
at the end no instance and no process the bench started is left running. About 60-80 s
on a loaded 2-core machine (a Prefect server, moto and a worker start and stop): `slow`,
run with ``-m slow``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RUNS = 3


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_watches_every_flow_run_in_one_describe_per_poll_and_cleans_up(tmp_path):
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "home")}
    env.pop("PREFECT_API_URL", None)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.scale_prefect",
            "--runs",
            str(RUNS),
            "--seconds",
            "5",
            "--poll-interval",
            "1",
            "--idle-seconds",
            "0",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout)["prefect_worker_ec2_moto"]
    assert result["leased_runs"] == RUNS and result["runs_ended_unlaunched"] == 0
    assert result["live_instances_in_window"] == RUNS
    assert result["polls"] >= 2
    assert result["ids_described_per_poll"] == RUNS  # every lease, each poll
    assert result["ec2_describe_calls_per_poll"] == 1.0  # in one DescribeInstances
    assert result["cpu_s"] > 0 and result["cpu_s_per_job_hour"] > 0
    assert result["instances_live_at_end"] == 0
    assert result["processes_started"] >= 3 and result["processes_alive_at_end"] == 0
