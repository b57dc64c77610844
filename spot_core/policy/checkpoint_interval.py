"""How often to checkpoint: the Young/Daly optimum for the observed interruption rate.

Checkpointing too often wastes time writing; too rarely loses work at each interruption.
Young (1974) puts the optimum at ``sqrt(2 C M)`` for checkpoint cost ``C`` and mean time
between interruptions ``M``; Daly (2006) adds higher-order terms that matter when ``C``
is not small against ``M``, and caps the interval at ``M`` when checkpoints are so dear
(``C >= 2M``) that the expansion no longer holds. All times are seconds.

On spot the interruption notice (2 minutes on AWS) usually allows an emergency save, so
this interval is the safety net for notices that are missed or too short.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from spot_core.errors import ConfigError
from spot_core.policy.registry import Registry

if TYPE_CHECKING:
    from spot_core.model import CheckpointRef


def _check_positive(**values: float) -> None:
    for name, value in values.items():
        if not (isinstance(value, (int, float)) and value > 0 and math.isfinite(value)):
            raise ConfigError(f"{name} must be a finite number > 0, got {value!r}")


def young_interval(checkpoint_seconds: float, mtbi_seconds: float) -> float:
    """Young's first-order optimum ``sqrt(2 C M)``."""
    _check_positive(checkpoint_seconds=checkpoint_seconds, mtbi_seconds=mtbi_seconds)
    return math.sqrt(2.0 * checkpoint_seconds * mtbi_seconds)


def daly_interval(checkpoint_seconds: float, mtbi_seconds: float) -> float:
    """Daly's higher-order optimum (Daly 2006, "A higher order estimate of the optimum
    checkpoint interval for restart dumps").

    ``sqrt(2CM) * (1 + sqrt(C/(2M))/3 + C/(18M)) - C`` for ``C < 2M``, else ``M``.
    """
    c, m = checkpoint_seconds, mtbi_seconds
    _check_positive(checkpoint_seconds=c, mtbi_seconds=m)
    if c >= 2.0 * m:
        return m
    return math.sqrt(2.0 * c * m) * (1.0 + math.sqrt(c / (2.0 * m)) / 3.0 + c / (18.0 * m)) - c


FORMULAS: Registry[Callable[[float, float], float]] = Registry(
    "checkpoint interval formula", default="daly"
)
FORMULAS.register("daly", daly_interval)
FORMULAS.register("young", young_interval)


def checkpoint_interval(
    checkpoint_seconds: float,
    interruptions_per_hour: float,
    *,
    min_seconds: float = 60.0,
    max_seconds: float = 3600.0,
    formula: Literal["daly", "young"] = "daly",
) -> float:
    """Seconds between checkpoints for a pool interrupting at the observed rate.

    A rate of zero means no interruption has been seen: checkpoint at ``max_seconds``,
    the longest gap the user will tolerate losing. The result is clamped to
    ``[min_seconds, max_seconds]`` so a burst of interruptions cannot make the job spend
    its time writing checkpoints.
    """
    _check_positive(
        checkpoint_seconds=checkpoint_seconds, min_seconds=min_seconds, max_seconds=max_seconds
    )
    if min_seconds > max_seconds:
        raise ConfigError(
            f"min_seconds ({min_seconds}) must not exceed max_seconds ({max_seconds})"
        )
    if not (interruptions_per_hour >= 0 and math.isfinite(interruptions_per_hour)):
        raise ConfigError(f"interruptions_per_hour must be >= 0, got {interruptions_per_hour!r}")
    if interruptions_per_hour == 0:
        return float(max_seconds)
    tau = FORMULAS.get(formula)(checkpoint_seconds, 3600.0 / interruptions_per_hour)
    return float(min(max(tau, min_seconds), max_seconds))


# -- per attempt: what the controller gives each attempt for its pool --------------------------
@dataclass(frozen=True)
class CheckpointBounds:
    """The settings that shape an attempt's interval (capacity seconds): the save cost
    assumed until one is measured, and the interval's floor and ceiling."""

    cost: float
    min_seconds: float
    max_seconds: float

    def __post_init__(self) -> None:
        for name, value in (
            ("checkpoint_cost", self.cost),
            ("checkpoint_interval_min", self.min_seconds),
            ("checkpoint_interval_max", self.max_seconds),
        ):
            if not (isinstance(value, (int, float)) and value > 0):
                raise ConfigError(f"{name} must be > 0 seconds, got {value!r}")
        if self.min_seconds > self.max_seconds:
            raise ConfigError(
                f"checkpoint_interval_min ({self.min_seconds:g} s) exceeds "
                f"checkpoint_interval_max ({self.max_seconds:g} s); lower the "
                "minimum or raise the maximum"
            )


def mean_save_seconds(ref: CheckpointRef | None) -> float | None:
    """The job's mean measured save, from the ledger a ``Checkpointer`` writes into each
    checkpoint's metadata (``checkpoint_seconds_total`` over ``checkpoint_saves``, wall
    seconds on the node); None before any save or for a checkpoint written without it."""
    metadata: Mapping[str, Any] = getattr(ref, "metadata", None) or {}
    total, saves = metadata.get("checkpoint_seconds_total"), metadata.get("checkpoint_saves")
    if (
        not isinstance(total, (int, float))
        or isinstance(total, bool)
        or not isinstance(saves, (int, float))
        or isinstance(saves, bool)
        or not saves > 0
        or not math.isfinite(total)
        or not total > 0
    ):
        return None
    return float(total) / float(saves)


def pool_checkpoint_interval(
    interruptions_per_hour: float, save_seconds: float, bounds: CheckpointBounds
) -> float:
    """Seconds between an attempt's time-based saves on a pool interrupting at
    ``interruptions_per_hour`` when a save costs ``save_seconds`` (all capacity time).

    Why per pool and per attempt: pools differ by an order of magnitude in how often they
    are reclaimed, and a job's own saves tell its real cost; a fixed interval is either
    wasteful on a quiet pool or loses work on a busy one."""
    rate = interruptions_per_hour if math.isfinite(interruptions_per_hour) else 0.0
    return checkpoint_interval(
        max(save_seconds, 1e-3),
        max(rate, 0.0),
        min_seconds=bounds.min_seconds,
        max_seconds=bounds.max_seconds,
    )
