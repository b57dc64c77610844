"""The demo's and tests' objective: the softmax regression trained with a trial's learning
rate and batch size, checkpointed, reporting its test loss for pruners.

Deterministic for given parameters (the data set and mini-batches come from fixed seeds),
so a trial resumed after a reclaim ends with the value an uninterrupted run has.
``SPOT_SWEEP_STEP_SECONDS`` adds simulated compute per step so a trial lives long enough
to be reclaimed.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import optuna
from optuna.distributions import FloatDistribution, IntDistribution

from spot_core.checkpoint import Checkpointer
from spot_core.checkpoint.state import arrays_from_bytes, arrays_to_bytes
from spot_core.workloads.softmax_regression import (
    STATE_FILE,
    SimulatedCompute,
    TrainConfig,
    initial_state,
    make_dataset,
    train_step,
)

STEP_SECONDS = "SPOT_SWEEP_STEP_SECONDS"
STEPS, REPORT_EVERY = 120, 20
SEARCH_SPACE = {
    "learning_rate": FloatDistribution(0.005, 2.0, log=True),
    "batch_size": IntDistribution(8, 128, log=True),
}


def median_pruner() -> optuna.pruners.BasePruner:
    """The demo's pruner (a step builds it from ``--pruner``; the storage keeps none)."""
    return optuna.pruners.MedianPruner(n_startup_trials=2)


def test_loss(state: dict[str, Any], x: np.ndarray, y: np.ndarray) -> float:
    logits = x @ state["W"] + state["b"]
    logits = logits - logits.max(axis=1, keepdims=True)
    log_probs = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    return round(float(-log_probs[np.arange(len(y)), y].mean()), 10)


def softmax_objective(trial: optuna.Trial, checkpointer: Checkpointer | None = None) -> float:
    """Test log-loss after ``STEPS`` SGD steps (lower is better)."""
    cfg = TrainConfig(
        learning_rate=trial.suggest_float("learning_rate", 0.005, 2.0, log=True),
        batch_size=trial.suggest_int("batch_size", 8, 128, log=True),
        steps=STEPS,
    )
    x, y, x_test, y_test = make_dataset(TrainConfig())
    state, start = initial_state(cfg), 0
    restored = checkpointer.restore() if checkpointer is not None else None
    if restored is not None:
        start, payload = restored
        state = arrays_from_bytes(payload[STATE_FILE])
    pace = SimulatedCompute(float(os.environ.get(STEP_SECONDS) or 0))
    for step in range(start, cfg.steps):
        train_step(state, step, x, y, cfg)
        pace.step()
        if (step + 1) % REPORT_EVERY == 0:
            trial.report(test_loss(state, x_test, y_test), step + 1)
            if trial.should_prune():
                raise optuna.TrialPruned()
        if checkpointer is not None:
            checkpointer.maybe_save(step + 1, lambda: {STATE_FILE: arrays_to_bytes(state)})
    return test_loss(state, x_test, y_test)
