"""`spot-pipelines demo --engine airflow` as a new user sees it (issue 50, item 7): no
deprecation note about the engine's own dependencies (starlette's TestClient on httpx),
and each pool alert logged once, not once per task that ended."""

from __future__ import annotations

import collections
import os
import re

import pytest

from tests.support.spot_helpers import run_engine_demo

pytestmark = pytest.mark.timeout(600)

ALERT = re.compile(r"spot pool alert: (\S+): .*\((alert_\w+)\)")


def test_the_airflow_demo_logs_each_alert_once_and_no_httpx_deprecation(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    _, out = run_engine_demo("airflow", tmp_path, env)
    assert "httpx" not in out and "Traceback" not in out, out[-3000:]
    alerts = collections.Counter(m.groups() for m in ALERT.finditer(out))
    assert all(n == 1 for n in alerts.values()), alerts
