"""One real Prefect server (SQLite, in a temp folder) for the whole session, and one on
PostgreSQL as in production for the worker's end-to-end tests (test_worker.py); moto in
server mode and the AWS and PostgreSQL helpers of tests/core, and the Prefect processes
of bench/prefect_stack.py (shared, not copied)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = str(Path(__file__).resolve().parents[2])  # bench/ (bench/prefect_stack.py)
CORE_TESTS = str(Path(__file__).resolve().parents[1] / "core")
for _path in (REPO, CORE_TESTS):
    if _path not in sys.path:
        sys.path.append(_path)

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
    from postgres_helpers import fresh_database, psql, with_driver
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from bench.prefect_stack import prefect_server

    home = tmp_path_factory.mktemp("prefect-postgres-home")
    with (
        fresh_database(postgres_url, "spot_prefect_server") as database,
        prefect_server(
            home, with_driver(database, "postgresql+asyncpg"), SERVER_START_TIMEOUT
        ) as api,
    ):
        assert "flow_run" in psql(database, "-c", "SELECT to_regclass('flow_run')")
        with temporary_settings(updates={PREFECT_API_URL: api}):
            yield api
