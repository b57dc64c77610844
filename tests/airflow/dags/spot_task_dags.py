"""Test DAGs for ``@task.spot``; parameters come from the environment the tests set.

``SPOT_TEST_DIR`` holds the checkpoint store (``ckpt-<dag>``) and the progress file the
tests watch; ``SPOT_TEST_METADATA_URL`` is the metadata emulator serving notices.
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


def _crunch(dag_id: str, checkpointer, restored, ti, kill_at: int | None):
    progress = TEST_DIR / f"progress-{dag_id}"
    step = 0 if restored is None else int(restored[1]["step"].decode())
    start = step
    while step < STEPS:
        step += 1
        time.sleep(0.03)
        progress.write_text(f"{ti.try_number} {step}")
        checkpointer.maybe_save(step, lambda: {"step": str(step).encode()})
        if kill_at is not None and ti.try_number == 1 and step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)  # the node vanishes without a notice
    return {"start": start, "try": ti.try_number}


with DAG("spot_task_notice", schedule=None, start_date=datetime(2026, 1, 1), catchup=False):

    @task.spot(checkpoint_uri=(TEST_DIR / "ckpt-spot_task_notice").as_uri(), cloud="aws",
               metadata_endpoint=os.environ.get("SPOT_TEST_METADATA_URL", "http://127.0.0.1:9"),
               checkpoint_every_steps=10, notice_poll_interval=0.05, retries=2,
               retry_delay=timedelta(seconds=1))
    def crunch(checkpointer=None, restored=None, ti=None):
        return _crunch("spot_task_notice", checkpointer, restored, ti, kill_at=None)

    crunch()


with DAG("spot_task_budget", schedule=None, start_date=datetime(2026, 1, 1), catchup=False):

    @task.spot(checkpoint_uri=(TEST_DIR / "ckpt-spot_task_budget").as_uri(), cloud="aws",
               metadata_endpoint=os.environ.get("SPOT_TEST_METADATA_URL", "http://127.0.0.1:9"),
               checkpoint_every_steps=10, notice_poll_interval=0.05, max_preemptions=1,
               retries=1, retry_delay=timedelta(seconds=1))
    def crunch_budget(checkpointer=None, restored=None, ti=None):
        return _crunch("spot_task_budget", checkpointer, restored, ti, kill_at=None)

    crunch_budget()


with DAG("spot_task_sigkill", schedule=None, start_date=datetime(2026, 1, 1), catchup=False):

    @task.spot(checkpoint_uri=(TEST_DIR / "ckpt-spot_task_sigkill").as_uri(), cloud="signal",
               checkpoint_every_steps=10, notice_poll_interval=0.05, retries=2,
               retry_delay=timedelta(seconds=1))
    def crunch_killed(checkpointer=None, restored=None, ti=None):
        return _crunch("spot_task_sigkill", checkpointer, restored, ti, kill_at=37)

    crunch_killed()
