"""End to end under ``airflow standalone`` (api-server, scheduler, dag-processor, triggerer).

The standalone Airflow is the session's (``standalone_server.py``, shared with the Spot
UI's tests): its own AIRFLOW_HOME on PostgreSQL, bound to 127.0.0.1 on free ports, with its
own local cloud server. Tests trigger DAG runs with the CLI and read the outcome from the
metadata database in a subprocess (the test process's own Airflow points at the
session's other AIRFLOW_HOME).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from tests.support.standalone_server import BIN, Standalone

# Standalone start-up, parsing and two DAG runs take minutes on a busy machine.
pytestmark = pytest.mark.timeout(900)


def test_pipeline_survives_a_triggerer_restart_mid_training(standalone, runs):
    from spot_core.checkpoint import open_store

    dag_id = "spot_ml_pipeline"
    work = Path(standalone.env["SPOT_PIPELINE_WORKDIR"])
    run_id = runs[dag_id]
    runs = work / "runs"
    # Kill the triggerer while it watches the lease: past step 100 and deferred at the same
    # moment. Between attempts (after a preemption) the task is briefly running again, so
    # the two are awaited together rather than the state asserted once at step 100.
    deadline = time.monotonic() + 240
    step_at_kill, step, ti = None, 0, None
    while time.monotonic() < deadline and step_at_kill is None:
        refs = [open_store(d.as_uri()).latest() for d in runs.glob("*/checkpoints/train")]
        step = max((ref.step for ref in refs if ref is not None), default=0)
        if step >= 100:
            ti = standalone.state(dag_id)["tis"].get("train:-1")
            if ti is not None and ti[0] == "deferred":
                step_at_kill = step
                break
        time.sleep(0.5)
    assert step_at_kill is not None, f"train never deferred past step 100 (step {step}, {ti})"

    pids = standalone.triggerer_pids()
    assert pids, "no triggerer process found"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)  # our own standalone's triggerer, by pid
    time.sleep(5)  # training goes on on its lease while no triggerer watches it
    standalone.extra.append(
        subprocess.Popen(
            [str(BIN / "airflow"), "triggerer"],
            env=standalone.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    )

    state = standalone.wait_run(dag_id, run_id, timeout=400)
    assert state["runs"][run_id] == "success", state
    assert state["tis"]["train:-1"] == ["success", 1], "the restart cost an Airflow try"
    record = state["xcom"]["train:-1:spot_job_record"]
    record = json.loads(record) if isinstance(record, str) else record
    outcomes = [a["outcome"] for a in record["attempts"]]
    assert "infrastructure_failed" not in outcomes and outcomes[-1] == "succeeded"
    # No progress lost: no attempt after the restart went back before the step reached.
    later = [
        a
        for a in record["attempts"]
        if a["checkpoint_step_end"] is not None and a["checkpoint_step_end"] >= step_at_kill
    ]
    assert later, record
    starts = [a["checkpoint_step_start"] or 0 for a in record["attempts"]]
    assert starts == sorted(starts)
    report = json.loads(next(runs.glob("*/report.json")).read_text())["result"]
    assert report["final_weights_sha256"] == report["uninterrupted_weights_sha256"]


def test_sigkilled_task_spot_resumes_from_the_last_periodic_checkpoint(standalone, runs):
    """The task process dies without notice; the supervisor fails the try; the retry
    closes the lost attempt and resumes from the newest periodic checkpoint."""
    dag_id = "spot_task_sigkill"
    run_id = runs[dag_id]
    state = standalone.wait_run(dag_id, run_id, timeout=240)
    assert state["runs"][run_id] == "success", state
    assert state["tis"]["crunch_killed:-1"] == ["success", 2]
    result = state["xcom"]["crunch_killed:-1:return_value"]
    result = json.loads(result) if isinstance(result, str) else result
    assert result == {"start": 30, "try": 2}  # killed at step 37; saved every 10 steps
    summary = state["xcom"]["crunch_killed:-1:spot_task_record"]
    summary = json.loads(summary) if isinstance(summary, str) else summary
    assert summary["preemptions"] == 1 and summary["resumed_from_steps"] == [30]
    assert summary["lost_work_seconds"] > 0


def _api(standalone: Standalone, method: str, path: str, body: dict | None = None) -> dict:
    """One call to the standalone's REST API with the admin's token."""
    base = f"http://127.0.0.1:{standalone.port}"
    token = standalone.token()
    request = urllib.request.Request(
        f"{base}{path}",
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read() or b"{}")


def test_a_deferred_spot_task_marked_failed_leaves_no_lease(standalone):
    """Marking the deferred task failed cancels its trigger; the trigger stops the lease."""
    from conftest import TEST_DIR

    from tests.support.spot_helpers import marked_processes, wait_until

    dag_id, task_id = "spot_job_mark_failed", "long_step"
    mine = str(TEST_DIR / f"ckpt-{dag_id}")
    run_id = standalone.trigger(dag_id)
    assert wait_until(
        lambda: (
            standalone.state(dag_id)["tis"].get(f"{task_id}:-1", [None])[0] == "deferred"
            and marked_processes(mine)
        ),
        timeout=240,
        interval=2,
    ), f"the task never deferred with a running lease: {standalone.state(dag_id)}"
    _api(
        standalone,
        "PATCH",
        f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}",
        {"new_state": "failed"},
    )
    assert wait_until(lambda: not marked_processes(mine), timeout=90, interval=1), (
        "the lease of the task marked failed is still running"
    )
    assert standalone.state(dag_id)["tis"][f"{task_id}:-1"][0] == "failed"
