"""`spot-pipelines demo --json`: the main job end to end, as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.timeout(200)
def test_demo_pipeline_survives_real_trace_preemptions(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "spot_core.cli", "demo", "--json",
                           "--workdir", str(tmp_path)],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["engine"] == "none"
    assert report["preemptions"] >= 2
    assert report["fallbacks"] >= 1
    assert len(report["resumed_from_steps"]) >= 2 and report["resumed_from_steps"][0] > 0
    assert report["final_weights_sha256"] == report["uninterrupted_weights_sha256"]
    assert 0 < report["spot_cost"] < report["on_demand_cost"]
    assert 0 < report["savings_fraction"] < 1
    assert report["lost_work_seconds"] >= 0
    assert report["accuracy"] > 0.8
    assert "(equal)" in proc.stdout  # the human report shows the hashes side by side


def test_demo_rejects_unbuilt_engine_in_one_line():
    proc = subprocess.run([sys.executable, "-m", "spot_core.cli", "demo", "--engine", "airflow"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
