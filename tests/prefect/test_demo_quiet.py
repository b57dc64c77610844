"""`spot-pipelines demo --engine prefect` as a new user sees it (issue 50, item 7): the
demo's throwaway server says nothing of Prefect's own telemetry (a "database is locked"
traceback on a busy SQLite file, a "Failed to send telemetry" error offline)."""

from __future__ import annotations

import os

import pytest

from tests.support.spot_helpers import run_engine_demo

pytestmark = pytest.mark.timeout(600)


def test_the_prefect_demo_prints_no_telemetry_error_or_traceback(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "DO_NOT_TRACK"))}
    env["PREFECT_HOME"] = str(tmp_path / "home")
    _, out = run_engine_demo("prefect", tmp_path, env)
    assert "telemetry" not in out.lower(), out[-3000:]
    assert "Traceback" not in out and "database is locked" not in out, out[-3000:]
