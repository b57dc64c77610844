"""A ``TrialRunner`` over any provider: each trial one spot job assembled by ``jobs``.

The engines' sweep patterns (dags/spot_sweep.py, flows/spot_sweep.py) run ``optimize``
in a task and hand it this runner, so every trial is a spot job exactly as a
``SpotJobOperator`` or ``SpotTaskRunner`` job is: the same settings, provider,
controller and budgets, driven in the task's process.

    with spot_trials(SpotSettings.build(provider="local", max_preemptions=2)) as run_job:
        optimize(study, SPACE, n_trials=20, objective=..., checkpoint_root=..., run_job=run_job)
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from spot_core import jobs
from spot_core.controller import Listener
from spot_core.model import JobRecord
from spot_core.settings import SpotSettings
from spot_core.sweeps.study import TrialJob, TrialRunner


@contextmanager
def spot_trials(
    settings: SpotSettings,
    *,
    env: Mapping[str, str] | None = None,
    session: Any = None,
    scratch_dir: str | None = None,
    listener: Listener | None = None,
) -> Iterator[TrialRunner]:
    """A runner of trials as spot jobs on the settings' provider (opened here, closed on
    every exit path); ``env`` goes to every trial's step."""
    provider = jobs.open_provider_for(settings, session=session, scratch_dir=scratch_dir)

    def run_job(job: TrialJob) -> JobRecord:
        controller = jobs.assemble(settings, provider, listener=listener)
        spec = jobs.job_spec(
            settings,
            provider,
            job_id=job.job_id,
            checkpoint_uri=job.checkpoint_uri,
            command=job.command,
            env={**(env or {}), **job.env},
        )
        return controller.run(spec)

    try:
        yield run_job
    finally:
        close = getattr(provider, "close", None)
        if callable(close):
            close()
