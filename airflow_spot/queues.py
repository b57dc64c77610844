"""Batch work queues in Airflow: where a run's queue is recorded, and its progress.

The task that creates a run's queue pushes its URI under ``WORK_QUEUE_KEY``
(``publish_queue``); the Spot tab of any task of that run then shows the queue's units
done, claimed, pending and failed, read live from the queue's store, and a final task
waits on ``wait_for_queue`` until every unit is done (docs/batch.md).
"""

from __future__ import annotations

import time
from typing import Any

from spot_core.workloads.batch import Progress, WorkQueue

WORK_QUEUE_KEY = "spot_work_queue"


def publish_queue(ti: Any, uri: str) -> None:
    """Record ``uri`` as this run's work queue (for the Spot tab and the final task)."""
    ti.xcom_push(key=WORK_QUEUE_KEY, value=uri)


def queue_progress(uri: str) -> dict[str, Any]:
    """The queue's progress as the Spot tab shows it; an unreachable store is a line."""
    try:
        return {"uri": uri, **WorkQueue.open(uri).progress().to_json()}
    except Exception as exc:  # noqa: BLE001 - a tab that cannot reach the store says so
        return {"uri": uri, "error": f"{type(exc).__name__}: {exc}"}


def wait_for_queue(uri: str, *, timeout_seconds: float, poll_seconds: float = 2.0) -> Progress:
    """Until every unit is done or failed (bounded: TimeoutError naming what is left)."""
    queue = WorkQueue.open(uri)
    deadline = time.monotonic() + timeout_seconds
    while True:
        progress = queue.progress()
        if progress.complete:
            return progress
        if time.monotonic() >= deadline:
            raise TimeoutError(
                f"the queue {uri} is not finished after {timeout_seconds:.0f}s: "
                f"{progress.to_json()}; are its workers running?"
            )
        time.sleep(poll_seconds)
