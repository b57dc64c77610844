"""The node's side of a spot sweep: one trial's step, run by the controller on a lease.

``python -m spot_core.sweeps.trial_step --storage URL --study NAME --trial N --objective
pkg.mod:objective`` reopens the study, takes trial N as an ``optuna.Trial`` (its
parameters were sampled by the driver; ``trial.suggest_*`` reads them back), and calls
``objective(trial, checkpointer)``. The ``Checkpointer`` is the attempt's
(``SPOT_CHECKPOINT_URI``: the trial's own store), so a resumed attempt restores where the
reclaimed one saved. The result (value, or pruned) goes to the trial's store for the
driver, which tells the study; a notice saves and exits 143 like any spot step.
"""

from __future__ import annotations

import argparse
import importlib
import json
from collections.abc import Callable
from typing import Any

import optuna

from spot_core.attempt_env import exit_ignoring_notices, report_step_exit
from spot_core.checkpoint import Checkpointer
from spot_core.errors import ConfigError, SpotError
from spot_core.sweeps.study import RESULT_KEY

Objective = Callable[[optuna.Trial, Checkpointer], float]


def load(spec: str, what: str) -> Any:
    module, _, name = spec.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(
            f"{what} {spec!r} is not importable here ({exc}); give package.module:function"
        ) from exc


def open_trial(
    storage: str, study_name: str, number: int, pruner: optuna.pruners.BasePruner | None = None
) -> optuna.Trial:
    """Trial ``number`` of the study, for reporting and reading its parameters; the
    study's pruner is the driver's (``pruner``), since the storage keeps none."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=study_name, storage=storage, pruner=pruner)
    trial_id = study._storage.get_trial_id_from_study_id_trial_number(study._study_id, number)
    return optuna.Trial(study, trial_id)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--storage", required=True)
    parser.add_argument("--study", required=True)
    parser.add_argument("--trial", type=int, required=True)
    parser.add_argument("--objective", required=True)
    parser.add_argument("--pruner", default=None, help="package.module:factory of the pruner")
    args = parser.parse_args(argv)
    objective: Objective = load(args.objective, "--objective")
    pruner = load(args.pruner, "--pruner")() if args.pruner else None
    trial = open_trial(args.storage, args.study, args.trial, pruner)
    try:
        checkpointer = Checkpointer.from_env()
        # Attached until the process ends: a notice after the objective returned must not
        # kill the step while it writes its result or exits (the trial is done).
        checkpointer.attach_signals()
        try:
            result = {"state": "complete", "value": float(objective(trial, checkpointer))}
        except optuna.TrialPruned:
            result = {"state": "pruned"}
        checkpointer.store.put_object(RESULT_KEY, json.dumps(result).encode())
    except SpotError as exc:
        return report_step_exit(exc)
    print(json.dumps({"trial": args.trial, **result}), flush=True)
    return 0


if __name__ == "__main__":
    exit_ignoring_notices(main())
