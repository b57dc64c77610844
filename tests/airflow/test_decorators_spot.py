"""``@task.spot`` under real Airflow: a notice leads to a retry from the emergency checkpoint."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta

import pytest

from spot_core.checkpoint import open_store
from spot_core.emulators.metadata import MetadataEmulator


def _wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def test_task_spot_is_registered_with_airflow():
    from airflow.sdk import task

    from airflow_spot.decorators.spot import spot_task

    assert task.spot is spot_task


def test_task_spot_rejects_bad_parameters_at_parse_time():
    from airflow.sdk import DAG, task

    def step():
        return 1

    with DAG("bad_spot_task", schedule=None, start_date=datetime(2026, 1, 1)):
        with pytest.raises(ValueError, match="must start with file:// or s3://"):
            task.spot(checkpoint_uri="relative/path")(step)()
        with pytest.raises(ValueError, match="cloud='ibm' is not one of auto, aws"):
            task.spot(checkpoint_uri="file:///x", cloud="ibm")(step)()
        with pytest.raises(ValueError, match="checkpoint_every=0 must be > 0s"):
            task.spot(checkpoint_uri="file:///x", checkpoint_every=0)(step)()
        with pytest.warns(DeprecationWarning, match="checkpoint_every_seconds is deprecated"), \
                pytest.raises(ValueError, match="checkpoint_every=0 must be > 0s"):
            task.spot(checkpoint_uri="file:///x", checkpoint_every_seconds=0)(step)()


def test_notice_mid_run_leads_to_a_retry_from_the_emergency_checkpoint(airflow_home,
                                                                       monkeypatch):
    from conftest import TEST_DIR, load_dag

    dag_id = "spot_task_notice"
    emulator = MetadataEmulator(clouds=("aws",)).start()
    monkeypatch.setenv("SPOT_TEST_METADATA_URL", emulator.url)
    store = open_store((TEST_DIR / f"ckpt-{dag_id}").as_uri())
    progress = TEST_DIR / f"progress-{dag_id}"
    emergency: list[int] = []

    def preempt_once() -> None:
        _wait_for(lambda: progress.exists() and progress.read_text().startswith("1 ")
                  and int(progress.read_text().split()[1]) >= 25, 120, "try 1 at step 25")
        emulator.schedule_interruption(notice_seconds=30)
        ref = _wait_for(lambda: (r := store.latest()) and r.metadata.get("emergency") and r,
                        60, "the emergency checkpoint")
        emergency.append(ref.step)
        emulator.clear()  # the retry runs on fresh capacity

    helper = threading.Thread(target=preempt_once, daemon=True)
    try:
        dag = load_dag(dag_id)
        helper.start()
        run = dag.test()
        helper.join(timeout=5)
    finally:
        emulator.stop()

    (ti,) = run.get_task_instances()
    assert run.state == "success" and ti.try_number == 2
    assert emergency and emergency[0] >= 25
    result = ti.xcom_pull(task_ids="crunch", key="return_value")
    assert result == {"start": emergency[0], "try": 2}
    summary = ti.xcom_pull(task_ids="crunch", key="spot_task_record")
    assert summary["preemptions"] == 1 and summary["attempts"] == 2
    assert summary["resumed_from_steps"] == [emergency[0]]


# SIGKILL of the task process needs a real supervisor and executor: see
# test_standalone.py::test_sigkilled_task_spot_resumes_from_the_last_periodic_checkpoint.
