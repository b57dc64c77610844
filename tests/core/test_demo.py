"""`spot-pipelines demo --json`: the main job end to end, as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys


def test_demo_survives_interruption_with_identical_weights(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "spot_core.cli", "demo", "--json",
                           "--workdir", str(tmp_path)],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["preemptions"] >= 1
    assert report["attempts"] == report["preemptions"] + 1
    assert report["resumed_from_steps"] and report["resumed_from_steps"][0] > 0
    assert report["final_weights_sha256"] == report["uninterrupted_weights_sha256"]
    assert report["accuracy"] > 0.8


def test_demo_rejects_unbuilt_engine_in_one_line():
    proc = subprocess.run([sys.executable, "-m", "spot_core.cli", "demo", "--engine", "airflow"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
