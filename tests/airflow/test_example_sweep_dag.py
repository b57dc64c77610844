"""The sweep example DAG: Optuna trials as spot jobs on the local spot cloud, reclaimed on
the way; every trial finishes once, and the best value equals a plain study.optimize's."""

from __future__ import annotations

import os

import pytest
from test_example_batch_dag import pushed


@pytest.fixture(params=["sqlite", "postgresql"])
def storage(request):
    """The study's storage: SQLite in the work folder (the DAG's default), or a database
    of the deployment's PostgreSQL, as drivers on several workers would share it."""
    if request.param == "sqlite":
        yield ""
        return
    from tests.support.postgres_helpers import fresh_database, with_driver

    with fresh_database(request.getfixturevalue("postgres_url"), "sweep") as url:
        yield with_driver(url, "postgresql+psycopg2")


@pytest.mark.timeout(600)
def test_sweep_dag_trials_survive_reclaims(tmp_path, airflow_home, storage):
    import optuna
    from conftest import load_dag

    from airflow_spot.demo import cloud_server
    from spot_core.localcloud.server import client_environ
    from spot_core.sweeps.objectives import median_pruner, softmax_objective

    cloud = tmp_path / "cloud"
    with cloud_server(cloud, time_scale=3600.0, start_tick=450, start_on_first_client=True) as url:
        environ = client_environ(url, cloud)
        saved = {name: os.environ.get(name) for name in environ}
        os.environ.update(environ)
        try:
            run = load_dag("spot_sweep").test(
                run_conf={"workdir": str(tmp_path), "trials": 4, "seed": 3, "storage": storage}
            )
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
    tis = {(ti.task_id, ti.map_index): ti for ti in run.get_task_instances()}
    assert run.state == "success", {k: ti.state for k, ti in tis.items()}
    result = pushed(run, "best", "return_value")
    assert len(result["trials"]) == 4 and set(result["trials"]) <= {"COMPLETE", "PRUNED"}
    plain = optuna.create_study(
        sampler=optuna.samplers.TPESampler(seed=3, n_startup_trials=4), pruner=median_pruner()
    )
    plain.optimize(softmax_objective, n_trials=4)
    assert result["best_value"] == plain.best_value
    preempted = [list((tmp_path / "trials").glob("trial-*/checkpoints/*"))]
    assert preempted[0], "no trial checkpointed"
