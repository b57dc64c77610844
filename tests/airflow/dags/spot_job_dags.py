"""Test DAG for ``SpotJobOperator`` kill safety; parameters come from the environment.

``spot_job_mark_failed`` runs a step that sleeps for ten minutes on the local spot cloud
(``SPOT_LOCAL_CLOUD_URL``), deferred to the triggerer; the test marks it failed and
checks that its lease is gone. The checkpoint store sits under ``SPOT_TEST_DIR`` in a
directory the lease's environment names, so the test finds its own lease processes.
"""

from __future__ import annotations

import os
import sys
from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG

from airflow_spot.operators.spot import SpotJobOperator

TEST_DIR = Path(os.environ.get("SPOT_TEST_DIR", "/tmp/spot-task-tests"))

with DAG("spot_job_mark_failed", schedule=None, start_date=datetime(2026, 1, 1), catchup=False):
    SpotJobOperator(
        task_id="long_step",
        command=[sys.executable, "-c", "import time; time.sleep(600)"],
        checkpoint_uri=(TEST_DIR / "ckpt-spot_job_mark_failed").as_uri(),
        provider="local",
        on_demand_fallback=True,
        capacity_wait=0.5,
        poll_interval=0.5,
        attempt_timeout=timedelta(minutes=15),
        deferrable=True,
        retries=0,
    )
