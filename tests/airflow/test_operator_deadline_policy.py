"""SpotJobOperator with a deadline policy: the knobs reach the controller from a DAG, in
the settings' time convention, and a bad combination fails the DAG's import in one line.

The operator runs (as in the worker, ``deferrable=False``) on an in-process local cloud
replaying a hand-built trace (``spot_helpers.DEADLINE_ZONES``): greedy's plan waits for
zone a's spot instead of the safety net's immediate on-demand launch. Deferrable, it
runs as Airflow runs it across deferrals (its real ``SpotJobTrigger`` for the plan's
waits and for watching), on the same trace served by a local cloud server, so that the
trigger's provider sees the operator's leases.
"""

from __future__ import annotations

import time
from datetime import datetime

import pytest
from airflow.sdk import DAG

from airflow_spot.operators.spot import RECORD_KEY, SpotJobOperator
from spot_core.localcloud.server import LocalCloudServer
from spot_core.market.trace import load_traces
from spot_core.model import JobRecord
from tests.support.spot_helpers import (
    DEADLINE_KNOBS,
    DEADLINE_SCALE,
    check_greedy_record,
    deadline_traces,
    marked_processes,
    train_command,
)
from tests.support.task_context import TI, StateStore, drive_deferrals

pytestmark = pytest.mark.timeout(180)


def test_greedy_from_the_operator_waits_for_spot_and_meets_its_deadline(tmp_path, monkeypatch):
    monkeypatch.delenv("SPOT_LOCAL_CLOUD_URL", raising=False)  # this test's own cloud
    with DAG("deadline_policy", schedule=None, start_date=datetime(2026, 1, 1)):
        op = SpotJobOperator(
            task_id="train",
            command=list(train_command(steps=40, step_seconds=0.05, every_steps=10)),
            checkpoint_uri=(tmp_path / "ckpt").as_uri(),
            deferrable=False,
            provider_options={
                "traces": deadline_traces(tmp_path / "traces"),
                "time_scale": DEADLINE_SCALE,
                "workdir": str(tmp_path / "cloud"),
            },
            poll_interval=0.1,
            capacity_wait=0.5,
            **DEADLINE_KNOBS,
        )
    store = StateStore()
    try:
        summary = op.execute({"task_state_store": store, "ti": TI()})
    finally:
        op.spot_hook.get_provider().close()
    assert summary["status"] == "succeeded"
    check_greedy_record(JobRecord.from_dict(store.data[RECORD_KEY]))
    assert not marked_processes(str(tmp_path))


def test_greedy_deferrable_waits_in_the_trigger_and_meets_its_deadline(tmp_path, monkeypatch):
    monkeypatch.delenv("SPOT_LOCAL_CLOUD_URL", raising=False)  # this test's own cloud
    traces = load_traces(deadline_traces(tmp_path / "traces"))
    with LocalCloudServer.from_traces(
        traces, time_scale=DEADLINE_SCALE, workdir=tmp_path / "cloud"
    ) as server:
        with DAG("deadline_policy_deferrable", schedule=None, start_date=datetime(2026, 1, 1)):
            op = SpotJobOperator(
                task_id="train",
                command=list(train_command(steps=40, step_seconds=0.05, every_steps=10)),
                checkpoint_uri=(tmp_path / "ckpt").as_uri(),
                deferrable=True,
                provider_options={"url": server.url, "workdir": str(tmp_path / "cloud")},
                poll_interval=0.1,
                capacity_wait=0.5,
                **DEADLINE_KNOBS,
            )
        store = StateStore()
        summary = drive_deferrals(op, {"task_state_store": store, "ti": TI()}, max_deferrals=60)
    assert summary["status"] == "succeeded"
    check_greedy_record(JobRecord.from_dict(store.data[RECORD_KEY]))
    assert not marked_processes(str(tmp_path))


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"deadline_policy": "greedy", "work": "1h"}, "work=1h needs deadline=DURATION too"),
        (
            {"deadline_policy": "greedy", "deadline": "2h"},
            "deadline_policy='greedy' needs deadline and work",
        ),
        (
            {"deadline_policy": "psychic", "deadline": "2h", "work": "1h"},
            "deadline_policy='psychic' is not one of",
        ),
        ({"deadline": "tomorrow"}, "deadline='tomorrow' is neither a duration"),
    ],
)
def test_a_bad_combination_is_a_one_line_import_error(tmp_path, knobs, message):
    from airflow.dag_processing.dagbag import DagBag

    (tmp_path / "bad_deadline.py").write_text(
        "from datetime import datetime\n"
        "from airflow.sdk import DAG\n"
        "from airflow_spot.operators.spot import SpotJobOperator\n"
        "with DAG('bad', schedule=None, start_date=datetime(2026, 1, 1)):\n"
        f"    SpotJobOperator(task_id='t', command=['true'], checkpoint_uri='file:///c', "
        f"**{knobs!r})\n"
    )
    bag = DagBag(dag_folder=str(tmp_path))
    (error,) = bag.import_errors.values()
    assert f"ValueError: t: {message}" in error.splitlines()[-1], error


def test_the_pod_operator_takes_the_deadline_knobs():
    from airflow_spot.operators.kubernetes import SpotKubernetesPodOperator

    with DAG("deadline_pod", schedule=None, start_date=datetime(2026, 1, 1)):
        op = SpotKubernetesPodOperator(
            task_id="train",
            image="python:3.11",
            cmds=["python", "-m", "train"],
            checkpoint_uri="s3://ckpt/train",
            deadline=datetime(2026, 12, 1, 8),
            work="6h",
            deadline_policy="uniform-progress",
            total_steps=100,
        )
    assert op.settings.deadline_at.isoformat() == "2026-12-01T08:00:00+00:00"
    assert (op.settings.work_capacity_seconds, op.settings.deadline_policy) == (
        21600.0,
        "uniform-progress",
    )
    with pytest.raises(ValueError, match="^t: deadline_policy='greedy' needs deadline and work"):
        with DAG("deadline_pod_bad", schedule=None, start_date=datetime(2026, 1, 1)):
            SpotKubernetesPodOperator(
                task_id="t",
                image="python:3.11",
                cmds=["true"],
                checkpoint_uri="s3://ckpt/t",
                deadline_policy="greedy",
            )


@pytest.mark.parametrize("capacity_wait", ["60s", "1s"])
def test_a_wait_shorter_than_a_triggers_hold_is_waited_in_the_worker(
    tmp_path, monkeypatch, capacity_wait
):
    """A deferral's event is held ``MIN_DEFER_SECONDS`` (15 s), so a shorter wait (a
    deadline policy's wait for the next tick of a compressed trace) deferred would wake
    late: the worker waits it out; a long wait defers."""
    from airflow.sdk.exceptions import TaskDeferred

    from airflow_spot.operators.spot import SpotJobFailed
    from spot_core.controller import Next
    from tests.support.spot_helpers import write_trace

    monkeypatch.delenv("SPOT_LOCAL_CLOUD_URL", raising=False)
    trace = write_trace(tmp_path / "traces", "us-east-1a_v100_1", "0" * 40)  # no spot
    with DAG("short_wait", schedule=None, start_date=datetime(2026, 1, 1)):
        op = SpotJobOperator(
            task_id="train",
            command=["sleep", "30"],
            checkpoint_uri=(tmp_path / "c").as_uri(),
            deferrable=True,
            provider_options={
                "traces": [trace],
                "time_scale": 60.0,
                "workdir": str(tmp_path / "cloud"),
            },
            on_demand_fallback=False,
            capacity_wait=capacity_wait,
            max_capacity_waits=2,
            poll_interval=0.1,
        )
    context = {"task_state_store": StateStore(), "ti": TI()}
    try:
        if capacity_wait == "60s":
            with pytest.raises(TaskDeferred) as deferred:
                op.execute(context)
            assert Next.from_dict(deferred.value.trigger.next).action == "sleep"
        else:  # both 1 s waits in the worker, then the policy gives up: no deferral
            started = time.monotonic()
            with pytest.raises(SpotJobFailed, match="capacity"):
                op.execute(context)
            assert 1.5 < time.monotonic() - started < 14
    finally:
        op.spot_hook.get_provider().close()
    assert not marked_processes(str(tmp_path))
