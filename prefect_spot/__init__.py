"""Prefect 3 integration: run flow and task work on spot capacity, safely.

- ``spot_task``: a task that checkpoints and survives interruption notices in place.
- ``SpotTaskRunner``: a task runner that runs each task as a spot job under the controller.
- ``SpotWorker`` (type ``spot``): a worker that runs flow runs on spot capacity and
  reschedules a flow run whose capacity is reclaimed, so it resumes from its checkpoint.
- ``SpotConfiguration`` / ``CheckpointStorage``: blocks, saved and loaded by name.

Names are imported lazily so ``import prefect_spot`` stays cheap (a spot step that only
needs the checkpoint API never pays for Prefect's import).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "spot_task": "prefect_spot.tasks",
    "SpotTaskRunner": "prefect_spot.task_runners",
    "spot_record": "prefect_spot.task_runners",
    "SpotWorker": "prefect_spot.workers.spot",
    "SpotJobConfiguration": "prefect_spot.workers.spot",
    "SpotJobVariables": "prefect_spot.workers.spot",
    "SpotConfiguration": "prefect_spot.blocks",
    "CheckpointStorage": "prefect_spot.blocks",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'prefect_spot' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
