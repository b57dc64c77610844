"""``@task.spot`` under real Airflow: a notice reruns the task from its emergency checkpoint
without spending a try, within the preemption budget."""

from __future__ import annotations

import threading
import time
from datetime import datetime

import pytest

from spot_core.checkpoint import open_store
from spot_core.localcloud.metadata import MetadataEmulator


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
        with pytest.raises(ValueError, match="'relative/path' has no scheme; pass file:///"):
            task.spot(checkpoint_uri="relative/path")(step)()
        with pytest.raises(ValueError, match="cloud='ibm' is not one of auto, aws"):
            task.spot(checkpoint_uri="file:///x", cloud="ibm")(step)()
        with pytest.raises(ValueError, match="checkpoint_every=0 must be > 0s"):
            task.spot(checkpoint_uri="file:///x", checkpoint_every=0)(step)()
        with (
            pytest.warns(DeprecationWarning, match="checkpoint_every_seconds is deprecated"),
            pytest.raises(ValueError, match="checkpoint_every=0 must be > 0s"),
        ):
            task.spot(checkpoint_uri="file:///x", checkpoint_every_seconds=0)(step)()


def _run_with_notices(dag_id: str, at_steps: list[int], monkeypatch):
    """Run ``dag_id`` under dag.test() and serve an interruption notice once the step
    reaches each of ``at_steps``; returns (dag run, emergency checkpoint steps).

    The step holds at each of ``at_steps`` until its notice arrives
    (``SPOT_TEST_HOLD_AT_STEPS``), so the notice does not race the end of the loop however
    slowly this thread runs; the notice is withdrawn as soon as it has been served once,
    well before the rerun (1 s later at least) asks for it on "fresh capacity"."""
    from conftest import TEST_DIR, load_dag

    emulator = MetadataEmulator(clouds=("aws",)).start()
    monkeypatch.setenv("SPOT_TEST_METADATA_URL", emulator.url)
    monkeypatch.setenv("SPOT_TEST_HOLD_AT_STEPS", ",".join(map(str, at_steps)))
    store = open_store((TEST_DIR / f"ckpt-{dag_id}").as_uri())
    progress = TEST_DIR / f"progress-{dag_id}"
    emergency: list[int] = []

    def step() -> int:
        try:
            return int(progress.read_text().split()[1])
        except (OSError, IndexError, ValueError):  # not there yet, or caught mid-write
            return 0

    def preempt() -> None:
        for at in at_steps:
            _wait_for(lambda at=at: step() >= at, 120, f"step {at}")
            emulator.clear_log()
            emulator.schedule_interruption(notice_seconds=30)
            _wait_for(
                lambda: any(
                    r.path.endswith("/spot/instance-action") and r.status == 200
                    for r in emulator.requests
                ),
                60,
                f"the notice at step {at}",
            )
            emulator.clear()  # served once: the rerun runs on fresh capacity
            ref = _wait_for(
                lambda at=at: (
                    (r := store.latest()) and r.metadata.get("emergency") and r.step >= at and r
                ),
                60,
                "the emergency checkpoint",
            )
            emergency.append(ref.step)

    helper = threading.Thread(target=preempt, daemon=True)
    try:
        dag = load_dag(dag_id)
        helper.start()
        run = dag.test()
        helper.join(timeout=5)
    finally:
        emulator.stop()
    return run, emergency


def test_a_preemption_reruns_from_the_emergency_checkpoint_without_spending_a_try(
    airflow_home, monkeypatch
):
    run, emergency = _run_with_notices("spot_task_notice", [25], monkeypatch)
    (ti,) = run.get_task_instances()
    assert run.state == "success"
    assert ti.try_number == 1, "the preemption spent an Airflow try"
    assert emergency == [25], "the step held at 25 until the notice stopped it there"
    result = ti.xcom_pull(task_ids="crunch", key="return_value")
    assert result == {"start": emergency[0], "try": 1}
    summary = ti.xcom_pull(task_ids="crunch", key="spot_task_record")
    assert summary["preemptions"] == 1 and summary["attempts"] == 2
    assert summary["user_failures"] == 0 and summary["resumed_from_steps"] == [emergency[0]]


def test_max_preemptions_bounds_the_free_reruns(airflow_home, monkeypatch):
    """Within the budget a preemption keeps the try; past it, Airflow's retries apply."""
    run, emergency = _run_with_notices("spot_task_budget", [25, 50], monkeypatch)
    (ti,) = run.get_task_instances()
    assert run.state == "success" and emergency == [25, 50]
    assert ti.try_number == 2, "only the preemption past max_preemptions=1 spends a try"
    assert ti.xcom_pull(task_ids="crunch_budget", key="return_value") == {
        "start": emergency[1],
        "try": 2,
    }
    summary = ti.xcom_pull(task_ids="crunch_budget", key="spot_task_record")
    assert summary["preemptions"] == 2 and summary["resumed_from_steps"] == emergency


# SIGKILL of the task process needs a real supervisor and executor: see
# test_standalone.py::test_sigkilled_task_spot_resumes_from_the_last_periodic_checkpoint.
