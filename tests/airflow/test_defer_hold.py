"""A deferring spot task holds its trigger's event 15 s only where an executor can report
the deferral late: not under dag.test(), which runs the task and then its trigger in one
process (the Airflow demo and the example DAG's tests would wait 15 s per deferral)."""

from __future__ import annotations

from airflow_spot.operators.controller_driver import MIN_DEFER_SECONDS, defer_hold_seconds


def test_a_task_under_dag_test_defers_without_a_hold(airflow_home):
    from conftest import load_dag

    run = load_dag("spot_defer_hold_in_process").test()
    assert run.state == "success"
    (ti,) = run.get_task_instances()
    assert ti.xcom_pull(task_ids="hold") == 0.0


def test_outside_the_in_process_supervisor_the_hold_stays():
    assert defer_hold_seconds() == MIN_DEFER_SECONDS == 15.0
