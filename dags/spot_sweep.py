"""An Optuna sweep on spot: each trial a spot job that survives reclaims as the same trial.

make_study -> drivers (a task mapped over N drivers of the same study; each asks Optuna
for trials and runs every one as a spot job on the local spot cloud, recording the
trial's heartbeat while it waits) -> best (the study's best trial to XCom).

A reclaim is another attempt of the trial's spot job, resumed from the trial's
checkpoint (keyed by trial number), so the study sees the same trial finish. A driver
that dies (its worker lost) stops the trial's heartbeat; the next driver fails it after
the grace period and Optuna's stale-trial retry callback enqueues it again with the same
parameters, resuming from its checkpoint. The study lives in Optuna's RDB storage: SQLite
in the work folder by default; give ``storage`` a ``postgresql+psycopg2://`` URL (the
deployment's PostgreSQL, its own database) for drivers on several workers. docs/sweeps.md.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import DAG, Param, task

WORKDIR = os.environ.get("SPOT_PIPELINE_WORKDIR", "/tmp/spot-sweep")
DRIVERS = 2
SPOT = {
    "provider": "local",
    "max_preemptions": 2,
    "capacity_wait": 0.5,
    "max_capacity_waits": 20,
    "poll_interval": 0.1,
}
OBJECTIVE = "spot_core.sweeps.objectives:softmax_objective"
PRUNER = "spot_core.sweeps.objectives:median_pruner"


def _study(params: dict, run_id: str):
    import re

    import optuna

    from spot_core.sweeps.objectives import median_pruner
    from spot_core.sweeps.study import open_storage

    storage = params["storage"] or f"sqlite:///{params['workdir']}/study.db"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(
        study_name=re.sub(r"[^A-Za-z0-9_.-]+", "-", f"spot-sweep-{run_id}"),
        storage=open_storage(storage, heartbeat_interval_seconds=5),
        sampler=optuna.samplers.TPESampler(seed=params["seed"], n_startup_trials=4),
        pruner=median_pruner(),
        load_if_exists=True,
    )


with DAG(
    dag_id="spot_sweep",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    doc_md=__doc__,
    tags=["spot", "ml", "example", "sweep"],
    params={
        "workdir": Param(WORKDIR, type="string"),
        "storage": Param("", type="string", description="Optuna RDB URL; empty: SQLite"),
        "trials": Param(6, type="integer", minimum=1),
        "seed": Param(3, type="integer"),
        "step_seconds": Param(0.02, type="number"),
    },
    default_args={"retries": 1, "retry_delay": timedelta(seconds=2)},
):

    @task
    def make_study(params=None, run_id=None) -> str:
        os.makedirs(params["workdir"], exist_ok=True)
        return _study(params, run_id).study_name

    @task(execution_timeout=timedelta(minutes=20))
    def driver(index: int, params=None, run_id=None) -> list[str]:
        from spot_core.settings import SpotSettings
        from spot_core.sweeps.objectives import SEARCH_SPACE, STEP_SECONDS
        from spot_core.sweeps.runner import spot_trials
        from spot_core.sweeps.study import optimize

        settings = SpotSettings.build(where=f"driver {index}", **SPOT)
        env = {STEP_SECONDS: str(params["step_seconds"])}
        with spot_trials(settings, env=env) as run_job:
            states = optimize(
                _study(params, run_id),
                SEARCH_SPACE,
                n_trials=params["trials"],
                objective=OBJECTIVE,
                pruner=PRUNER,
                checkpoint_root=f"file://{params['workdir']}/trials",
                run_job=run_job,
            )
        return [state.name for state in states]

    @task
    def best(_drivers: list, params=None, run_id=None) -> dict:
        study = _study(params, run_id)
        return {
            "best_value": study.best_value,
            "best_params": study.best_params,
            "trials": [t.state.name for t in study.get_trials(deepcopy=False)],
        }

    name = make_study()
    name >> best(driver.expand(index=list(range(DRIVERS))))
