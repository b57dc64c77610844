"""Batch inference on spot through a durable work queue, for Prefect (the DAG's twin).

make_queue -> batch_worker.map over N workers (tagged ``spot``: each a spot job under
``SpotTaskRunner``, taking units of the same queue until none is left) -> queue_progress
(waits until every unit is done, keeping a progress artifact up to date, and leaves a
table of the queue's units).

A reclaimed worker is relaunched by the task runner as another attempt of the same spot
job (Prefect's retries untouched); its unit is released on the notice with its progress
checkpointed, or taken over by any worker once its claim's heartbeat lapses. A unit the
user's code keeps failing on spends that unit's retries, not the task's. docs/batch.md.
"""

from __future__ import annotations

import time
from pathlib import Path

from prefect import flow, task, unmapped
from prefect.artifacts import (
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)

from prefect_spot import SpotConfiguration, SpotTaskRunner, spot_record

# Where the run starts in the shipped real trace: us-east-2a loses capacity about 4 s in.
DEMO_SPOT = SpotConfiguration(
    provider_options={"start_tick": 450, "time_scale": 3600.0},
    max_preemptions=2,
    capacity_wait=0.5,
    poll_interval=0.1,
    max_capacity_waits=20,
    min_on_demand="365d",
)
WAIT_SECONDS = 300.0  # the final task's bound on waiting for the workers


@task
def make_queue(workdir: str, items: int, unit_size: int) -> str:
    from spot_core.workloads.batch import ItemRange, WorkQueue

    uri = (Path(workdir) / "queue").resolve().as_uri()
    WorkQueue.create(uri, ItemRange(0, items), unit_size=unit_size, claim_timeout_seconds=5.0)
    return uri


@task(name="batch-worker", tags=["spot"], retries=1)
def batch_worker(queue_uri: str, worker: int, item_seconds: float, checkpointer=None) -> dict:
    """One worker: units until none is left; a notice stops it (unit released, 143)."""
    import os

    from spot_core.workloads.batch import WorkQueue
    from spot_core.workloads.batch_inference import ITEM_SECONDS, infer
    from spot_core.workloads.batch_worker import Stop, run_worker

    os.environ[ITEM_SECONDS] = str(item_seconds)  # a simulated forward pass per item
    attempt = os.environ.get("SPOT_ATTEMPT", "1")
    stats = run_worker(
        WorkQueue.open(queue_uri),
        infer,
        worker_id=f"w{worker}.a{attempt}",
        stop=Stop.on_notice_of(checkpointer) if checkpointer is not None else None,
        checkpoint_every_items=5,
    )
    return stats.__dict__


@task
def queue_progress(queue_uri: str, _workers: list[dict]) -> dict:
    """Wait until every unit is done (bounded), with a live progress artifact."""
    from spot_core.workloads.batch import WorkQueue, outputs_sha256

    queue = WorkQueue.open(queue_uri)
    progress = queue.progress()
    artifact = create_progress_artifact(
        100.0 * progress.done / progress.total, description="units of the batch done"
    )
    deadline = time.monotonic() + WAIT_SECONDS
    while not progress.complete and time.monotonic() < deadline:
        time.sleep(1.0)
        progress = queue.progress()
        update_progress_artifact(artifact, 100.0 * progress.done / progress.total)
    update_progress_artifact(artifact, 100.0 * progress.done / progress.total)
    create_table_artifact([progress.to_json()], description=f"work queue {queue_uri}")
    if not progress.complete or progress.failed:
        raise RuntimeError(f"the queue is not finished cleanly: {progress.to_json()}")
    return {**progress.to_json(), "outputs_sha256": outputs_sha256(queue.outputs())}


@flow(name="spot-batch-inference", task_runner=SpotTaskRunner(DEMO_SPOT, spot_tag="spot"))
def spot_batch_inference(
    workdir: str,
    items: int = 300,
    unit_size: int = 10,
    workers: int = 3,
    item_seconds: float = 0.06,
) -> dict:
    queue = make_queue(workdir, items, unit_size)
    done = batch_worker.map(unmapped(queue), list(range(workers)), unmapped(item_seconds))
    progress = queue_progress(queue, done.result())
    records = [spot_record(future) for future in done]
    return {**progress, "preemptions": sum(r.preemptions for r in records if r is not None)}


if __name__ == "__main__":
    import tempfile

    print(spot_batch_inference(tempfile.mkdtemp(prefix="spot-batch-")))
