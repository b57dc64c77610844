"""One real Prefect server (SQLite, in a temp folder) for the whole session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def prefect_server():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture
def prefect_api(prefect_server):
    """Tests that talk to Prefect ask for this; the server starts once per session."""
    yield
