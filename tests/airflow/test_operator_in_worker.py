"""SpotJobOperator's non-deferrable loop against a real local cloud server.

The context holds what the Task SDK gives an operator (``task_context``).
"""

from __future__ import annotations

import sys
import time
from datetime import datetime

import pytest
from airflow.sdk import DAG

from airflow_spot.operators.spot import RECORD_KEY, SpotJobOperator, SpotUserStepFailed
from spot_core.model import JobRecord
from tests.support.task_context import TI, StateStore


def _operator(cloud_url, tmp_path, script: str) -> SpotJobOperator:
    with DAG("worker_mode", schedule=None, start_date=datetime(2026, 1, 1)):
        return SpotJobOperator(
            task_id="t",
            command=[sys.executable, "-c", script],
            checkpoint_uri=(tmp_path / "ckpt").as_uri(),
            provider_options={"url": cloud_url},
            deferrable=False,
            poll_interval=0.1,
            capacity_wait=0.5,
            on_demand_fallback=True,
        )


def test_non_deferrable_run_succeeds_and_keeps_the_record(cloud_url, tmp_path):
    store, ti = StateStore(), TI()
    op = _operator(cloud_url, tmp_path, "print('done')")
    summary = op.execute({"task_state_store": store, "ti": ti})
    assert summary["status"] == "succeeded" and summary["attempts"] >= 1
    record = JobRecord.from_dict(store.data[RECORD_KEY])
    assert record.attempts[-1].outcome == "succeeded"
    assert ti.xcom[RECORD_KEY]["status"] == "succeeded"
    assert ti.xcom["spot_checkpoint_link"].startswith("file://")


def test_user_failure_raises_and_the_next_try_resumes_the_same_record(cloud_url, tmp_path):
    store, ti = StateStore(), TI()
    flag = tmp_path / "fail-once"
    flag.write_text("x")
    # The step fails once, a second after it starts: an attempt launched into a notice (the
    # shared cloud replays a real trace from the session's start) is reclaimed before it
    # fails, so the failure is on the next attempt; it never exits 3 inside a notice,
    # which is read as the reclaim's doing (preempted), and the failure would be lost.
    script = (
        f"import os, sys, time; p = {str(flag)!r}; time.sleep(1.0)\n"
        "if os.path.exists(p):\n    os.remove(p); sys.exit(3)\n"
    )
    op = _operator(cloud_url, tmp_path, script)
    with pytest.raises(SpotUserStepFailed, match=r"own code failed on attempt \d+ \(exit code 3\)"):
        op.execute({"task_state_store": store, "ti": ti})
    first = JobRecord.from_dict(store.data[RECORD_KEY])
    assert first.user_failures == 1 and first.attempts[-1].outcome == "user_failed"
    assert all(a.outcome == "preempted" for a in first.attempts[:-1])
    summary = op.execute({"task_state_store": store, "ti": ti})  # Airflow's retry
    assert summary["status"] == "succeeded" and summary["user_failures"] == 1
    assert summary["job_id"] == first.job_id


def test_on_kill_terminates_the_running_lease(cloud_url, tmp_path):
    import threading

    store, ti = StateStore(), TI()
    op = _operator(cloud_url, tmp_path, "import time; time.sleep(60)")
    errors = []
    worker = threading.Thread(target=lambda: _run_catching(op, store, ti, errors), daemon=True)
    worker.start()
    deadline = time.monotonic() + 60
    while op._lease is None and time.monotonic() < deadline:
        time.sleep(0.05)
    lease = op._lease
    assert lease is not None
    op.on_kill()
    provider = op.hook.get_provider()
    assert provider.observe([lease])[lease.lease_id].ended
    worker.join(timeout=30)
    assert not worker.is_alive() and "killed" in str(errors[0])


def _run_catching(op, store, ti, errors):
    try:
        op.execute({"task_state_store": store, "ti": ti})
    except Exception as exc:  # noqa: BLE001 - the killed lease ends the job one way or another
        errors.append(exc)


def test_a_price_cap_reaches_the_policy_and_the_job_still_finishes(cloud_url, tmp_path):
    store, ti = StateStore(), TI()
    with DAG("worker_mode_cap", schedule=None, start_date=datetime(2026, 1, 1)):
        op = SpotJobOperator(
            task_id="t",
            command=[sys.executable, "-c", "print('done')"],
            checkpoint_uri=(tmp_path / "ckpt").as_uri(),
            provider_options={"url": cloud_url},
            deferrable=False,
            poll_interval=0.1,
            max_spot_price=0.01,  # below every trace price
            capacity_wait=0.5,
            max_capacity_waits=2,
        )
    assert op.policy.max_spot_price == 0.01
    summary = op.execute({"task_state_store": store, "ti": ti})
    record = JobRecord.from_dict(store.data[RECORD_KEY])
    assert summary["status"] == "succeeded"
    assert [str(a.pool.market) for a in record.attempts] == ["on-demand"], (
        "never spot above the cap"
    )


def test_a_new_try_reattaches_to_the_attempt_an_earlier_try_left_running(cloud_url, tmp_path):
    """A worker lost mid-attempt leaves the attempt (and its lease) in the record; the
    next try watches that lease to its end instead of launching another."""
    store, ti = StateStore(), TI()
    op = _operator(cloud_url, tmp_path, "import time; time.sleep(2)")
    context = {"task_state_store": store, "ti": ti}
    controller = op._controller(context)
    spec = op._job_spec(context, None)  # a new job, as a first try makes it
    record = controller.persist(controller.new_record(spec))
    left = controller.advance(spec, record)  # launched, then the worker vanished
    assert left.action == "watch"
    assert JobRecord.from_dict(store.data[RECORD_KEY]).current_attempt is not None
    summary = op.execute(context)
    record = JobRecord.from_dict(store.data[RECORD_KEY])
    first = record.attempts[0]
    assert summary["status"] == "succeeded", record.summary()
    assert first.lease_id == left.lease.lease_id and first.ended_at is not None, record.summary()
    # Reattached, not relaunched: a second attempt only after the first one ended (the
    # session's trace may preempt it), never a second launch beside a running one.
    assert all(a.started_at >= first.ended_at - 1.0 for a in record.attempts[1:]), record.attempts
