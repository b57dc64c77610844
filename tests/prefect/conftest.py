"""One real Prefect server (SQLite, in a temp folder) for the whole session, and one on
PostgreSQL as in production for the worker's end-to-end tests (test_worker.py); moto in
server mode and the AWS and PostgreSQL helpers of tests/core (shared, not copied)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

CORE_TESTS = str(Path(__file__).resolve().parents[1] / "core")
if CORE_TESTS not in sys.path:
    sys.path.append(CORE_TESTS)

from aws_helpers import aws_env, bucket, moto_server  # noqa: E402,F401  (pytest fixtures)
from postgres_helpers import postgres_url  # noqa: E402,F401  (pytest fixture)

SERVER_START_TIMEOUT = 120


@pytest.fixture(scope="session")
def prefect_server():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture
def prefect_api(prefect_server):
    """Tests that talk to Prefect ask for this; the server starts once per session."""
    yield


@pytest.fixture(scope="module")
def prefect_server_on_postgres(postgres_url, tmp_path_factory):
    """`prefect server start` on a fresh PostgreSQL database (asyncpg), on a free port;
    the module's client settings point at it, and it is stopped (bounded) at the end."""
    import os
    import subprocess

    from postgres_helpers import free_port, fresh_database, psql, with_driver
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect_helpers import PREFECT, wait_healthy

    home = tmp_path_factory.mktemp("prefect-postgres-home")
    port = free_port()
    with fresh_database(postgres_url, "spot_prefect_server") as database:
        env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_UI_ENABLED": "false",
               "PREFECT_SERVER_DATABASE_CONNECTION_URL": with_driver(database,
                                                                     "postgresql+asyncpg")}
        env.pop("PREFECT_API_URL", None)
        with open(home / "server.log", "wb") as log:
            server = subprocess.Popen([str(PREFECT), "server", "start", "--host", "127.0.0.1",
                                       "--port", str(port)], env=env, stdout=log,
                                      stderr=subprocess.STDOUT, start_new_session=True)
            try:
                api = f"http://127.0.0.1:{port}/api"
                wait_healthy(api, server, home / "server.log", SERVER_START_TIMEOUT)
                assert "flow_run" in psql(database, "-c", "SELECT to_regclass('flow_run')")
                with temporary_settings(updates={PREFECT_API_URL: api}):
                    yield api
            finally:
                server.terminate()
                try:
                    server.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    server.kill()
                    server.wait(timeout=10)
