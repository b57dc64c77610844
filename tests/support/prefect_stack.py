"""A real Prefect stack as processes: ``prefect server start``, a ``spot`` work pool with
a deployment, and ``prefect worker start --type spot``.

Shared by the Prefect tests (tests/prefect: the worker end to end, the server on
PostgreSQL) and the scale bench (``bench/scale_prefect.py``), so that both start and stop
these processes the same, bounded way. Runs in the Prefect environment.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from spot_emulators.moto_server import free_port
from tests.support.process_helpers import stop_process

FLOWS = Path(__file__).resolve().parents[2] / "flows"
PREFECT = Path(sys.executable).with_name("prefect")
SERVER_START_TIMEOUT = 120.0
STOP_TIMEOUT = 30.0


def wait_healthy(api_url: str, server: subprocess.Popen, log_path: Path, timeout: float) -> None:
    """Until ``API/health`` answers (bounded); the server's log tail if it exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise AssertionError(log_path.read_text(errors="replace")[-3000:])
        try:
            with urllib.request.urlopen(f"{api_url}/health", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise AssertionError(
        f"the Prefect server at {api_url} was not healthy in {timeout} s: "
        + log_path.read_text(errors="replace")[-3000:]
    )


@contextmanager
def prefect_server(
    home: Path, database_url: str | None = None, timeout: float = SERVER_START_TIMEOUT
) -> Iterator[str]:
    """``prefect server start`` on a free port with its home in ``home`` (SQLite there, or
    ``database_url``, a ``postgresql+asyncpg://`` URL); yields its API URL and stops it
    (bounded) however the body ends."""
    home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_UI_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    if database_url:
        env["PREFECT_SERVER_DATABASE_CONNECTION_URL"] = database_url
    log_path = home / "server.log"
    with open(log_path, "wb") as log:
        server = subprocess.Popen(
            [str(PREFECT), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        api = f"http://127.0.0.1:{port}/api"
        wait_healthy(api, server, log_path, timeout)
        yield api
    finally:
        stop_process(server, session=True)


def deploy_example_flow(
    pool: str,
    name: str,
    job_variables: dict[str, Any],
    source: Path = FLOWS,
    entrypoint: str = "spot_ml_pipeline.py:spot_ml_pipeline_on_worker",
    base_job_template: dict[str, Any] | None = None,
):
    """A ``spot`` work pool (the worker's default template unless given) and a flow (the
    example flow unless told) deployed to it; the deployment id. Talks to the Prefect API
    of the current settings."""
    from prefect import flow, get_client
    from prefect.client.schemas.actions import WorkPoolCreate

    from prefect_spot.workers import SpotWorker

    with get_client(sync_client=True) as client:
        client.create_work_pool(
            WorkPoolCreate(
                name=pool,
                type="spot",
                base_job_template=base_job_template or SpotWorker.get_default_base_job_template(),
            ),
            overwrite=True,
        )
    deployable = flow.from_source(source=str(source), entrypoint=entrypoint)
    return deployable.deploy(
        name=name,
        work_pool_name=pool,
        job_variables=job_variables,
        build=False,
        push=False,
        print_next_steps=False,
    )


@contextmanager
def running_worker(
    pool: str,
    log_path: Path,
    *,
    limit: int = 2,
    env: dict[str, str] | None = None,
    stop_timeout: float = STOP_TIMEOUT,
) -> Iterator[subprocess.Popen]:
    """``prefect worker start --type spot`` on ``pool`` (at most ``limit`` flow runs at
    once), against the current settings' API; stopped on exit: SIGTERM, SIGKILL after
    ``stop_timeout``."""
    from prefect.settings import get_current_settings

    env = {
        **os.environ,
        "PREFECT_API_URL": get_current_settings().api.url,
        "PREFECT_WORKER_QUERY_SECONDS": "1",
        "PREFECT_WORKER_PREFETCH_SECONDS": "1",
        "PREFECT_LOGGING_LEVEL": "INFO",
        **(env or {}),
    }
    with open(log_path, "wb") as log:
        worker = subprocess.Popen(
            [
                str(PREFECT),
                "worker",
                "start",
                "--pool",
                pool,
                "--type",
                "spot",
                "--limit",
                str(limit),
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        yield worker
    finally:
        stop_process(worker, stop_timeout)
