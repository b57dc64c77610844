"""Test DAGs for ``@task.spot``; parameters come from the environment the tests set.

``SPOT_TEST_DIR`` holds the checkpoint store (``ckpt-<dag>``) and the progress file the
tests watch; ``SPOT_TEST_METADATA_URL`` is the metadata emulator serving notices;
``SPOT_TEST_HOLD_AT_STEPS`` (e.g. ``25,50``) are the steps at which the notice DAGs' step
waits for the test's notice, so that a notice never races the end of the loop on a
loaded machine.
"""

from __future__ import annotations

import os
import signal
import time
from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG, task

TEST_DIR = Path(os.environ.get("SPOT_TEST_DIR", "/tmp/spot-task-tests"))
STEPS = 80


def _hold_steps() -> set[int]:
    return {int(s) for s in os.environ.get("SPOT_TEST_HOLD_AT_STEPS", "").split(",") if s}


def _hold(checkpointer, step: int) -> None:
    """Stay at ``step`` until a notice stops the step (``maybe_save`` raises Preempted),
    for at most 60 s; after that the loop goes on and the test fails on its missing
    emergency checkpoint."""
    give_up = time.monotonic() + 60
    while time.monotonic() < give_up:
        checkpointer.maybe_save(step, lambda step=step: {"step": str(step).encode()})
        time.sleep(0.03)


def _crunch(
    dag_id: str,
    checkpointer,
    restored,
    ti,
    kill_at: int | None,
    hold_at: frozenset[int] = frozenset(),
):
    progress = TEST_DIR / f"progress-{dag_id}"
    step = 0 if restored is None else int(restored[1]["step"].decode())
    start = step
    while step < STEPS:
        step += 1
        time.sleep(0.03)
        progress.write_text(f"{ti.try_number} {step}")
        checkpointer.maybe_save(step, lambda step=step: {"step": str(step).encode()})
        if step in hold_at:
            _hold(checkpointer, step)
        if kill_at is not None and ti.try_number == 1 and step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)  # the node vanishes without a notice
    return {"start": start, "try": ti.try_number}


with DAG("spot_task_notice", schedule=None, start_date=datetime(2026, 1, 1), catchup=False):

    @task.spot(
        checkpoint_uri=(TEST_DIR / "ckpt-spot_task_notice").as_uri(),
        cloud="aws",
        metadata_endpoint=os.environ.get("SPOT_TEST_METADATA_URL", "http://127.0.0.1:9"),
        checkpoint_every_steps=10,
        notice_poll_interval=0.05,
        retries=2,
        retry_delay=timedelta(seconds=1),
    )
    def crunch(checkpointer=None, restored=None, ti=None):
        return _crunch(
            "spot_task_notice",
            checkpointer,
            restored,
            ti,
            kill_at=None,
            hold_at=frozenset(_hold_steps()),
        )

    crunch()


with DAG("spot_task_budget", schedule=None, start_date=datetime(2026, 1, 1), catchup=False):

    @task.spot(
        checkpoint_uri=(TEST_DIR / "ckpt-spot_task_budget").as_uri(),
        cloud="aws",
        metadata_endpoint=os.environ.get("SPOT_TEST_METADATA_URL", "http://127.0.0.1:9"),
        checkpoint_every_steps=10,
        notice_poll_interval=0.05,
        max_preemptions=1,
        retries=1,
        retry_delay=timedelta(seconds=1),
    )
    def crunch_budget(checkpointer=None, restored=None, ti=None):
        return _crunch(
            "spot_task_budget",
            checkpointer,
            restored,
            ti,
            kill_at=None,
            hold_at=frozenset(_hold_steps()),
        )

    crunch_budget()


with DAG("spot_task_sigkill", schedule=None, start_date=datetime(2026, 1, 1), catchup=False):

    @task.spot(
        checkpoint_uri=(TEST_DIR / "ckpt-spot_task_sigkill").as_uri(),
        cloud="signal",
        checkpoint_every_steps=10,
        notice_poll_interval=0.05,
        retries=2,
        retry_delay=timedelta(seconds=1),
    )
    def crunch_killed(checkpointer=None, restored=None, ti=None):
        return _crunch("spot_task_sigkill", checkpointer, restored, ti, kill_at=37)

    crunch_killed()


with DAG("spot_task_s3_conn", schedule=None, start_date=datetime(2026, 1, 1), catchup=False):
    # The store is S3 and its credentials come only from the AWS connection
    # (tests/airflow/test_connections.py sets both).
    @task.spot(
        checkpoint_uri=os.environ.get("SPOT_TEST_CONN_STORE", "s3://unset/store"),
        aws_conn_id="aws_spot",
        cloud="signal",
        checkpoint_every_steps=5,
    )
    def crunch_on_s3(checkpointer=None, restored=None):
        start = 0 if restored is None else restored[0]
        for step in range(start, 20):
            checkpointer.maybe_save(step + 1, lambda n=step + 1: {"step": str(n).encode()})
        return {"start": start}

    crunch_on_s3()
