"""What several Prefect test files share: a resumable task, and the worker end to end
(a work pool of type ``spot``, the example flow deployed to it, ``prefect worker start``
as a subprocess, waiting for the flow run and reading the record the worker kept)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from prefect import task

from spot_core.model import JobRecord
from spot_core.emulators.lease_processes import LEASE_MARKER

FLOWS = Path(__file__).resolve().parents[2] / "flows"
PREFECT = Path(sys.executable).with_name("prefect")


@task
def count_to(total: int, pause: float, checkpointer=None) -> dict:
    """A resumable loop: its state is the step counter in the checkpoint."""
    start = 0 if checkpointer.restored is None else checkpointer.restored.step
    for step in range(start, total):
        time.sleep(pause)
        checkpointer.maybe_save(step + 1, lambda: {"n": str(step + 1).encode()})
    return {"total": total, "started_at": start, "instance": os.environ.get(LEASE_MARKER)}


def deploy_example_flow(pool: str, name: str, job_variables: dict[str, Any],
                        source: Path = FLOWS,
                        entrypoint: str = "spot_ml_pipeline.py:spot_ml_pipeline_on_worker",
                        base_job_template: dict[str, Any] | None = None):
    """A ``spot`` work pool (the worker's default template unless given) and a flow (the
    example flow unless told) deployed to it; the deployment id."""
    from prefect import flow, get_client
    from prefect.client.schemas.actions import WorkPoolCreate

    from prefect_spot.workers import SpotWorker

    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(
            name=pool, type="spot",
            base_job_template=base_job_template or SpotWorker.get_default_base_job_template()),
            overwrite=True)
    deployable = flow.from_source(source=str(source), entrypoint=entrypoint)
    return deployable.deploy(name=name, work_pool_name=pool, job_variables=job_variables,
                         build=False, push=False, print_next_steps=False)


@contextmanager
def running_worker(pool: str, log_path: Path) -> Iterator[subprocess.Popen]:
    """``prefect worker start --type spot`` on ``pool``, stopped (bounded) on exit."""
    from prefect.settings import get_current_settings

    env = {**os.environ, "PREFECT_API_URL": get_current_settings().api.url,
           "PREFECT_WORKER_QUERY_SECONDS": "1", "PREFECT_WORKER_PREFETCH_SECONDS": "1",
           "PREFECT_LOGGING_LEVEL": "INFO"}
    with open(log_path, "wb") as log:
        worker = subprocess.Popen([str(PREFECT), "worker", "start", "--pool", pool, "--type",
                                   "spot", "--limit", "2"], env=env, stdout=log,
                                  stderr=subprocess.STDOUT, start_new_session=True)
        try:
            yield worker
        finally:
            worker.terminate()
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait(timeout=10)


def wait_healthy(api_url: str, server: subprocess.Popen, log_path: Path,
                 timeout: float) -> None:
    """Until ``API/health`` answers (bounded); the server's log tail if it exits first."""
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert server.poll() is None, log_path.read_text(errors="replace")[-3000:]
        try:
            with urllib.request.urlopen(f"{api_url}/health", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise AssertionError(f"the Prefect server at {api_url} was not healthy in {timeout} s: "
                         + log_path.read_text(errors="replace")[-3000:])


def wait_completed(client, flow_run_id, timeout: float):
    """The flow run once Completed (a Crashed state on the way may still be rescheduled
    by the worker), or as it is at the timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = client.read_flow_run(flow_run_id)
        if run.state is not None and run.state.is_completed():
            return run
        time.sleep(1)
    return client.read_flow_run(flow_run_id)


def final_record(flow_run_id, timeout: float = 60) -> JobRecord:
    """The record the worker keeps in a keyed artifact, once the job has ended."""
    from prefect_spot.artifacts import load_record, record_key

    deadline = time.monotonic() + timeout
    while True:
        record = load_record(record_key(flow_run_id))
        if (record is not None and record.status.value != "running") \
                or time.monotonic() > deadline:
            return record
        time.sleep(0.5)
