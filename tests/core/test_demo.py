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


@pytest.mark.timeout(200)
def test_demo_on_kubernetes_spot_node_pools(tmp_path):
    """The same contract with the training step as pods on the Kubernetes emulator: two
    preemptions by two flavours' reclaims, a fallback to the on-demand node group, and the
    uninterrupted run's weights."""
    proc = subprocess.run([sys.executable, "-m", "spot_core.cli", "demo", "--provider",
                           "kubernetes", "--json", "--workdir", str(tmp_path)],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["preemptions"] >= 2 and report["fallbacks"] >= 1
    assert len(report["resumed_from_steps"]) >= 2 and report["resumed_from_steps"][0] > 0
    assert report["final_weights_sha256"] == report["uninterrupted_weights_sha256"]
    assert 0 < report["spot_cost"] < report["on_demand_cost"]
    # two different flavours took the node away: Karpenter's pool, then the EKS node group
    assert "us-east-1b m5.xlarge" in proc.stdout and "us-east-1a m5.xlarge" in proc.stdout
