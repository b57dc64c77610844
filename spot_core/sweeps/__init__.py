"""Optuna sweeps on spot: each trial one spot job, its checkpoints keyed by trial number.

``study`` is the driver's side (the process an engine runs: an Airflow task, a Prefect
task, ``spot-pipelines demo --workload sweep``): it opens Optuna's RDB storage with trial
heartbeats and the stale-trial retry callback, asks for trials, runs each as a spot job
through a ``TrialRunner`` and tells the result. ``trial_step`` is the node's side: the
step process that restores the trial's checkpoint and runs the user's objective.
Optuna is imported only here (the ``sweeps`` extra).
"""
