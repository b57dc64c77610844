"""An Optuna sweep on spot, for Prefect (the DAG's twin): each trial a spot job that
survives reclaims as the same trial.

make_study -> driver.map over N drivers of the same study (each runs Optuna trials as
spot jobs on the local spot cloud, recording each trial's heartbeat while it waits) ->
best. A reclaimed trial resumes from its checkpoint as the same trial; a dead driver's
trial is failed by Optuna's heartbeat and retried with the same parameters from its
checkpoint. SQLite by default; a ``postgresql+psycopg2://`` URL for drivers on several
machines (the Prefect server's PostgreSQL, its own database). docs/sweeps.md.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow, task, unmapped

OBJECTIVE = "spot_core.sweeps.objectives:softmax_objective"
PRUNER = "spot_core.sweeps.objectives:median_pruner"
SPOT = {
    "provider": "local",
    "max_preemptions": 2,
    "capacity_wait": 0.5,
    "max_capacity_waits": 20,
    "poll_interval": 0.1,
    "provider_options": {"start_tick": 450, "time_scale": 3600.0},
}


def _study(storage: str, name: str, seed: int):
    import optuna

    from spot_core.sweeps.objectives import median_pruner
    from spot_core.sweeps.study import open_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(
        study_name=name,
        storage=open_storage(storage, heartbeat_interval_seconds=5),
        sampler=optuna.samplers.TPESampler(seed=seed, n_startup_trials=4),
        pruner=median_pruner(),
        load_if_exists=True,
    )


@task
def make_study(storage: str, name: str, seed: int) -> str:
    return _study(storage, name, seed).study_name


@task
def driver(index: int, storage: str, name: str, seed: int, trials: int, workdir: str) -> list:
    from spot_core.settings import SpotSettings
    from spot_core.sweeps.objectives import SEARCH_SPACE, STEP_SECONDS
    from spot_core.sweeps.runner import spot_trials
    from spot_core.sweeps.study import optimize

    settings = SpotSettings.build(where=f"driver {index}", **SPOT)
    with spot_trials(settings, env={STEP_SECONDS: "0.02"}) as run_job:
        states = optimize(
            _study(storage, name, seed),
            SEARCH_SPACE,
            n_trials=trials,
            objective=OBJECTIVE,
            pruner=PRUNER,
            checkpoint_root=(Path(workdir) / "trials").resolve().as_uri(),
            run_job=run_job,
        )
    return [state.name for state in states]


@task
def best(storage: str, name: str, seed: int, _drivers: list) -> dict:
    study = _study(storage, name, seed)
    return {
        "best_value": study.best_value,
        "best_params": study.best_params,
        "trials": [t.state.name for t in study.get_trials(deepcopy=False)],
    }


@flow(name="spot-sweep")
def spot_sweep(
    workdir: str, storage: str = "", trials: int = 6, seed: int = 3, drivers: int = 2
) -> dict:
    storage = storage or f"sqlite:///{Path(workdir).resolve()}/study.db"
    Path(workdir).mkdir(parents=True, exist_ok=True)
    name = make_study(storage, "spot-sweep", seed)
    runs = driver.map(
        list(range(drivers)),
        unmapped(storage),
        unmapped(name),
        unmapped(seed),
        unmapped(trials),
        unmapped(workdir),
    )
    return best(storage, name, seed, runs.result())


if __name__ == "__main__":
    import tempfile

    print(spot_sweep(tempfile.mkdtemp(prefix="spot-sweep-")))
