"""One real Prefect server (SQLite, in a temp folder) for the whole session; moto in server
mode and the AWS helpers of tests/core (shared, not copied) for the EC2 tests."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

CORE_TESTS = str(Path(__file__).resolve().parents[1] / "core")
if CORE_TESTS not in sys.path:
    sys.path.append(CORE_TESTS)

from aws_helpers import aws_env, bucket, moto_server  # noqa: E402,F401  (pytest fixtures)


@pytest.fixture(scope="session")
def prefect_server():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture
def prefect_api(prefect_server):
    """Tests that talk to Prefect ask for this; the server starts once per session."""
    yield
