"""The sweep demo: an Optuna study whose trials run as spot jobs on the local spot cloud.

Eight trials of the softmax regression (learning rate, batch size; TPE with a fixed seed,
a median pruner), each a spot job under the controller on the local cloud replaying a
real AWS V100 trace; the study lives in SQLite (Optuna's RDB storage) with trial
heartbeats. A reclaim preempts a trial's job; the controller resumes the same job from
the trial's checkpoint, so the study sees the same trial finish, and the best value
equals a plain in-process ``study.optimize`` with the same seed.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from spot_core.controller import Controller, JobSpec, Listener
from spot_core.demo.pipeline import demo_policy
from spot_core.model import JobRecord
from spot_core.providers.local import LocalProvider
from spot_core.sweeps.objectives import (
    SEARCH_SPACE,
    STEP_SECONDS,
    median_pruner,
    softmax_objective,
)
from spot_core.sweeps.study import TrialJob, open_storage, optimize

OBJECTIVE = "spot_core.sweeps.objectives:softmax_objective"
PRUNER = "spot_core.sweeps.objectives:median_pruner"


@dataclass(frozen=True)
class SweepDemoConfig:
    trials: int = 8
    seed: int = 3
    step_seconds: float = 0.02  # simulated compute: about 2.4 s of training per trial
    time_scale: float = 3600.0
    start_tick: int = 450  # shortly before us-east-2a loses capacity
    max_preemptions: int = 2


@dataclass(frozen=True)
class SweepDemoReport:
    records: tuple[JobRecord, ...]
    trials_total: int
    trials_complete: int
    trials_pruned: int
    best_value: float
    uninterrupted_best_value: float
    best_params: dict[str, Any]
    storage: str

    def to_json(self) -> dict[str, object]:
        """The stable JSON of `spot-pipelines demo --workload sweep --json`."""
        return {
            "workload": "sweep",
            "trials_total": self.trials_total,
            "trials_complete": self.trials_complete,
            "trials_pruned": self.trials_pruned,
            "preemptions": sum(r.preemptions for r in self.records),
            "attempts": sum(len(r.attempts) for r in self.records),
            "spot_cost": sum(r.summary()["spot_cost"] for r in self.records),
            "on_demand_cost": sum(r.summary()["on_demand_cost"] for r in self.records),
            "best_value": self.best_value,
            "uninterrupted_best_value": self.uninterrupted_best_value,
            "best_params": self.best_params,
            "storage": self.storage,
        }


def new_study(
    cfg: SweepDemoConfig, storage: optuna.storages.BaseStorage | str | None, name: str
) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(
        study_name=name,
        storage=storage,
        sampler=optuna.samplers.TPESampler(seed=cfg.seed, n_startup_trials=4),
        pruner=median_pruner(),
        load_if_exists=True,
    )


def run_sweep_demo(
    workdir: Path, cfg: SweepDemoConfig = SweepDemoConfig(), listener: Listener | None = None
) -> SweepDemoReport:
    workdir.mkdir(parents=True, exist_ok=True)
    storage = open_storage(
        f"sqlite:///{(workdir / 'study.db').resolve()}", heartbeat_interval_seconds=2
    )
    study = new_study(cfg, storage, f"demo-sweep-{uuid.uuid4().hex[:6]}")
    records: list[JobRecord] = []
    with LocalProvider.from_traces(
        time_scale=cfg.time_scale, start_tick=cfg.start_tick, workdir=workdir / "cloud"
    ) as provider:
        controller = Controller(
            provider,
            provider.market,
            demo_policy(cfg.max_preemptions),
            listener=listener,
            poll_interval_seconds=0.1,
        )

        def run_job(job: TrialJob) -> JobRecord:
            spec = JobSpec(
                job_id=job.job_id,
                command=job.command,
                checkpoint_uri=job.checkpoint_uri,
                pools=provider.pools(),
                env={STEP_SECONDS: f"{cfg.step_seconds:g}"},
            )
            record = controller.run(spec)
            records.append(record)
            return record

        optimize(
            study,
            SEARCH_SPACE,
            n_trials=cfg.trials,
            objective=OBJECTIVE,
            checkpoint_root=(workdir / "trials").resolve().as_uri(),
            run_job=run_job,
            pruner=PRUNER,
        )
    reference = new_study(cfg, None, "uninterrupted")
    reference.optimize(softmax_objective, n_trials=cfg.trials)
    trials = study.get_trials(deepcopy=False)
    finished = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    return SweepDemoReport(
        tuple(records),
        trials_total=cfg.trials,
        trials_complete=len(finished),
        trials_pruned=sum(t.state is TrialState.PRUNED for t in trials),
        best_value=study.best_value,
        uninterrupted_best_value=reference.best_value,
        best_params=dict(study.best_params),
        storage="sqlite",
    )
