"""Test DAG for the trigger hold: one task that reports the hold a deferral of a spot
operator would get where it runs (test_defer_hold.py runs it under dag.test())."""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG, task

with DAG(
    "spot_defer_hold_in_process", schedule=None, start_date=datetime(2026, 1, 1), catchup=False
):

    @task
    def hold() -> float:
        from airflow_spot.operators.controller_driver import defer_hold_seconds

        return defer_hold_seconds()

    hold()
