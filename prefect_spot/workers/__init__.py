"""Prefect workers. Importing this registers the ``spot`` worker type and the blocks
(it is the package's ``prefect.collections`` entry point)."""

from prefect_spot.blocks import CheckpointStorage, SpotConfiguration
from prefect_spot.workers.spot import (
    SpotJobConfiguration,
    SpotJobVariables,
    SpotWorker,
    SpotWorkerResult,
)

__all__ = [
    "CheckpointStorage",
    "SpotConfiguration",
    "SpotJobConfiguration",
    "SpotJobVariables",
    "SpotWorker",
    "SpotWorkerResult",
]
