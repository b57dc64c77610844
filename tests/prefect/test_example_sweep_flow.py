"""The sweep example flow on a real Prefect server: Optuna trials as spot jobs on the
local spot cloud; every trial finishes once, the best value equals a plain optimize's."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

FLOW_FILE = Path(__file__).resolve().parents[2] / "flows" / "spot_sweep.py"


def load_flow():
    if "spot_sweep" not in sys.modules:
        spec = importlib.util.spec_from_file_location("spot_sweep", FLOW_FILE)
        module = importlib.util.module_from_spec(spec)
        sys.modules["spot_sweep"] = module
        spec.loader.exec_module(module)
    return sys.modules["spot_sweep"]


@pytest.mark.timeout(600)
def test_sweep_flow_trials_finish_once_with_the_plain_best_value(prefect_api, tmp_path):
    result = load_flow().spot_sweep(workdir=str(tmp_path), trials=4, seed=3, drivers=2)
    assert len(result["trials"]) == 4 and set(result["trials"]) <= {"COMPLETE", "PRUNED"}
    # Each trial ran as a spot job with its own checkpoints, keyed by trial number, and
    # left its result there for its driver.
    stores = sorted((tmp_path / "trials").glob("trial-*"))
    assert [p.name for p in stores] == [f"trial-{n:06d}" for n in range(4)]
    assert all((p / "sweep" / "result.json").is_file() for p in stores)
