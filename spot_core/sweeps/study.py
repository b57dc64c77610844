"""The driver's side of a spot sweep: Optuna asks, a spot job runs the trial, Optuna tells.

What survives what:

- **a reclaimed lease**: the trial's job is one spot job under the controller, so a
  preemption is another attempt of the *same* job, resumed from the trial's checkpoint.
  The trial stays RUNNING in the study throughout, so the sampler's history is what it
  would have been without the reclaim (same trials, same parameters, same order).
- **a dead driver** (the Airflow worker or Prefect process that ran the trial): the
  driver records Optuna's trial heartbeat while the job runs. When it stops, the next
  driver's ``fail_stale_trials`` fails the trial after ``grace_period`` and Optuna's
  ``RetryHeartbeatStaleTrialCallback`` (formerly ``RetryFailedTrialCallback``) enqueues
  it again as a WAITING trial with the same parameters. Its checkpoints are keyed by the
  *original* trial number (``retried_trial_number``), so the retry resumes from where
  the dead driver's job got to.
- **pruning**: the step reports intermediate values with ``trial.report`` and asks
  ``trial.should_prune()``, exactly as in plain Optuna; a pruned trial is told PRUNED.

    storage = open_storage("sqlite:///study.db", heartbeat_interval_seconds=10)
    study = optuna.create_study(study_name="lr", storage=storage, sampler=TPESampler(seed=1),
                                load_if_exists=True)
    optimize(study, SEARCH_SPACE, n_trials=20, objective="my.mod:objective",
             checkpoint_root="s3://bucket/sweeps/lr", run_job=run_on_spot)
"""

from __future__ import annotations

import json
import logging
import sys
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback, fail_stale_trials
from optuna.storages._heartbeat import BaseHeartbeat, get_heartbeat_thread
from optuna.trial import FrozenTrial, TrialState

from spot_core.checkpoint import open_store
from spot_core.errors import ConfigError
from spot_core.model import JobRecord, JobStatus

log = logging.getLogger(__name__)

RESULT_KEY = "sweep/result.json"  # what the step leaves in the trial's store
SearchSpace = Mapping[str, BaseDistribution]


@dataclass(frozen=True)
class TrialJob:
    """One trial as a spot job: what a ``TrialRunner`` hands to the controller."""

    job_id: str
    command: tuple[str, ...]
    checkpoint_uri: str
    trial_number: int
    env: Mapping[str, str] = field(default_factory=dict)


TrialRunner = Callable[[TrialJob], JobRecord]


def open_storage(
    url: str,
    *,
    heartbeat_interval_seconds: int = 60,
    grace_period_seconds: int | None = None,
    max_retry: int | None = 3,
) -> RDBStorage:
    """Optuna's RDB storage (``sqlite:///path`` by default, ``postgresql://...`` where
    the engine has one) with trial heartbeats, and stale trials retried with the same
    parameters up to ``max_retry`` times."""
    if heartbeat_interval_seconds < 1:
        raise ConfigError(
            f"heartbeat_interval_seconds must be a whole number >= 1 (got "
            f"{heartbeat_interval_seconds}); Optuna records heartbeats in whole seconds"
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return RDBStorage(
            url,
            heartbeat_interval=heartbeat_interval_seconds,
            grace_period=grace_period_seconds,
            heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=max_retry),
        )


def storage_url(storage: Any) -> str:
    """The URL a step reopens the study with (RDB storages only: the node needs one)."""
    url = getattr(getattr(storage, "_backend", storage), "url", None)  # under Optuna's cache
    if not isinstance(url, str):
        raise ConfigError(
            "a spot sweep needs Optuna's RDB storage (sqlite:/// or postgresql://) so "
            "its trials' steps can reach the study; open it with spot_core.sweeps.study."
            "open_storage"
        )
    return url


def checkpoint_number(trial: FrozenTrial) -> int:
    """The trial number its checkpoints are keyed by: the original trial's for a retry."""
    attrs = trial.system_attrs
    original = attrs.get("failed_trial")
    return int(original) if original is not None else trial.number


def trial_checkpoint_uri(root: str, number: int) -> str:
    return f"{root.rstrip('/')}/trial-{number:06d}"


def trial_job(
    study: optuna.Study,
    trial: optuna.Trial,
    *,
    objective: str,
    checkpoint_root: str,
    pruner: str | None = None,
) -> TrialJob:
    number = checkpoint_number(study._storage.get_trial(trial._trial_id))
    command = (
        sys.executable,
        "-m",
        "spot_core.sweeps.trial_step",
        "--storage",
        storage_url(study._storage),
        "--study",
        study.study_name,
        "--trial",
        str(trial.number),
        "--objective",
        objective,
        *(("--pruner", pruner) if pruner else ()),
    )
    safe_name = "".join(c if c.isalnum() or c in "-_." else "-" for c in study.study_name)
    return TrialJob(
        job_id=f"sweep-{safe_name}-trial-{number:06d}",
        command=command,
        checkpoint_uri=trial_checkpoint_uri(checkpoint_root, number),
        trial_number=trial.number,
    )


def run_trial(
    study: optuna.Study,
    trial: optuna.Trial,
    run_job: TrialRunner,
    *,
    objective: str,
    checkpoint_root: str,
    pruner: str | None = None,
) -> TrialState:
    """Run one asked trial as a spot job and tell the study how it ended. The trial's
    heartbeat is recorded for as long as this driver waits on the job."""
    job = trial_job(
        study, trial, objective=objective, checkpoint_root=checkpoint_root, pruner=pruner
    )
    beat = get_heartbeat_thread(trial._trial_id, study._storage)
    beat.start()
    try:
        record = run_job(job)
    finally:
        beat.join()
    result = _result(job.checkpoint_uri)
    if record.status is JobStatus.SUCCEEDED and result.get("state") == "complete":
        study.tell(trial, float(result["value"]))
        return TrialState.COMPLETE
    if record.status is JobStatus.SUCCEEDED and result.get("state") == "pruned":
        study.tell(trial, state=TrialState.PRUNED)
        return TrialState.PRUNED
    log.warning("trial %d failed: %s", trial.number, record.status)
    study.tell(trial, state=TrialState.FAIL)
    return TrialState.FAIL


def optimize(
    study: optuna.Study,
    search_space: SearchSpace,
    *,
    n_trials: int,
    objective: str,
    checkpoint_root: str,
    run_job: TrialRunner,
    pruner: str | None = None,
    wait_for_others_seconds: float = 3600.0,
) -> list[TrialState]:
    """Run trials, one at a time from this driver, until ``n_trials`` of them have
    finished in this study (complete, pruned, or failed for good).

    Parameters are sampled here, from ``search_space``, so the study's sampler (and its
    seed) decides them, not the node's; the objective's ``trial.suggest_*`` calls read
    them back. ``pruner``: a ``package.module:factory`` returning the study's pruner,
    for the step's ``trial.should_prune()`` (Optuna keeps no pruner in the storage;
    default: Optuna's default ``MedianPruner``).

    Other drivers' running trials count towards ``n_trials``; this driver then waits
    for them (polling at the heartbeat interval, at most ``wait_for_others_seconds``),
    so that one whose driver died, failed by the heartbeat once its grace period is
    over, is retried here rather than left unfinished."""
    states: list[TrialState] = []
    deadline = time.monotonic() + wait_for_others_seconds
    while True:
        with warnings.catch_warnings():
            # experimental APIs; "heartbeat is supposed to be used with Study.optimize"
            warnings.simplefilter("ignore")
            fail_stale_trials(study)  # another driver died: its trials go back as WAITING
            taken, running = _taken(study)
            if taken >= n_trials:
                if not running or time.monotonic() >= deadline:
                    return states
                time.sleep(_poll_seconds(study))
                continue
            trial = study.ask(dict(search_space))
        states.append(
            run_trial(
                study,
                trial,
                run_job,
                objective=objective,
                checkpoint_root=checkpoint_root,
                pruner=pruner,
            )
        )


def _poll_seconds(study: optuna.Study) -> float:
    storage = study._storage
    interval = storage.get_heartbeat_interval() if isinstance(storage, BaseHeartbeat) else None
    return float(interval) if interval else 5.0


def _taken(study: optuna.Study) -> tuple[int, int]:
    """(trials finished or running, running ones). A failed trial counts only when no
    retry of it was enqueued (its retry counts instead, once asked); running ones count
    so that several drivers of one study stop at ``n_trials`` between them."""
    trials = study.get_trials(deepcopy=False)
    retried = {n for t in trials for n in t.system_attrs.get("retry_history", ())}
    taken = sum(
        t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)
        or (t.state is TrialState.FAIL and t.number not in retried)
        for t in trials
    )
    return taken, sum(t.state is TrialState.RUNNING for t in trials)


def _result(uri: str) -> dict[str, Any]:
    data = open_store(uri).get_object(RESULT_KEY)
    if data is None:
        return {}
    doc: dict[str, Any] = json.loads(data)
    return doc
