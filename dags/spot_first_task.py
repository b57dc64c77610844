"""A first spot task: train on the local spot cloud with checkpoints in object storage.

The DAG of the docker/ stack (docker/compose.yaml mounts this folder): one
SpotJobOperator whose step trains the example softmax regression, checkpointing to
``$SPOT_CHECKPOINT_ROOT`` (the stack's S3 bucket) and resuming there after a preemption,
while the triggerer watches the lease. The local cloud's URL is in
``$SPOT_LOCAL_CLOUD_URL``; its token is in the server's workdir,
``$SPOT_LOCAL_CLOUD_WORKDIR`` (a volume the stack shares).
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import DAG, Param

from airflow_spot.operators.spot import SpotJobOperator

CHECKPOINT_ROOT = os.environ.get("SPOT_CHECKPOINT_ROOT", "file:///tmp/spot-checkpoints")
CLOUD_WORKDIR = os.environ.get("SPOT_LOCAL_CLOUD_WORKDIR")

with DAG(
    dag_id="spot_first_task",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    doc_md=__doc__,
    tags=["spot", "example"],
    params={"steps": Param(400, type="integer", minimum=1)},
):
    SpotJobOperator(
        task_id="train",
        command=[
            "python",
            "-m",
            "spot_core.workloads.softmax_regression",
            "--steps",
            "{{ params.steps }}",
            "--step-seconds",
            "0.01",
            "--checkpoint-every-seconds",
            "1",
        ],
        checkpoint_uri=CHECKPOINT_ROOT + "/airflow/{{ dag.dag_id }}/{{ run_id }}",
        provider="local",
        provider_options={"workdir": CLOUD_WORKDIR} if CLOUD_WORKDIR else {},
        max_preemptions=2,
        attempt_timeout=timedelta(minutes=10),
        deferrable=True,
    )
