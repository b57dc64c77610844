"""Optuna sweeps on spot: a preempted trial resumes from its checkpoint as the same trial
(the study's trials, parameters and best value equal a plain ``study.optimize`` with the
same seed), on SQLite and on PostgreSQL; a trial whose driver died is failed by Optuna's
heartbeat and retried with the same parameters, resuming from the dead driver's
checkpoint; pruned trials are pruned as in plain Optuna.

Each trial's step is the real ``spot_core.sweeps.trial_step`` process; the tests' runner
plays the controller (attempt numbers, a SIGTERM notice once the trial has checkpointed),
so these run in seconds; the demo test runs the same sweep on the local spot cloud.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import optuna
import pytest
from optuna.trial import TrialState

from spot_core.attempt_env import PREEMPTED_EXIT_CODE, AttemptEnv
from spot_core.checkpoint import open_store
from spot_core.model import JobRecord, JobStatus
from spot_core.sweeps.objectives import (
    SEARCH_SPACE,
    STEP_SECONDS,
    median_pruner,
    softmax_objective,
)
from spot_core.sweeps.study import TrialJob, open_storage, optimize
from tests.support.postgres_helpers import fresh_database, postgres_url, with_driver  # noqa: F401

pytestmark = pytest.mark.timeout(240)
OBJECTIVE = "spot_core.sweeps.objectives:softmax_objective"
PRUNER = "spot_core.sweeps.objectives:median_pruner"
TRIALS, SEED = 5, 11


def new_study(storage, name="s"):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(
        study_name=name,
        storage=storage,
        sampler=optuna.samplers.TPESampler(seed=SEED, n_startup_trials=2),
        pruner=median_pruner(),
        load_if_exists=True,
    )


class Runner:
    """Runs a trial's job as the controller would: attempt 1, and when ``preempt`` says
    so, a notice once the trial has a checkpoint, then attempt 2 resuming from it."""

    def __init__(self, preempt=lambda job: True) -> None:
        self.preempt, self.resumed_from = preempt, {}

    def attempt(self, job: TrialJob, number: int) -> subprocess.Popen:
        env = AttemptEnv(job.checkpoint_uri, job.job_id, number, None, None, None)
        return subprocess.Popen(
            job.command,
            env={
                **os.environ,
                **env.to_environ(),
                STEP_SECONDS: "0.01",
                "SPOT_CHECKPOINT_INTERVAL": "0.2",
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def __call__(self, job: TrialJob) -> JobRecord:
        store = open_store(job.checkpoint_uri)
        attempt = store.fence_level() + 1  # above every attempt the store has seen
        step = self.attempt(job, attempt)
        if self.preempt(job):
            deadline = time.monotonic() + 60
            while store.latest() is None and step.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            step.send_signal(signal.SIGTERM)
            out, err = step.communicate(timeout=60)
            if step.returncode == PREEMPTED_EXIT_CODE:
                self.resumed_from[job.trial_number] = store.latest().step
                step = self.attempt(job, attempt + 1)
        out, err = step.communicate(timeout=120)
        assert step.returncode == 0, err[-3000:]
        return JobRecord(job.job_id, time.time(), status=JobStatus.SUCCEEDED)


@pytest.fixture(params=["sqlite", "postgresql"])
def storage_url(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'study.db'}"
        return
    admin = request.getfixturevalue("postgres_url")
    with fresh_database(admin, "sweep") as url:
        yield with_driver(url, "postgresql+psycopg2")


def test_preempted_trials_resume_as_the_same_trials(storage_url, tmp_path):
    study = new_study(open_storage(storage_url, heartbeat_interval_seconds=2))
    runner = Runner()
    optimize(
        study,
        SEARCH_SPACE,
        n_trials=TRIALS,
        objective=OBJECTIVE,
        pruner=PRUNER,
        checkpoint_root=(tmp_path / "trials").as_uri(),
        run_job=runner,
    )
    reference = new_study(None)
    reference.optimize(softmax_objective, n_trials=TRIALS)

    trials, plain = study.get_trials(), reference.get_trials()
    assert [t.number for t in trials] == list(range(TRIALS))  # no trial added by a reclaim
    assert [t.params for t in trials] == [t.params for t in plain]  # the sampler's history
    assert [t.state for t in trials] == [t.state for t in plain]  # pruned alike
    assert [t.value for t in trials] == [t.value for t in plain]
    assert study.best_value == reference.best_value
    assert runner.resumed_from and all(step > 0 for step in runner.resumed_from.values())


def test_a_trial_whose_driver_died_is_retried_from_its_checkpoint(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    root = (tmp_path / "trials").as_uri()
    storage = open_storage(url, heartbeat_interval_seconds=1, grace_period_seconds=2)
    study = new_study(storage)
    # The first driver asks trial 0, beats once, runs its job until a checkpoint, and dies
    # (its job's lease is reclaimed with it): no tell, no more heartbeats.
    trial = study.ask(dict(SEARCH_SPACE))
    storage.record_heartbeat(trial._trial_id)
    from spot_core.sweeps.study import trial_job

    job = trial_job(study, trial, objective=OBJECTIVE, pruner=PRUNER, checkpoint_root=root)
    step = Runner().attempt(job, 1)
    deadline = time.monotonic() + 60
    while open_store(job.checkpoint_uri).latest() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    step.kill()
    step.wait()
    saved = open_store(job.checkpoint_uri).latest().step
    # No wait here: the next driver sees trial 0 running, waits, and retries it once
    # Optuna's heartbeat fails it after the grace period.

    # The next driver: Optuna fails the stale trial and enqueues its retry, same params.
    runner = Runner(preempt=lambda job: False)
    seen = []

    def run_job(job):
        seen.append((job.trial_number, job.checkpoint_uri, open_store(job.checkpoint_uri).latest()))
        return runner(job)

    optimize(
        new_study(open_storage(url, heartbeat_interval_seconds=1, grace_period_seconds=2)),
        SEARCH_SPACE,
        n_trials=1,
        objective=OBJECTIVE,
        pruner=PRUNER,
        checkpoint_root=root,
        run_job=run_job,
    )
    trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.COMPLETE]
    retry = trials[1]
    assert retry.params == trials[0].params
    assert optuna.storages.RetryHeartbeatStaleTrialCallback.retried_trial_number(retry) == 0
    [(number, uri, resumed)] = seen
    assert number == 1 and uri == job.checkpoint_uri  # keyed by the original trial
    assert resumed is not None and resumed.step == saved > 0
    plain = new_study(None, "plain")
    plain.enqueue_trial(trials[0].params)
    plain.optimize(softmax_objective, n_trials=1)
    assert retry.value == plain.best_value  # resumed, and the same result
