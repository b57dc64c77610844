"""One real Prefect server (SQLite, in a temp folder) for the whole session, and one on
PostgreSQL as in production for the worker's end-to-end tests (test_worker.py,
test_worker_handover.py), also one for the whole session; moto in server mode and the AWS
and PostgreSQL helpers and the Prefect processes of tests/support
(shared, not copied).

The tests that share a server keep apart by name: each makes its own work pool
("spot-e2e", "spot-handover-cancel", ...), and the worker looks only at its pool's runs."""

from __future__ import annotations

import pytest

from tests.support.aws_helpers import aws_env, bucket, moto_server  # noqa: F401  (fixtures)
from tests.support.postgres_helpers import postgres_url  # noqa: F401  (pytest fixture)

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


@pytest.fixture(scope="session")
def prefect_postgres_server(postgres_url, tmp_path_factory):
    """`prefect server start` on a fresh PostgreSQL database (asyncpg), on a free port,
    started once for the session (it took about a minute per start on a loaded machine)
    and stopped (bounded) at the end; its API URL."""
    from tests.support.postgres_helpers import fresh_database, psql, with_driver
    from tests.support.prefect_stack import prefect_server

    home = tmp_path_factory.mktemp("prefect-postgres-home")
    with (
        fresh_database(postgres_url, "spot_prefect_server") as database,
        prefect_server(
            home, with_driver(database, "postgresql+asyncpg"), SERVER_START_TIMEOUT
        ) as api,
    ):
        assert "flow_run" in psql(database, "-c", "SELECT to_regclass('flow_run')")
        yield api


@pytest.fixture(scope="module")
def prefect_server_on_postgres(prefect_postgres_server):
    """The module's client settings point at the session's server on PostgreSQL (the
    settings only for the module: the other modules talk to the SQLite one)."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: prefect_postgres_server}):
        yield prefect_postgres_server
