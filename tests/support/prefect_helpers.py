"""What several Prefect test files share: a resumable task, and the worker end to end
(a work pool of type ``spot``, the example flow deployed to it, ``prefect worker start``
as a subprocess: tests/support/prefect_stack.py, which the scale bench uses too; waiting for the
flow run and reading the record the worker kept)."""

from __future__ import annotations

import os
import time

from prefect import task

from spot_core.localcloud.lease_processes import LEASE_MARKER
from spot_core.model import JobRecord
from tests.support.prefect_stack import (
    FLOWS,  # noqa: F401 - a fixture / shared name
    PREFECT,  # noqa: F401 - a fixture / shared name
    deploy_example_flow,  # noqa: F401  (shared)
    running_worker,  # noqa: F401 - a fixture / shared name
    wait_healthy,  # noqa: F401 - a fixture / shared name
)


@task
def count_to(total: int, pause: float, checkpointer=None) -> dict:
    """A resumable loop: its state is the step counter in the checkpoint."""
    start = 0 if checkpointer.restored is None else checkpointer.restored.step
    for step in range(start, total):
        time.sleep(pause)
        checkpointer.maybe_save(step + 1, lambda n=step + 1: {"n": str(n).encode()})
    return {"total": total, "started_at": start, "instance": os.environ.get(LEASE_MARKER)}


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
        if (record is not None and record.status.value != "running") or time.monotonic() > deadline:
            return record
        time.sleep(0.5)
