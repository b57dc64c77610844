"""`spot-pipelines demo --engine airflow` as a new user sees it (issue 50, item 7): no
deprecation note about the engine's own dependencies (starlette's TestClient on httpx),
and each pool alert logged once, not once per task that ended."""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(600)

ALERT = re.compile(r"spot pool alert: (\S+): .*\((alert_\w+)\)")


def test_the_airflow_demo_logs_each_alert_once_and_no_httpx_deprecation(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    proc = subprocess.run(
        [sys.executable, "-m", "spot_core.cli", "demo", "--engine", "airflow", "--json"],
        capture_output=True,
        text=True,
        timeout=560,
        cwd=tmp_path,
        env=env,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["preemptions"] >= 1
    assert "httpx" not in out and "Traceback" not in out, out[-3000:]
    alerts = collections.Counter(m.groups() for m in ALERT.finditer(out))
    assert all(n == 1 for n in alerts.values()), alerts
