"""`spot-pipelines demo --engine prefect` as a new user sees it (issue 50, item 7): the
demo's throwaway server says nothing of Prefect's own telemetry (a "database is locked"
traceback on a busy SQLite file, a "Failed to send telemetry" error offline)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(600)


def test_the_prefect_demo_prints_no_telemetry_error_or_traceback(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "DO_NOT_TRACK"))}
    env["PREFECT_HOME"] = str(tmp_path / "home")
    proc = subprocess.run(
        [sys.executable, "-m", "spot_core.cli", "demo", "--engine", "prefect", "--json"],
        capture_output=True,
        text=True,
        timeout=560,
        cwd=tmp_path,
        env=env,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["preemptions"] >= 1
    assert "telemetry" not in out.lower(), out[-3000:]
    assert "Traceback" not in out and "database is locked" not in out, out[-3000:]
