"""Batch inference on spot through a durable work queue: nothing lost, nothing repeated.

make_queue -> workers (SpotJobOperator mapped over N workers of the same queue, each a
spot job that takes units until none is left) -> queue_progress (waits until every unit
is done, then pushes the queue's progress and the result's digest to XCom).

A reclaimed worker is resumed by its operator as another attempt of the same spot job;
the unit it held is released on the notice (its progress checkpointed) or, if the lease
vanished, taken over by any worker once its claim's heartbeat lapses. Airflow retries are
spent only by the workers' own code failing; a unit's failures spend that unit's retries
(``max_unit_retries``), not the task's. See docs/batch.md.

The local cloud is a server (``SPOT_LOCAL_CLOUD_URL``, ``SPOT_LOCAL_CLOUD_TOKEN``) and
``SPOT_PIPELINE_WORKDIR`` is where the queue goes (an ``s3://`` URI works the same).
"""

from __future__ import annotations

import os
import sys
from datetime import datetime, timedelta

from airflow.sdk import DAG, Param, task

from airflow_spot.operators.spot import SpotJobOperator

WORKDIR = os.environ.get("SPOT_PIPELINE_WORKDIR", "/tmp/spot-batch-inference")
WORKERS = 3
QUEUE = "file://{{ params.workdir }}/runs/{{ run_id | pathsafe }}/queue"
WORKER = [
    sys.executable,
    "-m",
    "spot_core.workloads.batch_worker",
    "--queue",
    QUEUE,
    "--function",
    "spot_core.workloads.batch_inference:infer",
    "--checkpoint-every-items",
    "5",
]


def _pathsafe(text: str) -> str:
    import re

    return re.sub(r"[^A-Za-z0-9_.-]+", "-", str(text)).strip("-")


with DAG(
    dag_id="spot_batch_inference",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    doc_md=__doc__,
    tags=["spot", "ml", "example", "batch"],
    user_defined_filters={"pathsafe": _pathsafe},
    params={
        "workdir": Param(WORKDIR, type="string"),
        "items": Param(300, type="integer", minimum=1),
        "unit_size": Param(10, type="integer", minimum=1),
    },
    default_args={"retries": 1, "retry_delay": timedelta(seconds=2)},
):

    @task
    def make_queue(params=None, run_id=None, ti=None) -> str:
        from airflow_spot.queues import publish_queue
        from spot_core.workloads.batch import ItemRange, WorkQueue

        uri = f"file://{params['workdir']}/runs/{_pathsafe(run_id)}/queue"
        WorkQueue.create(
            uri,
            ItemRange(0, params["items"]),
            unit_size=params["unit_size"],
            claim_timeout_seconds=5.0,
        )
        publish_queue(ti, uri)  # the Spot tab of every task of this run shows its progress
        return uri

    workers = SpotJobOperator.partial(
        task_id="workers",
        checkpoint_uri="file://{{ params.workdir }}/runs/{{ run_id | pathsafe }}/workers/"
        "{{ ti.map_index }}",
        command=WORKER,
        provider="local",
        max_preemptions=2,
        capacity_wait=0.5,
        max_capacity_waits=20,
        poll_interval=0.2,
        attempt_timeout=timedelta(minutes=10),
        deferrable=True,
    ).expand(env=[{"SPOT_BATCH_ITEM_SECONDS": "0.02", "WORKER": str(i)} for i in range(WORKERS)])

    @task(retries=0, execution_timeout=timedelta(minutes=5))
    def queue_progress(queue_uri: str) -> dict:
        """The final task: waits until every unit is done (or failed for good)."""
        from airflow_spot.queues import wait_for_queue
        from spot_core.workloads.batch import WorkQueue, outputs_sha256

        progress = wait_for_queue(queue_uri, timeout_seconds=240)
        if progress.failed:
            raise RuntimeError(f"{progress.failed} unit(s) failed for good: {progress.to_json()}")
        outputs = WorkQueue.open(queue_uri).outputs()
        return {**progress.to_json(), "outputs_sha256": outputs_sha256(outputs)}

    queue = make_queue()
    queue >> workers >> queue_progress(queue)
